"""`motor up --tls`: the bundled local fleet (examples/local.json: 1 prefill + 1 decode
instance of simulated engines, 2 DP ranks each) with every listener on mutual TLS, from
the throwaway CA and certificates motor up makes in its state directory (issue 13).

* Every listener of the fleet (coordinator inference and management, controller, both
  node managers, the four engines) completes a verified TLS handshake with the
  generated CA and client certificate, refuses one without a client certificate, and
  answers plain HTTP with a plain 400 saying so and a closed connection.
* Chat completions through the coordinator over https (PD hand-off: coordinator ->
  prefill and decode engines over TLS, decode pulling KV from prefill over TLS),
  non-streamed and streamed, the same text.
* `motor status --state-dir` and `motor status -c <effective config>` read the fleet over
  https and say healthy; one that does not trust the fleet's CA is refused.
* A SIGKILLed decode engine is relaunched (node manager -> controller -> node manager over
  TLS, probes over TLS), and the fleet serves again.
* SIGTERM stops everything, exit 0.

This test must fail — never skip — when the fleet does not come up."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess

import motorlib
from motorlib import wait_for
from test_up import Fleet, cmdline, descendants, streamed_text


def ctx(tls: str, cert: bool = True) -> ssl.SSLContext:
    c = ssl.create_default_context(cafile=os.path.join(tls, "ca.crt"))
    if cert:
        c.load_cert_chain(os.path.join(tls, "client.crt"), os.path.join(tls, "client.key"))
    return c


def handshake(port: int, c: ssl.SSLContext) -> str:
    """A verified handshake (IP SAN 127.0.0.1) and one request; the status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with c.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.split(b"\r\n", 1)[0].decode()


def refuses_without_cert(port: int, tls: str) -> bool:
    """With TLS 1.3 the client finishes its handshake before the server has checked the
    certificate: the refusal (an alert, a close) comes on the first read."""
    try:
        return not handshake(port, ctx(tls, cert=False)).startswith("HTTP/")
    except (ssl.SSLError, ConnectionError, OSError):
        return True


