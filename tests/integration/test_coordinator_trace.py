"""motor coordinator: request identity (issue 20, deliverable 2) — a client's X-Request-Id
is kept (validated, capped at 63 characters), sent to the engine and echoed back; a valid
W3C traceparent (and its tracestate) is passed to every leg unchanged, an invalid one is
dropped. The engine side is a small HTTP server of the test's own that records the
headers it gets (and the engine simulator, whose completion id carries the request id)."""

from __future__ import annotations

import http.server
import json
import threading

import motorlib
from coord_helpers import FAST, ext_instance, start_coordinator
from motorlib import http as mhttp, start_sim

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorder:
    """An OpenAI-shaped completion server that records each request's headers."""

    def __init__(self):
        self.headers: list[dict[str, str]] = []
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                rec.headers.append({k.lower(): v for k, v in self.headers.items()})
                body = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "m",
                                   "choices": [{"index": 0, "text": "ok",
                                                "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                             "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.port = motorlib.free_port()
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.t = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.t.start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def post(c, headers=None):
    return mhttp("POST", c.url + "/v1/completions",
                 body={"model": "m", "prompt": "hi", "max_tokens": 1}, headers=headers,
                 timeout=10)


def test_request_id_and_trace_context_reach_the_engine(procs, tmpdir_path):
    rec = Recorder()
    try:
        c = start_coordinator(procs, tmpdir_path, workers=1)
        c.set_instances([ext_instance(1, "union", rec)])
        # kept, sent on, echoed
        r = post(c, {"X-Request-Id": "client-42.a:b", "traceparent": TP,
                     "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"})
        assert r.status == 200, r
        assert r.headers["x-request-id"] == "client-42.a:b"
        h = rec.headers[-1]
        assert h["x-request-id"] == "client-42.a:b"
        assert h["traceparent"] == TP
        assert h["tracestate"] == "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
        # capped at 63 characters
        long_id = "x" * 100
        r = post(c, {"X-Request-Id": long_id})
        assert r.headers["x-request-id"] == "x" * 63
        assert rec.headers[-1]["x-request-id"] == "x" * 63
        # invalid: a fresh id of our own; an invalid traceparent is not passed on (control
        # characters never get this far: the HTTP parser answers 400)
        for bad in ("has space", 'quo"te', "semi;colon"):
            r = post(c, {"X-Request-Id": bad, "traceparent": "00-" + "0" * 32 + "-" +
                         "00f067aa0ba902b7-01", "tracestate": "a=b"})
            assert r.status == 200, r
            assert r.headers["x-request-id"].startswith("motor-"), r.headers
            assert rec.headers[-1]["x-request-id"] == r.headers["x-request-id"]
            assert "traceparent" not in rec.headers[-1]
            assert "tracestate" not in rec.headers[-1]
        # none given: a fresh one, no trace headers
        r = post(c)
        assert r.headers["x-request-id"].startswith("motor-")
        assert "traceparent" not in rec.headers[-1]
        # a traceparent of a later version is read by its prefix
        tp2 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        post(c, {"traceparent": tp2})
        assert rec.headers[-1]["traceparent"] == tp2[:55]
    finally:
        rec.close()


def test_request_id_through_pd_legs(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    c = start_coordinator(procs, tmpdir_path, {"scheduler_config": {
        "enable_pd_separation_fallback_to_hybrid": False}}, workers=1)
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["prefill_handoff_decode"])
    r = post(c, {"X-Request-Id": "pd-req-7", "traceparent": TP})
    assert r.status == 200, r
    assert r.headers["x-request-id"] == "pd-req-7"
    # the simulator names its completion after the request id it got
    assert r.json()["id"] == "cmpl-pd-req-7", r.json()


def test_error_types_match_the_engines(procs, tmpdir_path):
    """The coordinator's error `type` values are vLLM's, as the simulator's are."""
    s = start_sim(procs, "--model", "m", *FAST)
    c = start_coordinator(procs, tmpdir_path, workers=1)
    # no instance yet: 503
    r = post(c)
    assert r.status == 503 and r.json()["error"]["type"] == "ServiceUnavailableError", r
    c.set_instances([ext_instance(1, "union", s)])
    body = {"model": "nope", "prompt": "x", "max_tokens": 1}
    mine = mhttp("POST", c.url + "/v1/completions", body=body, timeout=10)
    theirs = mhttp("POST", s.url + "/v1/completions", body=body, timeout=10)
    assert mine.status == theirs.status == 404
    assert mine.json()["error"]["type"] == theirs.json()["error"]["type"] == "NotFoundError"
    bad = b'{"model": "m", "prompt": '
    mine = mhttp("POST", c.url + "/v1/completions", raw=bad, timeout=10,
                 headers={"Content-Type": "application/json"})
    theirs = mhttp("POST", s.url + "/v1/completions", raw=bad, timeout=10,
                   headers={"Content-Type": "application/json"})
    assert mine.status == theirs.status == 400
    assert mine.json()["error"]["type"] == theirs.json()["error"]["type"] == "BadRequestError"
