"""Trigger mode (issue 19, deliverable 2; spec §9.4): instances announcing
`concurrent_engine_sync` (vLLM's layerwise KV connectors) are routed decode first: the
decode engine calls `POST /v1/metaserver?attempt=N` on its worker's metaserver port, the
coordinator runs the prefill there and answers, the decode engine generates. Unknown
requests get 404, stale attempts 409; a failing callback fails the attempt, which is
retried."""

import json

from coord_helpers import FAST, ext_instance, start_coordinator, stop_clean
from motorlib import SSEStream, post, start_sim


def test_trigger_mode_end_to_end(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    ref = start_sim(procs, "--model", "m", *FAST, name="reference")
    c = start_coordinator(procs, tmpdir_path, {"api_config": {"metaserver_base_port": 0},
                                               "exception_config": {"retry_delay": 0.01}},
                          workers=2)
    ev = c.proc.wait_event("coordinator_listening")
    meta_port = ev["metaserver_port"]
    assert meta_port > 0
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["concurrent_engine_sync"])
    body = {"model": "m", "prompt": "trigger me", "max_tokens": 8}
    want = ref.completion(**body).json()["choices"][0]["text"]
    r = c.completion(**body)
    assert r.status == 200, r
    assert r.json()["choices"][0]["text"] == want
    assert "kv_transfer_params" not in r.text
    cb = d.proc.find_events("sim_metaserver_callback")
    assert cb and cb[-1]["status"] == 200 and cb[-1]["attempt"] == 1, cb
    # streamed and chat too
    s = SSEStream(c.url + "/v1/chat/completions",
                  {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 5, "stream": True})
    assert s.status == 200
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in s.all()
                   if ch["choices"])
    assert text == ref.chat(model="m", messages=[{"role": "user", "content": "hi"}],
                            max_tokens=5).json()["choices"][0]["message"]["content"]
    # the metaserver's own answers: unknown request 404, no request id 400
    r = post(f"http://127.0.0.1:{meta_port}/v1/metaserver?attempt=1",
             {"request_id": "cmpl-nobody-0"})
    assert r.status == 404 and r.json()["error"]["code"] == 404, r
    r = post(f"http://127.0.0.1:{meta_port}/v1/metaserver?attempt=1", {"x": 1})
    assert r.status == 400, r
    # the callback fails (injected): each attempt fails (the decode engine answers 502)
    # and is retried; once the decode's breaker opens, the prefill instance serves the
    # whole request (hybrid fallback): the client is answered all the same
    assert d.fault("metaserver_fail").status == 200
    r = c.completion(**body)
    assert r.status == 200 and r.json()["choices"][0]["text"] == want, r
    assert c.proc.find_events("upstream_failed", instance_id=2, status=502)
    assert d.fault("recover").status == 200
    stop_clean(c)


def test_trigger_stale_attempt_is_409(procs, tmpdir_path):
    """A callback for an attempt that is not the request's current one, or for one whose
    prefill was already served, is refused 409 (stale attempt)."""
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "5",
                  name="decode")
    c = start_coordinator(procs, tmpdir_path, {"api_config": {"metaserver_base_port": 0}},
                          workers=1)
    meta_port = c.proc.wait_event("coordinator_listening")["metaserver_port"]
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["concurrent_engine_sync"])
    s = SSEStream(c.url + "/v1/completions",
                  {"model": "m", "prompt": "slow", "max_tokens": 20, "stream": True})
    assert s.status == 200
    cb = d.proc.wait_event("sim_metaserver_callback", timeout=5)
    assert cb["status"] == 200
    rid = cb["request_id"]  # vLLM's engine-side id: "cmpl-<id>"
    # the same request asks again: its prefill was served, the attempt is stale
    r = post(f"http://127.0.0.1:{meta_port}/v1/metaserver?attempt=1", {"request_id": f"{rid}-0"})
    assert r.status == 409 and "stale" in r.json()["error"]["message"], r
    r = post(f"http://127.0.0.1:{meta_port}/v1/metaserver?attempt=7", {"request_id": f"{rid}-0"})
    assert r.status == 409, r
    s.all()
    stop_clean(c)
