"""row_gateway — Motor's coordinator versus nginx as a reverse proxy, in front of the same
simulated engine, in the same run.

One `motor engine-sim --tokens-per-second 0 --ttft-ms 0` engine; nginx (upstream block
with keep-alive, proxy_buffering off so SSE is not held back) and `motor coordinator`
(the engine registered through POST /instances/refresh on its management port) in front
of it, both with 2 workers. POST /v1/completions (max_tokens 16) directly to the engine,
through nginx and through the coordinator, non-streaming and streaming, and non-streaming
with a 16 KiB prompt (the coordinator reads the body to route it; nginx only forwards it).

Latency: motor-latprobe (bench/latprobe.c, built next to motor), all three targets in ONE
run per mode and repetition: one keep-alive connection each, one request at a time, the
targets interleaved in batches (the first target of a round rotates), nanosecond timing.
The hop adds 10-20 us here; wrk -c1 (1 us histogram buckets, one run per target) let the
machine's drift between runs land on one target. Added latency = proxied percentile −
direct percentile of the same probe run; the paired figure (median over rounds of
proxied batch median − direct batch median of the same round) is kept in `extra`.
Req/s: wrk with many connections, one run per target.
"""

from __future__ import annotations

from typing import Optional

from . import common as C
from . import latprobe
from . import wrk
from .ctx import Ctx
from .report import Row