def plain_is_refused(port: int) -> bool:
    """A plain request on a TLS port: a plain-text 400 saying so (as nginx does), then the
    connection closes; never the route's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionError:
            pass
        return data == b"" or (data.startswith(b"HTTP/1.1 400 ") and b"TLS port" in data)


def chat(url: str, c: ssl.SSLContext, content: str, stream: bool = False):
    body = {"model": "motor-demo", "max_tokens": 12, "stream": stream, "ignore_eos": True,
            "messages": [{"role": "user", "content": content}]}
    if stream:
        return motorlib.SSEStream(url + "/chat/completions", body, timeout=20, context=c)
    return motorlib.post(url + "/chat/completions", body, 20, context=c)


def test_local_fleet_all_tls(procs, tmpdir_path):
    fleet = Fleet(procs, tmpdir_path, extra=["--tls"])
    ev = fleet.wait_ready()
    url = fleet.url
    assert url == f"https://127.0.0.1:{fleet.base}/v1"
    info = fleet.info()
    tls = os.path.join(fleet.state, "tls")
    assert info["tls"] == {"ca_file": os.path.join(tls, "ca.crt"),
                           "cert_file": os.path.join(tls, "client.crt"),
                           "key_file": os.path.join(tls, "client.key")}
    for u in ("coordinator_url", "coordinator_mgmt_url", "controller_url"):
        assert info[u].startswith("https://"), info
    assert oct(os.stat(os.path.join(tls, "ca.key")).st_mode & 0o777) == "0o600"
    c = ctx(tls)

    # Every listener: the plan's ports (motor up --dry-run prints them).
    r = subprocess.run([motorlib.motor_bin(), "up", "-c", fleet.config, "--port-base",
                        str(fleet.base), "--state-dir", fleet.state, "--tls", "--dry-run"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    listeners = {"coordinator": plan["coordinator_port"],
                 "coordinator-mgmt": plan["coordinator_mgmt_port"],
                 "controller": plan["controller_port"]}
    for pod in plan["pods"]:
        listeners[pod["name"] + " node manager"] = pod["node_manager_port"]
        for i, port in enumerate(pod["engine_ports"]):
            listeners[f"{pod['name']} engine {i}"] = port
    assert len(listeners) == 9, listeners
    for name, port in listeners.items():
        line = handshake(port, c)
        assert line.startswith("HTTP/1.1 "), (name, line)
        assert refuses_without_cert(port, tls), f"{name} took a client without a certificate"
        assert plain_is_refused(port), f"{name} answered plain HTTP"

    # Chat through the coordinator: PD hand-off, everything behind it on TLS too.
    r = motorlib.get(url + "/models", context=c)
    assert r.status == 200 and [m["id"] for m in r.json()["data"]] == ["motor-demo"]
    r = chat(url, c, "hello tls fleet")
    assert r.status == 200, r
    whole = r.json()["choices"][0]["message"]["content"]
    assert whole and r.json()["usage"]["completion_tokens"] == 12
    assert streamed_text(chat(url, c, "hello tls fleet", stream=True)) == whole

    # motor status over https (the CA and client certificate from up.json)
    model = fleet.wait_healthy(30)
    assert model["controller"]["url"].startswith("https://")
    assert model["coordinator"]["url"].startswith("https://")
    assert sorted(i["role"] for i in model["instances"]) == ["decode", "prefill"]
    assert all(p["healthy"] for p in model["pools"]) and len(model["pools"]) == 2
    # ... and from the effective user_config.json: https:// and the files of its TLS blocks
    r = subprocess.run([motorlib.motor_bin(), "status", "-c", info["effective_config"], "--json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr)
    assert json.loads(r.stdout)["healthy"]
    # ... and a client without the fleet's CA is refused (verification on by default)
    r = subprocess.run([motorlib.motor_bin(), "status", "--controller", info["controller_url"],
                        "--coordinator", "none", "--ca-file", "/etc/ssl/certs/ca-certificates.crt",
                        "--json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert json.loads(r.stdout)["controller"]["reachable"] is False

    # SIGKILL one decode engine: relaunched over the TLS control plane, serving again.
    nm = fleet.child("decode-0")
    engines = motorlib.children_of(nm["pid"])
    assert len(engines) == 2, [cmdline(p) for p in engines]
    victim = engines[0]
    assert "engine-sim" in cmdline(victim) and "--ssl-certfile" in cmdline(victim)
    os.kill(victim, signal.SIGKILL)

    def relaunched():
        now = motorlib.children_of(nm["pid"])
        return now if len(now) == 2 and victim not in now else None
    wait_for(relaunched, 60, interval=0.1, what="the decode engines relaunched")
    fleet.wait_healthy(60)
    for i in range(3):
        r = chat(url, c, f"after relaunch {i}")
        assert r.status == 200, r
    assert streamed_text(chat(url, c, "after relaunch stream", stream=True))

    # No TLS failure inside the fleet but the ones this test provoked: per listener a
    # client without a certificate and a plain request, and the controller's refusal of
    # the `motor status` that did not trust the fleet's CA. The daemons' own connections
    # to each other all verified.
    logs = os.path.join(fleet.state, "logs")
    failures = []
    for name in os.listdir(logs):
        with open(os.path.join(logs, name)) as f:
            failures += [(name, json.loads(x)["error"]) for x in f if '"tls_handshake_failed"' in x]
    for name, err in failures:
        assert ("did not return a certificate" in err or "plain HTTP" in err or
                (name == "controller.log" and "unknown ca" in err)), (name, err)
    assert any("unknown ca" in err for _, err in failures), failures
    # exactly one of each per listener: no daemon of the fleet ever spoke plain HTTP to a
    # TLS peer (a node manager's log holds its engines' lines too)
    expect = {"coordinator.log": 2, "controller.log": 1}
    for pod in plan["pods"]:
        expect[f"nm-{pod['name']}.log"] = 1 + len(pod["engine_ports"])
    for name, n in expect.items():
        for what in ("plain HTTP", "did not return a certificate"):
            got = sum(what in err for f, err in failures if f == name)
            assert got == n, (name, what, got, n, failures)

    tree = descendants(fleet.proc.pid)
    rc = fleet.stop()
    assert rc == 0, fleet.proc.tail()
    left = [p for p in tree if motorlib.pid_alive(p)]
    assert not left, [(p, cmdline(p)) for p in left]
