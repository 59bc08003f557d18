"""The issue's "done when" with `motor up`: the bundled local fleet (1 prefill + 1 decode
instance of simulated engines) with precision_check_enabled and auto-recovery; the decode
engines are switched to `garbled` under traffic; the alarm shows in `motor status`, the
PD group is terminated, `motor up` restarts its node managers (they exit 255) and the
fleet serves again with new instances. No request before the alarm fails."""

from __future__ import annotations

import json
import os

import motorlib
from motorlib import REPO, post, wait_for
from test_up import LOCAL_JSON, Fleet, chat, cmdline


def config(tmp: str) -> str:
    with open(LOCAL_JSON) as f:
        cfg = json.load(f)
    cfg["motor_coordinator_config"]["precision_detection_config"] = {
        "precision_check_enabled": True, "interval_seconds": 0, "logprobs_count": 5,
        "precision_issue_threshold": 3, "precision_clear_threshold": 3,
        "probe_max_attempts": 1, "probe_timeout_seconds": 10}
    cfg["motor_controller_config"]["fault_tolerance_config"][
        "precision_auto_recovery_enabled"] = True
    path = os.path.join(tmp, "precision.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def test_garbled_decode_alarm_recovery_and_replacement(procs, tmpdir_path):
    fleet = Fleet(procs, tmpdir_path, config=config(tmpdir_path))
    fleet.wait_ready()
    url = fleet.url
    before = fleet.wait_healthy(60)
    ids = sorted(i["id"] for i in before["instances"])
    decode = next(i for i in before["instances"] if i["role"] == "decode")
    prefill = next(i for i in before["instances"] if i["role"] == "prefill")
    assert before["alarms"] == [] and before["recent_alarms"] == []
    # good traffic: sampled, never flagged
    for i in range(4):
        r = chat(url, f"good {i}", max_tokens=32)
        assert r.status == 200, r
    nm = fleet.child("decode-0")
    engines = motorlib.children_of(nm["pid"])
    ports = [int(cmdline(p).split("--port ")[1].split()[0]) for p in engines]
    for port in ports:
        r = post(f"http://127.0.0.1:{port}/sim/fault", {"mode": "garbled"})
        assert r.status == 200, r
    # every request until the alarm is answered (garbage, but 200)
    for i in range(30):
        r = chat(url, f"story {i}", max_tokens=48)
        _, m = fleet.status()
        if m["recent_alarms"] or m["alarms"]:
            break
        assert r.status == 200, r
    rc, m = fleet.status()
    alarm = (m["recent_alarms"] or m["alarms"])[0]
    assert alarm["alarm_id"] == "0xFC001009" and alarm["d_instance_id"] == decode["id"]
    assert alarm["moi"].endswith(f"pId={prefill['id']}, instanceId={decode['id']}"), alarm
    # auto-recovery: cleared, the group replaced by new instances once motor up restarted
    # the node managers; the fleet is healthy and serves again
    wait_for(lambda: fleet.status()[1]["recent_alarms"], 20, what="alarm cleared")
    assert fleet.status()[1]["recent_alarms"][0]["cleared_by"] == "auto_recovery"

    def replaced():
        rc2, m2 = fleet.status()
        new = sorted(i["id"] for i in m2["instances"] if i["status"] == "active")
        return m2 if rc2 == 0 and len(new) == 2 and not set(new) & set(ids) else None
    after = wait_for(replaced, 90, interval=0.5, what="a replaced, healthy fleet")
    assert after["alarms"] == []
    restarts = {c["name"]: c.get("restarts", 0) for c in fleet.info()["children"]}
    assert restarts.get("decode-0", 0) >= 1 and restarts.get("prefill-0", 0) >= 1, restarts
    for i in range(3):
        r = chat(url, f"after {i}", max_tokens=32)
        assert r.status == 200, r
    rc = fleet.stop()
    assert rc == 0, fleet.proc.tail()
