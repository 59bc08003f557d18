"""Precision detection in the coordinator, with real simulators and a recording fake
controller (the real controller's side is test_precision_controller.py): sampled answers
are byte-identical to unsampled ones, each fault mode raises alarm 0xFC001009 within the
threshold, the probe is pinned to the suspect engine, CLEAR after good samples reuses the
moi, /precision/alarm_cleared and its bad bodies; with a mutual-TLS inference port the
probe is an https client of it, presenting the port's own certificate."""

import json
import os
import re
import ssl

import pytest

from coord_helpers import (FAST, ext_instance, metric_value, sim_served, start_coordinator,
                           stop_clean)
from fake_controller import FakeController
from motorlib import SSEStream, get, post, start_sim, wait_for


def prec_config(**over):
    cfg = {"precision_check_enabled": True, "interval_seconds": 0, "logprobs_count": 5,
           "precision_issue_threshold": 3, "precision_clear_threshold": 3,
           "probe_max_attempts": 2, "probe_timeout_seconds": 5,
           "probe_question": "who invented relativity", "probe_expected_answer": "Einstein"}
    cfg.update(over)
    return cfg




def start(procs, tmp, ctl, workers=2, name="coordinator", deploy=None, **over):
    root = {"motor_controller_config": {"api_config": {"controller_api_dns": "127.0.0.1",
                                                       "controller_api_port": ctl.port}}}
    if deploy:
        root["motor_deploy_config"] = deploy
    return start_coordinator(procs, tmp, {"precision_detection_config": prec_config(**over)},
                             workers=workers, root=root, name=name)


def samples(c, verdict=None):
    return metric_value(get(c.url + "/metrics", context=c.context).text, "motor_coordinator_precision_samples_total",
                        {"verdict": verdict} if verdict else None)


_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


def norm(raw: bytes) -> bytes:
    """The answer's bytes without what differs between any two requests (id, created)."""
    return _VOLATILE.sub(rb'"\1":_', raw)


def raw_post(url, body):
    r = post(url, body, 20)
    assert r.status == 200, r
    return r.body


def raw_stream(url, body):
    st = SSEStream(url, body)
    assert st.status == 200
    return b"".join(e.encode() + b"\n" for e in st.raw_events())


def test_sampled_answers_are_byte_identical(procs, tmpdir_path):
    s = start_sim(procs, "--model", "m", *FAST, name="sim")
    with FakeController() as ctl:
        sampled = start(procs, tmpdir_path, ctl)
        plain = start_coordinator(procs, tmpdir_path, {}, name="plain")
        for c in (sampled, plain):
            c.set_instances([ext_instance(1, "union", s)])
        msgs = [{"role": "user", "content": "tell me about the sea"}]
        cases = [
            ("/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 32}),
            ("/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 32,
                                      "logprobs": True}),
            ("/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 32,
                                      "logprobs": True, "top_logprobs": 2}),
            ("/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 32,
                                      "logprobs": True, "top_logprobs": 8}),
            ("/v1/completions", {"model": "m", "prompt": "the sea is", "max_tokens": 32}),
            ("/v1/completions", {"model": "m", "prompt": "the sea is", "max_tokens": 32,
                                 "logprobs": 1}),
            ("/v1/completions", {"model": "m", "prompt": "the sea is", "max_tokens": 32,
                                 "logprobs": 0, "return_tokens_as_token_ids": True}),
        ]
        before = samples(sampled)
        n = 0
        for path, body in cases:
            for stream in (False, True):
                b = dict(body, stream=stream)
                if stream:
                    b["stream_options"] = {"include_usage": True}
                    got, want = raw_stream(sampled.url + path, b), raw_stream(plain.url + path, b)
                else:
                    got, want = raw_post(sampled.url + path, b), raw_post(plain.url + path, b)
                assert norm(got) == norm(want), (path, b, got[:600], want[:600])
                n += 1
        # every one of them was sampled (interval 0) and judged good
        wait_for(lambda: samples(sampled) - before >= n, timeout=10)
        assert samples(sampled, "bad") == 0
        assert samples(sampled, "good") >= n - 2  # the shortest may be judged too short
        assert ctl.count("/controller/report_alarms") == 0
        stop_clean(sampled)
        stop_clean(plain)


def alarms(ctl, category=None):
    out = []
    for r in ctl.of("/controller/report_alarms"):
        for a in r.body:
            if category is None or a["category"] == category:
                out.append(a)
    return out


def status(c):
    r = get(c.mgmt + "/precision/status")
    assert r.status == 200, r
    return r.json()


