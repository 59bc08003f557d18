"""etcd over TLS (etcd_tls_config, issue 13): the controller's store and the coordinator's
master/standby against a real etcd that serves https and requires client certificates
(--client-cert-auth). The certificates come from tests/fixtures/mkcerts.sh.

* The controller with `etcd_tls_config` (and upstream's etcd_config switch: the derived
  endpoint turns https://) becomes leader and writes its records through TLS.
* The same controller trusting another CA never becomes leader, and says why (a
  certificate verification failure) in its log.
* An http:// endpoint next to an enabled etcd_tls_config is refused at startup.
* A coordinator with `motor_deploy_config.tls_config.etcd_tls_config` becomes master."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

import motorlib
from coord_helpers import Coord
from ctl_fakes import Controller, Etcd, FakeCoordinator, controller_config, etcd_available

pytestmark = pytest.mark.skipif(not etcd_available() and os.environ.get("MOTOR_REQUIRE_ETCD") != "1",
                                reason="etcd not installed")



@pytest.fixture
def tls_etcd(procs, pki):
    e = Etcd(procs, tls={"cert": pki("srv.crt"), "key": pki("srv.key"), "ca": pki("ca.crt"),
                         "client_cert": pki("cli.crt"), "client_key": pki("cli.key")})
    yield e
    e.close()


@pytest.fixture
def fake_coord():
    fc = FakeCoordinator()
    yield fc
    fc.close()


def check_config(cfg: str) -> subprocess.CompletedProcess:
    return subprocess.run([motorlib.motor_bin(), "controller", "--check-config", "--config", cfg,
                           "--port", "0"], capture_output=True, text=True, timeout=30)


def etcd_ctl_config(tmpdir, coord_port, etcd, pki, ca="ca.crt", prefix="/motor-tls/"):
    return controller_config(
        tmpdir, coord_port, store={"backend": "etcd", "etcd_prefix": prefix, "etcd_timeout": 1,
                                   "leader_retry_interval": 0.3},
        extra={"etcd_config": {"enable_etcd_persistence": True, "etcd_host": "127.0.0.1",
                               "etcd_port": etcd.client_port},
               "etcd_tls_config": {"enable_tls": True, "ca_file": pki(ca),
                                   "cert_file": pki("cli.crt"), "key_file": pki("cli.key")}})


def test_controller_store_on_tls_etcd(procs, tmpdir_path, pki, tls_etcd, fake_coord):
    cfg = etcd_ctl_config(tmpdir_path, fake_coord.port, tls_etcd, pki)
    r = check_config(cfg)
    assert r.returncode == 0, r.stderr
    dumped = json.loads(r.stdout)
    assert dumped["store_config"]["etcd_endpoints"] == [f"https://127.0.0.1:{tls_etcd.client_port}"]
    c = Controller(procs, cfg)
    c.proc.wait_event("controller_leader", timeout=15)
    # its records went through TLS with the client certificate: etcd holds them
    motorlib.wait_for(lambda: tls_etcd.keys("/motor-tls/"), 10, what="controller keys in etcd")
    st, body = c.get("/controller/instances")
    assert st == 200, body


def test_controller_wrong_ca_never_leads(procs, tmpdir_path, pki, tls_etcd, fake_coord):
    cfg = etcd_ctl_config(tmpdir_path, fake_coord.port, tls_etcd, pki, ca="other-ca.crt",
                          prefix="/motor-tls-bad/")
    c = Controller(procs, cfg, wait_ready=False)

    def said_why():
        for e in c.proc.events():
            text = json.dumps(e).lower()
            if "certificate" in text or "verify" in text:
                return e
        return None
    motorlib.wait_for(said_why, 10, what="a certificate error in the controller's log")
    assert not c.proc.find_events("controller_leader")
    assert c.proc.alive()
    assert tls_etcd.keys("/motor-tls-bad/") == {}


def test_http_endpoint_with_etcd_tls_is_refused(procs, tmpdir_path, pki, fake_coord):
    cfg = controller_config(
        tmpdir_path, fake_coord.port,
        store={"backend": "etcd", "etcd_endpoints": ["http://127.0.0.1:2379"]},
        extra={"etcd_tls_config": {"enable_tls": True, "ca_file": pki("ca.crt"),
                                   "cert_file": pki("cli.crt")}})
    r = check_config(cfg)
    assert r.returncode != 0
    assert "etcd_tls_config" in r.stderr and "http://" in r.stderr, r.stderr
    assert "key_file" in r.stderr, r.stderr  # cert_file without its key


def test_coordinator_master_on_tls_etcd(procs, tmpdir_path, pki, tls_etcd):
    key = f"/motor-tls-ha/{os.getpid()}-{time.monotonic_ns()}"
    cfg = {"motor_coordinator_config": {
               "standby_config": {"enable_master_standby": True, "master_lock_ttl": 2,
                                  "master_standby_check_interval": 0.3,
                                  "master_lock_retry_interval": 0.5, "master_lock_key": key},
               "etcd_config": {"etcd_host": "127.0.0.1", "etcd_port": tls_etcd.client_port,
                               "etcd_timeout": 1}},
           "motor_deploy_config": {"tls_config": {"etcd_tls_config": {
               "enable_tls": True, "ca_file": pki("ca.crt"), "cert_file": pki("cli.crt"),
               "key_file": pki("cli.key")}}}}
    path = os.path.join(tmpdir_path, "coord.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    infer, mgmt = motorlib.free_port(), motorlib.free_port()
    p = procs.motor("coordinator", "--config", path, "--port", infer, "--mgmt-port", mgmt,
                    "--workers", 1, name="coordinator")
    p.wait_event("coordinator_listening", timeout=15)
    c = Coord(p, infer, mgmt)
    motorlib.wait_for(lambda: (motorlib.try_get(c.mgmt + "/readiness", timeout=1) or
                               type("r", (), {"status": 0})).status == 200, 15,
                      what="the coordinator is master")
    assert key in tls_etcd.keys(key)
