"""row_mgmt_api — `GET /node-manager/status` under wrk, next to nginx serving the same
bytes from a static file (the ceiling for a small HTTP answer on this machine).

The node manager runs standalone with 4 engine simulators; once its status answer is
`{"status":true}` that exact body is written to a file that nginx (one worker: the node
manager's API is one reactor thread) serves with the same Content-Type. wrk -t T -c C -d D
--latency against each, alternating, after a 1 s warm-up of each.
"""

from __future__ import annotations

import os

from . import common as C
from . import supervisors as S
from . import wrk
from .ctx import Ctx
from .report import Row
from .row_restart import _render, workloads

GROUP = "Management API: GET /node-manager/status"
PATH = "/node-manager/status"


def run(ctx: Ctx) -> list[Row]:
    why = S.MotorNM.available_in(ctx.motor) or wrk.available() or wrk.nginx_available()
    metrics = [("req/s", "rps", "req/s", "higher"), ("p50", "p50", "ms", "lower"),
               ("p99", "p99", "ms", "lower")]
    peer_label = f"nginx {wrk.nginx_version() or ''} static file, 1 worker".replace("  ", " ")
    runs: dict[str, list[dict]] = {"motor": [], "nginx": []}
    body = b""
    err = None
    if why is None:
        sess = C.Session("mgmt")
        try:
            template = workloads(ctx.motor)["engine-sim"][0]
            base = C.free_port_run(4, 2)
            nm = S.MotorNM(sess, _render(template, base, 4), template, base, ctx.motor,
                           tuned=False)
            nm.start()
            nm.wait_services(timeout=30)
            port = nm.wait_api()
            url_nm = f"http://127.0.0.1:{port}{PATH}"

            def ready():
                st, b = C.http_get(url_nm)
                return b if st == 200 and b.replace(b" ", b"") == b'{"status":true}' else None
            body = C.wait_for(ready, 30, "node manager status true", 0.1, nm.proc)
            www = sess.path("www", "node-manager")
            os.makedirs(www)
            with open(os.path.join(www, "status"), "wb") as f:
                f.write(body)
            nport = C.free_port()
            wrk.start_nginx(sess, 1, f"""
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{nport};
        root {sess.path('www')};
        location = {PATH} {{ default_type application/json; }}
    }}""", nport)
            url_ng = f"http://127.0.0.1:{nport}{PATH}"
            st, b = C.http_get(url_ng)
            if st != 200 or b != body:
                raise RuntimeError(f"nginx answers {st} {b!r}, expected {body!r}")
            for rep in range(ctx.reps):
                order = [("motor", url_nm), ("nginx", url_ng)]
                if rep % 2:
                    order.reverse()
                for who, url in order:
                    C.log(f"mgmt api rep {rep + 1}/{ctx.reps}: {who}, wrk "
                          f"-t{ctx.wrk_threads} -c{ctx.wrk_connections} -d{ctx.wrk_seconds}s")
                    wrk.run(url, 1, ctx.wrk_threads, ctx.wrk_connections)
                    r = wrk.run(url, ctx.wrk_seconds, ctx.wrk_threads, ctx.wrk_connections)
                    runs[who].append(r)
                    C.log(f"  {r['rps']:.0f} req/s  p50 {r['p50']:.3f} ms  p99 {r['p99']:.3f} ms")
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
            C.log(f"  error: {err}")
        finally:
            S.stop_quietly(sess)
    notes = [f"Management API: wrk -t{ctx.wrk_threads} -c{ctx.wrk_connections} "
             f"-d{ctx.wrk_seconds}s --latency over keep-alive connections, 1 s warm-up; body "
             f"{len(body) or '?'} bytes ({body.decode(errors='replace') or 'n/a'}) from both. "
             f"The node manager supervises 4 engine simulators meanwhile; wrk, the server and "
             f"everything else share the machine's CPUs."]
    rows = []
    for metric, key, unit, better in metrics:
        m = C.summary(r[key] for r in runs["motor"])
        p = C.summary(r[key] for r in runs["nginx"])
        row = Row(id=f"mgmt_api.{key}", group=GROUP, workload=f"GET {PATH}", metric=metric,
                  unit=unit, better=better, motor=m, peer_name=peer_label, peer=p,
                  reps=min(m["n"] if m else 0, p["n"] if p else 0), notes=notes,
                  extra={"motor_runs": runs["motor"], "peer_runs": runs["nginx"]})
        if m is None or p is None:
            row.status = "pending" if why else "error"
            row.reason = why or err or "no data"
        rows.append(row)
    return rows
