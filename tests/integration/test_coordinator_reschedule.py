"""Mid-stream rescheduling and unfinished upstream answers (issue 19, deliverables 1 and
4a): a streamed answer whose engine dies, stalls or ends its stream early is continued on
another instance and reaches the client as one seamless answer, identical to the
fault-free one; a clean upstream end without [DONE] is never passed off as complete; a
non-streamed body cut short is retried. Real coordinator, real simulators (whose
continuation is exact: docs/engine-sim.md)."""

import json
import signal
import threading

from coord_helpers import (FAST, ext_instance, fsm_count, metric_value, start_coordinator,
                           stop_clean)
from motorlib import SSEStream, get, post, start_sim, wait_for

FAST_RETRY = {"exception_config": {"retry_delay": 0.01}}


def cfg(**resched):
    out = json.loads(json.dumps(FAST_RETRY))
    if resched:
        out["reschedule_config"] = resched
    return out


def read_stream(url, path, body, timeout=60.0):
    """The client's view of a streamed answer: text, finish_reason, ids, usage, errors,
    whether it ended with [DONE]."""
    s = SSEStream(url + path, body, timeout)
    out = {"status": s.status, "text": "", "finish": None, "ids": set(), "created": set(),
           "usage": None, "errors": [], "done": False, "roles": 0, "token_ids": []}
    if s.status != 200:
        out["body"] = s.error_body
        return out
    chat = path.endswith("chat/completions")
    for payload in s.raw_events():
        if payload == "[DONE]":
            continue
        ev = json.loads(payload)
        if "error" in ev:
            out["errors"].append(ev["error"])
            continue
        out["ids"].add(ev["id"])
        out["created"].add(ev["created"])
        if ev.get("usage"):
            out["usage"] = ev["usage"]
        for ch in ev["choices"]:
            assert ch["index"] == 0, ev
            if chat:
                d = ch["delta"]
                if "role" in d:
                    out["roles"] += 1
                out["text"] += d.get("content") or ""
            else:
                out["text"] += ch.get("text") or ""
                lp = ch.get("logprobs")
                if lp:
                    out["token_ids"] += lp["tokens"]
            if ch.get("finish_reason"):
                assert out["finish"] is None, f"two finish_reasons: {ev}"
                out["finish"] = ch["finish_reason"]
    out["done"] = s.done
    return out


def reference(sim, path, body):
    """The fault-free answer, from an engine directly (not streamed)."""
    b = dict(body, stream=False)
    b.pop("stream_options", None)
    r = post(sim.url + path, b, 30)
    assert r.status == 200, r
    j = r.json()
    ch = j["choices"][0]
    text = ch["message"]["content"] if path.endswith("chat/completions") else ch["text"]
    return {"text": text, "finish": ch["finish_reason"], "usage": j["usage"]}


def assert_same(got, ref, what):
    assert got["status"] == 200, (what, got)
    assert not got["errors"], (what, got["errors"])
    assert got["done"], (what, "no [DONE]", got)
    assert got["text"] == ref["text"], (what, got["text"], ref["text"])
    assert got["finish"] == ref["finish"], (what, got["finish"], ref["finish"])
    assert len(got["ids"]) == 1 and len(got["created"]) == 1, (what, got["ids"])
    if got["usage"] is not None:
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            assert got["usage"][k] == ref["usage"][k], (what, k, got["usage"], ref["usage"])


def bodies(n):
    """n different requests, completions and chat, some with usage."""
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append(("/v1/chat/completions",
                        {"model": "m", "stream": True, "max_tokens": 200,
                         "messages": [{"role": "user", "content": f"tell me story number {i}"}],
                         "stream_options": {"include_usage": True}}))
        else:
            body = {"model": "m", "stream": True, "max_tokens": 200,
                    "prompt": f"request {i} of the rescheduling test says"}
            if i % 2:
                body["stream_options"] = {"include_usage": True}
            out.append(("/v1/completions", body))
    return out


def test_unfinished_stream_is_an_error_without_rescheduling(procs, tmpdir_path):
    """4a: the engine ends its stream cleanly mid-answer (no finish_reason, no [DONE]):
    with rescheduling off the client gets an in-band error event, never a clean end."""
    a = start_sim(procs, "--model", "m", *FAST, name="cut")
    c = start_coordinator(procs, tmpdir_path, cfg(enable=False), workers=1)
    c.set_instances([ext_instance(1, "union", a)])
    assert a.fault("cut", after_tokens=3).status == 200
    got = read_stream(c.url, "/v1/completions",
                      {"model": "m", "prompt": "x y", "max_tokens": 50, "stream": True})
    assert got["status"] == 200
    assert not got["done"] and got["finish"] is None
    assert len(got["errors"]) == 1, got
    assert "finished" in got["errors"][0]["message"], got["errors"]
    assert c.proc.find_events("upstream_stream_broken")
    assert c.metric("motor_coordinator_errors_total", {"cause": "upstream_protocol"}) == 1
    assert c.metric("motor_coordinator_reschedules_total", {"outcome": "refused"}) == 1
    stop_clean(c)


