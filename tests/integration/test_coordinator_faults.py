"""motor coordinator failure handling against simulated engines: circuit breaker opening
and recovering, retries and their exhaustion, first_token_timeout and infer_timeout (504
or an in-band error on a committed stream), client disconnects cancelling upstream."""

import http.client
import json
import socket
import time

from coord_helpers import (stop_clean, FAST, ext_instance, fsm_events, fsm_count, metric_value,
                           openai_error, sim_aborted, sim_served, start_coordinator)
from motorlib import SSEStream, get, start_sim, wait_for

BREAKER = {"exception_config": {"retry_delay": 0.01, "circuit_breaker_open_timeout": 0.5,
                                "circuit_breaker_max_open_timeout": 2}}


def breaker_of(c, iid):
    for i in c.instances()["instances"]:
        if i["id"] == iid:
            return i
    raise KeyError(iid)


def test_breaker_opens_and_recovers(procs, tmpdir_path):
    bad = start_sim(procs, "--model", "m", *FAST, name="flaky")
    good = start_sim(procs, "--model", "m", *FAST, name="good")
    c = start_coordinator(procs, tmpdir_path, BREAKER, workers=1)
    c.set_instances([ext_instance(1, "union", bad), ext_instance(2, "union", good)])
    assert bad.fault("unhealthy").status == 200  # inference answers 503 now

    # clients never see the failures: each one is retried on the good instance
    for _ in range(12):
        r = c.completion(model="m", prompt="x", max_tokens=1)
        assert r.status == 200, r
        if c.proc.find_events("breaker_open", instance_id=1):
            break
    ev = c.proc.wait_event("breaker_open", instance_id=1, timeout=1)
    assert ev["trip_count"] == 1
    view = breaker_of(c, 1)
    assert view["circuit_breaker"]["state"] == "open" and view["healthy"] is False
    assert view["circuit_breaker"]["trip_count"] == 1
    assert breaker_of(c, 2)["healthy"] is True
    fails = len(c.proc.find_events("upstream_failed", instance_id=1))
    assert fails == 3

    # while open, the instance gets nothing
    t_open = time.monotonic()
    served = sim_served(good)
    for _ in range(3):
        assert c.completion(model="m", prompt="x", max_tokens=1).status == 200
    if time.monotonic() - t_open < 0.4:
        assert len(c.proc.find_events("upstream_failed", instance_id=1)) == fails
    assert sim_served(good) == served + 3

    # half-open trial fails: open again with the period doubled
    def tripped_twice():
        c.completion(model="m", prompt="x", max_tokens=1)
        return c.proc.find_events("breaker_open", instance_id=1, trip_count=2)
    ev = wait_for(tripped_twice, 10, interval=0.1, what="second trip")[0]
    assert ev["open_ms"] == 1000

    # the engine recovers: the next trial succeeds and closes the breaker
    assert bad.fault("recover").status == 200

    def closed():
        c.completion(model="m", prompt="x", max_tokens=1)
        return c.proc.find_events("breaker_closed", instance_id=1)
    wait_for(closed, 10, interval=0.1, what="breaker closed")
    view = breaker_of(c, 1)
    assert view["circuit_breaker"]["state"] == "closed" and view["healthy"] is True
    assert view["circuit_breaker"]["current_timeout"] == 0.5
    before = sim_served(bad)
    for _ in range(6):
        assert c.completion(model="m", prompt="x", max_tokens=1).status == 200
    assert sim_served(bad) > before
    assert c.metric("motor_coordinator_breaker_trips_total") == 2
    stop_clean(c)


def test_retries_exhausted_pass_upstream_error(procs, tmpdir_path):
    s1 = start_sim(procs, "--model", "m", *FAST, name="s1")
    s2 = start_sim(procs, "--model", "m", *FAST, name="s2")
    c = start_coordinator(procs, tmpdir_path, {"exception_config": {
        "max_retry": 2, "retry_delay": 0.01, "circuit_breaker_failure_threshold": 100}})
    c.set_instances([ext_instance(1, "union", s1), ext_instance(2, "union", s2)])
    s1.fault("error")
    s2.fault("error")
    r = c.completion(model="m", prompt="x", max_tokens=1)
    assert r.status == 500, r
    assert "error" in r.json()  # the engine's own body, passed through
    assert len(c.proc.find_events("upstream_failed")) == 3  # 1 + max_retry
    assert c.metric("motor_coordinator_retries_total") == 2
    # the request's path: DECODE -> BACKOFF twice, then the last failure answered once
    ev = fsm_events(c)
    assert ev[("DECODE", "RETRY", "BACKOFF")] == 2
    assert ev[("BACKOFF", "RETRY_TIMER", "ROUTING")] == 2
    assert ev[("DECODE", "GIVE_UP", "DONE")] == 1
    assert fsm_count(c, "SENT") == 3
    assert c.metric("motor_coordinator_requests_total", {"code": "500"}) == 1

    # a dead engine: transport errors, retried on the live one
    s2.fault("recover")
    s1.proc.kill()
    s1.proc.wait(5)
    for _ in range(4):
        assert c.completion(model="m", prompt="x", max_tokens=1).status == 200
    assert metric_value(get(c.url + "/metrics").text, "motor_coordinator_errors_total",
                        {"cause": "upstream_transport"}) == 0
    stop_clean(c)


