"""motor engine-sim: the endpoints a gateway passes through (Responses, Messages,
embeddings, /v1/models/{id}), SGLang's abort_request, the connection cap, the trigger-mode
metaserver callback (spec §9.4), and the stream faults (crash after N tokens, stall,
a clean end that is not a finished answer) — against the real binary."""

import base64
import http.client
import json
import signal
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from motorlib import SSEStream, get, post, start_sim, wait_for

FAST = ("--ttft-ms", "0", "--tokens-per-second", "0")


def named_events(url, body, timeout=10):
    """(event, data) pairs of a stream with named SSE events."""
    conn = http.client.HTTPConnection(url.split("//")[1].split("/")[0], timeout=timeout)
    path = "/" + url.split("//")[1].split("/", 1)[1]
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    out = []
    for block in resp.read().decode().split("\n\n"):
        if not block:
            continue
        ev_line, data_line = block.split("\n")
        assert ev_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[6:])
        assert data["type"] == ev_line[7:]
        out.append((ev_line[7:], data))
    conn.close()
    return out


# ---- Responses, Messages, embeddings, models ---------------------------------------

def test_responses_api(procs):
    sim = start_sim(procs, *FAST)
    r = post(sim.url + "/v1/responses", {"input": "hello there", "instructions": "be brief",
                                         "max_output_tokens": 300})
    assert r.status == 200, r
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "completed" and body["incomplete_details"] is None
    assert body["instructions"] == "be brief"
    (item,) = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    text = item["content"][0]["text"]
    assert item["content"][0]["type"] == "output_text" and text
    u = body["usage"]
    assert u["output_tokens"] == len(text.split(" ")) and u["total_tokens"] == \
        u["input_tokens"] + u["output_tokens"]
    # the same conversation as chat: the same answer
    chat = sim.chat(messages=[{"role": "system", "content": "be brief"},
                              {"role": "user", "content": "hello there"}],
                    max_tokens=300).json()
    assert chat["choices"][0]["message"]["content"] == text
    # input as items; max_output_tokens cuts: incomplete
    r = post(sim.url + "/v1/responses",
             {"input": [{"type": "message", "role": "user", "content": "hello there"}],
              "instructions": "be brief", "max_output_tokens": 3}).json()
    assert r["status"] == "incomplete"
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    short = r["output"][0]["content"][0]["text"]
    assert text.startswith(short)
    # streamed: the response.* event sequence, deltas concatenating to the text
    evs = named_events(sim.url + "/v1/responses",
                       {"input": "hello there", "instructions": "be brief", "stream": True,
                        "max_output_tokens": 300})
    kinds = [k for k, _ in evs]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    deltas = "".join(d["delta"] for k, d in evs if k == "response.output_text.delta")
    assert deltas == text == evs[-4][1]["text"]
    assert evs[-1][1]["response"]["usage"]["output_tokens"] == u["output_tokens"]
    # errors
    r = post(sim.url + "/v1/responses", {"input": []})
    assert r.status == 400 and r.json()["error"]["param"] == "input"


def test_responses_pd_handoff(procs):
    """kv_transfer_params work on /v1/responses as on the other generation routes."""
    p = start_sim(procs, *FAST, name="prefill")
    d = start_sim(procs, *FAST, name="decode")
    body = {"input": "hello there", "max_output_tokens": 6}
    ref = post(d.url + "/v1/responses", body).json()
    leg1 = post(p.url + "/v1/responses",
                dict(body, max_output_tokens=1,
                     kv_transfer_params={"do_remote_decode": True})).json()
    kv = leg1["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["remote_port"] == p.port
    leg2 = post(d.url + "/v1/responses", dict(body, kv_transfer_params=kv)).json()
    assert leg2["output"][0]["content"][0]["text"] == ref["output"][0]["content"][0]["text"]


def test_messages_api(procs):
    sim = start_sim(procs, *FAST)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    r = post(sim.url + "/v1/messages", {"model": "sim-model", "max_tokens": 4,
                                        "system": "be brief", "messages": msgs})
    assert r.status == 200, r
    body = r.json()
    assert body["type"] == "message" and body["role"] == "assistant"
    assert body["id"].startswith("msg_") and body["stop_reason"] == "max_tokens"
    assert body["content"][0]["type"] == "text"
    assert body["usage"] == {"input_tokens": 5, "output_tokens": 4}  # 2+1 system, 1+1 user
    evs = named_events(sim.url + "/v1/messages", {"max_tokens": 4, "system": "be brief",
                                                  "messages": msgs, "stream": True})
    kinds = [k for k, _ in evs]
    assert kinds == ["message_start", "content_block_start", "ping"] + \
        ["content_block_delta"] * 4 + ["content_block_stop", "message_delta", "message_stop"]
    text = "".join(d["delta"]["text"] for k, d in evs if k == "content_block_delta")
    assert text == body["content"][0]["text"]
    assert evs[-2][1]["delta"]["stop_reason"] == "max_tokens"
    # Anthropic's error shape here
    r = post(sim.url + "/v1/messages", {"messages": msgs})
    assert r.status == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "'max_tokens' is required"}}


