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


class Collector:
    """A tiny OTLP/HTTP JSON collector: keeps every span POSTed to /v1/traces."""

    def __init__(self):
        self.spans: list[dict] = []
        self.resources: list[dict] = []
        col = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n))
                assert self.path == "/v1/traces"
                for rs in body["resourceSpans"]:
                    col.resources.append(rs["resource"])
                    for ss in rs["scopeSpans"]:
                        col.spans += ss["spans"]
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        self.port = motorlib.free_port()
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def attrs(span: dict) -> dict:
    out = {}
    for a in span.get("attributes", []):
        v = a["value"]
        out[a["key"]] = v.get("stringValue", v.get("intValue"))
    return out


def test_spans_exported_to_a_collector(procs, tmpdir_path):
    col = Collector()
    rec = Recorder()
    try:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{col.port}",
               "OTEL_SERVICE_NAME": "gw-test"}
        c = start_coordinator(procs, tmpdir_path, workers=1, env=env)
        c.wait_event("tracing_enabled", timeout=5)
        p = start_sim(procs, "--model", "m", *FAST, name="prefill")
        d = start_sim(procs, "--model", "m", *FAST, name="decode")
        # union, with the client's trace: the request span is the child of the client's
        c.set_instances([ext_instance(1, "union", rec)])
        r = post(c, {"traceparent": TP, "X-Request-Id": "traced-1"})
        assert r.status == 200, r
        motorlib.wait_for(lambda: len(col.spans) >= 3, timeout=10)
        by = {s["name"]: s for s in col.spans}
        root, route, leg = by["request"], by["route"], by["leg union"]
        trace = TP[3:35]
        assert {s["traceId"] for s in col.spans} == {trace}
        assert root["parentSpanId"] == TP[36:52] and root["kind"] == 2
        assert route["parentSpanId"] == leg["parentSpanId"] == root["spanId"]
        assert leg["kind"] == 3
        assert attrs(root)["motor.request_id"] == "traced-1"
        assert attrs(root)["http.response.status_code"] == "200"
        assert attrs(leg)["motor.instance_id"] == "1"
        assert attrs(leg)["server.address"] == f"127.0.0.1:{rec.port}"
        assert int(root["startTimeUnixNano"]) <= int(leg["startTimeUnixNano"]) <= \
            int(leg["endTimeUnixNano"]) <= int(root["endTimeUnixNano"])
        # the engine got the leg's span as its parent, same trace
        assert rec.headers[-1]["traceparent"] == f"00-{trace}-{leg['spanId']}-01"
        assert col.resources[0]["attributes"][0]["value"]["stringValue"] == "gw-test"

        # PD without a client trace: a new trace, prefill and decode legs under the request
        col.spans.clear()
        c.set_instances([ext_instance(2, "prefill", p), ext_instance(3, "decode", d)],
                        dispatch_capabilities=["prefill_handoff_decode"])
        assert post(c).status == 200
        motorlib.wait_for(lambda: len(col.spans) >= 4, timeout=10)
        by = {s["name"]: s for s in col.spans}
        root = by["request"]
        assert "parentSpanId" not in root
        assert by["leg prefill"]["parentSpanId"] == root["spanId"]
        assert by["leg decode"]["parentSpanId"] == root["spanId"]
        assert int(by["leg prefill"]["endTimeUnixNano"]) <= \
            int(by["leg decode"]["startTimeUnixNano"])

        # a client trace not sampled (flags 00): nothing exported, its context passed on
        col.spans.clear()
        c.set_instances([ext_instance(1, "union", rec)])
        unsampled = TP[:-2] + "00"
        assert post(c, {"traceparent": unsampled}).status == 200
        assert rec.headers[-1]["traceparent"] == unsampled
    finally:
        col.close()
        rec.close()
    assert not col.spans


def test_tracing_sampling_ratio_zero_exports_nothing(procs, tmpdir_path):
    col = Collector()
    rec = Recorder()
    try:
        env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{col.port}/v1/traces",
               "OTEL_TRACES_SAMPLER_ARG": "0"}
        c = start_coordinator(procs, tmpdir_path, workers=1, env=env)
        c.set_instances([ext_instance(1, "union", rec)])
        for _ in range(5):
            assert post(c).status == 200
        # a sampled client trace is still followed
        assert post(c, {"traceparent": TP}).status == 200
        motorlib.wait_for(lambda: len(col.spans) >= 3, timeout=10)
        assert {s["traceId"] for s in col.spans} == {TP[3:35]}
    finally:
        col.close()
        rec.close()
