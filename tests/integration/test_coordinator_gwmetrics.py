"""motor coordinator: gateway metrics per model and role (issue 20, deliverable 1) —
TTFT, inter-token latency, TPOT, end-to-end, queue time, PD hand-off, prompt and
generation token histograms and counters, with vLLM's bucket edges, and model_name
bounded (GWM_MAX_MODELS, the rest under "other")."""

import shutil
import subprocess

from coord_helpers import FAST, ext_instance, metric_value, start_coordinator
from motorlib import SSEStream, get, start_sim

FAMILIES = ("time_to_first_token_seconds", "inter_token_latency_seconds",
            "time_per_output_token_seconds", "e2e_request_latency_seconds",
            "queue_time_seconds", "pd_handoff_seconds", "request_prompt_tokens",
            "request_generation_tokens")


def gw(text, fam, suffix, model="m", role="union"):
    return metric_value(text, f"motor_gateway_{fam}{suffix}", {"model_name": model, "role": role})


def test_union_stream_and_non_stream(procs, tmpdir_path):
    s = start_sim(procs, "--model", "m", "--ttft-ms", "20", "--tokens-per-second", "100")
    c = start_coordinator(procs, tmpdir_path, workers=1)
    c.set_instances([ext_instance(1, "union", s)])
    msgs = [{"role": "user", "content": "hello there"}]
    r = c.chat(model="m", messages=msgs, max_tokens=5)
    assert r.status == 200, r
    usage = r.json()["usage"]
    st = SSEStream(c.url + "/v1/completions",
                   {"model": "m", "prompt": "once upon a time", "max_tokens": 8, "stream": True})
    chunks = st.all()
    assert len(chunks) == 8
    text = get(c.url + "/metrics").text
    # two requests answered, both through a union instance
    for fam in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                "queue_time_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert gw(text, fam, "_count") == 2, fam
    # the stream: 8 token events + [DONE] -> 8 tokens, 7 gaps of ~10 ms
    assert gw(text, "time_per_output_token_seconds", "_count") == 1
    tpot = gw(text, "time_per_output_token_seconds", "_sum")
    assert 0.002 < tpot < 0.5, tpot
    assert gw(text, "inter_token_latency_seconds", "_count") >= 2
    assert gw(text, "request_generation_tokens", "_sum") == usage["completion_tokens"] + 8
    assert metric_value(text, "motor_gateway_generation_tokens_total",
                        {"model_name": "m", "role": "union"}) == usage["completion_tokens"] + 8
    assert gw(text, "request_prompt_tokens", "_sum") >= usage["prompt_tokens"] + 1
    # vLLM's edges: TTFT's first bucket is 1 ms, the token histograms' 1, 2, 5, ...
    assert 'motor_gateway_time_to_first_token_seconds_bucket{model_name="m",role="union",' \
        'le="0.001"}' in text
    assert 'motor_gateway_request_generation_tokens_bucket{model_name="m",role="union",' \
        'le="5"}' in text
    # no PD, no hand-off
    assert gw(text, "pd_handoff_seconds", "_count") == 0
    # a request that failed (unknown model) adds no series
    assert c.chat(model="nope", messages=msgs, max_tokens=2).status == 404
    assert 'model_name="nope"' not in get(c.url + "/metrics").text
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing (scripts/deps.sh installs prometheus)"
    chk = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                         capture_output=True, timeout=30)
    assert chk.returncode == 0, chk.stdout.decode() + chk.stderr.decode()


def test_pd_roles_and_handoff(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    c = start_coordinator(procs, tmpdir_path, {"scheduler_config": {
        "enable_pd_separation_fallback_to_hybrid": False}}, workers=1)
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["prefill_handoff_decode"])
    r = c.completion(model="m", prompt="tell me about motors", max_tokens=6)
    assert r.status == 200, r
    st = SSEStream(c.url + "/v1/completions",
                   {"model": "m", "prompt": "tell me more", "max_tokens": 6, "stream": True})
    assert len(st.all()) >= 1
    text = get(c.url + "/metrics").text
    # the answers came from the decode instance; the endpoint was picked for the prefill
    assert gw(text, "time_to_first_token_seconds", "_count", role="decode") == 2
    assert gw(text, "pd_handoff_seconds", "_count", role="decode") == 2
    assert gw(text, "queue_time_seconds", "_count", role="prefill") == 2
    assert gw(text, "request_generation_tokens", "_sum", role="decode") == 12


def test_model_label_is_bounded(procs, tmpdir_path):
    names = [f"m{i}" for i in range(40)]
    s = start_sim(procs, "--model", "base", "--served-model-name", *names, *FAST, name="many")
    c = start_coordinator(procs, tmpdir_path, workers=1)
    c.set_instances([ext_instance(i + 1, "union", s, model_name=n) for i, n in enumerate(names)],
                    model=None)
    ok = 0
    for n in names:
        ok += c.completion(model=n, prompt="x", max_tokens=1).status == 200
    assert ok == 40
    text = get(c.url + "/metrics").text
    labelled = {line.split('model_name="', 1)[1].split('"', 1)[0]
                for line in text.splitlines()
                if line.startswith("motor_gateway_time_to_first_token_seconds_count")}
    assert len(labelled) == 32 + 1 and "other" in labelled, labelled
    assert metric_value(text, "motor_gateway_time_to_first_token_seconds_count",
                        {"model_name": "other", "role": "union"}) == 8