def test_embeddings(procs):
    sim = start_sim(procs, *FAST)
    r = post(sim.url + "/v1/embeddings", {"input": ["the engine", "the cache"]})
    assert r.status == 200, r
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 2
    v0 = body["data"][0]["embedding"]
    assert len(v0) == 256 and abs(sum(x * x for x in v0) - 1) < 1e-4
    assert body["data"][1]["index"] == 1 and body["usage"]["prompt_tokens"] == 4
    # deterministic; base64 = the same little-endian float32s; token ids = the text
    again = post(sim.url + "/v1/embeddings", {"input": "the engine", "dimensions": 8,
                                              "encoding_format": "base64"}).json()
    floats = struct.unpack("<8f", base64.b64decode(again["data"][0]["embedding"]))
    plain = post(sim.url + "/v1/embeddings", {"input": "the engine", "dimensions": 8}).json()
    assert [round(x, 5) for x in floats] == [round(x, 5) for x in plain["data"][0]["embedding"]]
    ids = post(sim.url + "/tokenize", {"prompt": "the engine"}).json()["tokens"]
    by_ids = post(sim.url + "/v1/embeddings", {"input": ids, "dimensions": 8}).json()
    assert by_ids["data"][0]["embedding"] == plain["data"][0]["embedding"]
    for bad, param in (({"input": 5}, "input"), ({"input": "x", "encoding_format": "hex"},
                                                  "encoding_format"),
                       ({"input": "x", "dimensions": 0}, "dimensions"), ({}, "input")):
        r = post(sim.url + "/v1/embeddings", bad)
        assert r.status == 400 and r.json()["error"]["param"] == param, (bad, r)


def test_models_by_id(procs):
    sim = start_sim(procs, *FAST, "--served-model-name", "a", "b")
    r = get(sim.url + "/v1/models/b")
    assert r.status == 200 and r.json()["id"] == "b" and r.json()["object"] == "model"
    r = get(sim.url + "/v1/models/zz")
    assert r.status == 404
    assert r.json()["error"] == {"message": "The model `zz` does not exist.",
                                 "type": "NotFoundError", "param": "model", "code": 404}


# ---- SGLang abort_request ------------------------------------------------------------

def metric_line(sim, needle):
    return [l for l in get(sim.url + "/metrics").text.splitlines() if needle in l]


def test_abort_request(procs):
    sim = start_sim(procs, "--ttft-ms", "0", "--tokens-per-second", "20")
    s = SSEStream(sim.url + "/v1/completions",
                  {"prompt": "x", "max_tokens": 100, "ignore_eos": True, "stream": True,
                   "rid": "job-7"})
    it = s.chunks()
    next(it)
    assert sim.status()["running"] == 1
    r = post(sim.url + "/abort_request", {"rid": "job-7"})
    assert r.status == 200 and r.json() == {"aborted": 1}
    rest = list(it)  # ends with [DONE] (required by chunks())
    assert rest[-1]["choices"][0]["finish_reason"] == "abort"
    assert sim.status()["running"] == 0
    assert any(l.endswith(" 1") for l in metric_line(sim, 'finished_reason="abort"'))
    # non-stream, aborted by its response id; unknown ids abort nothing
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "r", sim.completion(prompt="y", max_tokens=100, ignore_eos=True, request_id="q1",
                            timeout=20)))
    t.start()
    wait_for(lambda: sim.status()["running"] == 1, timeout=5)
    assert post(sim.url + "/abort_request", {"rid": "nope"}).json() == {"aborted": 0}
    assert post(sim.url + "/abort_request", {"rid": "cmpl-q1"}).json() == {"aborted": 1}
    t.join(10)
    body = out["r"].json()
    assert body["choices"][0]["finish_reason"] == "abort"
    assert 0 < body["usage"]["completion_tokens"] < 100
    assert post(sim.url + "/abort_request", {}).status == 400
    # abort_all with requests waiting for a slot (aborting one starts the next)
    one = start_sim(procs, "--ttft-ms", "0", "--tokens-per-second", "20", "--max-num-seqs", "1",
                    name="one")
    results = {}

    def run(i):  # a waiting request has no response head yet: open each in a thread
        st = SSEStream(one.url + "/v1/completions", {"prompt": f"p{i}", "max_tokens": 100,
                                                     "ignore_eos": True, "stream": True},
                       timeout=15)
        results[i] = st.all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: one.status()["waiting"] == 2, timeout=5)
    assert post(one.url + "/abort_request", {"abort_all": True}).json() == {"aborted": 3}
    for t in threads:
        t.join(15)
    assert sorted(results) == [0, 1, 2]
    for chunks in results.values():
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert one.status()["running"] == 0 and one.status()["waiting"] == 0


