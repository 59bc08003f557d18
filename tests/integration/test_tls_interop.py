"""TLS between Motor and peers nobody here wrote.

The server side is the node manager's management API (mgmt_tls_config: the one httpd
serves it, TLS beneath); its clients: `openssl s_client`, the `curl` CLI, Python's
`ssl`, and nginx as a TLS reverse proxy in front of it (nginx then is a TLS client of
Motor, with a client certificate and upstream keep-alive). The client side is the node
manager's HTTP client towards its Controller: nginx plays the Controller over TLS with
client certificates required. The certificates come from tests/fixtures/mkcerts.sh.

Also: a node manager without TLS never maps libssl; one with TLS does (it is loaded on
first use).

The coordinator (phase B of issue 13): nginx as a TLS reverse proxy in front of its
inference port (mutual TLS, keep-alive), nginx as a TLS "engine" behind it (the
coordinator verifies nginx with infer_tls_config's CA and presents its certificate, which
nginx requires), `motor register` and `motor status` over https against it, with a TLS
simulator (--ssl-*) registered through `--engine-tls`."""

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import time

import pytest

import motorlib
from fake_controller import nm_config, start_body, start_nm, write_json



def nginx_bin():
    for p in ("/usr/sbin/nginx", shutil.which("nginx") or ""):
        if p and os.access(p, os.X_OK):
            return p
    raise FileNotFoundError("nginx is required (scripts/deps.sh installs it)")


def tls_nm(procs, tmpdir_path, pki, *, ca=True, crl=False, standalone=True, controller_port=1,
           key="srv.key", password=None, debug=False):
    tls = {"enable_tls": True, "cert_file": pki("srv.crt"), "key_file": pki(key)}
    if ca:
        tls["ca_file"] = pki("ca.crt")
    if crl:
        tls["crl_file"] = pki("crl.pem")
    if password:
        pw = os.path.join(tmpdir_path, "key.pass")
        with open(pw, "w") as f:
            f.write(password + "\n")
        tls["passwd_file"] = pw
    nm = {"mgmt_tls_config": tls}
    if debug:
        nm["logging_config"] = {"log_level": "DEBUG"}
    if standalone:
        nm["standalone"] = True
    cfg = nm_config(controller_port=controller_port, nm=nm)
    n = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg), scheme="https")
    n.cfg = cfg
    return n


def client_ctx(pki, cert="cli", verify=True):
    ctx = ssl.create_default_context(cafile=pki("ca.crt"))
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(pki(cert + ".crt"), pki(cert + ".key"))
    return ctx


def wait_error(proc, event, text, timeout=5.0):
    """Wait for a log line `event` whose "error" contains text."""
    return motorlib.wait_for(
        lambda: next((e for e in proc.find_events(event) if text in (e.get("error") or "")), None),
        timeout, what=f"{event} with {text!r}")


def maps(pid):
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


# ---- the server side: Motor's httpd over TLS ------------------------------------------------


def test_openssl_s_client(procs, tmpdir_path, pki):
    nm = tls_nm(procs, tmpdir_path, pki)
    req = b"GET /liveness HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    for proto in ("-tls1_3", "-tls1_2"):
        r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{nm.port}", proto,
                            "-CAfile", pki("ca.crt"), "-cert", pki("cli.crt"), "-key", pki("cli.key"),
                            "-verify_return_error", "-verify_ip", "127.0.0.1", "-ign_eof"],
                           input=req, capture_output=True, timeout=30)
        out = r.stdout.decode(errors="replace")
        assert "Verify return code: 0 (ok)" in out, out
        assert "HTTP/1.1 200 OK" in out, out
        if proto == "-tls1_2":
            # the default TLS 1.2 list: ECDHE with AEAD ciphers only
            line = next(x for x in out.splitlines() if "Cipher is" in x)
            assert "Cipher is ECDHE-" in line and ("GCM" in line or "CHACHA20" in line), line
    # below TLS 1.2: refused, and said so in the log
    r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{nm.port}", "-tls1_1",
                        "-cipher", "DEFAULT@SECLEVEL=0", "-CAfile", pki("ca.crt")],
                       input=b"", capture_output=True, timeout=30)
    assert "HTTP/1.1" not in r.stdout.decode(errors="replace")
    nm.wait_event("tls_handshake_failed", timeout=5)


