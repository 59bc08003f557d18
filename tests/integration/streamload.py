"""streamload — many concurrent streaming chat completions against one HTTP port, and
the process's memory while they run (the coordinator soak test and bench/coord_memory.py).

    rounds = soak(port, pid, streams=400, rounds=10)

One round = `streams` streaming chats opened at once and read to `data: [DONE]`, then
`streams` more opened at once and dropped by the client after the first chunk (the
aborted ones). Each connection is its own TCP connection (what 2,000 browser tabs do).
RSS is read from /proc/<pid>/status after the round, once the proxy has answered
everything (its in-flight gauge is back to 0, see wait_idle).

Standard library only (asyncio); 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Callable, Optional


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _request(model: str, max_tokens: int, path: str = "/v1/chat/completions") -> bytes:
    body = json.dumps({"model": model, "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "tell me a story"}]}).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


async def _one(port: int, req: bytes, abort: bool, started: asyncio.Event | None,
               timeout: float) -> str:
    """One streaming request: 'done' (read to [DONE]), 'aborted' (dropped after the first
    chunk) or an error string."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port),
                                                timeout)
    except (OSError, asyncio.TimeoutError) as e:
        return f"connect: {e!r}"
    try:
        writer.write(req)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        if not head.startswith(b"HTTP/1.1 200"):
            return "status: " + head.split(b"\r\n", 1)[0].decode(errors="replace")
        buf = b""
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), timeout)
            if not chunk:
                return "eof before [DONE]"
            buf += chunk
            if abort and b"data: {" in buf:
                return "aborted"
            if b"data: [DONE]" in buf:
                return "done"
            if len(buf) > 1 << 20:
                buf = buf[-64:]
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
        return f"io: {e!r}"
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


async def _burst(port: int, n: int, abort: bool, model: str, max_tokens: int,
                 timeout: float, during: Optional[Callable[[], None]]) -> dict[str, int]:
    req = _request(model, max_tokens)
    tasks = [asyncio.ensure_future(_one(port, req, abort, None, timeout)) for _ in range(n)]
    if during is not None:
        # Sample while the streams are open (the peak): every 50 ms until the first ends.
        while not any(t.done() for t in tasks):
            during()
            await asyncio.sleep(0.05)
    out: dict[str, int] = {}
    for r in await asyncio.gather(*tasks):
        out[r] = out.get(r, 0) + 1
    return out


def burst(port: int, n: int, abort: bool = False, model: str = "m", max_tokens: int = 16,
          timeout: float = 60.0, during: Optional[Callable[[], None]] = None) -> dict[str, int]:
    """n concurrent streaming chats; {'done': n} (or {'aborted': n}) when all went well."""
    return asyncio.run(_burst(port, n, abort, model, max_tokens, timeout, during))


def metric(url: str, name: str) -> float:
    """The sum of a family's samples in a /metrics text (0 if absent)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_idle(metrics_url: Optional[str], timeout: float = 30.0) -> None:
    """Until the proxy reports no request in flight (the aborted ones included: it has
    noticed every client's close and cancelled the upstream legs)."""
    if metrics_url is None:
        time.sleep(1.0)
        return
    deadline = time.monotonic() + timeout
    while metric(metrics_url, "motor_coordinator_inflight_requests") > 0:
        if time.monotonic() > deadline:
            raise TimeoutError("requests still in flight after the round")
        time.sleep(0.05)


def soak(port: int, pid: int, streams: int, rounds: int, metrics_url: Optional[str] = None,
         model: str = "m", max_tokens: int = 16, settle: float = 3.0,
         trim_metric: Optional[str] = None) -> list[dict]:
    """`rounds` rounds of `streams` completed + `streams` aborted streams; per round the
    outcomes, the peak RSS while the completed ones were open, and the RSS after it (KiB).
    With trim_metric (a counter of metrics_url), "after" is read once that counter moved
    after the proxy went idle (at most 15 s) plus `settle`: on a loaded machine the
    proxy's idle trim may come later than `settle` after the last stream (a trim while
    the round ran does not count)."""
    out = []
    for i in range(rounds):
        peak = [0]

        def sample() -> None:
            peak[0] = max(peak[0], rss_kib(pid))

        done = burst(port, streams, False, model, max_tokens, during=sample)
        aborted = burst(port, streams, True, model, max_tokens)
        wait_idle(metrics_url)
        trims0 = metric(metrics_url, trim_metric) if trim_metric and metrics_url else None
        if trims0 is not None:
            deadline = time.monotonic() + 15.0
            while metric(metrics_url, trim_metric) <= trims0 and time.monotonic() < deadline:
                time.sleep(0.1)
        time.sleep(settle)
        out.append({"round": i + 1, "done": done, "aborted": aborted, "peak_kib": peak[0],
                    "rss_kib": rss_kib(pid)})
    return out
