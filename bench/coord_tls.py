#!/usr/bin/env python3
"""TLS rows: the coordinator and the node manager over TLS next to nginx with the same
certificates, in the same run (issue 13, deliverable 7).

Certificates: tests/fixtures/mkcerts.sh (EC P-256; server certificate for 127.0.0.1).
Every TLS listener of the gateway rows asks for a client certificate (mutual TLS, as
`motor up --tls` runs): the coordinator's `infer_tls_config` with `ca_file`, nginx with
`ssl_verify_client on`, the same files.

* Gateway added latency over TLS: a static engine (nginx, 1 worker, a fixed completion
  JSON), behind it nginx (2 workers, upstream keep-alive) and `motor coordinator`
  (2 workers), both serving the client over TLS. Two modes: engine plain (coordinator
  `engine_tls: false`; nginx `proxy_pass http://`) and engine TLS (the engine's TLS port
  requires a client certificate; coordinator `engine_tls: true`, nginx `proxy_pass
  https://` with `proxy_ssl_certificate`, `proxy_ssl_verify on`, session reuse).
  motor-latprobe (bench/latprobe.c, `tls:` targets) times one request at a time per
  keep-alive TLS connection, the targets interleaved batch by batch: direct (the engine:
  plain, or TLS in the TLS mode), nginx, coordinator. Added = proxied − direct percentile.
* New TLS handshakes per second: `openssl s_time -new` (a full handshake per connection,
  no resumption, TLS 1.3, client certificate) against the coordinator's inference port
  and nginx's TLS port; one s_time process (the client's own handshake work is in the
  figure for both).
* Management API over TLS: `GET /node-manager/status` of a standalone node manager with
  `mgmt_tls_config` (server authentication only: wrk cannot present a client
  certificate) vs nginx (1 worker) serving the same bytes over TLS; wrk https.

usage: bench/coord_tls.py [--motor PATH] [--seconds S]      (motor-bench-plugin: 1)
Environment: BENCH_QUICK, BENCH_REPS, BENCH_GW_REQUESTS, BENCH_GW_BATCH, BENCH_WRK_*.
Needs nginx, wrk, openssl, motor-latprobe next to --motor. Everything on 127.0.0.1;
leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1
from lib import latprobe, wrk  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import motorlib  # noqa: E402

GROUP_GW = "Gateway over TLS: coordinator vs nginx, same certificates"
GROUP_HS = "New TLS handshakes: coordinator vs nginx"
GROUP_MG = "Management API over TLS: GET /node-manager/status"
WORKERS = 2
ANSWER = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "m",
                     "choices": [{"index": 0, "text": "a b c d", "finish_reason": "length"}],
                     "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}})
REQ = {"model": "m", "prompt": "hello", "max_tokens": 4}


def nginx_conf(d: str, workers: int, body: str) -> str:
    return f"""