def test_curl_cli(procs, tmpdir_path, pki):
    nm = tls_nm(procs, tmpdir_path, pki, crl=True)
    base = f"https://127.0.0.1:{nm.port}"

    def curl(*args):
        return subprocess.run(["curl", "-sS", "--noproxy", "*", "--max-time", "10",
                               "--cacert", pki("ca.crt"), *args], capture_output=True,
                              timeout=30)

    r = curl("--cert", pki("cli.crt"), "--key", pki("cli.key"), base + "/node-manager/status")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"status": False}
    # keep-alive: several URLs, one connection (curl says "Re-using existing connection")
    r = curl("-v", "--cert", pki("cli.crt"), "--key", pki("cli.key"), base + "/liveness",
             base + "/readiness", base + "/liveness")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(b"Connected to") == 1, r.stderr
    # rejected client certificates, each one log line with the reason
    for cert, reason in (("expired", "certificate has expired"),
                         ("revoked", "certificate revoked"),
                         ("other-cli", "unable to get local issuer certificate")):
        r = curl("--cert", pki(cert + ".crt"), "--key", pki(cert + ".key"), base + "/liveness")
        assert r.returncode != 0, (cert, r)
        wait_error(nm, "tls_handshake_failed", reason)
    r = curl(base + "/liveness")  # no certificate
    assert r.returncode != 0
    wait_error(nm, "tls_handshake_failed", "peer did not return a certificate")
    # plain HTTP on the TLS port: a plain 400 that says why
    r = subprocess.run(["curl", "-sS", "--noproxy", "*", "--max-time", "10",
                        f"http://127.0.0.1:{nm.port}/liveness"], capture_output=True, timeout=30)
    assert b"plain HTTP request sent to a TLS port" in r.stdout, r
    assert nm.alive()


def test_python_ssl(procs, tmpdir_path, pki):
    nm = tls_nm(procs, tmpdir_path, pki, key="srv-enc.key", password="hunter2")
    ctx = client_ctx(pki)
    c = http.client.HTTPSConnection("127.0.0.1", nm.port, context=ctx, timeout=10)
    for _ in range(3):  # one connection, kept alive
        c.request("GET", "/node-manager/engines")
        r = c.getresponse()
        assert r.status == 200
        assert "endpoints" in json.loads(r.read())
    assert c.sock.version() in ("TLSv1.3", "TLSv1.2")
    session = c.sock.session
    c.close()
    # a new connection resumes the session (tickets; client certificates verified)
    raw = socket.create_connection(("127.0.0.1", nm.port), timeout=10)
    s = ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session)
    s.sendall(b"GET /liveness HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK"), data
    assert s.session_reused
    s.close()
    # a peer that never sends close_notify (Python closes the socket without it): no
    # trouble, and the server goes on
    for _ in range(3):
        raw = socket.create_connection(("127.0.0.1", nm.port), timeout=10)
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        s.sendall(b"GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200 OK")
        s.close()
    c = http.client.HTTPSConnection("127.0.0.1", nm.port, context=ctx, timeout=10)
    c.request("GET", "/liveness")
    assert c.getresponse().status == 200
    c.close()


