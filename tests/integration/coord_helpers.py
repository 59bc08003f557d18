"""Helpers for the coordinator and `motor register` integration tests (on top of the
shared motorlib harness): start a coordinator on ephemeral ports, push instances,
read engine-simulator counters."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from motorlib import Proc, ProcRegistry, Response, get, http, post, wait_http

FAST = ("--ttft-ms", "0", "--tokens-per-second", "0")


class Coord:
    """A running `motor coordinator`."""

    def __init__(self, proc: Proc, infer_port: int, mgmt_port: int):
        self.proc = proc
        self.infer_port = infer_port
        self.mgmt_port = mgmt_port
        self.url = f"http://127.0.0.1:{infer_port}"
        self.mgmt = f"http://127.0.0.1:{mgmt_port}"
        self.context: Any = None  # an ssl.SSLContext once the inference port is TLS

    def use_tls(self, context: Any) -> None:
        """The inference port serves TLS: chat, completion, metric and stop_clean go to
        https with this client context (management stays plain)."""
        self.url = f"https://127.0.0.1:{self.infer_port}"
        self.context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self.proc, name)

    def refresh(self, body: Any, key: Optional[str] = None, timeout: float = 10.0) -> Response:
        hdrs = {"X-Motor-Management-Key": key} if key is not None else None
        return post(self.mgmt + "/instances/refresh", body, timeout, headers=hdrs)

    def set_instances(self, instances: list[dict], model: Optional[str] = "m",
                      **top: Any) -> Response:
        body = {"event": "set", "instances": instances, **top}
        if model is not None:
            body["model_name"] = model
        r = self.refresh(body)
        assert r.status == 200, r
        return r

    def instances(self, key: Optional[str] = None) -> dict:
        hdrs = {"X-Motor-Management-Key": key} if key is not None else None
        r = get(self.mgmt + "/instances", headers=hdrs)
        assert r.status == 200, r
        return r.json()

    def completion(self, timeout: float = 20.0, headers: Optional[dict] = None,
                   **body: Any) -> Response:
        return post(self.url + "/v1/completions", body, timeout, headers=headers,
                    context=self.context)

    def chat(self, timeout: float = 20.0, headers: Optional[dict] = None, **body: Any) -> Response:
        return post(self.url + "/v1/chat/completions", body, timeout, headers=headers,
                    context=self.context)

    def metric(self, name: str, labels: Optional[dict[str, str]] = None) -> float:
        return metric_value(get(self.url + "/metrics", context=self.context).text, name, labels)


def start_coordinator(procs: ProcRegistry, tmpdir: str, config: Optional[dict] = None,
                      workers: int = 2, extra: tuple = (), env: Optional[dict] = None,
                      name: str = "coordinator", root: Optional[dict] = None) -> Coord:
    """`motor coordinator --port 0 --mgmt-port 0` with an optional
    motor_coordinator_config block (written to a user_config.json; root: other blocks
    of the same file, e.g. motor_controller_config)."""
    argv = ["coordinator", "--port", "0", "--mgmt-port", "0", "--workers", str(workers)]
    if config is not None or root is not None:
        path = os.path.join(tmpdir, f"{name}-user_config.json")
        with open(path, "w") as f:
            json.dump({"motor_coordinator_config": config or {}, **(root or {})}, f)
        argv += ["--config", path]
    argv += list(extra)
    p = procs.motor(*argv, name=name, extra_env=env)
    ev = p.wait_event("coordinator_listening", timeout=15)
    c = Coord(p, int(ev["infer_port"]), int(ev["mgmt_port"]))
    wait_http(c.mgmt + "/liveness", 200, timeout=10, proc=p)
    return c


def ext_instance(iid: int, role: str, *sims: Any, **extra: Any) -> dict:
    """An External Deployer shape instance over simulators (one endpoint each)."""
    return {"id": iid, "role": role,
            "endpoints": [{"id": i, "address": f"127.0.0.1:{s.port}"} for i, s in enumerate(sims)],
            **extra}


def ctrl_instance(iid: int, role: str, *sims: Any, job: str = "job", model: str = "m",
                  status: str = "active", **extra: Any) -> dict:
    """A Controller shape instance: endpoints {pod_ip: {id: Endpoint}}."""
    eps: dict[str, dict[str, dict]] = {}
    for i, s in enumerate(sims):
        eps.setdefault("127.0.0.1", {})[str(i)] = {
            "id": i, "ip": "127.0.0.1", "business_port": str(s.port), "status": "normal",
            "headless": False}
    return {"id": iid, "role": role, "job_name": job, "model_name": model, "engine_type": "vllm",
            "status": status, "endpoints": eps, **extra}


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def metric_value(text: str, name: str, labels: Optional[dict[str, str]] = None) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if labels and any(got.get(k) != v for k, v in labels.items()):
            continue
        total += float(m.group(3))
    return total


def fsm_events(c: "Coord") -> dict[tuple[str, str, str], float]:
    """The request state machine's applied events: {(from, event, to): count}."""
    out: dict[tuple[str, str, str], float] = {}
    for line in get(c.url + "/metrics").text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or m.group(1) != "motor_coordinator_request_events_total":
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(got["from"], got["event"], got["to"])] = float(m.group(3))
    return out


def fsm_count(c: "Coord", event: str, to: Optional[str] = None) -> float:
    """How often `event` was applied (into state `to`, when given)."""
    return sum(v for (f, e, t), v in fsm_events(c).items()
               if e == event and (to is None or t == to))


def sim_served(sim: Any) -> float:
    """Requests a simulator completed (vllm:request_success_total)."""
    return metric_value(get(sim.url + "/metrics").text, "vllm:request_success_total")


def sim_aborted(sim: Any) -> float:
    return metric_value(get(sim.url + "/metrics").text, "sim:requests_aborted_total")


def openai_error(resp: Response, status: int) -> dict:
    assert resp.status == status, resp
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"], err
    return err


def no_internal_fields(obj: Any) -> None:
    """Assert nothing of the PD machinery reached the client."""
    text = json.dumps(obj)
    for k in ("kv_transfer_params", "bootstrap_room", "bootstrap_host", "do_remote"):
        assert k not in text, f"internal field {k} leaked: {text[:300]}"


def stop_clean(c: Coord, timeout: float = 15.0) -> None:
    """SIGTERM the coordinator: it must exit 0 with no sanitizer report (leaks included)."""
    # The request state machine met no event its table forbids (each would be a bug: an
    # exit path taken twice, a callback after the end); the log says the same.
    text = get(c.url + "/metrics", context=getattr(c, "context", None)).text
    assert metric_value(text, "motor_coordinator_request_events_ignored_total") == 0, \
        [ln for ln in text.splitlines() if "events_ignored_total{" in ln]
    assert not c.proc.find_events("request_event_ignored")
    rc = c.proc.stop(timeout)
    out = c.proc.output()
    assert "AddressSanitizer" not in out and "runtime error:" not in out and \
        "LeakSanitizer" not in out, c.proc.tail(60)
    assert rc == 0, c.proc.tail()