# ---- connection cap --------------------------------------------------------------------

def test_connection_cap(procs):
    sim = start_sim(procs, *FAST, "--max-connections", "2")
    held = [socket.create_connection(("127.0.0.1", sim.port)) for _ in range(2)]
    wait_for(lambda: True)
    time.sleep(0.1)
    extra = socket.create_connection(("127.0.0.1", sim.port))
    extra.settimeout(3)
    extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        data = extra.recv(100)
    except ConnectionResetError:
        data = b""
    assert data == b""  # over the cap: closed at accept
    for h in held:
        h.close()
    extra.close()
    def healthy():  # until the engine has seen the held connections close
        try:
            return get(sim.url + "/health").status == 200
        except OSError:
            return False
    wait_for(healthy, timeout=5)
    # the default has no cap (as vLLM): 100 idle connections and still served
    free = start_sim(procs, *FAST, name="nocap")
    many = [socket.create_connection(("127.0.0.1", free.port)) for _ in range(100)]
    assert get(free.url + "/health").status == 200
    for m in many:
        m.close()


# ---- trigger mode: the metaserver callback ---------------------------------------------

class Metaserver:
    def __init__(self, status=200, delay=0.0):
        self.calls = []
        self.status = status
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                outer.calls.append((self.path, json.loads(self.rfile.read(n)), time.monotonic()))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_trigger_mode_metaserver_callback(procs):
    sim = start_sim(procs, *FAST, "--kv-transfer-config",
                    '{"kv_connector": "MooncakeLayerwiseConnector", "kv_role": "kv_consumer"}')
    meta = Metaserver()
    try:
        url = f"http://127.0.0.1:{meta.port}/v1/metaserver"
        kv = {"do_remote_decode": False, "do_remote_prefill": True, "metaserver": url}
        ref = sim.completion(prompt="the prompt", max_tokens=6, ignore_eos=True).json()
        r = sim.completion(prompt="the prompt", max_tokens=6, ignore_eos=True,
                           request_id="t1", kv_transfer_params=kv)
        assert r.status == 200, r
        assert r.json()["choices"][0]["text"] == ref["choices"][0]["text"]
        (path, body, _), = meta.calls
        assert path == "/v1/metaserver?attempt=1"
        assert body["request_id"] == "cmpl-t1-0"  # vLLM's engine-side id
        assert body["do_remote_decode"] is True and body["do_remote_prefill"] is False
        assert body["remote_host"] == "127.0.0.1" and body["remote_port"] == sim.port
        assert body["remote_engine_id"] == sim.status()["engine_id"]
        assert isinstance(body["remote_block_ids"], list)
        # chat ids, an attempt the caller chose
        kv2 = dict(kv, metaserver=url + "?attempt=3")
        assert sim.chat(messages=[{"role": "user", "content": "x"}], max_tokens=1,
                        request_id="c9", kv_transfer_params=kv2).status == 200
        assert meta.calls[-1][0] == "/v1/metaserver?attempt=3"
        assert meta.calls[-1][1]["request_id"] == "chatcmpl-c9"
        # the metaserver does not know the request / the attempt is stale: 502
        for code, words in ((404, "unknown request"), (409, "stale attempt")):
            meta.status = code
            r = sim.completion(prompt="x", max_tokens=1, kv_transfer_params=kv)
            assert r.status == 502 and words in r.json()["error"]["message"]
        meta.status = 200
        # faults: the callback fails (not made), or is late
        n = len(meta.calls)
        sim.fault("metaserver_fail")
        r = sim.completion(prompt="x", max_tokens=1, kv_transfer_params=kv)
        assert r.status == 502 and len(meta.calls) == n
        sim.fault("metaserver_delay", ms=400)
        t0 = time.monotonic()
        assert sim.completion(prompt="x", max_tokens=1, kv_transfer_params=kv).status == 200
        assert meta.calls[-1][2] - t0 >= 0.35
        sim.fault("recover")
        # a metaserver that is not there
        bad = dict(kv, metaserver="http://127.0.0.1:1/v1/metaserver")
        r = sim.completion(prompt="x", max_tokens=1, kv_transfer_params=bad)
        assert r.status == 502 and "unreachable" in r.json()["error"]["message"]
        r = sim.completion(prompt="x", max_tokens=1,
                           kv_transfer_params=dict(kv, metaserver="ftp://x"))
        assert r.status == 400
    finally:
        meta.close()


# ---- stream faults --------------------------------------------------------------------