def test_bad_input_is_one_line_and_a_closed_connection(procs, tmpdir_path, pki):
    nm = tls_nm(procs, tmpdir_path, pki)
    # a handshake that stops halfway: cut by the idle rule later; here only its start
    ctx = client_ctx(pki)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    s = socket.create_connection(("127.0.0.1", nm.port), timeout=10)
    s.sendall(hello[: len(hello) // 2])
    s.close()
    # a TLS ClientHello where plain HTTP is expected: the engine simulator's plain port
    sim = motorlib.start_sim(procs)
    t0 = time.monotonic()
    with pytest.raises(ssl.SSLError):
        raw = socket.create_connection(("127.0.0.1", sim.port), timeout=10)
        ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    assert time.monotonic() - t0 < 5  # closed at once, not after an idle timeout
    sim.wait_event("http_tls_on_plain_port", timeout=5)
    # the server is fine
    c = http.client.HTTPSConnection("127.0.0.1", nm.port, context=ctx, timeout=10)
    c.request("GET", "/liveness")
    assert c.getresponse().status == 200
    c.close()


def test_libssl_mapped_only_with_tls(procs, tmpdir_path, pki):
    cfg = nm_config(nm={"standalone": True})
    plain = start_nm(procs, write_json(os.path.join(tmpdir_path, "p.json"), cfg), name="plain-nm")
    plain.engines()
    assert "libssl" not in maps(plain.pid) and "libcrypto" not in maps(plain.pid)
    d = os.path.join(tmpdir_path, "tls")
    os.makedirs(d)
    nm = tls_nm(procs, d, pki)
    assert "libssl.so.3" in maps(nm.pid)


# ---- nginx in front of Motor, and Motor's client against nginx -------------------------------


NGINX_BASE = """
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 64; }}
http {{
  log_format motor '$connection $connection_requests $ssl_protocol "$request" $status';
  access_log {d}/access.log motor;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
{body}
}}
"""


class Nginx:
    def __init__(self, procs, d, body):
        self.dir = d
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_BASE.format(d=d, body=body))
        self.proc = procs.start([nginx_bin(), "-p", d, "-c", conf], name="nginx")

    def wait_port(self, port):
        motorlib.wait_for(lambda: self._listening(port), 10, what="nginx listening")

    @staticmethod
    def _listening(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def log(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return f.read()


def test_nginx_tls_reverse_proxy_in_front(procs, tmpdir_path, pki):
    """client --TLS--> nginx --TLS, client certificate, keep-alive--> node manager."""
    nm = tls_nm(procs, tmpdir_path, pki, debug=True)
    port = motorlib.free_port()
    d = os.path.join(tmpdir_path, "nginx")
    os.makedirs(d)
    body = f"""
  upstream motor {{ server 127.0.0.1:{nm.port}; keepalive 4; }}
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {pki("srv.crt")};
    ssl_certificate_key {pki("srv.key")};
    location / {{
      proxy_pass https://motor;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_ssl_verify on;
      proxy_ssl_verify_depth 2;
      proxy_ssl_trusted_certificate {pki("ca.crt")};
      proxy_ssl_name localhost;  # nginx checks DNS names only
      proxy_ssl_server_name on;
      proxy_ssl_certificate {pki("cli.crt")};
      proxy_ssl_certificate_key {pki("cli.key")};
      proxy_ssl_session_reuse on;
    }}
  }}"""
    ngx = Nginx(procs, d, body)
    ngx.wait_port(port)
    ctx = ssl.create_default_context(cafile=pki("ca.crt"))
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    for _ in range(5):
        c.request("GET", "/node-manager/engines")
        r = c.getresponse()
        assert r.status == 200, [x for x in ngx.log("error.log").splitlines() if "[error]" in x or "[crit]" in x]
        assert "endpoints" in json.loads(r.read())
    c.request("POST", "/node-manager/status", body=b"{}",
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 405  # the method check is Motor's, through the proxy
    r.read()
    c.close()
    # nginx kept its upstream TLS connection: Motor saw one handshake for six requests
    assert len(nm.find_events("tls_handshake_done")) == 1, nm.find_events("tls_handshake_done")
    assert len(nm.find_events("http_request", path="/node-manager/engines")) == 5  # status: quiet
    assert not nm.find_events("tls_handshake_failed")


def test_nginx_as_tls_controller_behind(procs, tmpdir_path, pki):
    """node manager --TLS, client certificate--> nginx (playing the Controller)."""
    port = motorlib.free_port()
    d = os.path.join(tmpdir_path, "nginx")
    os.makedirs(d)
    body = f"""
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {pki("srv.crt")};
    ssl_certificate_key {pki("srv.key")};
    ssl_client_certificate {pki("ca.crt")};
    ssl_verify_client on;
    keepalive_requests 1000;
    location /controller/ {{
      default_type application/json;
      return 200 '{{"message": "ok"}}';
    }}
  }}"""
    ngx = Nginx(procs, d, body)
    ngx.wait_port(port)
    nmd = os.path.join(tmpdir_path, "nm")
    os.makedirs(nmd)
    nm = tls_nm(procs, nmd, pki, standalone=False, controller_port=port)
    nm.wait_event("registered", timeout=15)
    # started (over TLS, with a client certificate), it sends heartbeats through nginx
    c = http.client.HTTPSConnection("127.0.0.1", nm.port, context=client_ctx(pki), timeout=10)
    c.request("POST", "/node-manager/start", body=json.dumps(start_body(nm.cfg)),
              headers={"Content-Type": "application/json"})
    assert c.getresponse().status == 200
    c.close()
    motorlib.wait_for(lambda: ngx.log("access.log").count("/controller/heartbeat") >= 3, 15,
                      what="three heartbeats through nginx")
    log = ngx.log("access.log")
    assert '"POST /controller/register HTTP/1.1" 200' in log, log
    assert not nm.find_events("register_failed")
    # keep-alive: the heartbeats share one TLS connection
    beats = [x.split() for x in log.splitlines() if "/controller/heartbeat" in x]
    assert len({b[0] for b in beats}) == 1, log
    assert beats[-1][2] in ("TLSv1.3", "TLSv1.2")


# ---- the coordinator: nginx in front, nginx behind, motor register/status over https -------


def tls_coordinator(procs, tmpdir_path, pki, engine_tls=True, name="coordinator"):
    """A coordinator with both ports on mutual TLS (srv.crt; its client certificate
    towards engines too)."""
    block = {"enable_tls": True, "cert_file": pki("srv.crt"), "key_file": pki("srv.key"),
             "ca_file": pki("ca.crt")}
    cfg = {"motor_coordinator_config": {"exception_config": {"max_retry": 1},
                                        "logging_config": {"log_level": "DEBUG"}},
           "motor_deploy_config": {"tls_config": {
               "infer_tls_config": {**block, "engine_tls": engine_tls},
               "mgmt_tls_config": block}}}
    path = os.path.join(tmpdir_path, f"{name}.json")
    write_json(path, cfg)
    p = procs.motor("coordinator", "--config", path, "--port", 0, "--mgmt-port", 0,
                    "--workers", 1, name=name)
    ev = p.wait_event("coordinator_listening", timeout=15)
    p.infer_port, p.mgmt_port, p.config = int(ev["infer_port"]), int(ev["mgmt_port"]), path
    return p


def coord_refresh(coord, pki, body):
    r = motorlib.post(f"https://127.0.0.1:{coord.mgmt_port}/instances/refresh", body, 10,
                      context=client_ctx(pki))
    assert r.status == 200, r
    return r


def chat_body(model="m", stream=False):
    return {"model": model, "max_tokens": 4, "stream": stream, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}]}


def test_nginx_tls_proxy_in_front_of_coordinator(procs, tmpdir_path, pki):
    """client --TLS--> nginx --mutual TLS, keep-alive--> coordinator --TLS--> simulator."""
    sim = motorlib.start_sim(procs, "--model", "m", "--ttft-ms", "1", "--tokens-per-second", "0",
                             "--ssl-certfile", pki("srv.crt"), "--ssl-keyfile", pki("srv.key"),
                             "--ssl-ca-certs", pki("ca.crt"), "--ssl-cert-reqs", "2", name="sim")
    coord = tls_coordinator(procs, tmpdir_path, pki)
    coord_refresh(coord, pki, {"event": "set", "model_name": "m", "instances": [
        {"id": 1, "role": "union", "endpoints": [{"id": 0, "address": f"127.0.0.1:{sim.port}"}]}]})
    port = motorlib.free_port()
    d = os.path.join(tmpdir_path, "nginx")
    os.makedirs(d)
    body = f"""
  upstream motor {{ server 127.0.0.1:{coord.infer_port}; keepalive 4; }}
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {pki("srv.crt")};
    ssl_certificate_key {pki("srv.key")};
    location / {{
      proxy_pass https://motor;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate {pki("ca.crt")};
      proxy_ssl_name localhost;
      proxy_ssl_server_name on;
      proxy_ssl_certificate {pki("cli.crt")};
      proxy_ssl_certificate_key {pki("cli.key")};
      proxy_ssl_session_reuse on;
    }}
  }}"""
    ngx = Nginx(procs, d, body)
    ngx.wait_port(port)
    ctx = ssl.create_default_context(cafile=pki("ca.crt"))
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)
    for _ in range(3):
        c.request("POST", "/v1/chat/completions", body=json.dumps(chat_body()),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        assert r.status == 200, (data, ngx.log("error.log")[-2000:])
        assert json.loads(data)["usage"]["completion_tokens"] == 4
    c.request("POST", "/v1/chat/completions", body=json.dumps(chat_body(stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    assert r.status == 200 and data.rstrip().endswith("data: [DONE]"), data
    c.close()
    # nginx kept one upstream TLS connection for the four requests
    assert len(coord.find_events("tls_handshake_done", server="coordinator-infer")) == 1, \
        coord.find_events("tls_handshake_done")
    assert not coord.find_events("tls_handshake_failed")


def test_nginx_as_tls_engine_behind_coordinator(procs, tmpdir_path, pki):
    """coordinator --TLS, client certificate required by nginx--> nginx (playing vLLM)."""
    port = motorlib.free_port()
    d = os.path.join(tmpdir_path, "nginx")
    os.makedirs(d)
    answer = json.dumps({"id": "cmpl-ngx", "object": "chat.completion", "model": "m",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "from nginx"}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})
    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]})
    body = f"""
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {pki("srv.crt")};
    ssl_certificate_key {pki("srv.key")};
    ssl_client_certificate {pki("ca.crt")};
    ssl_verify_client on;
    keepalive_requests 1000;
    location = /v1/models {{ default_type application/json; return 200 '{models}'; }}
    location = /health {{ return 200; }}
    location = /v1/chat/completions {{
      default_type application/json;
      return 200 '{answer}';
    }}
  }}"""
    ngx = Nginx(procs, d, body)
    ngx.wait_port(port)
    coord = tls_coordinator(procs, tmpdir_path, pki)
    # no model_name: the coordinator asks the engine's /v1/models, over TLS as well
    coord_refresh(coord, pki, {"event": "set", "instances": [
        {"id": 1, "role": "union", "endpoints": [{"id": 0, "address": f"127.0.0.1:{port}"}]}]})
    ctx = client_ctx(pki)
    for _ in range(4):
        r = motorlib.post(f"https://127.0.0.1:{coord.infer_port}/v1/chat/completions",
                          chat_body(), 10, context=ctx)
        assert r.status == 200, r
        assert r.json()["choices"][0]["message"]["content"] == "from nginx"
    log = ngx.log("access.log")
    assert log.count('"GET /v1/models HTTP/1.1" 200') == 1, log
    posts = [x.split() for x in log.splitlines() if "/v1/chat/completions" in x]
    assert len(posts) == 4 and all(p[2] in ("TLSv1.3", "TLSv1.2") for p in posts), log
    # keep-alive towards the engine: one TLS connection for the four requests
    assert len({p[0] for p in posts}) == 1, log
    assert not coord.find_events("upstream_failed")


def test_coordinator_refuses_engine_with_wrong_name_or_ca(procs, tmpdir_path, pki):
    """Verification is on towards engines: a simulator with a certificate from another CA
    fails the handshake, said in the log; the client gets an error, not a hang."""
    sim = motorlib.start_sim(procs, "--model", "m", "--ssl-certfile", pki("other-srv.crt"),
                             "--ssl-keyfile", pki("other-srv.key"), name="sim-other")
    coord = tls_coordinator(procs, tmpdir_path, pki)
    coord_refresh(coord, pki, {"event": "set", "model_name": "m", "instances": [
        {"id": 1, "role": "union", "endpoints": [{"id": 0, "address": f"127.0.0.1:{sim.port}"}]}]})
    r = motorlib.post(f"https://127.0.0.1:{coord.infer_port}/v1/chat/completions", chat_body(),
                      20, context=client_ctx(pki))
    assert r.status in (502, 503), r
    ev = motorlib.wait_for(lambda: coord.find_events("upstream_failed"), 5, what="upstream_failed")
    assert "certificate" in json.dumps(ev).lower() or "verify" in json.dumps(ev).lower(), ev


def test_register_and_status_over_https(procs, tmpdir_path, pki):
    sim = motorlib.start_sim(procs, "--model", "m", "--ssl-certfile", pki("srv.crt"),
                             "--ssl-keyfile", pki("srv.key"), name="sim")
    coord = tls_coordinator(procs, tmpdir_path, pki)
    base = ["--coordinator", "https://127.0.0.1", "--mgmt-port", str(coord.mgmt_port)]
    tls = ["--ca-file", pki("ca.crt"), "--cert-file", pki("cli.crt"), "--key-file", pki("cli.key")]

    def register(*args):
        return subprocess.run([motorlib.motor_bin(), "register", *args], capture_output=True,
                              text=True, timeout=60)
    # without the CA: verification fails, said plainly
    r = register("set", "--union", f"127.0.0.1:{sim.port}", "--timeout", "2", "--model-name", "m",
                 "--no-health-check", *base)
    assert r.returncode != 0
    assert "certificate" in r.stderr.lower() or "verify" in r.stderr.lower(), r.stderr
    # with the CA and client certificate; the engine probed over https (--engine-tls)
    r = register("set", "--union", f"127.0.0.1:{sim.port}", "--engine-tls", *base, *tls)
    assert r.returncode == 0, r.stderr
    r = register("list", *base, *tls)
    assert r.returncode == 0 and f"127.0.0.1:{sim.port}" in r.stdout, (r.stdout, r.stderr)
    # motor status over https with the same files (the controller is not asked here)
    r = subprocess.run([motorlib.motor_bin(), "status", "--coordinator",
                        f"https://127.0.0.1:{coord.mgmt_port}", "--controller", "none",
                        "--json", *tls], capture_output=True, text=True, timeout=30)
    model = json.loads(r.stdout)
    assert model["coordinator"]["reachable"], model
    assert [p["id"] for p in model["pools"]] != [], model
    r = motorlib.post(f"https://127.0.0.1:{coord.infer_port}/v1/chat/completions", chat_body(),
                      20, context=client_ctx(pki))
    assert r.status == 200, r
