"""motor engine-sim: the vLLM HTTP surface, PD hand-off, fault tolerance, fault injection
and process behaviour, against the real binary."""

import http.client
import json
import os
import signal
import socket
import threading
import time

import pytest

from motorlib import (SSEStream, assert_no_process, free_port, get, pid_alive, port_is_free,
                      post, start_sim, try_get, wait_for, wait_http)

FAST = ("--ttft-ms", "0", "--tokens-per-second", "0")


def error_of(resp, status):
    """The OpenAI-style error object of resp, after checking its status and shape."""
    assert resp.status == status, resp
    err = resp.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["code"] == status
    return err


# ---- loading, models, health -------------------------------------------------------------

def test_loading_then_ready(procs):
    sim = start_sim(procs, "--load-seconds", "1.0", "--model", "demo", ready=False)
    t0 = time.monotonic()
    assert get(sim.url + "/health").status == 503
    err = error_of(sim.completion(prompt="hi"), 503)
    assert "loading" in err["message"]
    wait_http(sim.url + "/health", 200, timeout=10, proc=sim.proc)
    assert time.monotonic() - t0 >= 0.5  # the exact load time is checked from the log below
    ready = sim.wait_event("sim_ready")
    assert ready["port"] == sim.port and ready["model"] == "demo"
    assert ready["load_ms"] >= 900
    models = get(sim.url + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["demo"]


def test_served_model_names(procs):
    sim = start_sim(procs, "--model", "/models/x", "--served-model-name", "a", "b", *FAST)
    assert [m["id"] for m in get(sim.url + "/v1/models").json()["data"]] == ["a", "b"]
    assert sim.completion(model="b", prompt="x").json()["model"] == "b"
    assert sim.completion(prompt="x").json()["model"] == "a"
    err = error_of(sim.completion(model="/models/x", prompt="x"), 404)
    assert err["param"] == "model"


# ---- completions and chat ------------------------------------------------------------------

def test_completion_fields_and_determinism(procs):
    sim = start_sim(procs, *FAST)
    r = sim.completion(prompt="the quick brown fox", max_tokens=12, ignore_eos=True)
    assert r.status == 200, r
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["model"] == "sim-model"
    assert isinstance(body["created"], int) and abs(body["created"] - time.time()) < 60
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    text = choice["text"]
    assert len(text.split()) == 12
    # same prompt => same text (also on another engine); another prompt => another text
    again = sim.completion(prompt="the quick brown fox", max_tokens=12, ignore_eos=True).json()
    assert again["choices"][0]["text"] == text
    assert again["id"] != body["id"]
    other = start_sim(procs, *FAST, name="other")
    assert other.completion(prompt="the quick brown fox", max_tokens=12,
                            ignore_eos=True).json()["choices"][0]["text"] == text
    assert sim.completion(prompt="the quick brown fax", max_tokens=12,
                          ignore_eos=True).json()["choices"][0]["text"] != text
    # a shorter completion is a prefix of a longer one
    short = sim.completion(prompt="the quick brown fox", max_tokens=3).json()
    assert text.startswith(short["choices"][0]["text"])
    # request ids come from the body or X-Request-Id
    assert sim.completion(prompt="x", request_id="abc").json()["id"] == "cmpl-abc"
    r = post(sim.url + "/v1/completions", {"prompt": "x"}, headers={"X-Request-Id": "hdr1"})
    assert r.json()["id"] == "cmpl-hdr1"


def test_completion_defaults_batch_and_natural_stop(procs):
    sim = start_sim(procs, *FAST)
    body = sim.completion(prompt="a b").json()
    assert body["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens
    # without ignore_eos a long budget ends naturally ("stop") before max_tokens
    body = sim.completion(prompt="stop here", max_tokens=500).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert 8 <= body["usage"]["completion_tokens"] < 128
    # batched prompts and n: prompts x n choices, indexed in order
    body = sim.completion(prompt=["one", "two words"], n=2, max_tokens=3, ignore_eos=True).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}
    texts = [c["text"] for c in body["choices"]]
    assert texts[0] != texts[1] and texts[0] != texts[2]
    # token-id prompts
    body = sim.completion(prompt=[1, 2, 3, 4, 5], max_tokens=2).json()
    assert body["usage"]["prompt_tokens"] == 5


def test_chat_nonstream(procs):
    sim = start_sim(procs, *FAST)
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello to the cluster"}]
    r = sim.chat(messages=msgs, max_tokens=6, ignore_eos=True)
    assert r.status == 200, r
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 6
    assert choice["finish_reason"] == "length"
    # 2 messages of template overhead + 8 words
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}
    assert sim.chat(messages=msgs, max_completion_tokens=6, ignore_eos=True).json()[
        "choices"][0]["message"]["content"] == choice["message"]["content"]


