#!/usr/bin/env python3
"""Coordinator vs nginx, side by side, in the same run (CONVENTIONS §22).

Starts engines, Debian's nginx as a plain reverse proxy in front of them, and
`motor coordinator` in front of the same engines; non-streaming and streaming
completions. The default engines are static: an nginx answering a fixed completion (JSON
or SSE) at once, so the numbers measure the proxies, not an engine's scheduling;
`--engine sim` uses `motor engine-sim` instead.

Latency: motor-latprobe (bench/latprobe.c, built next to motor), ONE run per mode and
repetition covering direct (one engine), nginx and the coordinator: one keep-alive
connection per target, one request at a time, the targets interleaved in batches (the
first target rotates every round), nanosecond timing. A proxy adds 10-20 us here; with
wrk -c1 (1 us histogram buckets, one run per target) the machine's drift between runs
landed on one target, interleaving spreads it over all three. Added = proxied percentile
minus direct percentile of the same probe run; paired = median over rounds of (proxied
batch median minus direct batch median of the same round), the figure least moved by
drift. Requests/s: wrk with many connections, one run per proxy.
Target (issue #5): coordinator's added latency within 1.2x nginx's.

usage: bench/coordinator_vs_nginx.py [--motor PATH] [--seconds 5] [--connections 16]
                                     [--threads 2] [--workers 2] [--engines 2]
                                     [--engine static|sim] [--runs 1] [--pin CPUS]
                                     [--requests 20000] [--batch 50]
With --runs N every measurement is repeated N times (same processes) and each figure is
printed as the median with the min-max range; ratios are medians of the per-run ratios.
Needs: nginx, wrk (apt-get install nginx-light wrk), motor-latprobe next to --motor.
Standard library only.
"""

import argparse
import ctypes
import json
import statistics
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"port {port} not listening")


