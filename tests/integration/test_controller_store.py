"""motor controller persistence: SIGKILL and restart with SQLite and with a real etcd
(started here) lose nothing and restart no engine; two controllers on one etcd elect one
leader, the standby answers 503 and takes over when the leader dies; two controllers on
one SQLite file do the same through the lock file."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

import motorlib
from ctl_fakes import Controller, Etcd, FakeCoordinator, FakeNM, controller_config, etcd_available

needs_etcd = pytest.mark.skipif(not etcd_available() and os.environ.get("MOTOR_REQUIRE_ETCD") != "1",
                                reason="etcd not installed")


@pytest.fixture
def env(procs, tmpdir_path):
    made: list = []

    class Env:
        def __init__(self) -> None:
            self.coord = FakeCoordinator()
            made.append(self.coord)
            self.tmp = tmpdir_path
            self.procs = procs

        def config(self, **kw) -> str:
            return controller_config(tmpdir_path, self.coord.port, **kw)

        def nm(self, *a, **kw) -> FakeNM:
            n = FakeNM(*a, **kw)
            made.append(n)
            return n

        def etcd(self) -> Etcd:
            e = Etcd(procs)
            made.append(e)
            return e

    yield Env()
    for m in made:
        m.close()


def bring_up(c: Controller, nms: list[FakeNM], ctl_url_fn) -> int:
    for n in nms:
        assert n.register(c.url) == (200, {"result": 0})
    for n in nms:
        motorlib.wait_for(lambda n=n: n.start_cmd is not None, 10, what="start command")
        n.set_all("normal")
        n.start_heartbeats(ctl_url_fn, 0.15)
    iid = nms[0].instance_id
    c.wait_status(iid, "active", timeout=10)
    return iid


def restart_keeps_everything(env, cfg: str) -> None:
    holder: dict = {}
    c = Controller(env.procs, cfg, name="controller-1")
    holder["url"] = c.url
    a = env.nm("job-p", ports=(30000, 30002), dp=2)
    d = env.nm("job-d", role="decode", ports=(30100,), dp=1)
    pid = bring_up(c, [a], lambda: holder["url"])
    did = bring_up(c, [d], lambda: holder["url"])
    # an assembly in progress survives too
    half = env.nm("job-half", ports=(30200,), dp=2)
    half.register(c.url)
    motorlib.wait_for(lambda: len(c.get("/controller/instances")[1]["assembling"]) == 1, 5,
                      what="pending assembly")
    starts = (len(a.seen("/node-manager/start")), len(d.seen("/node-manager/start")))
    c.proc.kill()
    c.proc.wait(5)
    c2 = Controller(env.procs, cfg, name="controller-2", port=c.port)
    holder["url"] = c2.url
    ready = c2.proc.wait_event("controller_ready", timeout=10)
    assert ready["instances"] == 2 and ready["assembling"] == 1
    # heartbeats of the running instances are accepted, they stay active
    assert c2.status_of(pid) == "active" and c2.status_of(did) == "active"
    a.hb_errors.clear()  # the ones sent while no controller listened
    motorlib.wait_for(lambda: c2.instance(pid)["node_managers"][0]["heartbeat_age_ms"] < 300, 5,
                      what="heartbeats reach the new controller")
    n_ok = len(c2.proc.find_events("heartbeat_rejected"))
    assert n_ok == 0 and [e for e in a.hb_errors if isinstance(e, tuple)] == []
    # no engine restart, no second start command, no re-registration needed
    assert (len(a.seen("/node-manager/start")), len(d.seen("/node-manager/start"))) == starts
    assert not a.seen("/node-manager/engine-restart") and not a.seen("/node-manager/stop")
    assert not c2.proc.find_events("node_manager_reregistered")
    # the restarted controller republishes the fleet to the coordinator
    motorlib.wait_for(lambda: env.coord.routable() == {pid, did}, 5, what="full set after restart")
    # the pending assembly completes with the second pod, ids keep counting up
    half2 = env.nm("job-half", ports=(30300,), dp=2)
    half2.register(c2.url)
    motorlib.wait_for(lambda: half.start_cmd is not None and half2.start_cmd is not None, 10,
                      what="assembly finished after restart")
    assert half.start_cmd["instance_id"] == 3
    assert [e["id"] for e in half2.start_cmd["endpoints"]] == [1]
    late = env.nm("job-late", ports=(30400,), dp=1)
    late.register(c2.url)
    motorlib.wait_for(lambda: late.start_cmd is not None, 10, what="new instance")
    assert late.start_cmd["instance_id"] == 4
    # still active a while later (no timeout because of the gap)
    assert c2.status_of(pid) == "active"


def test_sqlite_restart_loses_nothing(env):
    restart_keeps_everything(env, env.config())


@needs_etcd
def test_etcd_restart_loses_nothing(env):
    e = env.etcd()
    cfg = env.config(store={"backend": "etcd", "etcd_endpoints": [e.url],
                            "etcd_prefix": "/motor-test/", "etcd_lease_ttl": 2,
                            "leader_retry_interval": 0.2})
    restart_keeps_everything(env, cfg)
    keys = e.keys("/motor-test/")
    assert "/motor-test/meta/next_id" in keys and keys["/motor-test/meta/next_id"] == "5"
    assert "/motor-test/instances/1" in keys and "/motor-test/ft/1" in keys
    assert "/motor-test/leader" in keys


def failover(env, cfg: str) -> None:
    a = Controller(env.procs, cfg, name="controller-a")
    b = Controller(env.procs, cfg, name="controller-b", wait_ready=False)
    b.proc.wait_event("controller_listening", timeout=10)
    # b is a standby: not ready, refuses the protocol
    motorlib.wait_for(lambda: b.get("/readiness")[0] == 503 and
                      b.get("/readiness")[1]["detail"]["leader"], 5, what="standby readiness")
    st, body = b.get("/readiness")
    assert body["detail"]["reason"] == "standby"
    assert body["detail"]["leader"] == a.proc.find_events("controller_listening")[0]["owner"]
    nm = env.nm("job-f", ports=(31000,), dp=1)
    assert nm.register(b.url)[0] == 503
    assert b.get("/liveness")[0] == 200
    leader = {"url": a.url}

    def ctl_url() -> str:
        return leader["url"]
    iid = bring_up(a, [nm], ctl_url)
    # the leader dies: b takes over within the lease TTL and keeps the instance active
    a.proc.signal(signal.SIGKILL)
    a.proc.wait(5)
    b.proc.wait_event("controller_ready", timeout=15)
    leader["url"] = b.url
    assert b.get("/readiness")[0] == 200
    # The instance survives the failover. Its last status change may not have reached the
    # store before the SIGKILL (writes are asynchronous), so the new leader may load it as
    # `initial`; the node manager's next heartbeats make it active again, with no restart.
    assert b.status_of(iid) in ("active", "initial")
    motorlib.wait_for(lambda: b.instance(iid)["node_managers"][0]["heartbeat_age_ms"] < 1000, 5,
                      what="heartbeats to the new leader")
    motorlib.wait_for(lambda: b.status_of(iid) == "active", 5, what="active under the new leader")
    assert len(nm.seen("/node-manager/start")) == 1
    assert b.status_of(iid) == "active"


@needs_etcd
def test_etcd_leader_failover(env):
    e = env.etcd()
    cfg = env.config(store={"backend": "etcd", "etcd_endpoints": [e.url],
                            "etcd_prefix": "/motor-failover/", "etcd_lease_ttl": 1,
                            "leader_retry_interval": 0.2})
    failover(env, cfg)


def test_sqlite_leader_failover(env):
    failover(env, env.config(store={"backend": "sqlite",
                                    "sqlite_path": os.path.join(env.tmp, "shared.db"),
                                    "leader_retry_interval": 0.2}))


def test_store_errors_are_fatal_at_start(env, procs):
    cfg = env.config(store={"backend": "sqlite", "sqlite_path": "/nonexistent-dir/x/c.db"})
    p = procs.motor("controller", "--config", cfg, name="bad-store")
    assert p.wait(10) == 1
    assert "cannot open the sqlite store" in p.output()


def test_check_config_prints_the_effective_configuration(tmpdir_path):
    """--check-config: the effective configuration as JSON on stdout (from the table: every
    key at its upstream path, durations in seconds, overrides applied), exit 0; no secret
    is printed, only whether it was loaded."""
    key = os.path.join(tmpdir_path, "coord.key")
    with open(key, "w") as f:
        f.write("very-secret-push-key\n")
    cfg = os.path.join(tmpdir_path, "ctl.json")
    with open(cfg, "w") as f:
        json.dump({"motor_controller_config": {
            "instance_config": {"instance_heartbeat_timeout": 2.5},
            "etcd_config": {"etcd_host": "etcd.x", "etcd_port": 2399,
                            "enable_etcd_persistence": True},
            "standby_config": {"master_lock_ttl": 4}},
            "motor_coordinator_config": {
                "api_config": {"coordinator_api_dns": "coord.x"},
                "mgmt_api_key_config": {"enable_api_key": True, "api_key_file": key}}}, f)
    r = subprocess.run([motorlib.motor_bin(), "controller", "--check-config", "--config", cfg,
                        "--port", "0"], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "POD_IP": "10.9.9.9"})
    assert r.returncode == 0, r.stderr
    assert "configuration OK" in r.stderr
    eff = json.loads(r.stdout)
    assert eff["config_path"] == cfg
    assert eff["api_config"]["controller_api_host"] == "10.9.9.9"
    assert eff["api_config"]["controller_api_port"] == 0
    assert eff["instance_config"]["instance_heartbeat_timeout"] == 2.5
    assert eff["instance_config"]["instance_heartbeat_timeout_inactive"] == 300
    assert eff["store_config"]["backend"] == "etcd"
    assert eff["store_config"]["etcd_endpoints"] == ["http://etcd.x:2399"]
    assert eff["store_config"]["etcd_lease_ttl"] == 4
    coord = eff["motor_coordinator_config"]
    assert coord["api_config"]["coordinator_api_dns"] == "coord.x"
    assert coord["mgmt_api_key_config"]["key_loaded"] is True
    assert "very-secret-push-key" not in r.stdout + r.stderr


def test_check_config_reports_every_error(env, procs, tmpdir_path):
    bad = os.path.join(tmpdir_path, "bad.json")
    with open(bad, "w") as f:
        f.write('{"motor_controller_config":{"api_config":{"controller_api_port":-1},'
                '"fault_tolerance_config":{"enable_engine_relaunch":"yes",'
                '"dp_scale_down_config":{"poll_interval_sec":0}},'
                '"store_config":{"backend":"mysql"}}}')
    p = procs.motor("controller", "--config", bad, "--check-config", name="check-bad")
    assert p.wait(10) == 1
    out = p.output()
    for key in ("controller_api_port", "enable_engine_relaunch", "poll_interval_sec", "backend"):
        assert key in out, out
    assert "4 errors" in out
    good = env.config()
    p = procs.motor("controller", "--config", good, "--check-config", name="check-good")
    assert p.wait(10) == 0
    assert "configuration OK" in p.output()