@pytest.mark.parametrize("mode", ["repeat", "garbled", "rare_chars"])
def test_fault_mode_alarm_probe_and_clear(procs, tmpdir_path, mode):
    good = start_sim(procs, "--model", "m", *FAST, name="good")
    bad = start_sim(procs, "--model", "m", *FAST, name="bad")
    with FakeController() as ctl:
        ctl.set("/controller/report_alarms", body={"code": 200, "message": "ok", "data": {}})
        c = start(procs, tmpdir_path, ctl)
        c.set_instances([ext_instance(11, "union", good), ext_instance(12, "union", bad)])
        bad.fault(mode)
        msgs = [{"role": "user", "content": "write a long story"}]
        # traffic: the bad engine's third bad sample in a row raises the alarm
        for i in range(40):
            r = c.chat(model="m", messages=msgs, max_tokens=64, timeout=20)
            assert r.status == 200, r  # the client never sees the fault as an error
            if alarms(ctl, "ALARM"):
                break
        rec = ctl.wait_request("/controller/report_alarms", timeout=15)
        a = rec.body[0]
        assert a["alarm_id"] == "0xFC001009"
        assert a["alarm_name"] == "Precision Anomaly Alarm"
        assert a["severity"] == "MAJOR" and a["event_type"] == "PROCESSING_ERROR"
        assert a["category"] == "ALARM"
        assert a["instance_id"] == 12 and a["p_instance_id"] == ""
        assert a["moi"] == "service name=Coordinator, service ip=127.0.0.1, instanceId=12"
        assert a["additional_information"] == (
            "precision_issue_count=3, probe_failure_count=2, p_instance_id=None, "
            "d_instance_id=12")
        # the probe went to the bad engine only (pinned), twice (it never answers right):
        # every request either engine served is a sampled client request of it, or a probe
        probes = [e for e in c.proc.find_events("precision_probe_done")]
        assert len(probes) == 2 and all(e["d_instance_id"] == 12 for e in probes), probes

        def per_engine():
            # the bad engine's samples are all bad (64 tokens, no natural end: warn events);
            # the rest of the samples are the good engine's (good ones are logged at debug)
            n_bad = sum(e["d_instance_id"] == 12 for e in c.proc.find_events("precision_sample"))
            return (sim_served(bad) - n_bad, sim_served(good) - (samples(c) - n_bad))
        wait_for(lambda: per_engine() == (2, 0), timeout=5, what=f"{per_engine()}")
        groups = status(c)["groups"]
        assert [(g["d_instance_id"], g["state"]) for g in groups] == [(12, "alarmed")], groups
        assert metric_value(get(c.url + "/metrics").text,
                            "motor_coordinator_precision_alarms_active") == 1
        # the good engine's group never had a bad sample
        assert not any(e.get("d_instance_id") == 11 and e.get("verdict") == "bad"
                       for e in c.proc.find_events("precision_sample"))

        # the engine recovers: three good samples in a row clear it, with the same moi
        bad.fault("recover")
        for i in range(40):
            assert c.chat(model="m", messages=msgs, max_tokens=32).status == 200
            if alarms(ctl, "CLEAR"):
                break
        clear = alarms(ctl, "CLEAR")
        assert len(clear) == 1, alarms(ctl)
        assert clear[0]["moi"] == a["moi"] and clear[0]["instance_id"] == 12
        wait_for(lambda: all(g["state"] == "clean" for g in status(c)["groups"]), timeout=5)
        assert len(alarms(ctl, "ALARM")) == 1  # no second alarm, no second probe run
        stop_clean(c)


def test_auto_recovery_answer_and_alarm_cleared_route(procs, tmpdir_path):
    bad = start_sim(procs, "--model", "m", *FAST, name="bad")
    with FakeController() as ctl:
        c = start(procs, tmpdir_path, ctl, probe_max_attempts=0)
        c.set_instances([ext_instance(5, "union", bad)])
        # bad bodies first: 400 with a message, 404 for a group without state
        for body, code in [(None, 400), ([], 400), ({}, 400), ({"d_instance_id": "x"}, 400),
                           ({"d_instance_id": -1}, 400),
                           ({"d_instance_id": 5, "p_instance_id": 1.5}, 400),
                           ({"d_instance_id": 5}, 404), ({"d_instance_id": 5,
                                                          "p_instance_id": 3}, 404)]:
            r = post(c.mgmt + "/precision/alarm_cleared", body) if body is not None else \
                post(c.mgmt + "/precision/alarm_cleared", raw=b"not json")
            assert r.status == code, (body, r)
            assert r.json()["detail"], r
        # the controller says it recovered the group at once: the state goes back to clean
        ctl.set("/controller/report_alarms",
                body={"code": 200, "data": {"precision_alarm_cleared": True,
                                            "precision_alarm_cleared_by_auto_recovery": True}})
        bad.fault("garbled")
        msgs = [{"role": "user", "content": "hello"}]
        for i in range(3):
            assert c.chat(model="m", messages=msgs, max_tokens=48).status == 200
        ctl.wait_request("/controller/report_alarms", timeout=10)
        wait_for(lambda: any(e["to"] == "clean" and e["on"] == "recovered"
                             for e in c.proc.find_events("precision_state")), timeout=5)
        assert all(g["state"] == "clean" for g in status(c)["groups"])
        # again, without the auto-recovery answer: alarmed, then the controller's clear
        ctl.set("/controller/report_alarms", body={"code": 200, "data": {}})
        for i in range(3):
            assert c.chat(model="m", messages=msgs, max_tokens=48).status == 200
        ctl.wait_request("/controller/report_alarms", after=1, timeout=10)
        wait_for(lambda: [g["state"] for g in status(c)["groups"]] == ["alarmed"], timeout=5)
        r = post(c.mgmt + "/precision/alarm_cleared", {"d_instance_id": 5, "p_instance_id": None})
        assert r.status == 200, r
        assert r.json()["data"]["previous_state"] == "alarmed"
        assert status(c)["groups"] == []
        r = post(c.mgmt + "/precision/alarm_cleared", {"d_instance_id": 5})
        assert r.status == 404
        stop_clean(c)


