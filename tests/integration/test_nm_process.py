"""motor node-manager: process supervision — worker trees, stop, subreaping, the local
restart policy, standalone mode, and the real argv of the vllm / sglang builders (through
fake `vllm` and `python3` on PATH that record their command line and exec the simulator)."""

import glob
import os
import signal
import subprocess
import time

import motorlib
from fake_controller import (FAKEBIN, FakeController, nm_config, start_body, start_nm,
                             write_json)


def standalone_nm(procs, tmpdir_path, **kw):
    nm_extra = {"standalone": True}
    nm_extra.update(kw.pop("nm", {}))
    cfg = nm_config(nm=nm_extra, **kw)
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    return nm, cfg


def port_of(cfg, i=0, role="union"):
    return cfg[f"motor_engine_{role}_config"]["motor_nodemanger_config"]["endpoint_config"][
        "base_port"] + 2 * i


def test_killed_engine_takes_its_workers_and_port(procs, tmpdir_path):
    nm, cfg = standalone_nm(procs, tmpdir_path, engine_config={"workers": 2})
    nm.wait_ready()
    pid = nm.endpoint()["pid"]
    workers = motorlib.wait_for(lambda: motorlib.children_of(pid)
                                if len(motorlib.children_of(pid)) == 2 else None, 5,
                                what="two workers")
    assert all(motorlib._stat(w)[2] == pid for w in workers)  # same process group
    os.kill(pid, signal.SIGKILL)
    motorlib.assert_no_process(pid, timeout=5, pids=workers)
    port = port_of(cfg)
    motorlib.wait_for(lambda: motorlib.port_is_free(port), 5, what="engine port free")
    ep = nm.engines()["endpoints"][0]
    assert ep["state"] == "stopped" and ep["last_exit"]["signal"] == 9
    # No zombies left among our children.
    assert not [p for p in os.listdir("/proc") if p.isdigit() and motorlib._stat(int(p))
                and motorlib._stat(int(p))[1] == nm.pid and motorlib._stat(int(p))[0] == "Z"]

    # Relaunch works standalone too; then /stop takes everything down and exits 255.
    r = nm.post("/node-manager/engine-restart", {"action": "restart"})
    assert r.status == 200, r
    nm.wait_ready()
    pid2 = nm.endpoint()["pid"]
    workers2 = motorlib.wait_for(lambda: motorlib.children_of(pid2)
                                 if len(motorlib.children_of(pid2)) == 2 else None, 5,
                                 what="two workers")
    r = nm.post("/node-manager/stop")
    assert r.status == 200
    assert r.json() == {"message": "All engine processes stopped successfully."}
    motorlib.assert_no_process(pid2, timeout=5, pids=workers2)
    assert motorlib.port_is_free(port)
    assert nm.proc.wait(timeout=10) == 255


def test_sigterm_stops_engines_and_exits_255(procs, tmpdir_path):
    nm, cfg = standalone_nm(procs, tmpdir_path, engine_config={"data_parallel_size": 2},
                            endpoints=2)
    nm.wait_ready()
    pids = [e["pid"] for e in nm.engines()["endpoints"]]
    nm.proc.signal(signal.SIGTERM)
    assert nm.proc.wait(timeout=10) == 255
    for p in pids:
        motorlib.assert_no_process(p, timeout=5)
    assert nm.find_events("engine_stopping")  # graceful: SIGTERM first


def test_stdin_stop_line(procs, tmpdir_path):
    """Upstream's daemon loop reads stdin: other lines are ignored, "stop" (any case,
    surrounding blanks) shuts down like SIGTERM — engines stopped, exit 255."""
    cfg = nm_config(nm={"standalone": True})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg),
                  stdin=subprocess.PIPE)
    nm.wait_ready()
    pid = nm.endpoint()["pid"]
    nm.proc.popen.stdin.write(b"hello\n")
    nm.proc.popen.stdin.flush()
    nm.proc.wait_event("stdin_ignored", timeout=5)
    assert nm.proc.alive()
    nm.proc.popen.stdin.write(b"  StOp \r\n")
    nm.proc.popen.stdin.flush()
    assert nm.proc.wait(timeout=10) == 255
    motorlib.assert_no_process(pid, timeout=5)
    assert nm.find_events("nm_shutdown")[0]["reason"] == "stdin stop"


