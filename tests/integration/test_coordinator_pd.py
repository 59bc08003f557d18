"""motor coordinator PD disaggregation with simulated vLLM engines: the prefill/decode
hand-off (stream and non-stream, completions and chat) gives the same output as a union
engine, nothing internal leaks, a decode leg failing after the prefill's engine is gone is
retried on another pair, hybrid fallback and its switch."""

import signal

from coord_helpers import (stop_clean, FAST, ext_instance, fsm_events, metric_value,
                           no_internal_fields, openai_error, sim_served, start_coordinator)
from motorlib import SSEStream, get, start_sim, wait_for


def gen_tokens(sim):
    return metric_value(get(sim.url + "/metrics").text, "vllm:generation_tokens_total")


def stream_text(chunks, chat):
    out = []
    for ch in chunks:
        no_internal_fields(ch)
        for choice in ch.get("choices") or []:
            out.append((choice.get("delta") or {}).get("content") or "" if chat
                       else choice.get("text") or "")
    return "".join(out)


def test_pd_handoff_equals_union(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    u = start_sim(procs, "--model", "m", *FAST, name="reference")
    c = start_coordinator(procs, tmpdir_path, {"scheduler_config": {
        "enable_pd_separation_fallback_to_hybrid": False}})
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["prefill_handoff_decode"])
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is disaggregated serving?"}]

    # non-stream completions
    ref = u.completion(model="m", prompt="tell me about motors", max_tokens=12).json()
    r = c.completion(model="m", prompt="tell me about motors", max_tokens=12)
    assert r.status == 200, r
    body = r.json()
    no_internal_fields(body)
    assert body["choices"][0]["text"] == ref["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == 12
    # the prefill engine generated exactly one token (max_tokens=1), the decode the rest
    assert gen_tokens(p) == 1
    assert sim_served(p) == 1 and sim_served(d) == 1

    # non-stream chat
    ref = u.chat(model="m", messages=msgs, max_tokens=9).json()
    r = c.chat(model="m", messages=msgs, max_tokens=9)
    assert r.status == 200, r
    no_internal_fields(r.json())
    assert r.json()["choices"][0]["message"]["content"] == \
        ref["choices"][0]["message"]["content"]
    assert gen_tokens(p) == 2

    # streamed completions, with usage
    st = SSEStream(c.url + "/v1/completions",
                   {"model": "m", "prompt": "tell me about motors", "max_tokens": 12,
                    "stream": True, "stream_options": {"include_usage": True}})
    assert st.status == 200, st.error_body
    chunks = st.all()
    assert stream_text(chunks, False) == \
        u.completion(model="m", prompt="tell me about motors", max_tokens=12).json()["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == 12

    # streamed chat
    st = SSEStream(c.url + "/v1/chat/completions",
                   {"model": "m", "messages": msgs, "max_tokens": 9, "stream": True})
    assert st.status == 200, st.error_body
    assert stream_text(st.all(), True) == ref["choices"][0]["message"]["content"]
    assert gen_tokens(p) == 4 and sim_served(d) == 4
    # four hand-offs: PREFILL -> ticket -> DECODE, two answered whole, two streamed
    ev = fsm_events(c)
    assert ev[("ROUTING", "HANDOFF", "PREFILL")] == 4
    assert ev[("PREFILL", "TICKET", "DECODE")] == 4
    assert ev[("BUFFERING", "COMPLETE", "DONE")] == 2
    assert ev[("STREAMING", "COMPLETE", "DONE")] == 2

    # fallback disabled and no decode left: 503 with a clear body
    c.set_instances([ext_instance(1, "prefill", p)])
    err = openai_error(c.completion(model="m", prompt="x", max_tokens=2), 503)
    assert "prefill 1, decode 0" in err["message"]
    stop_clean(c)


def test_hybrid_fallback(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    u = start_sim(procs, "--model", "m", *FAST, name="reference")
    c = start_coordinator(procs, tmpdir_path)
    c.set_instances([ext_instance(1, "prefill", p)])
    # only a prefill instance: it serves whole requests (hybrid routing)
    r = c.completion(model="m", prompt="alone", max_tokens=5)
    assert r.status == 200, r
    assert r.json()["choices"][0]["text"] == \
        u.completion(model="m", prompt="alone", max_tokens=5).json()["choices"][0]["text"]
    assert gen_tokens(p) == 5
    stop_clean(c)


def test_decode_leg_fails_after_prefill_gone_retries_other_pair(procs, tmpdir_path):
    # p1 hands out tickets whose KV source does not answer (127.0.0.2: nothing listens
    # there), exactly what a decode engine meets when the prefill engine died after
    # answering: the decode leg fails and the coordinator must retry on another pair.
    p1 = start_sim(procs, "--model", "m", *FAST, name="prefill-gone",
                   extra_env={"VLLM_HOST_IP": "127.0.0.2"})
    p2 = start_sim(procs, "--model", "m", *FAST, name="prefill-ok")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    u = start_sim(procs, "--model", "m", *FAST, name="reference")
    c = start_coordinator(procs, tmpdir_path, {"exception_config": {"retry_delay": 0.01}},
                          workers=1)
    c.set_instances([ext_instance(1, "prefill", p1), ext_instance(2, "prefill", p2),
                     ext_instance(3, "decode", d)])
    for i in range(6):
        prompt = f"request {i}"
        want = u.completion(model="m", prompt=prompt, max_tokens=6).json()["choices"][0]["text"]
        if i % 2:
            r = c.completion(model="m", prompt=prompt, max_tokens=6)
            assert r.status == 200, r
            got = r.json()["choices"][0]["text"]
        else:
            st = SSEStream(c.url + "/v1/completions",
                           {"model": "m", "prompt": prompt, "max_tokens": 6, "stream": True})
            assert st.status == 200, st.error_body
            got = stream_text(st.all(), False)
        assert got == want
    failed = c.proc.find_events("upstream_failed", leg="main")
    assert failed, "no decode leg ever went to the unreachable prefill's ticket"
    assert all(e["instance_id"] == 3 for e in failed)
    assert c.metric("motor_coordinator_retries_total") == len(failed)
    assert sim_served(p2) >= 6

    # now the prefill engine really dies: the prefill leg itself fails and is retried
    p2.proc.kill()
    p2.proc.wait(5)
    c.set_instances([ext_instance(2, "prefill", p2), ext_instance(4, "prefill", u),
                     ext_instance(3, "decode", d)])
    for i in range(4):
        r = c.completion(model="m", prompt=f"again {i}", max_tokens=3)
        assert r.status == 200, r
    assert c.proc.find_events("upstream_failed", instance_id=2)
    assert c.metric("motor_coordinator_errors_total", {"cause": "no_instance"}) == 0
    stop_clean(c)


def test_client_disconnect_cancels_pd_legs(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "20",
                  name="decode")
    c = start_coordinator(procs, tmpdir_path)
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)])
    st = SSEStream(c.url + "/v1/completions",
                   {"model": "m", "prompt": "long", "max_tokens": 400, "stream": True})
    it = st.raw_events()
    next(it)
    next(it)
    assert d.status()["running"] == 1
    st.close()
    c.proc.wait_event("client_disconnected", timeout=10)
    wait_for(lambda: d.status()["running"] == 0, 10, what="decode leg cancelled")
    wait_for(lambda: metric_value(get(d.url + "/metrics").text, "sim:requests_aborted_total") == 1,
             10, what="decode engine saw the abort")
    wait_for(lambda: c.metric("motor_coordinator_endpoint_inflight_requests") == 0, 10,
             what="in-flight released")
    assert c.metric("motor_coordinator_endpoint_inflight_tokens") == 0
    assert c.metric("motor_coordinator_errors_total", {"cause": "client_disconnect"}) == 1
    stop_clean(c)


