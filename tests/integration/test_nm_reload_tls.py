"""motor node-manager: configuration hot reload (inotify on the directory, rename-over and
Kubernetes-style symlink swaps, invalid files kept out) and TLS on the management API and
towards the Controller (mgmt_tls_config)."""

import json
import os
import ssl
import time
import urllib.request

import pytest

import motorlib
from fake_controller import (FakeController, nm_config, self_signed, start_body, start_nm,
                             write_json)


def replace_file(path, obj):
    """Write next to path and rename over it, as editors and config tools do."""
    tmp = path + ".new"
    write_json(tmp, obj)
    os.rename(tmp, path)


def hb_gaps(ctl, n, after):
    """Gaps between n+1 heartbeats arriving after index `after`."""
    recs = [ctl.wait_request("/controller/heartbeat", after=after + i, timeout=10)
            for i in range(n + 1)]
    return [b.t - a.t for a, b in zip(recs, recs[1:])]


def test_hot_reload_rename_over_and_invalid(procs, tmpdir_path):
    ctl = FakeController()
    try:
        cfg = nm_config(controller_port=ctl.port)
        path = write_json(os.path.join(tmpdir_path, "user_config.json"), cfg)
        nm = start_nm(procs, path)
        ctl.wait_request("/controller/register", timeout=5)
        assert nm.post("/node-manager/start", start_body(cfg)).status == 200
        gaps = hb_gaps(ctl, 3, len(ctl.of("/controller/heartbeat")))
        assert max(gaps) < 0.45, gaps

        # A valid new file: the heartbeat interval and the log level apply at once.
        cfg2 = json.loads(json.dumps(cfg))
        blk = cfg2["motor_engine_union_config"]["motor_nodemanger_config"]
        blk["basic_config"]["heartbeat_interval_seconds"] = 0.7
        blk["logging_config"] = {"log_level": "DEBUG"}
        replace_file(path, cfg2)
        ev = nm.wait_event("config_reloaded", timeout=5)
        assert ev["heartbeat_interval_seconds"] == 0.7 and ev["log_level"] == "DEBUG"
        # Both are live keys of the configuration table: nothing asks for a restart.
        assert not nm.find_events("config_reload_restart_required")
        nm.wait_event("heartbeat_interval_changed", interval_ms=700, timeout=5)
        gaps = hb_gaps(ctl, 2, len(ctl.of("/controller/heartbeat")))
        assert min(gaps) > 0.5, gaps
        # The debug level is on: the API server now logs each request.
        nm.engines()
        motorlib.wait_for(lambda: nm.find_events("http_request", path="/node-manager/engines"),
                          5, what="a debug line")

        # An invalid file is refused; the old configuration stays in force.
        bad = json.loads(json.dumps(cfg2))
        bad["motor_engine_union_config"]["motor_nodemanger_config"]["basic_config"][
            "heartbeat_interval_seconds"] = "fast"
        replace_file(path, bad)
        ev = nm.wait_event("config_reload_failed", timeout=5)
        assert "heartbeat_interval_seconds" in ev["detail"]
        assert nm.alive()
        gaps = hb_gaps(ctl, 2, len(ctl.of("/controller/heartbeat")))
        assert min(gaps) > 0.5, gaps

        # Fixed again: applied.
        cfg3 = json.loads(json.dumps(cfg2))
        cfg3["motor_engine_union_config"]["motor_nodemanger_config"]["basic_config"][
            "heartbeat_interval_seconds"] = 0.2
        replace_file(path, cfg3)
        nm.wait_event("heartbeat_interval_changed", interval_ms=200, timeout=5)
        assert nm.status() in (True, False)
    finally:
        ctl.close()


