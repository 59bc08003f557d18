"""motor node-manager: the engine FT manager (spec §2.10) — polling of
GET /v1/fault_tolerance/status on `motor engine-sim --ft` engines, signature-deduplicated
fault reports, transport failures, engines without the FT API (404), pause/resume around
a relaunch, hot reload."""

import os
import time
from datetime import datetime

import pytest

import motorlib
from fake_controller import FakeController, nm_config, start_body, start_nm, write_json

FT_STATE = "/node-manager/fault-tolerance"


@pytest.fixture
def ctl():
    c = FakeController()
    yield c
    c.close()


def started(procs, tmpdir_path, ctl, engine_ft=True, ft=None, **kw):
    f = {"container_restart_managed": False, "poll_interval_sec": 0.1,
         "poll_timeout_sec": 0.5}
    f.update(ft or {})
    ec = {"enable_fault_tolerance": True} if engine_ft else {}
    ec.update(kw.pop("engine_config", {}))
    cfg = nm_config(controller_port=ctl.port, ft=f, engine_config=ec, **kw)
    path = write_json(os.path.join(tmpdir_path, "c.json"), cfg)
    nm = start_nm(procs, path)
    ctl.wait_request("/controller/register", timeout=5)
    body = start_body(cfg, instance_id=2)
    assert nm.post("/node-manager/start", body).status == 200
    nm.wait_ready()
    port = int(body["endpoints"][0]["business_port"])
    return nm, cfg, path, port


def ft_ep(nm, i=0):
    r = nm.get(FT_STATE)
    assert r.status == 200, r
    return r.json()["endpoints"][i]


def ft_reports(ctl, eid=0):
    return [r.body for r in ctl.of("/controller/report_software_fault")
            if r.body and r.body.get("engine_id") == eid
            and (r.body.get("additional_info") or {}).get("source") == "ft_poll"]


def sim_fault(port, mode, **extra):
    r = motorlib.post(f"http://127.0.0.1:{port}/sim/fault", {"mode": mode, **extra})
    assert r.status == 200, r


def wait_polls(nm, more, timeout=10.0):
    """Wait until the endpoint has been polled `more` more times."""
    start = ft_ep(nm)["polls"]
    motorlib.wait_for(lambda: ft_ep(nm)["polls"] >= start + more, timeout=timeout,
                      what=f"{more} more FT polls")


def wait_report(ctl, n, pred=None, timeout=10.0):
    def got():
        reps = [b for b in ft_reports(ctl) if pred is None or pred(b)]
        return reps if len(reps) >= n else None
    return motorlib.wait_for(got, timeout=timeout, what=f"{n} FT report(s)")


def test_status_reports_deduplicated_by_signature(procs, tmpdir_path, ctl):
    nm, _, _, port = started(procs, tmpdir_path, ctl)
    nm.wait_event("ft_polling_started", cause="engines ready", timeout=5)
    wait_polls(nm, 3)
    assert ft_reports(ctl) == []  # healthy: nothing to say
    sig = ft_ep(nm)["last_signature"]
    assert sig[0] == "healthy", sig

    # dead (engine_status 1) — reported once, however often it is polled.
    sim_fault(port, "ft_dead")
    rep = wait_report(ctl, 1)[0]
    assert rep["engine_status"] == 1 and rep["exception_type"] == "EngineDeadError", rep
    assert rep["pod_ip"] == "127.0.0.1" and rep["instance_id"] == 2
    info = rep["additional_info"]
    assert info["ft_entry"]["id"] == 0 and info["ft_entry"]["status"] == "dead", info
    assert info["status"] == "dead" and info["fault_info"] == info["ft_entry"]["fault_info"]
    wait_polls(nm, 5)
    assert len(ft_reports(ctl)) == 1, ft_reports(ctl)
    assert ft_ep(nm)["last_signature"][0] == "dead"

    # unhealthy with fault_info (engine_status 2, exception_type = fault_info): a new
    # signature, so a new report.
    sim_fault(port, "unhealthy")
    rep = wait_report(ctl, 2)[1]
    assert rep["engine_status"] == 2, rep
    assert rep["exception_type"] == rep["additional_info"]["fault_info"], rep
    assert rep["exception_type"].startswith("EngineUnhealthyError"), rep
    wait_polls(nm, 5)
    assert len(ft_reports(ctl)) == 2

    # Back to healthy, then the same unhealthy status again: a new episode, reported.
    sim_fault(port, "recover")
    motorlib.wait_for(lambda: ft_ep(nm)["last_signature"][0] == "healthy", timeout=5,
                      what="healthy signature")
    sim_fault(port, "unhealthy")
    wait_report(ctl, 3)
    assert [r["engine_status"] for r in ft_reports(ctl)] == [1, 2, 2]