def test_stdin_eof_keeps_running_without_spinning(procs, tmpdir_path):
    cfg = nm_config(nm={"standalone": True})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg),
                  stdin=subprocess.PIPE)
    nm.wait_ready()
    nm.proc.popen.stdin.close()
    time.sleep(0.3)
    def cpu_ticks():
        with open(f"/proc/{nm.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    before = cpu_ticks()
    time.sleep(1.0)
    assert cpu_ticks() - before < 20  # < 0.2 s of CPU in 1 s: no busy loop on EOF
    assert nm.proc.alive() and nm.engines()["endpoints"][0]["status"] == "normal"


def test_orphans_are_reaped(procs, tmpdir_path):
    """A grandchild that escapes the engine's group and is orphaned lands on the node
    manager (child subreaper), which reaps it when it exits: no zombie."""
    pidfile = os.path.join(tmpdir_path, "orphan.pid")
    tmpl = ["/bin/sh", "-c",
            f"(setsid sh -c 'echo $$ > {pidfile}; exec sleep 1' &); "
            "exec \"$MOTOR_BIN\" engine-sim --host {host} --port {port} --model demo"]
    cfg = nm_config(nm={"standalone": True}, engine_type="cmd", engine_config={"model": "demo"})
    cfg["motor_engine_union_config"]["engine_command"] = tmpl
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg), name="nm-cmd")
    nm.wait_ready()
    orphan = motorlib.wait_for(lambda: int(open(pidfile).read()) if os.path.exists(pidfile)
                               and open(pidfile).read().strip() else None, 5, what="orphan pid")
    st = motorlib._stat(orphan)
    assert st is not None and st[1] == nm.pid, st  # reparented to the node manager
    motorlib.wait_for(lambda: not os.path.exists(f"/proc/{orphan}"), 5,
                      what="orphan reaped (no zombie)")
    assert nm.alive()


def test_local_restart_policy_backoff_and_limit(procs, tmpdir_path):
    nm, cfg = standalone_nm(
        procs, tmpdir_path, engine_config={"crash_after": 0.6, "load_seconds": 0.1},
        nm={"restart_policy": "local", "restart_backoff_initial_sec": 0.3,
            "restart_backoff_max_sec": 1.2, "restart_start_limit": 3,
            "restart_reset_after_sec": 600})
    ev = nm.wait_event("engine_failed", timeout=20)
    assert ev["restarts"] == 3
    delays = [e["delay_ms"] for e in nm.find_events("engine_restart_scheduled")]
    assert delays == [300, 600, 1200], delays
    spawned = [e for e in nm.find_events("engine_spawned")]
    assert len(spawned) == 4
    # Spacing between exits and the next spawn follows the backoff.
    ts = [time.mktime(time.strptime(e["ts"][:19], "%Y-%m-%dT%H:%M:%S")) + float(e["ts"][19:23])
          for e in spawned]
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    assert gaps[0] < gaps[1] < gaps[2], gaps
    ep = nm.endpoint()
    assert ep["failed"] is True and ep["status"] == "abnormal" and ep["restarts"] == 3
    # While restarts were pending the endpoint did not count for suicide; once it failed
    # for good it does: the node manager asks for a pod restart.
    assert nm.proc.wait(timeout=10) == 255


def test_local_restart_backoff_resets_after_healthy_run(procs, tmpdir_path):
    nm, cfg = standalone_nm(
        procs, tmpdir_path, engine_config={"crash_after": 1.6, "load_seconds": 0.1},
        nm={"restart_policy": "local", "restart_backoff_initial_sec": 0.2,
            "restart_backoff_max_sec": 5, "restart_start_limit": 2,
            "restart_reset_after_sec": 1},
        ft={"container_restart_managed": False})
    nm.wait_event("engine_restart_scheduled", after=2, timeout=15)
    delays = [e["delay_ms"] for e in nm.find_events("engine_restart_scheduled")]
    # Each run was ready for more than restart_reset_after_sec: no growth, no limit.
    assert delays[:3] == [200, 200, 200], delays
    assert not nm.find_events("engine_failed")


def test_standalone_start_without_controller(procs, tmpdir_path):
    ctl = FakeController()
    try:
        nm, cfg = standalone_nm(procs, tmpdir_path, controller_port=ctl.port)
        nm.wait_ready()
        assert nm.engines()["registered"] is False
        time.sleep(0.5)  # heartbeats would be every 0.2 s: none may come
        assert ctl.requests == []
        port = port_of(cfg)
        r = motorlib.post(f"http://127.0.0.1:{port}/v1/completions",
                          {"prompt": "hi", "max_tokens": 3}, timeout=10)
        assert r.status == 200 and r.json()["choices"]
    finally:
        ctl.close()


def read_records(d, prog):
    out = {}
    for f in glob.glob(os.path.join(d, f"{prog}.*.argv")):
        argv = open(f).read().splitlines()
        env = dict(line.split("=", 1) for line in open(f[:-5] + ".env").read().splitlines())
        port = int(argv[argv.index("--port") + 1])
        out[port] = (argv, env)
    return out


def flag(argv, name):
    i = argv.index(name)
    return argv[i + 1]