def test_cut_stream_continued_elsewhere(procs, tmpdir_path):
    """A stream cut short is continued on the other instance: one seamless answer equal
    to the reference, same id, usage over the whole answer; completions and chat."""
    a = start_sim(procs, "--model", "m", *FAST, name="cut")
    b = start_sim(procs, "--model", "m", *FAST, name="good")
    c = start_coordinator(procs, tmpdir_path, cfg(), workers=1)
    c.set_instances([ext_instance(1, "union", a)])
    # A alone first, then B joins: the first leg is on A, the continuation on B
    for path, body in [("/v1/completions",
                        {"model": "m", "prompt": "once upon a time", "max_tokens": 100,
                         "stream": True, "stream_options": {"include_usage": True}}),
                       ("/v1/chat/completions",
                        {"model": "m", "max_tokens": 100, "stream": True,
                         "messages": [{"role": "user", "content": "hello there"}],
                         "stream_options": {"include_usage": True}})]:
        c.set_instances([ext_instance(1, "union", a)])
        assert a.fault("recover").status == 200
        assert a.fault("cut", after_tokens=4).status == 200
        ref = reference(b, path, body)
        # the continuation needs somewhere to go once the first leg is cut: both listed,
        # A preferred for the first leg by making B busy-free but unknown until now
        c.set_instances([ext_instance(1, "union", a), ext_instance(2, "union", b)])
        got = None
        for _ in range(6):  # the balancer may pick B first: retry until A served a leg
            before = c.metric("motor_coordinator_reschedules_total", {"outcome": "started"})
            got = read_stream(c.url, path, body)
            assert_same(got, ref, path)
            if c.metric("motor_coordinator_reschedules_total",
                        {"outcome": "started"}) > before:
                break
        else:
            raise AssertionError("no request was served by the cut engine")
        if path.endswith("chat/completions"):
            assert got["roles"] == 1, got
    ev = c.proc.find_events("stream_rescheduled")
    assert ev and ev[0]["by"] == "text" and ev[0]["tokens_sent"] == 4, ev
    assert c.proc.find_events("stream_resumed")
    assert fsm_count(c, "RESCHEDULE", "RESUMING") >= 2
    assert c.metric("motor_coordinator_reschedule_gap_seconds_count") >= 2
    stop_clean(c)


def test_token_id_prompt_continued_by_ids(procs, tmpdir_path):
    """A token-id prompt whose stream carries token ids (return_tokens_as_token_ids) is
    continued by ids."""
    a = start_sim(procs, "--model", "m", *FAST, name="cut")
    b = start_sim(procs, "--model", "m", *FAST, name="good")
    ids = post(b.url + "/tokenize", {"prompt": "the token id prompt"}).json()["tokens"]
    body = {"model": "m", "prompt": ids, "max_tokens": 60, "stream": True, "logprobs": 1,
            "return_tokens_as_token_ids": True}
    ref = reference(b, "/v1/completions", body)
    c = start_coordinator(procs, tmpdir_path, cfg(), workers=1)
    c.set_instances([ext_instance(1, "union", a)])
    assert a.fault("cut", after_tokens=3).status == 200
    c.set_instances([ext_instance(1, "union", a), ext_instance(2, "union", b)])
    for _ in range(6):
        got = read_stream(c.url, "/v1/completions", body)
        assert_same(got, ref, "ids")
        if c.proc.find_events("stream_rescheduled"):
            break
    ev = c.proc.wait_event("stream_rescheduled", timeout=1)
    assert ev["by"] == "token_ids", ev
    stop_clean(c)


def test_stall_rescheduled_after_inter_token_timeout(procs, tmpdir_path):
    """A hung engine keeps its streams open: after inter_token_timeout the leg has failed
    and the answer continues elsewhere."""
    a = start_sim(procs, "--model", "m", *FAST, name="stall")
    b = start_sim(procs, "--model", "m", *FAST, name="good")
    c = start_coordinator(procs, tmpdir_path, cfg(inter_token_timeout=0.5), workers=1)
    c.set_instances([ext_instance(1, "union", a)])
    assert a.fault("stall", after_tokens=2).status == 200
    body = {"model": "m", "prompt": "a stalled answer", "max_tokens": 80, "stream": True}
    ref = reference(b, "/v1/completions", body)
    c.set_instances([ext_instance(1, "union", a), ext_instance(2, "union", b)])
    for _ in range(6):
        got = read_stream(c.url, "/v1/completions", body)
        assert_same(got, ref, "stall")
        if c.proc.find_events("inter_token_timeout"):
            break
    assert c.proc.find_events("stream_rescheduled")
    assert a.fault("recover").status == 200
    stop_clean(c)