def test_not_accepted_report_is_retried(procs, tmpdir_path, ctl):
    nm, _, _, port = started(procs, tmpdir_path, ctl)
    # The Controller says "not accepted" twice: the FT manager keeps reporting at each
    # poll until it is taken, then stops.
    ctl.set("/controller/report_software_fault", accepted=False, times=2)
    sim_fault(port, "ft_dead")

    def is_ft(rec):
        return (rec.body.get("additional_info") or {}).get("source") == "ft_poll"

    # The two refusals go to the first two reports, whoever sent them (the arbitration
    # also reports the endpoint once /health fails); then one accepted FT report.
    def accepted_ft():
        recs = ctl.of("/controller/report_software_fault")
        return [r for r in recs[2:] if is_ft(r)] or None
    motorlib.wait_for(accepted_ft, timeout=10, what="an accepted FT report")
    refused = [r for r in ctl.of("/controller/report_software_fault")[:2] if is_ft(r)]
    assert refused, "the FT manager should have been refused at least once"
    wait_polls(nm, 5)
    assert len(ft_reports(ctl)) == len(refused) + 1, ft_reports(ctl)
    assert all(r["engine_status"] == 1 for r in ft_reports(ctl))


def test_unreachable_engine_is_dead_at_the_first_failed_poll(procs, tmpdir_path, ctl):
    # Seed 002: the first failed status request during runtime reports DEAD; the legacy
    # max_poll_failures is accepted and takes no part.
    nm, _, _, port = started(procs, tmpdir_path, ctl,
                             ft={"max_poll_failures": 3, "poll_timeout_sec": 0.3})
    nm.wait_event("ft_polling_started", timeout=5)
    wait_polls(nm, 2)
    # The engine stops answering (alive, socket accepted, nothing served).
    sim_fault(port, "hang")
    rep = wait_report(ctl, 1)[0]
    assert rep["engine_status"] == 1 and rep["exception_type"] == "EngineDeadError", rep
    assert "unreachable at a failed poll during runtime (1 in a row)" in \
        rep["exception_message"], rep
    assert rep["additional_info"]["consecutive_failures"] == 1
    # Deduplicated: more failures, no second report.
    motorlib.wait_for(lambda: ft_ep(nm)["consecutive_failures"] >= 6, timeout=10,
                      what="more failed polls")
    assert len(ft_reports(ctl)) == 1, ft_reports(ctl)
    nm.wait_event("ft_poll_failed", endpoint_id=0, timeout=1)


def test_engine_without_ft_api_is_unsupported(procs, tmpdir_path, ctl):
    # The NM switch turns polling on; the engine has no FT API (404).
    nm, cfg, path, _ = started(
        procs, tmpdir_path, ctl, engine_ft=False,
        ft={"enable_fault_tolerance": True, "max_consecutive_404": 2,
            "unsupported_reprobe_interval_sec": 0.6})
    ev = nm.wait_event("ft_unsupported", endpoint_id=0, timeout=5)
    assert ev["consecutive_404"] == 2
    t_unsupported = datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp()
    ep = ft_ep(nm)
    assert ep["unsupported"] is True and ep["polls"] == 2, ep
    # Re-probed every unsupported_reprobe_interval_sec (0.6 s), not every poll interval.
    motorlib.wait_for(lambda: ft_ep(nm)["polls"] >= 3, timeout=5, what="re-probe")
    assert time.time() - t_unsupported >= 0.55
    assert ft_ep(nm)["unsupported"] is True
    assert ctl.count("/controller/report_software_fault") == 0

    # Hot reload: switching the NM's FT polling off stops it.
    cfg["motor_engine_union_config"]["motor_nodemanger_config"]["fault_tolerance_config"][
        "enable_fault_tolerance"] = False
    write_json(path + ".tmp", cfg)
    os.rename(path + ".tmp", path)
    nm.wait_event("ft_polling_stopped", cause="config reloaded", timeout=5)
    r = nm.get(FT_STATE).json()
    assert r["enabled"] is False and r["polling"] is False


def test_pause_and_resume_around_relaunch(procs, tmpdir_path, ctl):
    nm, _, _, port = started(procs, tmpdir_path, ctl)
    nm.wait_event("ft_polling_started", cause="engines ready", timeout=5)
    sim_fault(port, "ft_dead")
    wait_report(ctl, 1)
    r = nm.post("/node-manager/engine-restart", {"action": "restart", "instance_id": 2})
    assert r.status == 200, r
    nm.wait_event("ft_polling_stopped", cause="relaunch", timeout=5)
    nm.wait_event("relaunch_ready", timeout=15)
    nm.wait_event("ft_polling_started", cause="resume", timeout=5)
    # Fresh state after the relaunch: the new engine is healthy, nothing carried over.
    motorlib.wait_for(lambda: (ft_ep(nm)["last_signature"] or [""])[0] == "healthy",
                      timeout=5, what="healthy after relaunch")
    assert ft_ep(nm)["consecutive_failures"] == 0
    # The same fault on the new engine is a new report.
    sim_fault(port, "ft_dead")
    wait_report(ctl, 2)
    assert [r["engine_status"] for r in ft_reports(ctl)] == [1, 1]