# ---- SGLang bootstrap mode: a fake SGLang engine pair (the simulator speaks vLLM) ----------

import json as _json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeSGLang:
    """Records request bodies; the prefill answers only once the decode request arrived
    (SGLang's legs run concurrently: a sequential coordinator would deadlock here)."""

    def __init__(self, role, decode_arrived):
        self.role = role
        self.bodies = []
        self.aborts = []
        self.release = threading.Event()  # a "hang" prompt streams only once set
        self.decode_arrived = decode_arrived
        self.saw_decode = []
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):
                pass

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

            def do_POST(self):
                body = _json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/abort_request":
                    fake.aborts.append(body)
                    self._send(200, {"aborted": 1})
                    return
                fake.bodies.append(body)
                if fake.role == "prefill":
                    fake.saw_decode.append(fake.decode_arrived.wait(5))
                    self._send(200, {"id": "p", "object": "text_completion",
                                     "choices": [{"index": 0, "text": "",
                                                  "finish_reason": "length"}]})
                    return
                fake.decode_arrived.set()
                if body.get("prompt") == "hang":
                    fake.release.wait(10)
                    return
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for t in ("sg", "lang", "!"):
                        chunk = {"id": "d", "object": "text_completion",
                                 "choices": [{"index": 0, "text": t}],
                                 "bootstrap_room": body.get("bootstrap_room")}
                        self.wfile.write(f"data: {_json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                self._send(200, {"id": "d", "object": "text_completion",
                                 "choices": [{"index": 0, "text": "sglang!",
                                              "finish_reason": "length"}],
                                 "bootstrap_room": body.get("bootstrap_room")})

            def _send(self, status, obj):
                data = _json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the coordinator no longer needs this leg's answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_sglang_bootstrap(procs, tmpdir_path):
    arrived = threading.Event()
    p = FakeSGLang("prefill", arrived)
    d = FakeSGLang("decode", arrived)
    try:
        c = start_coordinator(procs, tmpdir_path)
        r = c.refresh({"event": "set", "model_name": "m", "engine_type": "sglang", "instances": [
            {"id": 1, "role": "prefill", "endpoints": [
                {"id": 0, "address": f"127.0.0.1:{p.port}", "bootstrap_port": 8998}]},
            {"id": 2, "role": "decode", "endpoints": [
                {"id": 0, "address": f"127.0.0.1:{d.port}"}]}]})
        assert r.status == 200, r
        r = c.completion(model="m", prompt="hi", max_tokens=4)
        assert r.status == 200, r
        assert r.json()["choices"][0]["text"] == "sglang!"
        no_internal_fields(r.json())
        arrived.clear()
        st = SSEStream(c.url + "/v1/completions",
                       {"model": "m", "prompt": "hi", "max_tokens": 4, "stream": True,
                        "stream_options": {"include_usage": True}})
        assert st.status == 200, st.error_body
        assert stream_text(st.all(), False) == "sglang!"

        # the prefill answers after the decode leg arrived (it may outlive the request)
        wait_for(lambda: len(p.saw_decode) == 2, 10, what="prefill legs answered")
        assert p.saw_decode == [True, True], "legs were not concurrent"
        rooms = set()
        for pb, db, stream in zip(p.bodies, d.bodies, (False, True)):
            for b in (pb, db):
                assert b["bootstrap_host"] == "127.0.0.1" and b["bootstrap_port"] == 8998
                assert isinstance(b["bootstrap_room"], int) and b["bootstrap_room"] >= 0
            assert pb["bootstrap_room"] == db["bootstrap_room"] and pb["rid"] == db["rid"]
            rooms.add(pb["bootstrap_room"])
            assert pb["stream"] is False and "stream_options" not in pb
            assert db.get("stream", False) is stream and db["prompt"] == "hi"
            assert "kv_transfer_params" not in pb and "kv_transfer_params" not in db
        assert len(rooms) == 2

        # the client leaves mid-request: each engine still holding a leg gets
        # POST /abort_request with the request's rid (closing a connection does not stop
        # SGLang)
        s = socket.create_connection(("127.0.0.1", c.infer_port))
        raw = _json.dumps({"model": "m", "prompt": "hang", "max_tokens": 4}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: " + str(len(raw)).encode() +
                  b"\r\n\r\n" + raw)
        wait_for(lambda: any(b.get("prompt") == "hang" for b in d.bodies), 5, what="decode leg")
        s.close()
        wait_for(lambda: d.aborts, 5, what="abort_request to the decode engine")
        hang = [b for b in d.bodies if b.get("prompt") == "hang"][0]
        assert d.aborts[0] == {"rid": hang["rid"]}
        d.release.set()
        stop_clean(c)
    finally:
        p.close()
        d.close()