worker_processes {workers};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 1000000;
{body}
}}
"""


def start_nginx(reg: motorlib.ProcRegistry, d: str, workers: int, body: str, ports: list[int],
                name: str) -> None:
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o755)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(nginx_conf(d, workers, body))
    p = reg.start([shutil.which("nginx"), "-p", d, "-c", conf, "-g", "daemon off;"], name=name)
    for port in ports:
        motorlib.wait_for(lambda port=port: not motorlib.port_is_free(port), 15,
                          what=f"{name} on {port}")
    if not p.alive():
        raise RuntimeError(f"{name} exited: {p.tail()}")


def ssl_server(pki, port: int, verify: bool = True) -> str:
    v = f"ssl_client_certificate {pki('ca.crt')}; ssl_verify_client on;" if verify else ""
    return (f"listen 127.0.0.1:{port} ssl reuseport; ssl_certificate {pki('srv.crt')}; "
            f"ssl_certificate_key {pki('srv.key')}; ssl_protocols TLSv1.2 TLSv1.3; {v}")


def s_time(pki, port: int, seconds: int) -> float:
    """Full handshakes per second (openssl s_time -new)."""
    r = subprocess.run(["openssl", "s_time", "-connect", f"127.0.0.1:{port}", "-new", "-time",
                        str(seconds), "-CAfile", pki("ca.crt"), "-cert", pki("cli.crt"),
                        "-key", pki("cli.key"), "-verify", "2"],
                       capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"(\d+) connections in (\d+) real seconds", r.stdout)
    if not m or int(m.group(1)) == 0:
        raise RuntimeError(f"openssl s_time: {r.stdout[-400:]} {r.stderr[-400:]}")
    # s_time prints whole seconds of real time; the user-time line has the finer figure
    # for the client only, so the real figure is used: connections / real seconds
    return int(m.group(1)) / max(1, int(m.group(2)))


def coordinator(reg, tmp, pki, engine_tls: bool, name: str):
    cfg = {"motor_coordinator_config": {"logging_config": {"log_level": "WARNING"}},
           "motor_deploy_config": {"tls_config": {"infer_tls_config": {
               "enable_tls": True, "cert_file": pki("srv.crt"), "key_file": pki("srv.key"),
               "ca_file": pki("ca.crt"), "engine_tls": engine_tls}}}}
    path = os.path.join(tmp, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    infer, mgmt = motorlib.free_port(), motorlib.free_port()
    p = reg.motor("coordinator", "--config", path, "--port", infer, "--mgmt-port", mgmt,
                  "--workers", WORKERS, name=name)
    motorlib.wait_http(f"http://127.0.0.1:{mgmt}/liveness", 200, timeout=15, proc=p)
    return p, infer, mgmt


def measure(a, pki, tmp, reg, probe, requests, batch, seconds) -> dict:
    out: dict = {"gw": {"plain": [], "tls": []}, "hs": {"coordinator": [], "nginx": []},
                 "mg": {"motor": [], "nginx": []}}
    # the static engine: plain and TLS ports, one worker
    ep, etp = motorlib.free_port(), motorlib.free_port()
    engine = f"""
  server {{ listen 127.0.0.1:{ep} reuseport;
    location / {{ default_type application/json; return 200 '{ANSWER}'; }} }}
  server {{ {ssl_server(pki, etp)}
    location / {{ default_type application/json; return 200 '{ANSWER}'; }} }}"""
    start_nginx(reg, os.path.join(tmp, "engine"), 1, engine, [ep, etp], "nginx-engine")
    # nginx as the TLS gateway, both modes
    na, nb = motorlib.free_port(), motorlib.free_port()
    proxy = f"""
  upstream plain {{ server 127.0.0.1:{ep}; keepalive 64; }}
  upstream tls {{ server 127.0.0.1:{etp}; keepalive 64; }}
  server {{ {ssl_server(pki, na)}
    location / {{ proxy_pass http://plain; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_buffering off; }} }}
  server {{ {ssl_server(pki, nb)}
    location / {{ proxy_pass https://tls; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_buffering off;
      proxy_ssl_verify on; proxy_ssl_trusted_certificate {pki('ca.crt')};
      proxy_ssl_name localhost; proxy_ssl_server_name on;
      proxy_ssl_certificate {pki('cli.crt')}; proxy_ssl_certificate_key {pki('cli.key')};
      proxy_ssl_session_reuse on; }} }}"""
    start_nginx(reg, os.path.join(tmp, "proxy"), WORKERS, proxy, [na, nb], "nginx-proxy")
    _, ca_port, ca_mgmt = coordinator(reg, tmp, pki, False, "coord-plain-engine")
    _, cb_port, cb_mgmt = coordinator(reg, tmp, pki, True, "coord-tls-engine")
    for mgmt, port in ((ca_mgmt, ep), (cb_mgmt, etp)):
        r = motorlib.post(f"http://127.0.0.1:{mgmt}/instances/refresh",
                          {"event": "set", "model_name": "m", "instances": [
                              {"id": 1, "role": "union",
                               "endpoints": [{"id": 0, "address": f"127.0.0.1:{port}"}]}]}, 10)
        if r.status != 200:
            raise RuntimeError(f"refresh: {r}")
    modes = {"plain": [("direct", str(ep)), ("nginx", f"tls:{na}"), ("coordinator", f"tls:{ca_port}")],
             "tls": [("direct", f"tls:{etp}"), ("nginx", f"tls:{nb}"),
                     ("coordinator", f"tls:{cb_port}")]}
    bf = os.path.join(tmp, "body.json")
    with open(bf, "w") as f:
        json.dump(REQ, f)
    for rep in range(a.reps):
        for mode, targets in modes.items():
            print(f"rep {rep + 1}/{a.reps}: gateway over TLS, engine {mode}, motor-latprobe "
                  f"{requests} requests per target", flush=True)
            cmd = [probe, "--requests", str(requests), "--batch", str(batch), "--path",
                   "/v1/completions", "--body-file", bf, "--ca-file", pki("ca.crt"),
                   "--cert-file", pki("cli.crt"), "--key-file", pki("cli.key")]
            cmd += [f"{n}={t}" for n, t in targets]
            r = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=120 + requests * 3 * 0.005)
            if r.returncode != 0:
                raise RuntimeError(f"motor-latprobe: {r.stderr.strip()[:400]}")
            doc = {t["name"]: t for t in json.loads(r.stdout)["targets"]}
            out["gw"][mode].append(doc)
            print("  " + "; ".join(f"{n}: p50 {doc[n]['p50_us']:.1f} us p99 "
                                   f"{doc[n]['p99_us']:.1f} us" for n, _ in targets), flush=True)
        order = [("coordinator", ca_port), ("nginx", na)]
        if rep % 2:
            order.reverse()
        for who, port in order:
            hs = s_time(pki, port, seconds)
            out["hs"][who].append(hs)
            print(f"  handshakes/s {who}: {hs:.0f}", flush=True)
    return out


def measure_mgmt(a, pki, tmp, reg, seconds, threads, conns) -> dict:
    from fake_controller import nm_config, start_nm, write_json
    out: dict = {"motor": [], "nginx": [], "body": b""}
    tls = {"enable_tls": True, "cert_file": pki("srv.crt"), "key_file": pki("srv.key"),
           "ca_file": "", "crl_file": ""}
    cfg = nm_config(nm={"mgmt_tls_config": tls, "standalone": True})
    nm = start_nm(reg, write_json(os.path.join(tmp, "nm.json"), cfg), scheme="https")
    import ssl
    ctx = ssl.create_default_context(cafile=pki("ca.crt"))
    r = motorlib.get(f"https://127.0.0.1:{nm.port}/node-manager/status", context=ctx)
    if r.status != 200:
        raise RuntimeError(f"node manager: {r}")
    body = r.body
    out["body"] = body
    www = os.path.join(tmp, "www", "node-manager")
    os.makedirs(www)
    with open(os.path.join(www, "status"), "wb") as f:
        f.write(body)
    os.chmod(os.path.join(tmp, "www"), 0o755)
    os.chmod(www, 0o755)
    os.chmod(os.path.join(www, "status"), 0o644)
    port = motorlib.free_port()
    start_nginx(reg, os.path.join(tmp, "static"), 1, f"""
  server {{ {ssl_server(pki, port, verify=False)} root {tmp}/www;
    location = /node-manager/status {{ default_type application/json; }} }}""",
                [port], "nginx-static")
    got = motorlib.get(f"https://127.0.0.1:{port}/node-manager/status", context=ctx)
    if got.status != 200 or got.body != body:
        raise RuntimeError(f"nginx answers {got.status} {got.body[:100]!r}")
    for rep in range(a.reps):
        order = [("motor", nm.port), ("nginx", port)]
        if rep % 2:
            order.reverse()
        for who, p in order:
            url = f"https://127.0.0.1:{p}/node-manager/status"
            wrk.run(url, 1, threads, conns)
            res = wrk.run(url, seconds, threads, conns)
            out[who].append(res)
            print(f"  mgmt over TLS {who}: {res['rps']:.0f} req/s p50 {res['p50']:.3f} ms "
                  f"p99 {res['p99']:.3f} ms", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--motor", default=None)
    ap.add_argument("--seconds", type=int, default=0)
    a = plugin.args(ap)
    os.environ["MOTOR_BIN"] = a.motor  # motorlib starts this binary (a release build)
    requests = int(os.environ.get("BENCH_GW_REQUESTS", "0")) or (5000 if a.quick else 20000)
    batch = int(os.environ.get("BENCH_GW_BATCH", "0")) or 50
    seconds = a.seconds or int(os.environ.get("BENCH_WRK_SECONDS", "0")) or (3 if a.quick else 10)
    threads = int(os.environ.get("BENCH_WRK_THREADS", "0")) or 2
    conns = int(os.environ.get("BENCH_WRK_CONNECTIONS", "0")) or 16
    probe = latprobe.find(a.motor)
    why = None
    for tool in ("nginx", "wrk", "openssl"):
        if not shutil.which(tool):
            why = f"{tool} not installed"
    if not probe:
        why = latprobe.missing_reason(a.motor)
    nver = wrk.nginx_version() or ""
    gw_work = ("POST /v1/completions to a static engine (nginx, fixed JSON), client over "
               "mutual TLS")
    rows = []
    res, mg, err = None, None, None
    if why is None:
        tmp = tempfile.mkdtemp(prefix="motor-bench-tls-")
        os.chmod(tmp, 0o755)
        reg = motorlib.ProcRegistry(tmp)
        try:
            pd = os.path.join(tmp, "pki")
            subprocess.run([str(REPO / "tests" / "fixtures" / "mkcerts.sh"), pd], check=True,
                           timeout=60, capture_output=True)
            os.chmod(pd, 0o755)
            for f in os.listdir(pd):  # nginx workers run unprivileged
                os.chmod(os.path.join(pd, f), 0o644)

            def pki(n):
                return os.path.join(pd, n)
            res = measure(a, pki, tmp, reg, probe, requests, batch, seconds)
            mg = measure_mgmt(a, pki, tmp, reg, seconds, threads, conns)
        except Exception as e:  # reported as the rows' error
            err = f"{type(e).__name__}: {e}"
            print(f"error: {err}", flush=True)
        finally:
            reg.close_all()
            shutil.rmtree(tmp, ignore_errors=True)
    lat_note = (f"motor-latprobe {requests} timed requests per target per repetition (500 "
                f"warm-up, batches of {batch}, interleaved), one keep-alive TLS connection "
                f"per target (TLS 1.3, client certificate; the handshake happens in the "
                f"warm-up); coordinator and nginx {WORKERS} workers each, free CPU "
                f"placement; added = proxied − direct percentile of the same run")
    for mode, label in (("plain", "engine plain HTTP"), ("tls", "engine over mutual TLS")):
        for q in ("p50", "p99"):
            m = p = None
            if res:
                m = [d["coordinator"][f"added_{q}_us"] / 1000 for d in res["gw"][mode]]
                p = [d["nginx"][f"added_{q}_us"] / 1000 for d in res["gw"][mode]]
            rows.append(plugin.row(
                f"gateway_tls.engine_{mode}.added_{q}", GROUP_GW, f"{gw_work}, {label}",
                f"added {q}", "ms", m, peer_name=f"nginx {nver} proxy", peer=p,
                target="≤ nginx", notes=[lat_note],
                status="ok" if res else ("pending" if why else "error"),
                reason=why or err or "",
                extra={"runs": res["gw"][mode] if res else []}))
    rows.append(plugin.row(
        "tls_handshakes.per_s", GROUP_HS,
        "openssl s_time -new: full TLS 1.3 handshakes with a client certificate, one client "
        "process, against the coordinator's inference port / nginx's TLS port",
        "handshakes/s", "1/s", res["hs"]["coordinator"] if res else None, better="higher",
        peer_name=f"nginx {nver}, {WORKERS} workers", peer=res["hs"]["nginx"] if res else None,
        target="≥ nginx", status="ok" if res else ("pending" if why else "error"),
        reason=why or err or "",
        notes=[f"s_time -time {seconds}; the client's own handshake work is in both figures"]))
    for key, metric, unit, better in (("rps", "req/s", "req/s", "higher"),
                                      ("p50", "p50", "ms", "lower"), ("p99", "p99", "ms", "lower")):
        rows.append(plugin.row(
            f"mgmt_api_tls.{key}", GROUP_MG,
            "GET /node-manager/status over TLS (server authentication), keep-alive",
            metric, unit, [r[key] for r in mg["motor"]] if mg else None, better=better,
            peer_name=f"nginx {nver} static file over TLS, 1 worker",
            peer=[r[key] for r in mg["nginx"]] if mg else None,
            status="ok" if mg else ("pending" if why else "error"), reason=why or err or "",
            notes=[f"wrk -t{threads} -c{conns} -d{seconds}s --latency https, 1 s warm-up; "
                   f"body {len(mg['body']) if mg else '?'} bytes from both"]))
    plugin.emit(a, rows)
    if not a.json:
        for r in rows:
            print(r["id"], r["motor"], r["peer"], r["status"], r["reason"])
    return 0 if (res and mg) or why else 1


if __name__ == "__main__":
    sys.exit(main())
