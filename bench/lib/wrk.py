"""wrk and nginx helpers: run wrk --latency and parse it; start nginx in a session."""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Optional

from . import common as C

UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def available() -> Optional[str]:
    if not C.which("wrk"):
        return "wrk not installed (apt-get install wrk)"
    return None


def nginx_available() -> Optional[str]:
    if not C.which("nginx"):
        return "nginx not installed (apt-get install nginx-light)"
    return None


def parse(out: str) -> dict:
    lat = {}
    for pct, val, unit in re.findall(r"^\s+(50|75|90|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m)\s*$",
                                     out, re.M):
        lat[pct] = float(val) * UNIT_MS[unit]
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m or "50" not in lat or "99" not in lat:
        raise RuntimeError(f"cannot parse wrk output:\n{out[-800:]}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                     out)
    total = re.search(r"(\d+) requests in", out)
    return {"p50": lat["50"], "p99": lat["99"], "rps": float(m.group(1)),
            "requests": int(total.group(1)) if total else None,
            "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "socket_errors": sum(int(x) for x in sock.groups()) if sock else 0}


def run(url: str, seconds: int, threads: int, connections: int,
        post_body: Optional[dict] = None, tmp: Optional[str] = None) -> dict:
    cmd = [C.which("wrk"), f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency"]
    if post_body is not None:
        assert tmp
        script = os.path.join(tmp, "post.lua")
        with open(script, "w") as f:
            f.write('wrk.method = "POST"\n'
                    'wrk.headers["Content-Type"] = "application/json"\n'
                    f"wrk.body = {json.dumps(json.dumps(post_body))}\n")
        cmd += ["-s", script]
    cmd.append(url)
    # wrk is short-lived and runs in the foreground; a timeout kills it
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60,
                         start_new_session=True)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed: {out.stderr.strip()[:400]}")
    r = parse(out.stdout)
    if r["requests"] is not None and r["non2xx"] >= max(1, r["requests"] // 100):
        raise RuntimeError(f"{url}: {r['non2xx']} of {r['requests']} responses not 2xx")
    return r


NGINX_HEAD = """
worker_processes {workers};
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/ngx-body;
    proxy_temp_path {tmp}/ngx-proxy;
    fastcgi_temp_path {tmp}/ngx-fastcgi;
    uwsgi_temp_path {tmp}/ngx-uwsgi;
    scgi_temp_path {tmp}/ngx-scgi;
{body}
}}
"""


def start_nginx(sess: C.Session, workers: int, http_body: str, port: int):
    tmp = sess.tmp
    # nginx workers run as an unprivileged user: they must be able to enter the dir
    os.chmod(tmp, 0o755)
    for d in ("ngx-body", "ngx-proxy", "ngx-fastcgi", "ngx-uwsgi", "ngx-scgi"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    conf = sess.path("nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_HEAD.format(workers=workers, tmp=tmp, body=http_body))
    p = sess.start([C.which("nginx"), "-p", tmp, "-c", conf, "-g", "daemon off;"],
                   "nginx.log")
    C.wait_port(port, 15, p)
    return p


def nginx_version() -> Optional[str]:
    try:
        r = subprocess.run([C.which("nginx"), "-v"], capture_output=True, text=True, timeout=5)
        return r.stderr.strip().split("/")[-1]
    except (OSError, subprocess.TimeoutExpired, TypeError):
        return None