GROUP = "Gateway: coordinator vs nginx reverse proxy"
WORKERS = 2
MAX_TOKENS = 16
# Latency is probed twice per mode: free placement, then every process of the row
# (engine, both proxies, the probe) on CPU 0. On one CPU each hand-off is a plain context switch and the
# figure is the proxy's own work per request, reproducible to ~1 us; free placement adds
# the machine's cross-CPU wake-ups (about 35 us each on this VM, measured: the probe and
# the engine alone take 13 us per request on one CPU, 90 us on two), which land on
# whichever hops the scheduler happened to split.
# Free placement runs first: right after a pinned run the scheduler keeps everything on
# CPU 0 for a while, which is neither placement.
PLACEMENTS = (("free_", None), ("", {0}))
# The long-prompt mode: a realistic prompt size (about 4k tokens), which the coordinator
# must read to route while nginx only forwards it.
LONG_PROMPT = ("Summarise the following text in one sentence. " * 350)[:16384]


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
        # Prompts above the default 16 KiB would go to a temporary file first (tens of
        # ms): an operator fronting LLM engines keeps request bodies in memory.
        client_body_buffer_size 1m;
        location / {{
            proxy_pass http://engines;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}"""


def _ms(us: float) -> float:
    return round(us / 1000.0, 6)


def run(ctx: Ctx) -> list[Row]:
    why = _why_not(ctx)
    probe = latprobe.find(ctx.motor)
    why_lat = why or (None if probe else latprobe.missing_reason(ctx.motor))
    # (row id part, workload label, stream, prompt)
    modes = (("non-stream", "non-stream", False, "benchmark prompt"),
             ("stream", "stream", True, "benchmark prompt"),
             ("long-prompt", "non-stream, 16 KiB prompt", False, LONG_PROMPT))
    names = ["direct", "nginx", "coordinator"]  # the probe's reference comes first
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
            ports = {"direct": eport, "nginx": nport, "coordinator": cport}
            for name, port in ports.items():
                url = f"http://127.0.0.1:{port}"
                st, b = C.http_post_json(url + "/v1/completions",
                                         {"model": "m", "prompt": "x", "max_tokens": 4})
                if st != 200:
                    raise RuntimeError(f"{url}: {st} {b[:200]!r}")
            for rep in range(ctx.reps):
                for mode, _, stream, prompt in modes:
                    req = {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS,
                           "stream": stream}
                    order = names[::-1] if rep % 2 else names
                    if rep == 0:  # warm-up: connection pools, caches
                        for name in order:
                            wrk.run(f"http://127.0.0.1:{ports[name]}/v1/completions", 1,
                                    ctx.wrk_threads, ctx.wrk_connections, req, sess.tmp)
                    lat = {}  # placement prefix -> the probe's targets by name
                    for prefix, cpus in PLACEMENTS if probe else ():
                        C.log(f"gateway rep {rep + 1}/{ctx.reps}: {mode}, motor-latprobe "
                              f"{ctx.gw_requests} requests per target, batches of "
                              f"{ctx.gw_batch}, interleaved, "
                              f"{'all processes on CPU 0' if cpus else 'free placement'}")
                        sess.set_affinity(cpus)
                        try:
                            doc = latprobe.run(probe, [(n, ports[n]) for n in names], req,
                                               ctx.gw_requests, ctx.gw_batch, sess.tmp,
                                               cpus=cpus)
                        finally:
                            sess.set_affinity(None)
                        lat[prefix] = doc["by_name"]
                    for name in order:
                        C.log(f"gateway rep {rep + 1}/{ctx.reps}: {mode} via {name}, wrk "
                              f"-c{ctx.wrk_connections}")
                        thr = wrk.run(f"http://127.0.0.1:{ports[name]}/v1/completions",
                                      ctx.gw_seconds, ctx.wrk_threads, ctx.wrk_connections,
                                      req, sess.tmp)
                        r = {"rps": thr["rps"], "loaded_p50": thr["p50"],
                             "loaded_p99": thr["p99"]}
                        for prefix, by_name in lat.items():
                            t = by_name[name]
                            r.update({prefix + k: (_ms(t[k + "_us"]) if k != "n" else t[k])
                                      for k in ("p50", "p90", "p99", "mean", "n")})
                            r[prefix + "reconnects"] = t["reconnects"]
                            if "added_p50_us" in t:
                                r.update({prefix + k: _ms(t[k + "_us"])
                                          for k in ("added_p50", "added_p90", "added_p99",
                                                    "added_paired_p50")})
                        runs.setdefault((mode, name), []).append(r)
                    for prefix, t in lat.items():
                        C.log(f"  {prefix or 'one CPU: '}" + "; ".join(
                            f"{n}: p50 {t[n]['p50_us']:.1f} us p99 {t[n]['p99_us']:.1f} us"
                            + (f" (added p50 {t[n]['added_p50_us']:.1f}, p99 "
                               f"{t[n]['added_p99_us']:.1f}, paired "
                               f"{t[n]['added_paired_p50_us']:.1f})"
                               if n != "direct" else "") for n in names))
                    C.log("  req/s: " + ", ".join(
                        f"{n} {runs[(mode, n)][-1]['rps']:.0f}" for n in names))
        except Exception as ex:
            err = f"{type(ex).__name__}: {ex}"
            C.log(f"  error: {err}")
        finally:
            swept = sess.close()
            if swept:
                C.log(f"  swept {len(swept)} leftover process(es)")

    lat_note = (f"Gateway: one engine simulator (--tokens-per-second 0 --ttft-ms 0), nginx "
                f"(upstream keep-alive, proxy_buffering off, client_body_buffer_size 1m) and the "
                f"coordinator, {WORKERS} workers each; POST /v1/completions max_tokens "
                f"{MAX_TOKENS} with a two-word prompt, or (long-prompt rows) a 16 KiB one. "
                f"Latency: "
                f"motor-latprobe, two runs per mode and repetition (free placement, which adds "
                f"this VM's ~35 us cross-CPU wake-ups wherever the scheduler splits a hop; "
                f"then every process of the row pinned to CPU 0: the proxy's own work per "
                f"request, cross-CPU wake-ups excluded), each covering direct, nginx and "
                f"coordinator: one keep-alive connection per target, one request at a time, "
                f"500 warm-up requests per target, then {ctx.gw_requests} timed requests per "
                f"target in batches of {ctx.gw_batch}, the targets interleaved batch by batch "
                f"(the first target rotates every round), CLOCK_MONOTONIC ns timing, so "
                f"machine drift during the run falls on all targets alike. Added latency = "
                f"proxied − direct percentile of the same probe run (the hop's own cost, not "
                f"queueing); results.json also keeps the paired added p50 (median over "
                f"rounds of proxied − direct batch median of the same round).")
    thr_note = (f"Gateway req/s: same processes; wrk -t{ctx.wrk_threads} "
                f"-c{ctx.wrk_connections} -d{ctx.gw_seconds}s per target, one target after "
                f"the other (order reversed every other repetition), a 1 s warm-up of each "
                f"target and mode in the first repetition.")
    rows = []

    def vals(mode: str, who: str, key: str) -> list:
        return [r.get(key) for r in runs.get((mode, who), [])]

    for mode, label, _, _ in modes:
        specs = [("added p50, one CPU", "added_p50", "ms", "lower", "≤ 1.2 × nginx"),
                 ("added p99, one CPU", "added_p99", "ms", "lower", "≤ 1.2 × nginx"),
                 ("added p50, free placement", "free_added_p50", "ms", "lower",
                  "≤ 1.2 × nginx"),
                 ("added p99, free placement", "free_added_p99", "ms", "lower",
                  "≤ 1.2 × nginx"),
                 ("req/s", "rps", "req/s", "higher", None)]
        for metric, key, unit, better, target in specs:
            m = C.summary(vals(mode, "coordinator", key))
            p = C.summary(vals(mode, "nginx", key))
            extra = {"direct": runs.get((mode, "direct"), []),
                     "coordinator": runs.get((mode, "coordinator"), []),
                     "nginx": runs.get((mode, "nginx"), [])}
            if key != "rps":
                paired = key.replace("_p99", "_p50").replace("added_p50", "added_paired_p50")
                pc = C.summary(vals(mode, "coordinator", paired))
                pn = C.summary(vals(mode, "nginx", paired))
                extra["added_paired_p50_ms"] = {
                    "coordinator": pc, "nginx": pn,
                    "ratio": (pc["median"] / pn["median"]
                              if pc and pn and pn["median"] > 0 else None)}
            rid = key.replace("added_", "")
            if rid.startswith("free_"):
                rid = rid[len("free_"):] + "_free"
            row = Row(id=f"gateway.{mode}.{rid}", group=GROUP,
                      workload=f"POST /v1/completions, {label}", metric=metric, unit=unit,
                      better=better, motor=m, motor_label="coordinator",
                      peer_name=f"nginx {wrk.nginx_version() or ''} proxy".replace("  ", " "),
                      peer=p, reps=min(m["n"] if m else 0, p["n"] if p else 0),
                      target=target, notes=[lat_note if key != "rps" else thr_note],
                      extra=extra)
            if m is None or p is None:
                w = why if key == "rps" else why_lat
                row.status = "pending" if w else "error"
                row.reason = w or err or "no data"
            rows.append(row)
    return rows