def test_report_failure_retries_and_window_is_shared(procs, tmpdir_path):
    bad = start_sim(procs, "--model", "m", *FAST, name="bad")
    with FakeController() as ctl:
        # one sampled request per decode instance per hour, across 3 workers
        c = start(procs, tmpdir_path, ctl, workers=3, interval_seconds=3600,
                  precision_issue_threshold=1, probe_max_attempts=0)
        c.set_instances([ext_instance(9, "union", bad)])
        msgs = [{"role": "user", "content": "hello"}]
        for i in range(12):
            assert c.chat(model="m", messages=msgs, max_tokens=20).status == 200
        wait_for(lambda: samples(c) >= 1, timeout=5)
        assert samples(c) == 1
        stop_clean(c)
    with FakeController() as ctl:
        ctl.set("/controller/report_alarms", body={"code": 200, "data": {}})
        ctl.set("/controller/report_alarms", status=503, body={"detail": "down"}, times=1)
        c = start(procs, tmpdir_path, ctl, name="coord2", precision_issue_threshold=2,
                  probe_max_attempts=0)
        c.set_instances([ext_instance(9, "union", bad)])
        bad.fault("repeat")
        for i in range(2):
            assert c.chat(model="m", messages=msgs, max_tokens=48).status == 200
        ctl.wait_request("/controller/report_alarms", timeout=10)
        # the failed report leaves the group one bad sample short: the next one retries
        wait_for(lambda: c.proc.find_events("precision_report_failed"), timeout=5)
        assert c.chat(model="m", messages=msgs, max_tokens=48).status == 200
        ctl.wait_request("/controller/report_alarms", after=1, timeout=10)
        wait_for(lambda: [g["state"] for g in status(c)["groups"]] == ["alarmed"], timeout=5)
        stop_clean(c)


def test_pd_group_alarm_and_byte_identical(procs, tmpdir_path):
    """A vLLM PD pair: the group is (P, D), the moi names both, the probe goes through
    the PD route pinned to that pair; PD answers sampled are byte-identical too."""
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    with FakeController() as ctl:
        ctl.set("/controller/report_alarms", body={"code": 200, "data": {}})
        sampled = start(procs, tmpdir_path, ctl, probe_max_attempts=1)
        plain = start_coordinator(procs, tmpdir_path, {}, name="plain")
        for c in (sampled, plain):
            c.set_instances([ext_instance(21, "prefill", p), ext_instance(22, "decode", d)],
                            dispatch_capabilities=["prefill_handoff_decode"])
        msgs = [{"role": "user", "content": "what is disaggregated serving?"}]
        for path, body in [("/v1/chat/completions", {"model": "m", "messages": msgs,
                                                      "max_tokens": 40}),
                           ("/v1/completions", {"model": "m", "prompt": "motors are",
                                                "max_tokens": 40, "logprobs": 2})]:
            for stream in (False, True):
                b = dict(body, stream=stream)
                if stream:
                    got, want = raw_stream(sampled.url + path, b), raw_stream(plain.url + path, b)
                else:
                    got, want = raw_post(sampled.url + path, b), raw_post(plain.url + path, b)
                assert norm(got) == norm(want), (path, b, got[:400], want[:400])
        d.fault("rare_chars")
        for _ in range(10):
            assert sampled.chat(model="m", messages=msgs, max_tokens=48).status == 200
            if alarms(ctl, "ALARM"):
                break
        a = ctl.wait_request("/controller/report_alarms", timeout=10).body[0]
        assert a["instance_id"] == 22 and a["p_instance_id"] == 21
        assert a["moi"] == "service name=Coordinator, service ip=127.0.0.1, pId=21, instanceId=22"
        assert a["additional_information"] == (
            "precision_issue_count=3, probe_failure_count=1, p_instance_id=21, d_instance_id=22")
        probes = sampled.proc.find_events("precision_probe_done")
        assert [(e["p_instance_id"], e["d_instance_id"], e["status"]) for e in probes] == \
            [(21, 22, 200)]
        stop_clean(sampled)
        stop_clean(plain)


