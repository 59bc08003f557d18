"""Helpers for the controller's end-to-end tests: real `motor node-manager`s (engine_type
"sim": `motor engine-sim` engines) on 127.0.0.1 with their own ports, driven by a real
`motor controller`."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import motorlib
from fake_controller import NM, nm_config, start_nm, write_json

from ctl_fakes import Controller


def sim_nm(procs: motorlib.ProcRegistry, tmp: str, ctl_port: int, job: str, *,
           role: str = "union", dp: int = 1, device_num: int = 1, nnodes: int = 1,
           rpc_port: int = 0, engine: Optional[dict] = None, controller_ft: Optional[dict] = None,
           name: str = "nm", load_seconds: float = 0.1, master_port: int = 0,
           nm: Optional[dict] = None) -> NM:
    """One node manager hosting `device_num` DP ranks (one endpoint per device); `nm`:
    extra motor_nodemanger_config keys (management_api_key_file, ...)."""
    ec: dict[str, Any] = {"model": "sim-model", "data_parallel_size": dp,
                          "load_seconds": load_seconds}
    if rpc_port:
        ec["data_parallel_rpc_port"] = rpc_port
    if nnodes > 1:
        ec["nnodes"] = nnodes
        if master_port:
            ec["master_port"] = master_port
    ec.update(engine or {})
    cfg = nm_config(job=job, role=role, controller_port=ctl_port, engine_config=ec,
                    basic={"device_num": device_num, "heartbeat_interval_seconds": 0.2},
                    controller_ft=controller_ft, endpoints=device_num, nm=nm,
                    ft={"engine_restart_wait_timeout_sec": 60})
    if role in ("prefill", "decode"):
        cfg[f"motor_engine_{role}_config"]["dispatch_profile"] = "handoff"
    path = write_json(os.path.join(tmp, f"{name}-{time.monotonic_ns()}.json"), cfg)
    return start_nm(procs, path, role=role, name=name)


def engine_pids(nm: NM) -> dict[int, int]:
    """endpoint id -> pid of its engine (None while down)."""
    return {e["id"]: e["pid"] for e in nm.engines()["endpoints"]}


def relaunches(nm: NM) -> int:
    return int(nm.engines().get("relaunch_count", 0))


def instance_of(c: Controller, job: str) -> dict:
    """The controller's instance of job ({} while it has none)."""
    for i in c.instances():
        if i["job_name"] == job:
            return i
    return {}


def wait_active(c: Controller, job: str, timeout: float = 20.0) -> int:
    """Wait for job's instance to be active at the controller; its id."""
    motorlib.wait_for(lambda: instance_of(c, job).get("status") == "active", timeout,
                      what=f"{job} active")
    return instance_of(c, job)["id"]
