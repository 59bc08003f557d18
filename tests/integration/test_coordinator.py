"""motor coordinator: union routing, the OpenAI surface (stream and non-stream), probes,
metrics, inference API keys, no-instance and unknown-model answers, graceful stop,
--check-config."""

import json
import os
import signal
import subprocess

from coord_helpers import (stop_clean, FAST, ext_instance, metric_value, openai_error, sim_served,
                           start_coordinator)
from motorlib import SSEStream, get, motor_bin, post, start_sim, wait_for


def test_union_routing_stream_and_non_stream(procs, tmpdir_path):
    s1 = start_sim(procs, "--model", "m", *FAST, name="sim1")
    s2 = start_sim(procs, "--model", "m", *FAST, name="sim2")
    c = start_coordinator(procs, tmpdir_path)
    assert get(c.url + "/readiness").json()["ready"] is False
    c.set_instances([ext_instance(7, "union", s1, s2)])
    assert get(c.url + "/readiness").json()["ready"] is True

    # non-stream completions: same answer as the engine gives directly
    direct = s1.completion(model="m", prompt="the quick fox", max_tokens=8).json()
    r = c.completion(model="m", prompt="the quick fox", max_tokens=8)
    assert r.status == 200, r
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers.get("x-request-id")
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == direct["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] == 8

    # chat, non-stream
    msgs = [{"role": "user", "content": "hello there"}]
    direct = s2.chat(model="m", messages=msgs, max_tokens=6).json()
    r = c.chat(model="m", messages=msgs, max_tokens=6)
    assert r.status == 200, r
    assert r.json()["choices"][0]["message"]["content"] == \
        direct["choices"][0]["message"]["content"]

    # chat, streamed: the concatenated deltas are the same text
    st = SSEStream(c.url + "/v1/chat/completions",
                   {"model": "m", "messages": msgs, "max_tokens": 6, "stream": True,
                    "stream_options": {"include_usage": True}})
    assert st.status == 200 and st.content_type.startswith("text/event-stream")
    chunks = st.all()
    text = "".join(ch["choices"][0]["delta"].get("content") or ""
                   for ch in chunks if ch.get("choices"))
    assert text == direct["choices"][0]["message"]["content"]
    assert chunks[-1].get("usage", {}).get("completion_tokens") == 6

    # completions, streamed
    st = SSEStream(c.url + "/v1/completions",
                   {"model": "m", "prompt": "the quick fox", "max_tokens": 8, "stream": True})
    assert st.status == 200
    text = "".join(ch["choices"][0]["text"] for ch in st.all())
    assert text == body["choices"][0]["text"]

    # the load is spread over both endpoints
    before = (sim_served(s1), sim_served(s2))
    for i in range(10):
        assert c.completion(model="m", prompt=f"p{i}", max_tokens=2).status == 200
    after = (sim_served(s1), sim_served(s2))
    assert after[0] - before[0] >= 3 and after[1] - before[1] >= 3, (before, after)

    models = get(c.url + "/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["m"]

    # metrics: requests by api/code, latency histograms, in-flight per endpoint
    text = get(c.url + "/metrics").text
    assert metric_value(text, "motor_coordinator_requests_total",
                        {"api": "completions", "code": "200"}) >= 12
    assert metric_value(text, "motor_coordinator_time_to_first_token_seconds_count") >= 14
    assert metric_value(text, "motor_coordinator_request_duration_seconds_count") >= 14
    assert f'endpoint="127.0.0.1:{s1.port}"' in text
    assert metric_value(text, "motor_coordinator_endpoint_inflight_requests") == 0
    assert metric_value(text, "motor_coordinator_inflight_requests") == 0
    assert get(c.mgmt + "/metrics").status == 200
    stop_clean(c)


def test_round_robin_alternates(procs, tmpdir_path):
    s1 = start_sim(procs, "--model", "m", *FAST, name="sim1")
    s2 = start_sim(procs, "--model", "m", *FAST, name="sim2")
    c = start_coordinator(procs, tmpdir_path, {"scheduler_config": {"scheduler_type": "round_robin"}},
                          workers=1)
    c.set_instances([ext_instance(1, "union", s1), ext_instance(2, "union", s2)])
    for i in range(8):
        assert c.completion(model="m", prompt="x", max_tokens=1).status == 200
    assert (sim_served(s1), sim_served(s2)) == (4, 4)
    stop_clean(c)


def test_no_instance_unknown_model_bad_request(procs, tmpdir_path):
    c = start_coordinator(procs, tmpdir_path)
    err = openai_error(c.completion(model="m", prompt="x"), 503)
    assert "no instance available" in err["message"]
    assert metric_value(get(c.url + "/metrics").text, "motor_coordinator_errors_total",
                        {"cause": "no_instance"}) == 1

    s = start_sim(procs, "--model", "m", *FAST)
    c.set_instances([ext_instance(1, "union", s)])
    err = openai_error(c.completion(model="other", prompt="x"), 404)
    assert "other" in err["message"]
    # no model given: served by whatever is there
    assert c.completion(prompt="x", max_tokens=1).status == 200

    openai_error(post(c.url + "/v1/completions", raw=b"{not json",
                      headers={"Content-Type": "application/json"}), 400)
    openai_error(c.completion(model="m", prompt="x", stream="yes"), 400)
    openai_error(c.chat(model="m", messages="hi"), 400)
    openai_error(post(c.url + "/v1/completions", [1, 2]), 400)

    # an engine's own 4xx is passed through, not retried
    r = c.completion(model="m", prompt="x", max_tokens=-5)
    assert r.status == 400, r
    assert sim_served(s) == 1

    # an instance that is not active is not routed to
    c.set_instances([ext_instance(1, "union", s, status="inactive")])
    openai_error(c.completion(model="m", prompt="x"), 503)
    pool = c.instances()["instances"][0]
    assert pool["pool"] == "unavailable" and pool["healthy"] is False
    stop_clean(c)


def test_inference_api_keys(procs, tmpdir_path):
    keyfile = f"{tmpdir_path}/keys"
    with open(keyfile, "w") as f:
        f.write("# inference keys\nsk-file-key\n")
    s = start_sim(procs, "--model", "m", *FAST)
    c = start_coordinator(procs, tmpdir_path,
                          {"api_key_config": {"enable_api_key": True, "api_keys": ["sk-inline"],
                                              "api_key_file": keyfile}})
    c.set_instances([ext_instance(1, "union", s)])
    r = c.completion(model="m", prompt="x", max_tokens=1)
    assert r.status == 401 and r.headers.get("www-authenticate") == "Bearer"
    assert c.completion(model="m", prompt="x", max_tokens=1,
                        headers={"Authorization": "Bearer wrong"}).status == 401
    assert c.completion(model="m", prompt="x", max_tokens=1,
                        headers={"Authorization": "Bearer sk-inline"}).status == 200
    assert c.completion(model="m", prompt="x", max_tokens=1,
                        headers={"Authorization": "Bearer sk-file-key"}).status == 200
    assert get(c.url + "/v1/models").status == 401
    # probes and metrics stay open
    for path in ("/health", "/readiness", "/liveness", "/startup", "/metrics"):
        assert get(c.url + path).status == 200, path
    stop_clean(c)


def test_graceful_stop_and_bad_config(procs, tmpdir_path):
    s = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "50")
    c = start_coordinator(procs, tmpdir_path)
    c.set_instances([ext_instance(1, "union", s)])
    # a stream in progress is finished during the grace period, then the process exits 0
    st = SSEStream(c.url + "/v1/completions",
                   {"model": "m", "prompt": "x", "max_tokens": 20, "stream": True}, timeout=15)
    it = st.chunks()
    first = next(it)
    assert first["choices"]
    c.proc.signal(signal.SIGTERM)
    rest = list(it)
    assert len(rest) >= 18 and st.done
    assert c.proc.wait(10) == 0
    assert c.proc.find_events("coordinator_stopped", exit_code=0)

    bad = f"{tmpdir_path}/bad.json"
    with open(bad, "w") as f:
        json.dump({"motor_coordinator_config": {"exception_config": {"max_retry": "x"},
                                                "timeout_config": {"infer_timeout": -1}}}, f)
    p = procs.motor("coordinator", "--config", bad, "--port", "0", "--mgmt-port", "0",
                    name="badcfg")
    assert p.wait(10) == 1
    out = p.output()
    assert "exception_config.max_retry" in out and "timeout_config.infer_timeout" in out

    # the config path may also come from the environment
    p = procs.motor("coordinator", "--port", "0", "--mgmt-port", "0", name="envcfg",
                    extra_env={"USER_CONFIG_PATH": bad})
    assert p.wait(10) == 1
    assert wait_for(lambda: "max_retry" in p.output(), 5)


def test_check_config(procs, tmpdir_path):
    """--check-config: every error and exit 1, or the effective configuration as JSON and
    exit 0, with command-line overrides applied and no secret printed."""
    def check(*args, env=None):
        e = dict(os.environ)
        e.update(env or {})
        return subprocess.run([motor_bin(), "coordinator", "--check-config", *args],
                              capture_output=True, text=True, timeout=30, env=e)

    bad = f"{tmpdir_path}/bad.json"
    with open(bad, "w") as f:
        json.dump({"motor_coordinator_config": {
            "api_config": {"coordinator_api_mgmt_port": 70000},
            "exception_config": {"max_retry": "x"},
            "timeout_config": {"infer_timeout": -1},
            "mgmt_api_key_config": {"enable_api_key": True}}}, f)
    r = check("--config", bad)
    assert r.returncode == 1, r
    assert r.stdout == ""
    for key in ("api_config.coordinator_api_mgmt_port", "exception_config.max_retry",
                "timeout_config.infer_timeout", "mgmt_api_key_config.api_key_file"):
        assert key in r.stderr, (key, r.stderr)

    keyfile = f"{tmpdir_path}/mgmt.key"
    with open(keyfile, "w") as f:
        f.write("very-secret-mgmt-key\n")
    good = f"{tmpdir_path}/good.json"
    with open(good, "w") as f:
        json.dump({"motor_coordinator_config": {
            "api_config": {"coordinator_api_infer_port": 31025,
                           "coordinator_api_mgmt_port": 31026},
            "scheduler_config": {"scheduler_type": "kv_cache_affinity"},
            "exception_config": {"max_retry": 2, "retry_delay": 0.5},
            "api_key_config": {"enable_api_key": True, "api_keys": ["sk-one", "sk-two"]},
            "mgmt_api_key_config": {"enable_api_key": True, "api_key_file": keyfile},
            "inference_workers_config": {"num_workers": 3}}}, f)
    r = check("--config", good, "--mgmt-port", "0", "--host", "127.0.0.9",
              env={"POD_IP": "10.0.0.1"})
    assert r.returncode == 0, r.stderr
    eff = json.loads(r.stdout)
    assert eff["config_path"] == good
    assert eff["api_config"] == {"coordinator_api_host": "127.0.0.9",
                                 "coordinator_api_infer_port": 31025,
                                 "coordinator_api_mgmt_port": 0,
                                 "max_request_body_bytes": 16 << 20,
                                 "max_connections": 0, "keep_alive_timeout": 60.0,
                                 "metaserver_base_port": 0}
    assert eff["scheduler_config"]["scheduler_type"] == "kv_cache_affinity"
    assert eff["scheduler_config"]["effective_scheduler"] == "kv_cache_affinity"
    assert eff["exception_config"]["max_retry"] == 2
    assert eff["exception_config"]["transport_max_retry"] == 2
    assert eff["exception_config"]["retry_delay"] == 0.5
    assert eff["timeout_config"]["infer_timeout"] == 3600
    assert eff["api_key_config"] == {"enable_api_key": True, "keys": 2}
    assert eff["mgmt_api_key_config"] == {"enable_api_key": True, "key_loaded": True}
    assert eff["inference_workers_config"]["num_workers"] == 3
    for secret in ("sk-one", "sk-two", "very-secret-mgmt-key"):
        assert secret not in r.stdout and secret not in r.stderr
    # The environment feeds the defaults as for a start.
    r = check(env={"POD_IP": "10.0.0.1", "USER_CONFIG_PATH": "", "CONFIG_PATH": ""})
    assert r.returncode == 0, r.stderr
    eff = json.loads(r.stdout)
    assert eff["config_path"] is None
    assert eff["api_config"]["coordinator_api_host"] == "10.0.0.1"
    assert eff["inference_workers_config"]["num_workers"] >= 1