def raw_stream(sim, body, timeout=10):
    """Every SSE payload until the server ends the stream (no [DONE] required)."""
    s = SSEStream(sim.url + "/v1/completions", dict(body, stream=True), timeout=timeout)
    return s, list(s.raw_events())


def test_crash_after_tokens_flag(procs):
    sim = start_sim(procs, *FAST, "--crash-after-tokens", "5")
    s, evs = raw_stream(sim, {"prompt": "x", "max_tokens": 20, "ignore_eos": True})
    tokens = [json.loads(e) for e in evs if e != "[DONE]"]
    assert len(tokens) == 5 and "[DONE]" not in evs
    assert all(t["choices"][0]["finish_reason"] is None for t in tokens)
    assert sim.proc.wait(10) == -signal.SIGKILL
    assert sim.proc.find_events("sim_crash")


def test_crash_after_tokens_fault(procs):
    sim = start_sim(procs, *FAST)
    sim.completion(prompt="warm", max_tokens=4)  # counted only from the fault on
    assert sim.fault("crash_after_tokens", tokens=3).status == 200
    s, evs = raw_stream(sim, {"prompt": "x", "max_tokens": 20, "ignore_eos": True})
    assert len([e for e in evs if e != "[DONE]"]) == 3
    assert sim.proc.wait(10) == -signal.SIGKILL
    r = start_sim(procs, *FAST, name="other")
    assert r.fault("crash_after_tokens").status == 400  # tokens is required


def test_stall_then_recover(procs):
    sim = start_sim(procs, "--ttft-ms", "0", "--tokens-per-second", "50")
    ref = sim.completion(prompt="stall me", max_tokens=30, ignore_eos=True).json()
    s = SSEStream(sim.url + "/v1/completions", {"prompt": "stall me", "max_tokens": 30,
                                                "ignore_eos": True, "stream": True})
    events = s.raw_events()
    first = [next(events) for _ in range(3)]
    assert sim.fault("stall").json()["mode"] == "stall"
    t0 = time.monotonic()
    got = []
    reader = threading.Thread(target=lambda: got.extend(events))
    reader.start()
    time.sleep(0.6)
    n_stalled = len(got)
    assert n_stalled <= 2  # what was already in flight, then nothing
    assert sim.status()["running"] == 1  # the connection is kept
    sim.fault("recover")
    reader.join(10)
    assert got[-1] == "[DONE]" and time.monotonic() - t0 >= 0.6
    text = "".join(json.loads(e)["choices"][0]["text"] for e in first + got[:-1])
    assert text == ref["choices"][0]["text"]
    # n=2, stalled half-way through a step (after 3 tokens: choice 0 is one ahead): after
    # recover both choices complete, each exactly its non-streamed text
    fast = start_sim(procs, *FAST, name="fast")
    want = [c["text"] for c in fast.completion(prompt="two", n=2, max_tokens=8,
                                               ignore_eos=True).json()["choices"]]
    fast.fault("stall", after_tokens=3)
    s = SSEStream(fast.url + "/v1/completions", {"prompt": "two", "n": 2, "max_tokens": 8,
                                                 "ignore_eos": True, "stream": True},
                  timeout=15)
    out = []
    reader = threading.Thread(target=lambda: out.extend(s.chunks()))
    reader.start()
    wait_for(lambda: fast.status()["tokens_total"] >= 8 * 2 + 3, timeout=5)
    time.sleep(0.2)
    assert fast.status()["tokens_total"] == 8 * 2 + 3  # the reference, then 3 streamed
    fast.fault("recover")
    reader.join(10)
    texts = ["".join(c["choices"][0]["text"] for c in out if c["choices"][0]["index"] == i)
             for i in (0, 1)]
    assert texts == want
    finals = [c["choices"][0] for c in out if c["choices"][0]["finish_reason"]]
    assert sorted(f["index"] for f in finals) == [0, 1]


def test_cut_clean_end_is_not_a_finished_answer(procs):
    sim = start_sim(procs, *FAST)
    assert sim.fault("cut", after_tokens=3).status == 200
    s, evs = raw_stream(sim, {"prompt": "x", "max_tokens": 20, "ignore_eos": True})
    chunks = [json.loads(e) for e in evs]
    assert len(chunks) == 3 and "[DONE]" not in evs  # a clean end, unfinished
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    # a non-streamed answer is cut short (HTTP 200, a body that is not whole JSON)
    r = sim.completion(prompt="x", max_tokens=20, ignore_eos=True)
    assert r.status == 200
    try:
        json.loads(r.body)
        whole = True
    except ValueError:
        whole = False
    assert not whole and r.body.startswith(b'{"id":')
    sim.fault("recover")
    s = SSEStream(sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 5, "stream": True})
    assert s.all()[-1]["choices"][0]["finish_reason"] == "length"