def test_first_token_timeout_on_hang(procs, tmpdir_path):
    s = start_sim(procs, "--model", "m", *FAST)
    c = start_coordinator(procs, tmpdir_path, {"timeout_config": {"first_token_timeout": 0.5}})
    c.set_instances([ext_instance(1, "union", s)])
    assert s.fault("hang").status == 200
    for stream in (False, True):
        t0 = time.monotonic()
        r = c.completion(model="m", prompt="x", max_tokens=3, stream=stream)
        took = time.monotonic() - t0
        err = openai_error(r, 504)
        assert "first_token_timeout" in err["message"]
        assert 0.4 <= took < 3, took
    assert c.metric("motor_coordinator_errors_total", {"cause": "first_token_timeout"}) == 2
    assert fsm_events(c)[("DECODE", "FIRST_TIMEOUT", "DONE")] == 2
    assert c.metric("motor_coordinator_requests_total", {"code": "504"}) == 2
    wait_for(lambda: c.metric("motor_coordinator_endpoint_inflight_requests") == 0, 5)
    stop_clean(c)


def test_infer_timeout(procs, tmpdir_path):
    s = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "10")
    c = start_coordinator(procs, tmpdir_path, {"timeout_config": {"infer_timeout": 0.6}})
    c.set_instances([ext_instance(1, "union", s)])
    # streaming: committed, so the stream is cut with an in-band error event
    t0 = time.monotonic()
    st = SSEStream(c.url + "/v1/completions",
                   {"model": "m", "prompt": "x", "max_tokens": 100, "stream": True}, timeout=10)
    assert st.status == 200
    events = list(st.raw_events())
    assert time.monotonic() - t0 < 3
    assert not st.done
    last = json.loads(events[-1])
    assert last["error"]["code"] == 504 and "infer_timeout" in last["error"]["message"]
    assert 2 <= len(events) <= 12
    # non-streaming: 504
    err = openai_error(c.completion(model="m", prompt="x", max_tokens=100), 504)
    assert "infer_timeout" in err["message"]
    wait_for(lambda: s.status()["running"] == 0, 5, what="upstream cancelled")
    assert c.metric("motor_coordinator_errors_total", {"cause": "infer_timeout"}) == 2
    ev = fsm_events(c)
    assert ev[("STREAMING", "TOTAL_TIMEOUT", "DONE")] == 1  # the in-band end
    assert ev[("DECODE", "TOTAL_TIMEOUT", "DONE")] == 1     # the 504
    stop_clean(c)


def test_client_disconnect_cancels_upstream(procs, tmpdir_path):
    s = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "20")
    c = start_coordinator(procs, tmpdir_path)
    c.set_instances([ext_instance(1, "union", s)])

    # streaming: read a little, then hang up
    st = SSEStream(c.url + "/v1/chat/completions",
                   {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 500, "stream": True})
    events = st.raw_events()  # keep the generator: dropping it closes the response
    next(events)
    assert s.status()["running"] == 1
    st.close()
    wait_for(lambda: s.status()["running"] == 0, 10, what="upstream stream cancelled")
    wait_for(lambda: sim_aborted(s) == 1, 10, what="engine saw the abort")

    # non-streaming: hang up before the answer
    conn = http.client.HTTPConnection("127.0.0.1", c.infer_port, timeout=5)
    conn.request("POST", "/v1/completions",
                  body=json.dumps({"model": "m", "prompt": "x", "max_tokens": 500}),
                  headers={"Content-Type": "application/json"})
    wait_for(lambda: s.status()["running"] == 1, 10, what="request reached the engine")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    wait_for(lambda: s.status()["running"] == 0, 10, what="upstream request cancelled")
    wait_for(lambda: sim_aborted(s) == 2, 10)
    wait_for(lambda: c.metric("motor_coordinator_inflight_requests") == 0, 10)
    assert c.metric("motor_coordinator_endpoint_inflight_tokens") == 0
    assert c.metric("motor_coordinator_errors_total", {"cause": "client_disconnect"}) == 2
    # each request ended once, on the client's side (499), wherever it was
    assert c.metric("motor_coordinator_requests_total", {"code": "499"}) == 2
    ev = fsm_events(c)
    assert ev[("STREAMING", "CLIENT_GONE", "DONE")] == 1
    assert ev[("DECODE", "CLIENT_GONE", "DONE")] == 1
    # and the coordinator keeps serving
    assert c.completion(model="m", prompt="x", max_tokens=2).status == 200
    stop_clean(c)


def test_upstream_error_body_capped(procs, tmpdir_path):
    """An engine's huge error body reaches the client cut at 64 KiB, with its status."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"error":"' + b"x" * (300 * 1024) + b'"}'
            try:
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        c = start_coordinator(procs, tmpdir_path, {"exception_config": {
            "max_retry": 1, "retry_delay": 0.01}})
        c.set_instances([{"id": 1, "role": "union", "endpoints": [
            {"id": 0, "address": f"127.0.0.1:{srv.server_address[1]}"}]}])
        r = c.completion(model="m", prompt="x", max_tokens=1)
        assert r.status == 500
        assert len(r.body) == 64 * 1024
        assert r.body.startswith(b'{"error":"xxxx')
        wait_for(lambda: c.metric("motor_coordinator_endpoint_inflight_requests") == 0, 5)
        stop_clean(c)
    finally:
        srv.shutdown()
        srv.server_close()