def wait_log(path, event, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in Path(path).read_text(errors="replace").splitlines():
            if line.startswith("{") and f'"event":"{event}"' in line:
                return json.loads(line)
        time.sleep(0.02)
    raise TimeoutError(f"no {event} in {path}")


UNIT = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def parse_wrk(out):
    lat = {}
    for pct, val, unit in re.findall(r"^\s+(50|99)(?:\.000)?%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
        lat[pct] = float(val) * UNIT[unit]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_err = re.search(r"Socket errors: (.*)", out)
    return {"p50": lat.get("50"), "p99": lat.get("99"), "rps": rps,
            "non2xx": int(errors.group(1)) if errors else 0,
            "socket_errors": socket_err.group(1) if socket_err else ""}


def pin_prefix(args):
    """taskset prefix when --pin is given: every process of the run on the same CPUs."""
    return ["taskset", "-c", args.pin] if args.pin else []


def wrk(url, body, args, tmp):
    script = Path(tmp) / "post.lua"
    script.write_text('wrk.method = "POST"\n'
                      'wrk.headers["Content-Type"] = "application/json"\n'
                      f"wrk.body = {json.dumps(json.dumps(body))}\n")
    cmd = pin_prefix(args) + ["wrk", f"-t{args.threads}", f"-c{args.connections}",
                              f"-d{args.seconds}s", "--latency", "-s", str(script), url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return parse_wrk(out.stdout)


def latprobe(probe, ports, body, args, tmp):
    """One interleaved motor-latprobe run over ports ({name: port}, the reference first);
    returns {name: target dict} (latencies in us)."""
    bf = Path(tmp) / "latprobe-body.json"
    bf.write_text(json.dumps(body))
    cmd = pin_prefix(args) + [probe, "--requests", str(args.requests), "--batch",
                              str(args.batch), "--body-file", str(bf)]
    cmd += [f"{n}={p}" for n, p in ports.items()]
    out = subprocess.run(cmd, capture_output=True, text=True,
                         timeout=120 + args.requests * len(ports) * 0.005)
    if out.returncode != 0:
        raise RuntimeError(f"motor-latprobe failed: {out.stderr.strip()}")
    return {t["name"]: t for t in json.loads(out.stdout)["targets"]}


NGINX_CONF = """
worker_processes {workers};
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream engines {{
        {servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            proxy_pass http://engines;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


STATIC_CONF = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 1000000;
    {servers}
}}
"""

STATIC_SERVER = """
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            default_type {ctype};
            return 200 '{answer}';
        }}
    }}
"""


def static_completion(max_tokens, stream):
    words = ["tok%d " % i for i in range(max_tokens)]
    if not stream:
        return json.dumps({"id": "cmpl-static", "object": "text_completion", "created": 0,
                           "model": "m", "choices": [{"index": 0, "text": "".join(words),
                                                      "finish_reason": "length"}],
                           "usage": {"prompt_tokens": 2, "completion_tokens": max_tokens,
                                     "total_tokens": max_tokens + 2}})
    out = ""
    for w in words:
        out += "data: " + json.dumps({"id": "cmpl-static", "object": "text_completion",
                                      "created": 0, "model": "m",
                                      "choices": [{"index": 0, "text": w}]}) + "\n\n"
    return out + "data: [DONE]\n\n"


def nginx_str(text):
    """A single-quoted nginx string: backslash and quote escaped; newlines stay literal
    (nginx keeps them inside a quoted string)."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--motor", default=os.environ.get("MOTOR_BIN") or str(REPO / "build" / "motor"))
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--engine", choices=("static", "sim"), default="static")
    ap.add_argument("--runs", type=int, default=1, help="repeat every measurement N times")
    ap.add_argument("--requests", type=int, default=20000,
                    help="motor-latprobe: timed requests per target, mode and run")
    ap.add_argument("--batch", type=int, default=50,
                    help="motor-latprobe: requests to one target before the next")
    ap.add_argument("--pin", default="",
                    help="CPU list for taskset (e.g. 1): run engines, proxies and wrk there; "
                         "on a small VM this removes cross-CPU wake-up noise from latency")
    args = ap.parse_args()
    for tool in ("nginx", "wrk"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            sys.exit(f"{tool} not found (apt-get install nginx-light wrk)")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    probe = os.path.join(os.path.dirname(os.path.abspath(args.motor)), "motor-latprobe")
    if not os.access(probe, os.X_OK):
        sys.exit(f"{probe} not found: motor-latprobe is built next to motor from "
                 f"bench/latprobe.c (ninja -C <build dir> motor-latprobe)")
    tmp = tempfile.mkdtemp(prefix="motor-bench-")
    procs = []

    def die_with_us():
        # A bench killed hard (timeout -s KILL, a CI limit) must not leave nginx or the
        # coordinator behind: they get SIGKILL when this process dies.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    def start(argv, log):
        f = open(os.path.join(tmp, log), "wb")
        p = subprocess.Popen(pin_prefix(args) + argv, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=die_with_us)
        procs.append(p)
        return p

    static = {"proc": None, "ports": []}

    def start_static(stream):
        """(Re)start the static engines answering a stream or a JSON completion."""
        if static["proc"] is not None:
            static["proc"].terminate()
            static["proc"].wait(10)
            procs.remove(static["proc"])
        sdir = os.path.join(tmp, "static-sse" if stream else "static-json")
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(sdir, d), exist_ok=True)
        conf = Path(sdir) / "nginx.conf"
        answer = nginx_str(static_completion(args.max_tokens, stream))
        ctype = "text/event-stream" if stream else "application/json"
        conf.write_text(STATIC_CONF.format(tmp=sdir, servers="\n".join(
            STATIC_SERVER.format(port=p, ctype=ctype, answer=answer) for p in static["ports"])))
        p = start([nginx, "-p", sdir, "-c", str(conf), "-g", "daemon off;"],
                  "static-sse.log" if stream else "static-json.log")
        for port in static["ports"]:
            wait_port(port, p)
        static["proc"] = p

    try:
        engines = []
        if args.engine == "sim":
            for i in range(args.engines):
                port = free_port()
                p = start([args.motor, "engine-sim", "--model", "m", "--port", str(port),
                           "--ttft-ms", "0", "--tokens-per-second", "0", "--log-level", "warn"],
                          f"sim{i}.log")
                wait_port(port, p)
                engines.append(port)
        else:
            engines = [free_port() for _ in range(args.engines)]
            static["ports"] = engines
            start_static(False)

        nport = free_port()
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(tmp, d), exist_ok=True)
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(
            workers=args.workers, tmp=tmp, port=nport,
            servers="\n        ".join(f"server 127.0.0.1:{p};" for p in engines)))
        p = start([nginx, "-p", tmp, "-c", str(conf), "-g", "daemon off;"], "nginx.log")
        wait_port(nport, p)

        p = start([args.motor, "coordinator", "--port", "0", "--mgmt-port", "0", "--workers",
                   str(args.workers), "--log-level", "info"], "coordinator.log")
        ev = wait_log(os.path.join(tmp, "coordinator.log"), "coordinator_listening")
        cport, mport = ev["infer_port"], ev["mgmt_port"]
        body = {"event": "set", "model_name": "m", "instances": [
            {"id": i + 1, "role": "union",
             "endpoints": [{"id": 0, "address": f"127.0.0.1:{port}"}]}
            for i, port in enumerate(engines)]}
        req = urllib.request.Request(f"http://127.0.0.1:{mport}/instances/refresh",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()

        # the probe's reference ("direct", one engine) must come first
        ports = {"direct": engines[0], "nginx": nport, "coordinator": cport}
        # Latency: one request at a time per connection, so the number is the per-request
        # cost of the path, not queueing; all three targets interleaved in one probe run.
        # Throughput: args.connections connections spread over every engine.
        warm = argparse.Namespace(**{**vars(args), "seconds": 1})
        runs = []
        for _ in range(max(1, args.runs)):
            results = {}
            for mode, stream in (("non-stream", False), ("stream", True)):
                if args.engine == "static":
                    start_static(stream)
                req_body = {"model": "m", "prompt": "benchmark prompt",
                            "max_tokens": args.max_tokens, "stream": stream}
                lat = latprobe(probe, ports, req_body, args, tmp)
                for name in ports:
                    t = lat[name]
                    results[(mode, "lat", name)] = {
                        "p50": t["p50_us"], "p99": t["p99_us"],
                        "add50": t.get("added_p50_us", 0.0),
                        "add99": t.get("added_p99_us", 0.0),
                        "paired50": t.get("added_paired_p50_us", 0.0)}
                for name in ("nginx", "coordinator"):
                    url = f"http://127.0.0.1:{ports[name]}/v1/completions"
                    wrk(url, req_body, warm, tmp)
                    results[(mode, "tput", name)] = wrk(url, req_body, args, tmp)
            runs.append(results)

        def ratio(a, b):
            return a / b if b > 0 else float("inf")

        def fig(key, field, fmt):
            """Median of one figure over the runs, with the range when there are several."""
            vals = [r[key][field] for r in runs]
            med = statistics.median(vals)
            if len(vals) == 1:
                return fmt.format(med)
            return f"{fmt.format(med)} ({fmt.format(min(vals))}-{fmt.format(max(vals))})"

        def rat(mode, kind, field):
            vals = [ratio(r[(mode, kind, "coordinator")][field], r[(mode, kind, "nginx")][field])
                    for r in runs]
            med = statistics.median(vals)
            if len(vals) == 1:
                return f"x{med:.2f}"
            return f"x{med:.2f} ({min(vals):.2f}-{max(vals):.2f})"

        print(f"\ncoordinator vs nginx: {args.engines} {args.engine} engines, "
              f"{args.workers} workers each, max_tokens {args.max_tokens}, {args.seconds}s runs, "
              f"{len(runs)} repetition(s)" + (", median (min-max)" if len(runs) > 1 else "") + "\n")
        print(f"latency, motor-latprobe ({args.requests} requests per target, batches of "
              f"{args.batch}, targets interleaved): added = proxy minus direct, us")
        print(f"  {'mode':<11}{'target':<13}{'p50':>22}{'p99':>22}{'+p50':>22}{'+p99':>22}"
              f"{'paired +p50':>22}")
        for mode in ("non-stream", "stream"):
            for name in ("direct", "nginx", "coordinator"):
                k = (mode, "lat", name)
                print(f"  {mode:<11}{name:<13}{fig(k, 'p50', '{:.1f}'):>22}"
                      f"{fig(k, 'p99', '{:.1f}'):>22}{fig(k, 'add50', '{:.1f}'):>22}"
                      f"{fig(k, 'add99', '{:.1f}'):>22}{fig(k, 'paired50', '{:.1f}'):>22}")
        print(f"\nthroughput, wrk -t{args.threads} -c{args.connections}")
        print(f"  {'mode':<11}{'target':<13}{'req/s':>22}{'p50 ms':>22}{'p99 ms':>22}")
        for mode in ("non-stream", "stream"):
            for name in ("nginx", "coordinator"):
                k = (mode, "tput", name)
                print(f"  {mode:<11}{name:<13}{fig(k, 'rps', '{:.0f}'):>22}"
                      f"{fig(k, 'p50', '{:.3f}'):>22}{fig(k, 'p99', '{:.3f}'):>22}")
        print("\ncoordinator / nginx (added latency: lower is better, target <= 1.2; "
              "req/s: higher is better)")
        for mode in ("non-stream", "stream"):
            print(f"  {mode:<11} added p50 {rat(mode, 'lat', 'add50')}   "
                  f"added p99 {rat(mode, 'lat', 'add99')}   "
                  f"paired added p50 {rat(mode, 'lat', 'paired50')}   "
                  f"req/s {rat(mode, 'tput', 'rps')}")
        bad = [(k, r) for results in runs for k, r in results.items()
               if r.get("non2xx") or r.get("socket_errors")]
        if bad:
            print("\nwarning: some requests failed:", bad)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
