"""Helpers for the worker-pool integration tests: start `motor worker-pool`, write
manifests for tests/integration/pool_worker.py, and read the pool's API."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import motorlib
from motorlib import get, http, post, wait_for

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "pool_worker.py")
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
BASE = "/node-manager/pool"


def manifest(node_id: str, **kw: Any) -> dict:
    """A manifest running the test worker; kw overrides/extends fields (env merged)."""
    m = {
        "id": node_id,
        "command": [PY, WORKER],
        "max_concurrency": 1,
        "max_instances": 1,
        "idle_ttl_seconds": 60,
        "ready_timeout_seconds": 10,
        "invoke_timeout_seconds": 10,
    }
    env = kw.pop("env", None)
    m.update(kw)
    if env:
        m["env"] = env
    return m


class Pool:
    """A running `motor worker-pool`."""

    def __init__(self, proc: motorlib.Proc, port: int):
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    # -- API ---------------------------------------------------------------------------
    def register(self, m: dict, timeout: float = 5.0) -> motorlib.Response:
        return post(self.url + BASE + "/nodes", m, timeout)

    def invoke(self, node_id: str, body: Any = None, timeout: float = 20.0,
               headers: Optional[dict] = None) -> motorlib.Response:
        return http("POST", f"{self.url}{BASE}/nodes/{node_id}/invoke",
                    body=body if body is not None else {}, timeout=timeout, headers=headers)

    def node(self, node_id: str) -> motorlib.Response:
        return get(f"{self.url}{BASE}/nodes/{node_id}")

    def instances(self, **query: Any) -> list[dict]:
        q = "&".join(f"{k}={v}" for k, v in query.items())
        r = get(f"{self.url}{BASE}/instances" + (f"?{q}" if q else ""))
        assert r.status == 200, r
        return r.json()["instances"]

    def instance(self, inst_id: str) -> dict:
        r = get(f"{self.url}{BASE}/instances/{inst_id}")
        assert r.status == 200, r
        return r.json()

    def wait_state(self, inst_id: str, state: str, timeout: float = 10.0) -> dict:
        def check():
            i = self.instance(inst_id)
            return i if i["state"] == state else None
        return wait_for(check, timeout, what=f"instance {inst_id} to be {state}")

    def live_pids(self) -> list[int]:
        return [i["pid"] for i in self.instances(live=1) if i.get("pid")]

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait: the pool stops its workers and exits 0."""
        return self.proc.stop(timeout)


def start_pool(procs: motorlib.ProcRegistry, tmpdir: str, manifests: Optional[list[dict]] = None,
               db: Optional[str] = None, extra: Optional[list[str]] = None,
               name: str = "worker-pool") -> Pool:
    """Start `motor worker-pool --port 0` (manifests written to a directory when given)."""
    args = ["worker-pool", "--port", "0", "--stop-grace-ms", "2000"]
    if manifests is not None:
        mdir = os.path.join(tmpdir, f"manifests-{name}")
        os.makedirs(mdir, exist_ok=True)
        for m in manifests:
            fname = m.get("id", "bad") if isinstance(m, dict) else "bad"
            with open(os.path.join(mdir, f"{fname}.json"), "w") as f:
                json.dump(m, f)
        args += ["--manifests", mdir]
    if db:
        args += ["--db", db]
    args += extra or []
    p = procs.motor(*args, name=name, cwd=tmpdir)
    ev = p.wait_event("pool_listening", timeout=15)
    return Pool(p, int(ev["port"]))


def read_calls(path: str, expect: int = 0, timeout: float = 5.0) -> list[dict]:
    """The worker's call log (one JSON object per line of calls tagged with "call").
    The worker writes a line just after its answer: with expect, wait (up to timeout)
    until that many tagged calls are there, then return what there is."""
    def load() -> list[dict]:
        if not os.path.exists(path):
            return []
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return [r for r in rows if r.get("call") is not None]
    try:
        wait_for(lambda: len(load()) >= expect, timeout, what=f"{expect} logged calls")
    except TimeoutError:
        pass  # the caller's assertion says what is missing
    return load()
