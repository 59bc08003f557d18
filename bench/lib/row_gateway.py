"""row_gateway — Motor's coordinator versus nginx as a reverse proxy, in front of the same
simulated engine, in the same run.

One `motor engine-sim --tokens-per-second 0 --ttft-ms 0` engine; nginx (upstream block
with keep-alive, proxy_buffering off so SSE is not held back) and `motor coordinator`
(the engine registered through POST /instances/refresh on its management port) in front
of it, both with 2 workers. wrk POSTs /v1/completions (max_tokens 16) directly to the
engine, through nginx and through the coordinator, non-streaming and streaming: once
with one connection (latency: what the hop itself costs) and once with many (req/s).
Added latency = through-proxy percentile − direct percentile of the same repetition.
"""

from __future__ import annotations

from typing import Optional

from . import common as C
from . import wrk
from .ctx import Ctx
from .report import Row

GROUP = "Gateway: coordinator vs nginx reverse proxy"
WORKERS = 2
MAX_TOKENS = 16


def _why_not(ctx: Ctx) -> Optional[str]:
    if "coordinator" not in ctx.motor_cmds:
        return "`motor coordinator` not in this build yet"
    if "engine-sim" not in ctx.motor_cmds:
        return "`motor engine-sim` not in this build"
    return wrk.available() or wrk.nginx_available()


def _nginx_conf(port: int, engine_port: int) -> str:
    return f"""
    upstream engines {{
        server 127.0.0.1:{engine_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://engines;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}"""


def run(ctx: Ctx) -> list[Row]:
    why = _why_not(ctx)
    modes = (("non-stream", False), ("stream", True))
    runs: dict[tuple[str, str], list[dict]] = {}
    err = None
    if why is None:
        sess = C.Session("gw")
        try:
            eport = C.free_port()
            e = sess.start([ctx.motor, "engine-sim", "--model", "m", "--port", str(eport),
                            "--ttft-ms", "0", "--tokens-per-second", "0", "--load-seconds", "0",
                            "--log-level", "warn"], "engine.log")
            C.wait_port(eport, 15, e)
            nport = C.free_port()
            wrk.start_nginx(sess, WORKERS, _nginx_conf(nport, eport), nport)
            clog = sess.path("coordinator.log")
            c = sess.start([ctx.motor, "coordinator", "--port", "0", "--mgmt-port", "0",
                            "--workers", str(WORKERS), "--log-level", "info"], "coordinator.log")
            ev = C.wait_log_event(clog, "coordinator_listening", 15, c)
            cport, mport = ev["infer_port"], ev["mgmt_port"]
            body = {"event": "set", "model_name": "m", "instances": [
                {"id": 1, "role": "union",
                 "endpoints": [{"id": 0, "address": f"127.0.0.1:{eport}"}]}]}
            st, b = C.http_post_json(f"http://127.0.0.1:{mport}/instances/refresh", body)
            if st // 100 != 2:
                raise RuntimeError(f"coordinator refresh answered {st}: {b[:200]!r}")
            targets = {"direct": f"http://127.0.0.1:{eport}",
                       "nginx": f"http://127.0.0.1:{nport}",
                       "coordinator": f"http://127.0.0.1:{cport}"}
            for url in targets.values():
                st, b = C.http_post_json(url + "/v1/completions",
                                         {"model": "m", "prompt": "x", "max_tokens": 4})
                if st != 200:
                    raise RuntimeError(f"{url}: {st} {b[:200]!r}")
            for rep in range(ctx.reps):
                for mode, stream in modes:
                    req = {"model": "m", "prompt": "benchmark prompt", "max_tokens": MAX_TOKENS,
                           "stream": stream}
                    names = list(targets)
                    if rep % 2:
                        names.reverse()
                    for name in names:
                        url = targets[name] + "/v1/completions"
                        C.log(f"gateway rep {rep + 1}/{ctx.reps}: {mode} via {name}")
                        if rep == 0:  # warm-up: connection pools, caches
                            wrk.run(url, 1, ctx.wrk_threads, ctx.wrk_connections, req, sess.tmp)
                        lat = wrk.run(url, ctx.gw_seconds, 1, 1, req, sess.tmp)
                        thr = wrk.run(url, ctx.gw_seconds, ctx.wrk_threads, ctx.wrk_connections,
                                      req, sess.tmp)
                        r = {"p50": lat["p50"], "p99": lat["p99"], "rps": thr["rps"],
                             "loaded_p50": thr["p50"], "loaded_p99": thr["p99"],
                             "c1_rps": lat["rps"]}
                        runs.setdefault((mode, name), []).append(r)
                        C.log(f"  1 connection: p50 {r['p50']:.3f} ms  p99 {r['p99']:.3f} ms; "
                              f"{ctx.wrk_connections} connections: {r['rps']:.0f} req/s")
        except Exception as ex:
            err = f"{type(ex).__name__}: {ex}"
            C.log(f"  error: {err}")
        finally:
            swept = sess.close()
            if swept:
                C.log(f"  swept {len(swept)} leftover process(es)")

    notes = [f"Gateway: one engine simulator (--tokens-per-second 0 --ttft-ms 0), nginx "
             f"(upstream keep-alive, proxy_buffering off) and the coordinator, {WORKERS} workers "
             f"each; POST /v1/completions max_tokens {MAX_TOKENS}, a 1 s warm-up of each target "
             f"and mode in the first repetition, then latency "
             f"with wrk -t1 -c1 -d{ctx.gw_seconds}s (one request at a time: the proxy's own "
             f"cost, not queueing) and req/s with wrk -t{ctx.wrk_threads} "
             f"-c{ctx.wrk_connections} -d{ctx.gw_seconds}s. Added latency = proxied − direct "
             f"percentile of the same repetition; wrk, the proxy and the engine share the "
             f"machine's CPUs."]
    rows = []

    def added(mode: str, who: str, key: str) -> list[float]:
        d = runs.get((mode, "direct"), [])
        p = runs.get((mode, who), [])
        return [x[key] - y[key] for x, y in zip(p, d)]

    for mode, _ in modes:
        specs = [("added p50", "p50", "ms", "lower", "≤ 1.2 × nginx"),
                 ("added p99", "p99", "ms", "lower", "≤ 1.2 × nginx"),
                 ("req/s", "rps", "req/s", "higher", None)]
        for metric, key, unit, better, target in specs:
            if key == "rps":
                m = C.summary(r[key] for r in runs.get((mode, "coordinator"), []))
                p = C.summary(r[key] for r in runs.get((mode, "nginx"), []))
            else:
                m = C.summary(added(mode, "coordinator", key))
                p = C.summary(added(mode, "nginx", key))
            row = Row(id=f"gateway.{mode}.{key}", group=GROUP,
                      workload=f"POST /v1/completions, {mode}", metric=metric, unit=unit,
                      better=better, motor=m, motor_label="coordinator",
                      peer_name=f"nginx {wrk.nginx_version() or ''} proxy".replace("  ", " "),
                      peer=p, reps=min(m["n"] if m else 0, p["n"] if p else 0),
                      target=target, notes=notes,
                      extra={"direct": runs.get((mode, "direct"), []),
                             "coordinator": runs.get((mode, "coordinator"), []),
                             "nginx": runs.get((mode, "nginx"), [])})
            if m is None or p is None:
                row.status = "pending" if why else "error"
                row.reason = why or err or "no data"
            rows.append(row)
    return rows