@pytest.mark.parametrize("port_cert", ["srv", "other-srv"])
def test_probe_over_mutual_tls_inference_port(procs, tmpdir_path, pki, port_cert):
    """The inference port is mutual TLS (ca_file: client certificates signed by ca.crt
    required); the engines stay plain HTTP (engine_tls false). The probe is a client of
    that port presenting the port's own cert_file/key_file: srv.crt, signed by ca.crt, is
    accepted, the probe reaches the suspect engine over the PD route pinned to it and
    gets an answer (200) without the expected one; other-srv.crt (another CA) is refused
    at the handshake, and the alarm says both attempts failed. Either way the alarm goes
    out (it used to go out with no probe at all on a TLS port)."""
    good = start_sim(procs, "--model", "m", *FAST, name="good")
    bad = start_sim(procs, "--model", "m", *FAST, name="bad")
    tls = {"enable_tls": True, "cert_file": pki(port_cert + ".crt"),
           "key_file": pki(port_cert + ".key"), "ca_file": pki("ca.crt"), "engine_tls": False}
    # the clients here: cli.crt (signed by ca.crt), verifying the port's certificate
    cli = ssl.create_default_context(cafile=pki("other-ca.crt" if port_cert == "other-srv"
                                                else "ca.crt"))
    cli.load_cert_chain(pki("cli.crt"), pki("cli.key"))
    with FakeController() as ctl:
        ctl.set("/controller/report_alarms", body={"code": 200, "message": "ok", "data": {}})
        c = start(procs, tmpdir_path, ctl, deploy={"tls_config": {"infer_tls_config": tls}})
        c.use_tls(cli)
        c.set_instances([ext_instance(11, "union", good), ext_instance(12, "union", bad)])
        # it is mutual TLS: no client certificate, no answer
        nocert = ssl.create_default_context(cafile=pki("other-ca.crt" if port_cert ==
                                                       "other-srv" else "ca.crt"))
        with pytest.raises(OSError):  # ssl.SSLError / a reset, as urllib.error.URLError
            r = post(c.url + "/v1/chat/completions", {"model": "m", "max_tokens": 4,
                                                      "messages": [{"role": "user",
                                                                    "content": "hi"}]},
                     10, context=nocert)
            raise AssertionError(f"answered without a client certificate: {r}")
        bad.fault("garbled")
        msgs = [{"role": "user", "content": "write a long story"}]
        for i in range(40):
            r = c.chat(model="m", messages=msgs, max_tokens=64, timeout=20)
            assert r.status == 200, r
            if alarms(ctl, "ALARM"):
                break
        a = ctl.wait_request("/controller/report_alarms", timeout=15).body[0]
        assert a["alarm_id"] == "0xFC001009" and a["category"] == "ALARM"
        assert a["instance_id"] == 12
        assert a["additional_information"] == (
            "precision_issue_count=3, probe_failure_count=2, p_instance_id=None, "
            "d_instance_id=12")
        probes = c.proc.find_events("precision_probe_done")
        assert len(probes) == 2 and all(e["d_instance_id"] == 12 and not e["passed"]
                                        for e in probes), probes

        def per_engine():
            # requests the engines served beyond the sampled client requests of each (a
            # sample judged after the alarm may still be logging: counted on every poll)
            n_bad = sum(e["d_instance_id"] == 12 for e in c.proc.find_events("precision_sample"))
            return (sim_served(bad) - n_bad, sim_served(good) - (samples(c) - n_bad))
        if port_cert == "srv":
            # the port took the probe's certificate: both probes answered, by the bad engine
            assert all(e["status"] == 200 for e in probes), probes
            wait_for(lambda: per_engine() == (2, 0), timeout=5, what=f"{per_engine()}")
        else:
            # refused at the handshake: no HTTP status, an error, no engine saw a probe
            assert all(e["status"] == 0 and e["error"] for e in probes), probes
            wait_for(lambda: per_engine() == (0, 0), timeout=5, what=f"{per_engine()}")
        groups = status(c)["groups"]
        assert [(g["d_instance_id"], g["state"]) for g in groups] == [(12, "alarmed")], groups
        stop_clean(c)