def test_cut_non_stream_body_retried(procs, tmpdir_path):
    """4a: a non-streamed body cut in the middle (HTTP 200, half a JSON document) is a
    failed leg: retried, the client gets the whole answer."""
    a = start_sim(procs, "--model", "m", *FAST, name="cut")
    b = start_sim(procs, "--model", "m", *FAST, name="good")
    c = start_coordinator(procs, tmpdir_path, cfg(), workers=1)
    c.set_instances([ext_instance(1, "union", a), ext_instance(2, "union", b)])
    assert a.fault("cut", after_tokens=0).status == 200
    body = {"model": "m", "prompt": "a whole body", "max_tokens": 40}
    ref = reference(b, "/v1/completions", body)
    for _ in range(6):
        r = c.completion(**body)
        assert r.status == 200, r
        assert r.json()["choices"][0]["text"] == ref["text"]
    assert c.proc.find_events("upstream_failed", instance_id=1)
    stop_clean(c)


def run_concurrent(c, reqs, doomed=None, running=10):
    """Every request at once; with doomed, that engine is SIGKILLed once it holds
    `running` streams in the middle of their answers."""
    results = [None] * len(reqs)

    def one(i):
        path, body = reqs[i]
        try:
            results[i] = read_stream(c.url, path, body, timeout=120)
        except Exception as e:  # noqa: BLE001 - reported below
            results[i] = {"status": -1, "exc": repr(e)}
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    if doomed is not None:
        def busy():
            try:
                st = doomed.status()
            except OSError:
                return False
            return st["running"] >= running and st["tokens_total"] >= 2 * running
        wait_for(busy, 90, interval=0.01, what="streams on the doomed engine")
        doomed.proc.signal(signal.SIGKILL)
    for t in threads:
        t.join(180)
    return results


def test_decode_engine_killed_under_100_streams(procs, tmpdir_path):
    """Done-when (make-test size): a union engine SIGKILLed in the middle of 100
    concurrent streams loses no answer; each equals its fault-free reference."""
    slow = ("--ttft-ms", "0", "--tokens-per-second", "20")
    a = start_sim(procs, "--model", "m", *slow, name="doomed")
    b = start_sim(procs, "--model", "m", *slow, name="survivor")
    ref_sim = start_sim(procs, "--model", "m", *FAST, name="reference")
    reqs = bodies(100)
    refs = [reference(ref_sim, p, b_) for p, b_ in reqs]
    c = start_coordinator(procs, tmpdir_path, cfg(), workers=2)
    c.set_instances([ext_instance(1, "union", a), ext_instance(2, "union", b)])
    results = run_concurrent(c, reqs, doomed=a, running=10)
    a.proc.wait(30)
    for i, (got, ref) in enumerate(zip(results, refs)):
        assert got and got.get("status") == 200, (i, got)
        assert_same(got, ref, f"request {i}")
    started = c.metric("motor_coordinator_reschedules_total", {"outcome": "started"})
    assert started >= 10, started
    assert c.metric("motor_coordinator_reschedules_total", {"outcome": "refused"}) == 0
    assert len(c.proc.find_events("stream_rescheduled")) == started
    stop_clean(c)


def test_pd_decode_engine_killed_mid_stream(procs, tmpdir_path):
    """The same through vLLM PD hand-offs: a decode engine dies, each answer continues
    through a new hand-off (prefill of prompt + answer so far) on the other decode."""
    slow = ("--ttft-ms", "0", "--tokens-per-second", "20")
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d1 = start_sim(procs, "--model", "m", *slow, name="doomed")
    d2 = start_sim(procs, "--model", "m", *slow, name="decode2")
    reqs = bodies(30)
    refs = [reference(p, path, b_) for path, b_ in reqs]
    c = start_coordinator(procs, tmpdir_path, cfg(), workers=2)
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d1),
                     ext_instance(3, "decode", d2)],
                    dispatch_capabilities=["prefill_handoff_decode"])
    results = run_concurrent(c, reqs, doomed=d1, running=2)
    d1.proc.wait(30)
    for i, (got, ref) in enumerate(zip(results, refs)):
        assert got and got.get("status") == 200, (i, got)
        assert_same(got, ref, f"request {i}")
    assert c.metric("motor_coordinator_reschedules_total", {"outcome": "started"}) >= 2
    text = get(c.url + "/metrics").text
    assert metric_value(text, "motor_coordinator_reschedules_total", {"outcome": "refused"}) == 0
    stop_clean(c)