def test_stream_completion_framing(procs):
    sim = start_sim(procs, *FAST)
    full = sim.completion(prompt="stream me", max_tokens=10, ignore_eos=True).json()
    s = SSEStream(sim.url + "/v1/completions",
                  {"prompt": "stream me", "max_tokens": 10, "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}})
    assert s.status == 200 and s.content_type.startswith("text/event-stream")
    chunks = s.all()
    assert s.events[-1] == "[DONE]"
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(token_chunks) == 10
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    for c in token_chunks:
        assert c["object"] == "text_completion"
        assert c["usage"] is None  # include_usage: null until the closing chunk
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 9 + ["length"]
    assert "".join(c["choices"][0]["text"] for c in token_chunks) == full["choices"][0]["text"]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == full["usage"]


def test_stream_chat_framing(procs):
    sim = start_sim(procs, *FAST)
    msgs = [{"role": "user", "content": "hello there"}]
    full = sim.chat(messages=msgs, max_tokens=5, ignore_eos=True).json()
    s = SSEStream(sim.url + "/v1/chat/completions",
                  {"messages": msgs, "max_tokens": 5, "ignore_eos": True, "stream": True})
    chunks = s.all()
    assert s.events[-1] == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "usage" not in chunks[1]  # no include_usage: no usage key at all
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == full["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_stream_large_instant(procs):
    """Thousands of tokens at tokens-per-second 0: bounded work per loop iteration, none
    lost, the choices interleaved in order."""
    sim = start_sim(procs, *FAST, "--max-model-len", "8192")
    body = {"prompt": "big", "max_tokens": 3000, "n": 2, "ignore_eos": True}
    full = sim.completion(**body, timeout=30).json()
    s = SSEStream(sim.url + "/v1/completions", dict(body, stream=True), timeout=30)
    texts = {0: [], 1: []}
    for c in s.chunks():
        (ch,) = c["choices"]
        texts[ch["index"]].append(ch["text"])
    assert len(texts[0]) == 3000 and len(texts[1]) == 3000
    for i in (0, 1):
        assert "".join(texts[i]) == full["choices"][i]["text"]


def test_stream_pacing(procs):
    sim = start_sim(procs, "--tokens-per-second", "100", "--ttft-ms", "100")
    t0 = time.monotonic()
    s = SSEStream(sim.url + "/v1/completions",
                  {"prompt": "pace", "max_tokens": 20, "ignore_eos": True, "stream": True})
    chunks = s.all()
    elapsed = time.monotonic() - t0
    assert len(chunks) == 20
    # ttft 0.1 s, then 19 intervals of 10 ms: >= 0.25 s in total; generous upper bound
    assert elapsed >= 0.25, elapsed
    assert elapsed < 5.0, elapsed
    assert s.times[0] - t0 >= 0.09
    assert s.times[19] - s.times[0] >= 0.1  # the tokens are spread, not sent at once
    # non-streamed answers take the same time
    t0 = time.monotonic()
    assert sim.completion(prompt="pace", max_tokens=20, ignore_eos=True).status == 200
    assert time.monotonic() - t0 >= 0.25


def test_max_num_seqs_queues(procs):
    sim = start_sim(procs, "--max-num-seqs", "1", "--tokens-per-second", "20", "--ttft-ms", "0")
    results = {}

    def run(key):
        results[key] = sim.completion(prompt=key, max_tokens=20, ignore_eos=True, timeout=20)

    threads = [threading.Thread(target=run, args=(k,)) for k in ("a", "b")]
    for t in threads:
        t.start()

    def metric(name):
        for line in get(sim.url + "/metrics").text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    try:
        wait_for(lambda: metric("vllm:num_requests_running") == 1 and
                 metric("vllm:num_requests_waiting") == 1, timeout=5,
                 what="one running and one waiting request")
    finally:
        for t in threads:
            t.join(20)
    assert results["a"].status == 200 and results["b"].status == 200
    assert metric("vllm:num_requests_running") == 0


def test_metrics(procs):
    sim = start_sim(procs, *FAST, "--data-parallel-rank", "2", "--data-parallel-size", "4")
    sim.completion(prompt="one two three", max_tokens=4, ignore_eos=True)
    sim.completion(prompt="four", max_tokens=5, ignore_eos=True)
    r = get(sim.url + "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    labels = '{model_name="sim-model",engine="2"}'
    for name, kind in [("vllm:num_requests_running", "gauge"),
                       ("vllm:num_requests_waiting", "gauge"),
                       ("vllm:prompt_tokens_total", "counter"),
                       ("vllm:generation_tokens_total", "counter")]:
        assert f"# TYPE {name} {kind}" in text
    assert f"vllm:prompt_tokens_total{labels} 4" in text
    assert f"vllm:generation_tokens_total{labels} 9" in text
    assert ('vllm:request_success_total{model_name="sim-model",engine="2",'
            'finished_reason="length"} 2') in text
    assert f"vllm:num_requests_running{labels} 0" in text


# ---- bad requests ------------------------------------------------------------------------------

def post_oversize(sim, chunked):
    body = b'{"prompt": "' + b"x" * ((1 << 20) + 10) + b'"}'
    conn = http.client.HTTPConnection(sim.host, sim.port, timeout=10)
    try:
        try:
            if chunked:
                pieces = (body[i:i + 65536] for i in range(0, len(body), 65536))
                conn.request("POST", "/v1/completions", body=pieces, encode_chunked=True,
                             headers={"Content-Type": "application/json"})
            else:
                conn.request("POST", "/v1/completions", body=body,
                             headers={"Content-Type": "application/json"})
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            return conn.getresponse().status
        except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
            return "reset"
    finally:
        conn.close()


BAD = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1,2]", 400, None),
    ("/v1/completions", b"{}", 400, "prompt"),
    ("/v1/completions", b'{"prompt": 7}', 400, "prompt"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 0}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": 100000}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "a", "max_tokens": "5"}', 400, "max_tokens"),
    ("/v1/completions", b'{"prompt": "a", "stream": "yes"}', 400, "stream"),
    ("/v1/completions", b'{"prompt": "a", "n": 0}', 400, "n"),
    ("/v1/completions", b'{"prompt": "a", "model": "nope"}', 404, "model"),
    ("/v1/chat/completions", b'{"prompt": "a"}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 1}]}', 400, "messages"),
]


def test_bad_requests(procs):
    sim = start_sim(procs, *FAST)
    for path, raw, status, param in BAD:
        r = post(sim.url + path, raw=raw, headers={"Content-Type": "application/json"})
        err = error_of(r, status)
        assert err["param"] == param, (raw, err)
        assert err["type"] == ("BadRequestError" if status == 400 else "NotFoundError")
    # a body over the 1 MiB cap, sent chunked: the server reads it all, then answers 413
    assert post_oversize(sim, chunked=True) == 413
    # announced by Content-Length: the excess is read and discarded, then a clean 413
    assert post_oversize(sim, chunked=False) == 413
    # the engine still serves
    assert sim.completion(prompt="ok").status == 200


# ---- PD hand-off ---------------------------------------------------------------------------------

PREFILL_KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


def prefill(sim, prompt, **extra):
    r = sim.completion(prompt=prompt, max_tokens=1, min_tokens=1, stream=False,
                       request_id="pd-1", kv_transfer_params=PREFILL_KV, **extra)
    assert r.status == 200, r
    return r.json()["kv_transfer_params"]


def test_pd_handoff(procs):
    p = start_sim(procs, *FAST, "--kv-transfer-config", '{"kv_role":"kv_producer"}', name="p")
    d = start_sim(procs, *FAST, "--kv-transfer-config", '{"kv_role":"kv_consumer"}', name="d")
    u = start_sim(procs, *FAST, name="u")
    prompt = " ".join(f"w{i}" for i in range(40))  # 40 tokens -> 3 blocks
    union = u.completion(prompt=prompt, max_tokens=12, ignore_eos=True).json()

    kv = prefill(p, prompt)
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_host"] == "127.0.0.1" and kv["remote_port"] == p.port
    assert kv["remote_engine_id"] == p.status()["engine_id"]
    assert len(kv["remote_block_ids"]) == 3
    assert p.status()["kv_tickets"] == 1

    r = d.completion(prompt=prompt, max_tokens=12, ignore_eos=True, kv_transfer_params=kv)
    assert r.status == 200, r
    assert r.json()["choices"][0]["text"] == union["choices"][0]["text"]
    assert r.json()["usage"] == union["usage"]
    assert p.status()["kv_tickets"] == 0  # taking the ticket consumed it

    # the same ticket again: unknown now
    err = error_of(d.completion(prompt=prompt, max_tokens=12, kv_transfer_params=kv), 400)
    assert "unknown KV ticket" in err["message"]

    # streamed decode leg, chat flavour
    msgs = [{"role": "user", "content": prompt}]
    union_chat = u.chat(messages=msgs, max_tokens=7, ignore_eos=True).json()
    r = p.chat(messages=msgs, max_tokens=1, kv_transfer_params=PREFILL_KV)
    kv = r.json()["kv_transfer_params"]
    s = SSEStream(d.url + "/v1/chat/completions",
                  {"messages": msgs, "max_tokens": 7, "ignore_eos": True, "stream": True,
                   "kv_transfer_params": kv})
    assert s.status == 200
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in s.chunks())
    assert text == union_chat["choices"][0]["message"]["content"]

    # a ticket for another prompt is refused
    kv = prefill(p, "a different prompt")
    err = error_of(d.completion(prompt=prompt, max_tokens=3, kv_transfer_params=kv), 400)
    assert "another prompt" in err["message"]

    # a ticket that was never issued
    bogus = dict(kv, remote_block_ids=[987654321])
    err = error_of(d.completion(prompt=prompt, kv_transfer_params=bogus), 400)
    assert "unknown KV ticket" in err["message"]
    assert err["param"] == "kv_transfer_params"


def test_pd_prefill_engine_gone(procs):
    p = start_sim(procs, *FAST, name="p")
    d = start_sim(procs, *FAST, name="d")
    kv = prefill(p, "lost prompt")
    p.proc.kill()
    p.proc.wait(5)
    t0 = time.monotonic()
    err = error_of(d.completion(prompt="lost prompt", kv_transfer_params=kv), 502)
    assert "unreachable" in err["message"] and str(p.port) in err["message"]
    assert time.monotonic() - t0 < 6
    # a stream request gets the same error before any SSE is sent
    s = SSEStream(d.url + "/v1/completions",
                  {"prompt": "lost prompt", "stream": True, "kv_transfer_params": kv})
    assert s.status == 502 and json.loads(s.error_body)["error"]["code"] == 502


# ---- fault tolerance API -------------------------------------------------------------------------

def ft_status(sim):
    r = get(sim.url + "/v1/fault_tolerance/status")
    assert r.status == 200, r
    (entry,) = r.json()["engines"]
    return entry


def test_ft_scale_down(procs):
    sim = start_sim(procs, *FAST, "--ft", "--ft-recover-ms", "300", "--data-parallel-rank", "3",
                    "--data-parallel-size", "4")
    assert ft_status(sim) == {"id": 3, "status": "healthy"}
    # a peer died: this survivor turns unhealthy (no ft_state: ready for apply)
    assert sim.fault("unhealthy").status == 200
    st = ft_status(sim)
    assert st["status"] == "unhealthy" and "ft_state" not in st
    assert get(sim.url + "/health").status == 503

    bad = post(sim.url + "/v1/fault_tolerance/apply",
               {"request_id": "r1", "instruction": "scale_down", "params": {}})
    assert bad.status == 400
    bad = post(sim.url + "/v1/fault_tolerance/apply",
               {"request_id": "r1", "instruction": "explode"})
    assert bad.status == 400
    mine = post(sim.url + "/v1/fault_tolerance/apply",
                {"request_id": "r1", "instruction": "scale_down",
                 "params": {"removed_dp_ranks": [3]}})
    assert mine.status == 400  # apply goes to survivors only

    t0 = time.monotonic()
    r = post(sim.url + "/v1/fault_tolerance/apply",
             {"request_id": "scale-down-abc", "instruction": "scale_down",
              "params": {"removed_dp_ranks": [1], "dp_master_ip": "127.0.0.1",
                         "dp_master_rank": 0}})
    assert r.status == 202, r
    assert r.json()["accepted"] is True
    st = ft_status(sim)
    assert st["status"] == "unhealthy" and st["ft_state"] == "recovering"
    assert st["last_ft_request_id"] == "scale-down-abc"
    wait_for(lambda: ft_status(sim)["status"] == "healthy", timeout=5, what="healthy again")
    assert time.monotonic() - t0 >= 0.25
    st = ft_status(sim)
    assert "ft_state" not in st and st["last_ft_request_id"] == "scale-down-abc"
    assert get(sim.url + "/health").status == 200
    assert sim.status()["dp_size"] == 3
    # the brief's alternative body shape ("action", top-level ranks) and retry
    r = post(sim.url + "/v1/fault_tolerance/apply",
             {"request_id": "r2", "action": "retry"})
    assert r.status == 202
    sim.wait_event("sim_ft_recovered", request_id="r2")


def test_ft_dead_and_absent(procs):
    sim = start_sim(procs, *FAST, "--enable-fault-tolerance")
    assert sim.fault("ft_dead").status == 200
    st = ft_status(sim)
    assert st["status"] == "dead" and st["id"] == 0
    assert get(sim.url + "/health").status == 503
    r = post(sim.url + "/v1/fault_tolerance/apply", {"request_id": "x", "instruction": "retry"})
    assert r.status == 409
    assert sim.fault("recover").status == 200
    assert ft_status(sim)["status"] == "healthy"

    plain = start_sim(procs, *FAST, name="noft")
    assert get(plain.url + "/v1/fault_tolerance/status").status == 404
    assert post(plain.url + "/v1/fault_tolerance/apply",
                {"request_id": "x", "instruction": "retry"}).status == 404


def test_dp_group_peer_death(procs):
    """A DP rank dies: the survivors' FT status turns unhealthy (ready for apply), and a
    scale_down apply brings them back, as the controller's DP scale-down expects."""
    rpc = free_port()
    common = (*FAST, "--ft", "--ft-recover-ms", "100", "--data-parallel-size", "3",
              "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", rpc)
    # members first: they keep retrying until rank 0 listens
    r2 = start_sim(procs, *common, "--data-parallel-rank", "2", name="dp2")
    r1 = start_sim(procs, *common, "--data-parallel-rank", "1", name="dp1")
    r0 = start_sim(procs, *common, "--data-parallel-rank", "0", name="dp0")
    r0.wait_event("sim_dp_group_formed", timeout=10)
    r2.wait_event("sim_dp_joined")
    assert ft_status(r0)["status"] == "healthy" and ft_status(r2)["status"] == "healthy"

    r1.proc.kill()
    for sim in (r0, r2):
        wait_for(lambda: ft_status(sim)["status"] == "unhealthy", timeout=5,
                 what=f"rank {sim.proc.name} unhealthy after a peer died")
        st = ft_status(sim)
        assert "ft_state" not in st and "DP group broken" in st["fault_info"]
        assert get(sim.url + "/health").status == 503
    assert "rank 1 lost" in ft_status(r0)["fault_info"]

    for sim in (r0, r2):
        r = post(sim.url + "/v1/fault_tolerance/apply",
                 {"request_id": "sd-1", "instruction": "scale_down",
                  "params": {"removed_dp_ranks": [1], "dp_master_rank": 0}})
        assert r.status == 202, r
    for sim in (r0, r2):
        wait_for(lambda: ft_status(sim)["status"] == "healthy", timeout=5, what="healthy")
        assert sim.status()["dp_size"] == 2
        assert sim.completion(prompt="after scale down").status == 200


def test_dp_group_port_taken(procs):
    """The rpc port is in use: rank 0 says so and serves anyway."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        sim = start_sim(procs, *FAST, "--data-parallel-size", "2", "--data-parallel-rank", "0",
                        "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", port)
        assert sim.find_events("sim_dp_group_disabled")
        assert sim.completion(prompt="x").status == 200


# ---- fault injection ---------------------------------------------------------------------------

def test_fault_crash(procs):
    sim = start_sim(procs, *FAST, "--workers", "2")
    workers = sim.status()["workers"]
    assert len(workers) == 2
    assert sim.fault("crash").status == 200
    rc = sim.proc.wait(5)
    assert rc == -signal.SIGKILL
    assert_no_process(sim.pgid, timeout=5, pids=workers)


def test_fault_exit0(procs):
    sim = start_sim(procs, *FAST)
    assert sim.fault("exit0").status == 200
    assert sim.proc.wait(5) == 0


def test_fault_hang(procs):
    sim = start_sim(procs, *FAST)
    assert sim.fault("hang", ignore_sigterm=True).status == 200
    sim.wait_event("sim_hang")
    with pytest.raises((socket.timeout, TimeoutError, OSError)):
        get(sim.url + "/health", timeout=1.0)
    assert sim.proc.alive()
    # SIGTERM ignored while hung (as asked): still alive, only SIGKILL ends it
    sim.proc.terminate(group=False)
    sim.wait_event("sim_hang_signal_ignored")
    assert sim.proc.alive()
    sim.proc.kill()
    assert sim.proc.wait(5) == -signal.SIGKILL

    other = start_sim(procs, *FAST, name="hang2")
    assert other.fault("hang").status == 200
    other.wait_event("sim_hang")
    assert try_get(other.url + "/health", timeout=0.5) is None
    other.proc.terminate(group=False)
    assert other.proc.wait(10) == 0


def test_fault_unhealthy_error_recover(procs):
    sim = start_sim(procs, *FAST)
    assert sim.fault("unhealthy").json() == {"mode": "unhealthy", "previous": "none"}
    assert get(sim.url + "/health").status == 503
    error_of(sim.completion(prompt="x"), 503)
    assert sim.fault("recover").status == 200
    assert get(sim.url + "/health").status == 200
    assert sim.completion(prompt="x").status == 200
    assert sim.fault("error").status == 200
    assert get(sim.url + "/health").status == 200
    error_of(sim.completion(prompt="x"), 500)
    assert sim.fault("recover").status == 200
    assert sim.fault("bogus").status == 400
    assert post(sim.url + "/sim/fault", {"nomode": 1}).status == 400


def test_fault_at_start(procs):
    sim = start_sim(procs, *FAST, "--fault", "unhealthy")
    assert get(sim.url + "/health").status == 503
    env_sim = start_sim(procs, *FAST, name="envfault", extra_env={"MOTOR_SIM_FAULT": "error"})
    error_of(env_sim.completion(prompt="x"), 500)


# ---- process behaviour ---------------------------------------------------------------------------

def test_workers_die_with_sigkilled_engine(procs):
    sim = start_sim(procs, *FAST, "--workers", "3")
    workers = sim.status()["workers"]
    assert len(workers) == 3
    assert sorted(workers) == sorted(e["pid"] for e in sim.find_events("sim_worker_started"))
    for w in workers:
        assert pid_alive(w)
        assert os.getpgid(w) == sim.pgid  # same process group as the engine
    sim.proc.signal(signal.SIGKILL)  # the leader only, not the group
    assert sim.proc.wait(5) == -signal.SIGKILL
    wait_for(lambda: not any(pid_alive(w) for w in workers), timeout=5,
             what="workers to die with their engine")
    assert_no_process(sim.pgid, timeout=5)


def test_sigterm_graceful_with_workers(procs):
    sim = start_sim(procs, "--workers", "3", "--tokens-per-second", "5")
    workers = sim.status()["workers"]
    s = SSEStream(sim.url + "/v1/completions",
                  {"prompt": "long", "max_tokens": 100, "ignore_eos": True, "stream": True})
    it = s.raw_events()
    next(it)  # a stream is in flight
    sim.proc.terminate(group=False)
    assert sim.proc.wait(10) == 0
    assert len(sim.find_events("sim_worker_exit")) == 3
    assert_no_process(sim.pgid, timeout=5, pids=workers)
    try:  # the rest of the stream: cut (error or early end), never completed
        for _ in it:
            pass
    except (OSError, ValueError, AssertionError, http.client.HTTPException):
        pass
    assert not s.done


def test_worker_death_stops_engine(procs):
    sim = start_sim(procs, *FAST, "--workers", "2")
    workers = sim.status()["workers"]
    os.kill(workers[0], signal.SIGKILL)
    sim.wait_event("sim_worker_died")
    assert sim.proc.wait(10) == 1
    assert_no_process(sim.pgid, timeout=5)


def test_fail_load(procs):
    p = procs.motor("engine-sim", "--port", "0", "--load-seconds", "0.2", "--fail-load",
                    "--workers", "1", name="failload")
    p.wait_event("sim_listening")
    assert p.wait(10) == 1
    assert p.find_events("sim_load_failed")
    assert_no_process(p.pgid, timeout=5)


def test_crash_after(procs):
    sim = start_sim(procs, *FAST, "--crash-after", "0.5")
    assert sim.proc.wait(10) == -signal.SIGKILL
    (ev,) = sim.find_events("sim_crash", cause="--crash-after")
    assert ev["after_s"] == 0.5


def test_vllm_command_line_accepted(procs):
    port = free_port()
    sim = start_sim(procs, "serve", "/models/qwen", "--host", "127.0.0.1", f"--port={port}",
                    "--tensor-parallel-size", "8", "--enforce-eager",
                    "--gpu-memory-utilization=0.9", "--disable-access-log-for-endpoints",
                    "/health,/metrics", "--data-parallel-size", "2", "--data-parallel-rank", "1",
                    "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", "9000",
                    "--kv-transfer-config",
                    '{"kv_connector":"NixlConnector","kv_role":"kv_producer","engine_id":"5"}',
                    *FAST)
    assert sim.port == port
    assert get(sim.url + "/v1/models").json()["data"][0]["id"] == "/models/qwen"
    ignored = [e["arg"] for e in sim.find_events("sim_flag_ignored")]
    assert ignored == ["--tensor-parallel-size 8", "--enforce-eager",
                       "--gpu-memory-utilization=0.9",
                       "--disable-access-log-for-endpoints /health,/metrics"]
    assert sim.status()["engine_id"] == "5-dp1"


def test_bad_flags_and_help(procs, motor):
    p = procs.motor("engine-sim", "--port", "99999", name="badflag")
    assert p.wait(10) == 2
    assert "--port" in p.output()
    h = procs.motor("engine-sim", "--help", name="help")
    assert h.wait(10) == 0
    assert "--tokens-per-second" in h.output()


def test_headless(procs):
    port = free_port()
    p = procs.motor("engine-sim", "--headless", "--port", port, "--workers", "1",
                    "--data-parallel-rank", "1", name="headless")
    ev = p.wait_event("sim_ready")
    assert ev["headless"] is True and "port" not in ev
    assert p.find_events("sim_headless")
    assert p.alive()
    assert port_is_free(port)
    assert try_get(f"http://127.0.0.1:{port}/health", timeout=0.5) is None
    p.terminate(group=False)
    assert p.wait(10) == 0
    assert_no_process(p.pgid, timeout=5)