def test_hot_reload_kubernetes_symlink_swap(procs, tmpdir_path):
    """ConfigMap volumes: user_config.json -> ..data/user_config.json, and ..data is a
    symlink swapped by rename to a fresh timestamped directory."""
    d = os.path.join(tmpdir_path, "cm")
    os.makedirs(os.path.join(d, "..v1"))
    cfg = nm_config(nm={"standalone": True})
    write_json(os.path.join(d, "..v1", "user_config.json"), cfg)
    os.symlink("..v1", os.path.join(d, "..data"))
    os.symlink("..data/user_config.json", os.path.join(d, "user_config.json"))
    nm = start_nm(procs, os.path.join(d, "user_config.json"))
    nm.wait_ready()

    cfg2 = json.loads(json.dumps(cfg))
    blk = cfg2["motor_engine_union_config"]["motor_nodemanger_config"]
    blk["basic_config"]["heartbeat_interval_seconds"] = 0.4
    blk["management_api_key"] = "new-key"  # live: rotated at once, never logged
    blk["port_allocator_config"] = {"scan_range": 50}  # a restart key: reported, not applied
    os.makedirs(os.path.join(d, "..v2"))
    write_json(os.path.join(d, "..v2", "user_config.json"), cfg2)
    os.symlink("..v2", os.path.join(d, "..data_tmp"))
    os.rename(os.path.join(d, "..data_tmp"), os.path.join(d, "..data"))
    ev = nm.wait_event("config_reloaded", timeout=5)
    assert ev["heartbeat_interval_seconds"] == 0.4
    ev = nm.wait_event("config_reload_restart_required", timeout=5)
    assert "scan_range" in ev["settings"] and "management" not in ev["settings"], ev
    ev = nm.wait_event("management_key_rotated", timeout=5)
    assert ev["before"] is False and ev["after"] is True
    assert nm.post("/node-manager/pause", {}).status == 401
    assert "new-key" not in nm.output()
    # A touch without a content change reloads nothing.
    n = len(nm.find_events("config_reloaded"))
    os.utime(os.path.join(d, "..data"), follow_symlinks=False)
    time.sleep(0.4)
    assert len(nm.find_events("config_reloaded")) == n


def client_ctx(cert, key=None):
    ctx = ssl.create_default_context(cafile=cert)
    if key:
        ctx.load_cert_chain(cert, key)
    return ctx


def tls_get(url, ctx, timeout=5):
    with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
        return r.status, json.loads(r.read())


def test_tls_api_and_controller(procs, tmpdir_path):
    cert, key = self_signed(tmpdir_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    ctl = FakeController(tls=server_ctx)
    try:
        tls = {"enable_tls": True, "cert_file": cert, "key_file": key, "ca_file": cert}
        cfg = nm_config(controller_port=ctl.port, nm={"mgmt_tls_config": tls})
        nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg),
                      scheme="https")
        ev = nm.wait_event("nm_listening")
        assert ev["tls"] is True and ev["mutual_tls"] is True
        # The Controller is reached over HTTPS with the same TLS files.
        reg = ctl.wait_request("/controller/register", timeout=5)
        assert reg.body["nm_port"] == str(nm.port)

        url = f"https://127.0.0.1:{nm.port}/node-manager/status"
        status, body = tls_get(url, client_ctx(cert, key))
        assert status == 200 and body == {"status": False}
        # Mutual TLS: no client certificate, no answer.
        with pytest.raises(Exception):
            tls_get(url, client_ctx(cert))
        # Plain HTTP on the TLS port gets nowhere either: a plain 400 that says why (as
        # nginx answers), never the API.
        r = motorlib.get(f"http://127.0.0.1:{nm.port}/node-manager/status", timeout=2)
        assert r.status == 400, r
        assert "TLS port" in r.json()["detail"]
        nm.wait_event("tls_handshake_failed", error="plain HTTP request on a TLS port")

        req = urllib.request.Request(f"https://127.0.0.1:{nm.port}/node-manager/start",
                                     data=json.dumps(start_body(cfg)).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=client_ctx(cert, key), timeout=10) as r:
            assert r.status == 200
        ctl.wait_request("/controller/heartbeat",
                         lambda rec: rec.body["status"] == {"0": "normal"}, timeout=15)
    finally:
        ctl.close()