def test_fake_vllm_argv_end_to_end(procs, tmpdir_path):
    rec = os.path.join(tmpdir_path, "rec")
    os.makedirs(rec)
    ctl = FakeController()
    try:
        cfg = nm_config(role="prefill", engine_type="vllm", controller_port=ctl.port,
                        engine_config={"data_parallel_size": 2, "tensor_parallel_size": 1,
                                       "max_model_len": 2048, "enforce_eager": True,
                                       "kv_transfer_config": {"kv_connector":
                                                              "MooncakeConnectorV1"}},
                        endpoints=2)
        path = write_json(os.path.join(tmpdir_path, "c.json"), cfg)
        env = {"PATH": f"{FAKEBIN}:{os.environ['PATH']}", "FAKE_ENGINE_ARGV_DIR": rec,
               "MOTOR_BIN": motorlib.motor_bin()}
        nm = start_nm(procs, path, role="prefill", env=env)
        ctl.wait_request("/controller/register", timeout=5)
        r = nm.post("/node-manager/start", start_body(cfg, role="prefill", instance_id=7))
        assert r.status == 200, r
        nm.wait_ready()
        recs = motorlib.wait_for(lambda: read_records(rec, "vllm")
                                 if len(read_records(rec, "vllm")) == 2 else None, 5,
                                 what="two vllm argv records")
        for i in range(2):
            argv, env_seen = recs[port_of(cfg, i, "prefill")]
            assert argv[0] == "serve"
            assert flag(argv, "--host") == "127.0.0.1"
            assert flag(argv, "--max-model-len") == "2048"
            assert "--enforce-eager" in argv
            assert flag(argv, "--disable-access-log-for-endpoints") == "/health,/metrics"
            assert flag(argv, "--data-parallel-size") == "2"
            assert flag(argv, "--data-parallel-rank") == str(i)
            assert flag(argv, "--data-parallel-address") == "127.0.0.1"
            assert flag(argv, "--data-parallel-rpc-port") == str(
                cfg["motor_engine_prefill_config"]["engine_config"]["data_parallel_rpc_port"])
            import json
            kv = json.loads(flag(argv, "--kv-transfer-config"))
            assert kv["kv_role"] == "kv_producer" and kv["engine_id"] == "7"
            assert env_seen["ASCEND_RT_VISIBLE_DEVICES"] == str(i)
            assert env_seen["VLLM_HOST_IP"] == "127.0.0.1"
    finally:
        ctl.close()


def test_fake_sglang_argv_end_to_end(procs, tmpdir_path):
    rec = os.path.join(tmpdir_path, "rec")
    os.makedirs(rec)
    cfg = nm_config(role="prefill", engine_type="sglang",
                    engine_config={"model_path": "demo", "tp_size": 1, "mem_fraction_static": 0.8},
                    nm={"standalone": True})
    path = write_json(os.path.join(tmpdir_path, "c.json"), cfg)
    env = {"PATH": f"{FAKEBIN}:{os.environ['PATH']}", "FAKE_ENGINE_ARGV_DIR": rec,
           "MOTOR_BIN": motorlib.motor_bin()}
    nm = start_nm(procs, path, role="prefill", env=env)
    nm.wait_ready()
    recs = read_records(rec, "sglang")
    assert len(recs) == 1
    argv, env_seen = recs[port_of(cfg, 0, "prefill")]
    assert flag(argv, "--model-path") == "demo"
    assert flag(argv, "--mem-fraction-static") == "0.8"
    assert "--enable-metrics" in argv
    assert flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--disaggregation-mode") == "prefill"
    assert "--kv-transfer-config" not in argv
    assert env_seen["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "true"


def test_stop_silences_heartbeats_at_once_and_exits(procs, tmpdir_path):
    """Regression: after POST /node-manager/stop was accepted the node manager kept
    heartbeating (engines reported stopping/abnormal) until it exited. Heartbeats stop the
    moment the stop is accepted, the engines are stopped, and the node manager exits 255
    0.5 s after its answer."""
    ctl = FakeController()
    try:
        # An engine whose group outlives SIGTERM (the shell ignores it): the stop takes
        # the whole grace (stop_grace_seconds 2), which is when heartbeats used to go on.
        tmpl = ["/bin/sh", "-c",
                "trap '' TERM; \"$MOTOR_BIN\" engine-sim --host {host} --port {port} "
                "--model demo & while :; do sleep 0.1; done"]
        cfg = nm_config(controller_port=ctl.port, engine_type="cmd",
                        engine_config={"model": "demo"})
        cfg["motor_engine_union_config"]["engine_command"] = tmpl
        nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
        ctl.wait_request("/controller/register", timeout=5)
        assert nm.post("/node-manager/start", start_body(cfg)).status == 200
        nm.wait_ready()
        ctl.wait_request("/controller/heartbeat", timeout=5)
        pid = nm.endpoint()["pid"]
        t_stop = time.monotonic()
        r = nm.post("/node-manager/stop", timeout=10)
        t_answer = time.monotonic()
        assert r.status == 200, r
        assert t_answer - t_stop >= 1.5  # the engine group took the grace
        # At most one heartbeat that was already on its way when the stop arrived (one
        # every 0.2 s went on for the whole 2 s grace before the fix).
        late = [h for h in ctl.of("/controller/heartbeat") if h.t > t_stop]
        assert len(late) <= 1 and all(h.t < t_stop + 0.5 for h in late), \
            [(round(h.t - t_stop, 3), h.body) for h in late]
        assert not [x for x in ctl.of("/controller/register") if x.t > t_stop]
        assert nm.proc.wait(timeout=5) == 255
        assert time.monotonic() - t_answer < 2.5
        motorlib.assert_no_process(pid, timeout=5)
        assert not nm.find_events("engine_death_reporting")
        assert not ctl.of("/controller/report_software_fault")
    finally:
        ctl.close()
