"""chaos_client — a client that keeps sending requests through the coordinator for the
whole run and checks every answer it gets.

The engine simulator is deterministic: the text is a pure function of the prompt (chat:
of the messages), the same on every engine and whether streamed or not, and a PD
hand-off gives what a union engine would. So each answer is compared with a reference
computed once by a direct, non-streamed call to an *oracle* engine that no fault ever
touches, and with the previous answer for the same request.

Outcomes (``Client.stats``):

* ``ok`` — 200 and the text, finish reason and completion token count equal the
  reference (streams: every event framed ``data: ...\\n\\n``, ``[DONE]`` last);
* ``http_error`` — a status >= 400 (allowed while faults are active; counted by
  status, and whether the body was an OpenAI-shaped JSON error);
* ``transport`` — refused, reset, timed out before an answer (allowed);
* ``truncated`` — a stream that stopped before ``[DONE]`` (connection cut) or ended with
  an in-band error event (allowed) — the text received so far must be a prefix of the
  reference;
* violations — a 200 whose body is not valid JSON or not a completion, a text that
  differs from the reference (or is not a prefix of it, when truncated), a malformed
  SSE event that arrived complete, an event after ``[DONE]``. Each is recorded with the
  request and what was received.

Standard library only.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any, Optional

PROMPTS = [
    "the quick brown fox",
    "tell me about node managers",
    "chaos engineering is",
    "a b c d e f g",
    "why did the engine die",
    "once upon a time in a data center",
    "retry budget",
    "x",
    "supervisors never make failures worse",
    "prefill then decode",
    "lorem ipsum dolor sit amet consectetur",
    "0 1 2 3 4 5 6 7 8 9",
]
MAX_TOKENS = [4, 12, 40, 160]


def _body(api: str, prompt: str, max_tokens: int, stream: bool, model: str,
          usage: bool) -> dict:
    if api == "chat":
        b: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream,
                             "messages": [{"role": "user", "content": prompt}]}
    else:
        b = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    if stream and usage:
        b["stream_options"] = {"include_usage": True}
    return b


def _path(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def _extract(api: str, obj: dict) -> tuple[str, Optional[str], Optional[int]]:
    """(text, finish_reason, completion_tokens) of a non-streamed answer; ValueError when
    it is not a completion."""
    ch = obj.get("choices")
    if not isinstance(ch, list) or not ch or not isinstance(ch[0], dict):
        raise ValueError("no choices")
    c = ch[0]
    if api == "chat":
        msg = c.get("message")
        if not isinstance(msg, dict) or not isinstance(msg.get("content"), str):
            raise ValueError("no message.content")
        text = msg["content"]
    else:
        if not isinstance(c.get("text"), str):
            raise ValueError("no text")
        text = c["text"]
    usage = obj.get("usage") or {}
    return text, c.get("finish_reason"), usage.get("completion_tokens")


class Reference:
    """Reference answers from the oracle engine, computed once per request shape."""

    def __init__(self, oracle_url: str, model: str):
        self.url = oracle_url
        self.model = model
        self.lock = threading.Lock()
        self.cache: dict[tuple, tuple[str, Optional[str], Optional[int]]] = {}

    def get(self, api: str, prompt: str, max_tokens: int) -> tuple[str, Optional[str], Optional[int]]:
        key = (api, prompt, max_tokens)
        with self.lock:
            if key in self.cache:
                return self.cache[key]
        body = json.dumps(_body(api, prompt, max_tokens, False, self.model, False)).encode()
        last: Optional[Exception] = None
        for _ in range(5):
            try:
                req = urllib.request.Request(self.url + _path(api), data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=15) as r:
                    ref = _extract(api, json.loads(r.read()))
                with self.lock:
                    self.cache[key] = ref
                return ref
            except (OSError, urllib.error.URLError, ValueError) as e:
                last = e
                time.sleep(0.2)
        raise RuntimeError(f"oracle engine failed: {last!r}")


class Client:
    """``threads`` workers sending requests to ``base_url`` until ``stop()``."""

    def __init__(self, base_url: str, ref: Reference, seed: int, threads: int = 3,
                 timeout: float = 25.0, model: str = "chaos-model", context: Any = None):
        self.base = base_url
        self.context = context  # ssl.SSLContext for an https:// base URL
        self.ref = ref
        self.seed = seed
        self.n_threads = threads
        self.timeout = timeout
        self.model = model
        self.lock = threading.Lock()
        self.stats: Counter = Counter()
        self.http_status: Counter = Counter()
        self.violations: list[dict] = []
        self.client_errors: list[dict] = []  # 4xx answers to valid requests (samples)
        # streams that began (200, events) and were cut: (start, end) monotonic times, for
        # the driver's check that an engine fault alone never cuts one (rescheduling)
        self.cuts: list[tuple[float, float]] = []
        self.last_answer: dict[tuple, str] = {}
        self.last_ok_at = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        for i in range(self.n_threads):
            t = threading.Thread(target=self._loop, args=(i,), daemon=True, name=f"client-{i}")
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)

    # -- one request -------------------------------------------------------------------------

    def _loop(self, idx: int) -> None:
        rng = random.Random(self.seed * 1000 + idx)
        while not self._stop.is_set():
            api = rng.choice(["completions", "chat"])
            prompt = rng.choice(PROMPTS)
            mt = rng.choice(MAX_TOKENS)
            stream = rng.random() < 0.5
            usage = rng.random() < 0.5
            try:
                self.one(api, prompt, mt, stream, usage)
            except Exception as e:  # a bug in the checker must not pass silently
                self._violation("client_exception", api, prompt, mt, stream, repr(e))
            # pace: a steady trickle, not a benchmark (2 shared cores)
            self._stop.wait(rng.uniform(0.02, 0.12))

    def probe(self, timeout: float = 10.0) -> tuple[bool, str]:
        """One synchronous non-streamed request: (answered correctly, what happened)."""
        api, prompt, mt = "completions", PROMPTS[0], 12
        out = self.one(api, prompt, mt, False, False, timeout=timeout, record=False)
        return out == "ok", out

    def one(self, api: str, prompt: str, mt: int, stream: bool, usage: bool,
            timeout: Optional[float] = None, record: bool = True) -> str:
        ref = self.ref.get(api, prompt, mt)
        t0 = time.monotonic()
        body = json.dumps(_body(api, prompt, mt, stream, self.model, usage)).encode()
        req = urllib.request.Request(self.base + _path(api), data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        to = timeout or self.timeout
        try:
            resp = urllib.request.urlopen(req, timeout=to, context=self.context)
        except urllib.error.HTTPError as e:
            with e:
                try:
                    raw = e.read()
                except (OSError, http.client.HTTPException):
                    raw = b""
            shaped = self._openai_error(raw)
            if record:
                self._count("http_error")
                with self.lock:
                    self.http_status[f"{e.code}{'' if shaped else ' (unshaped)'}"] += 1
                    # every request sent is valid: a 4xx blames the client for a fault
                    # of the fleet (it would not retry). Kept as samples for the report.
                    if 400 <= e.code < 500 and len(self.client_errors) < 20:
                        self.client_errors.append({"status": e.code, "api": api,
                                                   "stream": stream, "max_tokens": mt,
                                                   "body": raw[:400].decode(errors="replace"),
                                                   "at": time.monotonic()})
            return f"http {e.code}"
        except (OSError, urllib.error.URLError, http.client.HTTPException) as e:
            if record:
                self._count("transport")
            return f"transport {type(e).__name__}"
        with resp:
            if stream:
                outcome = self._check_stream(resp, api, prompt, mt, ref, record)
            else:
                outcome = self._check_plain(resp, api, prompt, mt, ref, record)
        if outcome == "truncated" and stream and record:
            with self.lock:
                self.cuts.append((t0, time.monotonic()))
        if outcome == "ok" and record:
            self._count("ok")
            with self.lock:
                self.last_ok_at = time.monotonic()
        return outcome

    @staticmethod
    def _openai_error(raw: bytes) -> bool:
        try:
            obj = json.loads(raw)
        except ValueError:
            return False
        return isinstance(obj, dict) and ("error" in obj or "detail" in obj)

    def _check_plain(self, resp, api: str, prompt: str, mt: int, ref, record: bool) -> str:
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException):
            if record:
                self._count("transport")
            return "transport (body cut)"
        try:
            obj = json.loads(raw)
            got = _extract(api, obj)
        except ValueError as e:
            if record:
                self._violation("garbled_200", api, prompt, mt, False,
                                f"{e}: {raw[:300]!r}")
            return "violation"
        return self._compare(api, prompt, mt, False, got, ref, record)

    def _compare(self, api: str, prompt: str, mt: int, stream: bool, got, ref,
                 record: bool) -> str:
        if got != ref:
            if record:
                self._violation("wrong_text", api, prompt, mt, stream,
                                f"got {got!r}, reference {ref!r}")
            return "violation"
        key = (api, prompt, mt)
        with self.lock:
            prev = self.last_answer.get(key)
            self.last_answer[key] = got[0]
        if prev is not None and prev != got[0] and record:
            self._violation("inconsistent", api, prompt, mt, stream,
                            f"now {got[0]!r}, before {prev!r}")
            return "violation"
        return "ok"

    def _check_stream(self, resp, api: str, prompt: str, mt: int, ref, record: bool) -> str:
        ctype = resp.headers.get("Content-Type", "")
        if "text/event-stream" not in ctype:
            # a 200 that is not a stream: only acceptable as a JSON error object
            try:
                raw = resp.read()
                obj = json.loads(raw)
                if isinstance(obj, dict) and "error" in obj:
                    if record:
                        self._count("truncated")
                    return "error object"
            except (OSError, ValueError, http.client.HTTPException):
                pass
            if record:
                self._violation("stream_not_sse", api, prompt, mt, True, f"Content-Type {ctype!r}")
            return "violation"
        text = ""
        finish = None
        tokens = None
        done = False
        ended_with_error = False
        cut = False
        try:
            while True:
                line = resp.readline()
                if not line:
                    cut = not done
                    break
                if not line.endswith(b"\n"):
                    cut = True  # connection closed in the middle of a line
                    break
                if done:
                    if record:
                        self._violation("event_after_done", api, prompt, mt, True, repr(line))
                    return "violation"
                if not line.startswith(b"data: "):
                    if record:
                        self._violation("sse_framing", api, prompt, mt, True, repr(line[:300]))
                    return "violation"
                blank = resp.readline()
                if blank == b"" or (not blank.endswith(b"\n")):
                    cut = True
                    break
                if blank != b"\n":
                    if record:
                        self._violation("sse_framing", api, prompt, mt, True,
                                        f"no blank line after event: {blank[:300]!r}")
                    return "violation"
                payload = line[6:-1]
                if payload == b"[DONE]":
                    done = True
                    continue
                try:
                    obj = json.loads(payload)
                except ValueError:
                    if record:
                        self._violation("sse_payload", api, prompt, mt, True, repr(payload[:300]))
                    return "violation"
                if not isinstance(obj, dict):
                    if record:
                        self._violation("sse_payload", api, prompt, mt, True, repr(payload[:300]))
                    return "violation"
                if "error" in obj:
                    ended_with_error = True
                    continue
                if obj.get("usage"):
                    tokens = obj["usage"].get("completion_tokens")
                for c in obj.get("choices") or []:
                    if c.get("index", 0) != 0:
                        continue
                    if api == "chat":
                        piece = (c.get("delta") or {}).get("content") or ""
                    else:
                        piece = c.get("text") or ""
                    if not isinstance(piece, str):
                        if record:
                            self._violation("sse_payload", api, prompt, mt, True, repr(payload[:300]))
                        return "violation"
                    text += piece
                    if c.get("finish_reason"):
                        finish = c["finish_reason"]
        except (OSError, http.client.HTTPException, ValueError):
            cut = True
        if not ref[0].startswith(text):
            if record:
                self._violation("wrong_text", api, prompt, mt, True,
                                f"received {text!r} is not a prefix of {ref[0]!r}")
            return "violation"
        if cut or ended_with_error or not done:
            if record:
                self._count("truncated")
            return "truncated"
        got = (text, finish, tokens if tokens is not None else ref[2])
        return self._compare(api, prompt, mt, True, got, ref, record)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _count(self, what: str) -> None:
        with self.lock:
            self.stats[what] += 1
            self.stats["requests"] += 1

    def _violation(self, kind: str, api: str, prompt: str, mt: int, stream: bool,
                   detail: str) -> None:
        with self.lock:
            self.stats["requests"] += 1
            self.stats["violation"] += 1
            self.violations.append({"kind": kind, "api": api, "prompt": prompt,
                                    "max_tokens": mt, "stream": stream, "detail": detail[:800],
                                    "at": time.monotonic()})

    def snapshot(self) -> dict:
        with self.lock:
            return {"stats": dict(self.stats), "http_status": dict(self.http_status),
                    "cuts": list(self.cuts),
                    "violations": list(self.violations),
                    "client_errors": list(self.client_errors)}
