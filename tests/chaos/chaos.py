#!/usr/bin/env python3
"""Motor's chaos suite: a real fleet on this machine, random faults from a seeded RNG,
a client that never stops sending requests, invariants checked after every round.

    tests/chaos/chaos.py [--seed S] [--rounds N] [--duration SEC] [--mode controller|
                         standalone|both] [--net auto|netns|proxy|none] [--json FILE]
                         [--keep] [--short]

``make chaos`` runs the long version; ``tests/integration/test_chaos_short.py`` (part of
``make test``) runs ``--short`` (about 100 s). See docs/chaos.md for the fleet, the faults,
the invariants and how to read the report.

Exit status: 0 when no invariant was violated, 1 otherwise, 2 on a usage or setup error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "integration"))

import chaos_fleet  # noqa: E402
from chaos_client import Client, Reference  # noqa: E402
from chaos_fleet import Daemon, Fleet, call  # noqa: E402
from chaos_net import make_net  # noqa: E402

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"{time.monotonic() - T0:7.1f}s {msg}", flush=True)


# ---------------------------------------------------------------------------------------
# faults
#
# A fault is planned (target and durations drawn from the RNG), then applied; it returns
# the actions to run later (SIGCONT, heal, ...) as (delay, callable) pairs, and its
# recovery budget: how long after its last action the fleet must be healthy again.


class Fault:
    def __init__(self, kind: str, target: str, budget: float, detail: str = ""):
        self.kind = kind
        self.target = target
        self.budget = budget
        self.detail = detail
        self.later: list[tuple[float, Callable[[], None]]] = []
        self.killed: list[int] = []  # must be gone after recovery
        self.replaced: list[int] = []  # engines that must have been replaced
        self.skipped = ""
        self.check: Optional[Callable[[], list[str]]] = None  # extra invariant
        # while the fault lasts, watch() samples the fleet; verdict(others) then says
        # whether the fleet noticed it (others: another control-plane fault this round)
        self.watch: Optional[Callable[[], None]] = None
        self.verdict: Optional[Callable[[bool], list[str]]] = None
        self.control_plane = kind.startswith(("controller", "coordinator", "etcd"))

    def __repr__(self) -> str:
        return f"{self.kind}({self.target}{', ' + self.detail if self.detail else ''})"


# Faults of one engine: with another route left, the coordinator continues every stream
# such a fault interrupts (mid-stream rescheduling), so none may reach a client cut.
ENGINE_SIDE = {"engine_kill", "worker_kill", "engine_hang", "engine_stop", "engine_error"}

KINDS_CONTROLLER = ["engine_kill", "engine_stop", "worker_kill", "engine_hang", "engine_error",
                    "nm_kill", "nm_stop", "controller_kill", "controller_stop",
                    "coordinator_kill", "coordinator_stop", "net_cut", "relaunch_controller_kill"]
KINDS_ETCD = KINDS_CONTROLLER + ["etcd_kill", "etcd_stop"]
KINDS_UP = [k for k in KINDS_CONTROLLER if k not in ("net_cut", "relaunch_controller_kill")] + \
    ["up_kill"]
KINDS_STANDALONE = ["engine_kill", "engine_stop", "worker_kill", "engine_hang", "engine_error",
                    "nm_kill", "nm_stop", "coordinator_kill", "coordinator_stop"]


class Injector:
    def __init__(self, fleet: Fleet, rng: random.Random, run: "Run"):
        self.fleet = fleet
        self.rng = rng
        self.run = run

    def kinds(self) -> list[str]:
        if getattr(self.fleet, "kind", "") == "up":
            ks = list(KINDS_UP)
        elif self.fleet.mode == "standalone":
            ks = list(KINDS_STANDALONE)
        else:
            ks = list(KINDS_ETCD if self.fleet.store == "etcd" else KINDS_CONTROLLER)
        if not self.fleet.net.supports_cut:
            ks = [k for k in ks if k != "net_cut"]
        if self.run.args.only:
            ks = [k for k in ks if k in self.run.args.only.split(",")] or ks
        return ks

    # -- helpers ---------------------------------------------------------------------------

    def _engine(self) -> tuple[Any, dict]:
        pods = list(self.fleet.pods)
        self.rng.shuffle(pods)
        for p in pods:
            v = self.fleet.engines(p)
            eps = [e for e in (v or {}).get("endpoints", []) if e.get("pid") and e.get("alive")
                   and self._ours(e["pid"])]
            if eps:
                return p, self.rng.choice(eps)
        raise LookupError("no live engine")

    def _ours(self, pid: int) -> bool:
        """Only processes of this run are ever signalled (a pid read a moment ago could
        have been reused by now)."""
        return pid in chaos_fleet.marked_pids(self.fleet.run_id)

    def _kill(self, pid: int, sig: int) -> None:
        if not self._ours(pid):
            raise LookupError(f"pid {pid} is gone")
        os.kill(pid, sig)

    def _stop_cont(self, d: Daemon, dur: float) -> Callable[[], None]:
        d.stopped = True
        pid = d.pid
        d.signal(signal.SIGSTOP)

        def cont() -> None:
            if d.pid == pid:
                d.signal(signal.SIGCONT)
                d.since = time.monotonic()
            d.stopped = False
        return cont

    # -- the faults ------------------------------------------------------------------------

    def apply(self, kind: str) -> Fault:
        return getattr(self, kind)()

    def engine_kill(self) -> Fault:
        p, e = self._engine()
        f = Fault("engine_kill", f"{p.name}/ep{e['id']}", 30, f"pid {e['pid']}")
        self._kill(e["pid"], signal.SIGKILL)
        f.killed.append(e["pid"])
        f.replaced.append(e["pid"])
        return f

    def engine_stop(self) -> Fault:
        p, e = self._engine()
        dur = round(self.rng.uniform(0.5, 4.0), 1)
        f = Fault("engine_stop", f"{p.name}/ep{e['id']}", dur + 30, f"SIGSTOP {dur}s")
        pid = e["pid"]
        self._kill(pid, signal.SIGSTOP)

        def cont() -> None:
            try:
                if self._ours(pid):
                    os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        f.later.append((dur, cont))
        return f

    def worker_kill(self) -> Fault:
        p, e = self._engine()
        kids = [k for k in _children(e["pid"]) if self._ours(k)]  # --workers children
        if not kids:
            raise LookupError(f"engine {e['pid']} has no worker")
        w = self.rng.choice(kids)
        f = Fault("worker_kill", f"{p.name}/ep{e['id']}", 30, f"worker {w} of {e['pid']}")
        self._kill(w, signal.SIGKILL)
        f.killed += [w, e["pid"]]  # a dead worker takes its engine down
        f.replaced.append(e["pid"])
        return f

    def engine_hang(self) -> Fault:
        p, e = self._engine()
        st, body = call("POST", f"{chaos_fleet.scheme()}://{p.ip}:{e['port']}/sim/fault",
                        {"mode": "hang"}, 3)
        if st != 200:
            raise LookupError(f"hang injection refused: {st} {body}")
        f = Fault("engine_hang", f"{p.name}/ep{e['id']}", 35, f"pid {e['pid']}")
        f.replaced.append(e["pid"])  # a hung engine must be detected and replaced
        return f

    def engine_error(self) -> Fault:
        p, e = self._engine()
        dur = round(self.rng.uniform(1.0, 4.0), 1)
        url = f"{chaos_fleet.scheme()}://{p.ip}:{e['port']}/sim/fault"
        st, body = call("POST", url, {"mode": "error"}, 3)
        if st != 200:
            raise LookupError(f"error injection refused: {st} {body}")
        f = Fault("engine_error", f"{p.name}/ep{e['id']}", dur + 25, f"inference 500 for {dur}s")
        f.later.append((dur, lambda: call("POST", url, {"mode": "recover"}, 3)))
        return f

    def _pick_pod(self):
        return self.rng.choice(self.fleet.pods)

    def nm_kill(self) -> Fault:
        p = self._pick_pod()
        hold = round(self.rng.uniform(0.2, 2.0), 1)
        engines = self.fleet.engine_pids(p)
        pid = p.daemon.kill(hold)
        f = Fault("nm_kill", p.daemon.name, hold + 40, f"pid {pid}, restart after {hold}s")
        f.killed += [pid, *engines]  # its engines die with it (PDEATHSIG)
        f.replaced += engines
        f.later.append((hold, self._member_down(p)))
        return f

    def _member_down(self, p) -> Callable[[], None]:
        """A member of a multi-pod instance goes silent now; the returned action ends it
        (the fleet's member_violations() watches the coordinator meanwhile)."""
        p.down_since = time.monotonic()

        def up() -> None:
            p.down_since = None
        return up

    def nm_stop(self) -> Fault:
        p = self._pick_pod()
        # multi-pod instances: also past the inactive timeout (8 s), where the instance
        # is deleted and its survivors told to stop (exit 255), the gang restarted
        top = 12.0 if p.multi else 7.0
        dur = round(self.rng.uniform(0.5, top), 1)
        f = Fault("nm_stop", p.daemon.name, dur + 40, f"SIGSTOP {dur}s")
        self._must_withdraw(f, p, dur)
        cont = self._stop_cont(p.daemon, dur)
        up = self._member_down(p)
        f.later.append((dur, lambda: (up(), cont())))
        return f

    # A pod whose node manager is silent longer than the controller's heartbeat timeout
    # (3 s) plus its probe (1 s) must be taken out of the coordinator: requests would
    # otherwise keep going to engines nobody watches. Checked for silences >= 6 s.
    NOTICE_AFTER = 6.0

    def _must_withdraw(self, f: Fault, p, dur: float) -> None:
        if self.fleet.mode != "controller":
            return
        ids = [i["id"] for i in (self.fleet.controller_instances() or [])
               if i.get("job_name") == p.job and i.get("status") == "active"]
        if not ids:
            return
        iid = ids[0]
        seen = {"withdrawn": False, "samples": 0, "flapped": 0}
        t_end = time.monotonic() + dur

        def watch() -> None:
            # the fault's own duration only: after it the member is back and routing the
            # instance again is what must happen
            if time.monotonic() >= t_end - 0.3:
                return
            coord = self.fleet.coordinator_instances()
            if coord is None:
                return
            seen["samples"] += 1
            routed = any(i.get("id") == iid and i.get("status") == "active"
                         and i.get("pool") == "available" for i in coord)
            if not routed:
                seen["withdrawn"] = True
            elif seen["withdrawn"]:
                # withdrawn, then routed again while its node manager is still silent: a
                # peer's heartbeat flipped it back (seed 001's flapping)
                seen["flapped"] += 1

        def verdict(others: bool) -> list[str]:
            self.run.noticed[f.kind][0 if seen["withdrawn"] else 1] += 1
            out = []
            if seen["flapped"] and not others:
                out.append(f"VIOLATION {p.job} (instance {iid}) routed again "
                           f"({seen['flapped']} sample(s)) while {p.daemon.name} was silent")
            if dur < self.NOTICE_AFTER or others or seen["withdrawn"] or not seen["samples"]:
                return out
            return out + [f"VIOLATION {p.job} (instance {iid}) still routed by the coordinator "
                          f"after {dur}s without its node manager"]
        f.watch, f.verdict = watch, verdict

    def controller_kill(self) -> Fault:
        d = self.fleet.controller
        before = self.fleet.controller_instances() or []
        hold = round(self.rng.uniform(0.2, 2.0), 1)
        pid = d.kill(hold)
        f = Fault("controller_kill", "controller", hold + 30, f"restart after {hold}s")
        f.killed.append(pid)
        f.check = lambda: self._controller_state_intact(d, before, hold, pid)
        return f

    def _controller_state_intact(self, d: Daemon, before: list[dict], hold: float,
                                 old_pid: int) -> list[str]:
        """Right after the restarted controller is ready, every instance it had (the
        SQLite store) is back with the same id, job and endpoints."""
        deadline = time.monotonic() + hold + 40
        while time.monotonic() < deadline:
            # ready = the new process leads and has loaded its state (/readiness 200)
            if d.pid and d.pid != old_pid and d.alive() and \
                    call("GET", self.fleet.ctl_url + "/readiness", timeout=1)[0] == 200:
                break
            time.sleep(0.05)
        else:
            return ["controller did not come back ready"]
        after = self.fleet.controller_instances()
        if after is None:
            return ["controller: instances unreachable after restart"]
        got = {i["id"]: i for i in after}
        out = []
        for i in before:
            if i.get("status") == "deleted":
                continue
            a = got.get(i["id"])
            if a is None or a.get("job_name") != i.get("job_name"):
                out.append(f"VIOLATION controller state lost: instance {i['id']} "
                           f"({i.get('job_name')}, {i.get('status')}) missing after restart")
                continue
            eb = sorted(f"{e.get('ip')}:{e.get('business_port')}" for nm in
                        i.get("node_managers", []) for e in nm.get("endpoints", []))
            ea = sorted(f"{e.get('ip')}:{e.get('business_port')}" for nm in
                        a.get("node_managers", []) for e in nm.get("endpoints", []))
            if eb != ea:
                out.append(f"VIOLATION controller state changed: instance {i['id']} "
                           f"endpoints {eb} -> {ea}")
        return out

    def relaunch_controller_kill(self) -> Fault:
        """SIGKILL an engine of one pod of the multi-pod instance, and the controller
        while it relaunches the instance's engines on both pods: the restarted controller
        must finish (or redo) the recovery from its store."""
        pods = [p for p in self.fleet.pods if p.multi]
        if not pods or self.fleet.mode != "controller":
            raise LookupError("no multi-pod instance in this fleet")
        p = self.rng.choice(pods)
        eps = [e for e in (self.fleet.engines(p) or {}).get("endpoints", [])
               if e.get("pid") and e.get("alive") and self._ours(e["pid"])]
        if not eps:
            raise LookupError(f"{p.daemon.name} has no live engine")
        e = self.rng.choice(eps)
        ids = [i["id"] for i in (self.fleet.controller_instances() or [])
               if i.get("job_name") == p.job]
        self._kill(e["pid"], signal.SIGKILL)

        def relaunching() -> bool:
            for i in self.fleet.controller_instances() or []:
                if i.get("id") in ids and i.get("strategy"):
                    return True
            return False
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not relaunching():
            time.sleep(0.05)
        seen = relaunching()
        hold = round(self.rng.uniform(0.2, 2.0), 1)
        pid = self.fleet.controller.kill(hold)
        f = Fault("relaunch_controller_kill", f"{p.name}/ep{e['id']}", hold + 60,
                  f"engine {e['pid']}, controller {pid} killed "
                  f"{'mid-relaunch' if seen else '(relaunch not seen yet)'}, restart after {hold}s")
        f.killed += [e["pid"], pid]
        f.replaced.append(e["pid"])
        return f

    def controller_stop(self) -> Fault:
        dur = round(self.rng.uniform(0.5, 4.0), 1)
        f = Fault("controller_stop", "controller", dur + 30, f"SIGSTOP {dur}s")
        f.later.append((dur, self._stop_cont(self.fleet.controller, dur)))
        return f

    def _coordinator(self) -> Daemon:
        """The coordinator to hit: the master when there are two (the standby taking over
        is what the two-coordinator fleet exists for), else the one."""
        if len(self.fleet.coordinators) > 1:
            m = self.fleet.master()
            if m is not None and self.rng.random() < 0.8:
                return m
            return self.rng.choice(self.fleet.coordinators)
        return self.fleet.coordinator

    def coordinator_kill(self) -> Fault:
        d = self._coordinator()
        hold = round(self.rng.uniform(0.2, 2.0), 1)
        pid = d.kill(hold)
        f = Fault("coordinator_kill", d.name, hold + 25, f"restart after {hold}s")
        f.killed.append(pid)
        return f

    def coordinator_stop(self) -> Fault:
        d = self._coordinator()
        # two coordinators: also past the lease (4 s), so the standby takes over and the
        # old master, running again, steps down
        top = 7.0 if len(self.fleet.coordinators) > 1 else 3.0
        dur = round(self.rng.uniform(0.5, top), 1)
        f = Fault("coordinator_stop", d.name, dur + 25, f"SIGSTOP {dur}s")
        f.later.append((dur, self._stop_cont(d, dur)))
        return f

    etcd_turn = 0

    def _etcd_member(self) -> tuple[Daemon, str]:
        """The member to hit: the only one, or in a 3-member cluster the leader and a
        follower in turn (the leader first)."""
        fl = self.fleet
        if len(fl.etcds) < 2:
            return fl.etcd, "etcd"
        leader = fl.etcd_leader()
        Injector.etcd_turn += 1
        if leader is None:
            d = self.rng.choice([d for d in fl.etcds if d.alive() and not d.stopped]
                                or fl.etcds)
            return d, f"{d.name} (no leader seen)"
        if Injector.etcd_turn % 2 == 1:
            return leader, f"{leader.name} (leader)"
        d = self.rng.choice([d for d in fl.etcds if d is not leader])
        return d, f"{d.name} (follower)"

    def etcd_kill(self) -> Fault:
        hold = round(self.rng.uniform(0.2, 2.0), 1)
        d, what = self._etcd_member()
        pid = d.kill(hold)
        f = Fault("etcd_kill", what, hold + 35, f"restart after {hold}s")
        f.killed.append(pid)
        return f

    def etcd_stop(self) -> Fault:
        # up to a little past the controller's lease (4 s): the leader must step down
        # and come back, not serve on without its lock
        dur = round(self.rng.uniform(0.5, 5.0), 1)
        d, what = self._etcd_member()
        f = Fault("etcd_stop", what, dur + 35, f"SIGSTOP {dur}s")
        f.later.append((dur, self._stop_cont(d, dur)))
        return f

    def up_kill(self) -> Fault:
        """SIGKILL `motor up` itself: every process it started must die with it (they
        carry PDEATHSIG); then it is started again with --keep-state, as systemd would."""
        fleet = self.fleet
        victims = fleet.kill_up()
        f = Fault("up_kill", "motor up", 90, f"{len(victims)} descendants must die with it")
        f.killed += victims
        found: list[str] = []

        def restart() -> None:
            def gone() -> bool:
                return not [v for v in victims
                            if (chaos_fleet.proc_stat(v) or ("X",))[0] not in ("Z", "X")]
            try:
                chaos_fleet.motorlib.wait_for(gone, 5, what="motor up's descendants to die")
            except TimeoutError:
                for v in victims:
                    st = chaos_fleet.proc_stat(v)
                    if st and st[0] not in ("Z", "X"):
                        found.append(f"VIOLATION {v} ({chaos_fleet.cmdline(v)[:60]}) outlived "
                                     f"motor up's SIGKILL")
                        try:
                            os.kill(v, signal.SIGKILL)  # ours (this run's marker)
                        except ProcessLookupError:
                            pass
            fleet.restart_up()
        f.later.append((0.3, restart))
        f.check = lambda: found
        return f

    def net_cut(self) -> Fault:
        p = self._pick_pod()
        dur = round(self.rng.uniform(1.0, 8.0), 1)
        net = self.fleet.net
        f = Fault("net_cut", p.daemon.name, dur + 45, f"{net.kind} partition {dur}s")
        if net.kind == "netns":  # the proxy only cuts NM -> controller: probes still work
            self._must_withdraw(f, p, dur)
        net.cut(p.g)
        up = self._member_down(p) if net.kind == "netns" else (lambda: None)
        f.later.append((dur, lambda: (up(), net.heal(p.g))))
        return f


def _active_state(fleet: Fleet) -> Optional[set]:
    """{(id, job, endpoints)} of the controller's active instances."""
    insts = fleet.controller_instances()
    if insts is None:
        return None
    return {(i["id"], i.get("job_name"),
             tuple(sorted(f"{e.get('ip')}:{e.get('business_port')}"
                          for nm in i.get("node_managers", []) for e in nm.get("endpoints", []))))
            for i in insts if i.get("status") == "active"}


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = chaos_fleet.proc_stat(int(name))
            if st and st[1] == pid and st[0] not in ("Z", "X"):
                out.append(int(name))
    return out


# ---------------------------------------------------------------------------------------
# rounds


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = random.Random(args.seed)
        self.run_id = f"{os.getpid():x}{self.rng.randrange(16 ** 4):04x}"
        self.violations: list[str] = []
        self.notes: list[str] = []
        self.injected: Counter = Counter()
        self.recovered: Counter = Counter()
        self.skipped: Counter = Counter()
        self.recovery_s: dict[str, list[float]] = defaultdict(list)
        self.noticed: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # [withdrawn, not]
        self.engines_kept: Counter = Counter()  # control-plane rounds: engines untouched
        self.streams_kept: Counter = Counter()  # single engine-fault rounds: no stream cut
        self.rounds = 0
        self.client_reports: list[dict] = []
        self.modes_run: list[dict] = []

    def violate(self, msg: str) -> None:
        msg = msg if msg.startswith("VIOLATION") else f"VIOLATION {msg}"
        self.violations.append(msg)
        log(msg)

    def wait_healthy(self, fleet: Fleet, client: Optional[Client], budget: float,
                     replaced: frozenset = frozenset()) -> tuple[bool, float, list[str]]:
        """Poll until the fleet is healthy twice in a row, 1 s apart (a single good
        look can precede the fleet noticing a fault). (ok, seconds to the first of the
        two good looks, problems)."""
        t = time.monotonic()
        deadline = t + budget
        problems: list[str] = []
        first_ok: Optional[float] = None
        while True:
            problems = fleet.health(replaced)
            hard = [p for p in problems if p.startswith("VIOLATION")]
            if not problems and client is not None:
                ok, what = client.probe(timeout=8)
                if not ok:
                    problems = [f"probe request through the coordinator: {what}"]
            if not problems:
                if first_ok is None:
                    first_ok = time.monotonic()
                elif time.monotonic() - first_ok >= 1.0:
                    return True, first_ok - t, []
                time.sleep(0.3)
                continue
            first_ok = None
            if hard and time.monotonic() > t + 3:
                # a port held by the wrong process is a finding, not a slow recovery;
                # give it a moment in case the check raced a restart
                return False, time.monotonic() - t, problems
            if time.monotonic() >= deadline:
                return False, time.monotonic() - t, problems
            time.sleep(0.3)

    def run_mode(self, mode: str, net, deadline: float, max_rounds: int) -> None:
        run_dir = self.dir
        store = "etcd" if mode in ("etcd", "ha", "etcd3") else "sqlite"
        if mode == "up":
            from chaos_up import UpFleet
            fleet: Fleet = UpFleet(self.run_id, run_dir, net, log=log, tls=self.args.tls)
        else:
            fleet = Fleet("standalone" if mode == "standalone" else "controller", self.run_id,
                          run_dir, net, workers=1, log=log, store=store,
                          coordinators=2 if mode == "ha" else 1,
                          etcd_members=3 if mode == "etcd3" else 1)
        client: Optional[Client] = None
        info: dict[str, Any] = {"mode": mode, "rounds": 0}
        try:
            fleet.start()
            ref = Reference(fleet.oracle_url, chaos_fleet.MODEL)
            client = Client(fleet.infer_url, ref, seed=self.args.seed, threads=self.args.clients,
                            context=chaos_fleet.TLS_CTX)
            ok, took, problems = self.wait_healthy(fleet, client, 60)
            if not ok:
                raise RuntimeError(f"[{mode}] fleet never became healthy: {problems}")
            log(f"[{mode}] fleet healthy after {took:.1f}s; client started "
                f"({self.args.clients} threads)")
            client.start()
            inj = Injector(fleet, self.rng, self)
            # every kind once (shuffled) before any repeats, so short runs cover them all
            queue: list[str] = []
            # the faults this fleet exists for come first (pop() takes from the end)
            first_cycle = {"etcd": ["etcd_kill", "etcd_stop", "controller_kill"],
                           "etcd3": ["etcd_kill", "etcd_stop", "controller_kill"],
                           "ha": ["coordinator_kill", "coordinator_stop", "etcd_stop"]
                           }.get(mode, [])
            r = 0
            while r < max_rounds and time.monotonic() < deadline - self.args.min_round:
                if not queue:
                    queue = inj.kinds()
                    self.rng.shuffle(queue)
                    front = [k for k in first_cycle if k in queue]
                    queue = [k for k in queue if k not in front] + front[::-1]
                    first_cycle = []
                first = queue.pop()
                kinds = [first]
                if self.rng.random() < self.args.overlap and queue:
                    kinds.append(queue.pop())
                r += 1
                self.rounds += 1
                info["rounds"] = r
                if not self.round(fleet, client, inj, r, kinds):
                    self.violate(f"[{mode}] fleet did not recover; remaining rounds skipped")
                    break
            info["client"] = client.snapshot()
        except Exception as e:
            self.violate(f"[{mode}] run aborted: {e!r}\n{traceback.format_exc()}")
        finally:
            if client is not None:
                client.stop()
                snap = client.snapshot()
                info["client"] = snap
                for ce in snap["client_errors"]:
                    self.notes.append(f"[{mode}] a valid request got HTTP {ce['status']} "
                                      f"({ce['api']}, stream={ce['stream']}): {ce['body']}")
                for v in snap["violations"]:
                    self.violate(f"[{mode}] request {v['kind']}: {v['api']} stream={v['stream']} "
                                 f"max_tokens={v['max_tokens']} prompt={v['prompt']!r}: "
                                 f"{v['detail']}")
            info["restarts"] = fleet.restart_counts()
            log(f"[{mode}] stopping the fleet")
            for v in fleet.stop():
                self.violate(f"[{mode}] {v}")
            for c in fleet.crashes:
                self.violate(f"[{mode}] {c['daemon']} crashed (exit {c['rc']}), log {c['log']}\n"
                             f"{c.get('tail', '')}")
            if fleet.supervisor:
                for e in fleet.supervisor.errors:
                    self.notes.append(f"[{mode}] supervisor: {e}")
            info["nm_suicides"] = len(fleet.suicides)
            info["leadership_losses"] = len(fleet.leadership_losses)
            for v in fleet.sanitizer_reports():
                self.violate(f"[{mode}] {v}")
            self.modes_run.append(info)

    def round(self, fleet: Fleet, client: Client, inj: Injector, r: int, kinds: list[str]) -> bool:
        faults: list[Fault] = []
        timeline: list[tuple[float, Callable[[], None]]] = []
        # A supervisor must never make a failure worse: losing the controller or the
        # coordinator for a while must not restart a single engine.
        engines_before = {p.name: fleet.engine_pids(p) for p in fleet.pods}
        state_before = _active_state(fleet) if fleet.mode == "controller" else None
        start = time.monotonic()
        for i, kind in enumerate(kinds):
            if i:
                time.sleep(self.rng.uniform(0.0, 1.0))
            try:
                f = inj.apply(kind)
            except (LookupError, ProcessLookupError) as e:  # its target vanished meanwhile
                self.skipped[kind] += 1
                log(f"round {r}: {kind} skipped ({e})")
                continue
            faults.append(f)
            self.injected[kind] += 1
            now = time.monotonic()
            for delay, fn in f.later:
                timeline.append((now + delay, fn))
        if not faults:
            return True
        log(f"round {r}: {', '.join(map(repr, faults))}")
        watches = [f.watch for f in faults if f.watch]
        member_seen: set[str] = set()

        def members() -> None:  # issue 15: never a routable instance with a silent member
            for v in fleet.member_violations():
                key = v.split(" while ")[0]
                if key not in member_seen:
                    member_seen.add(key)
                    self.violate(f"round {r}: {v}")
        if fleet.mode == "controller":
            watches.append(members)
        for at, fn in sorted(timeline, key=lambda x: x[0]):
            while True:  # the fault's own duration: sample the fleet meanwhile
                left = at - time.monotonic()
                if left <= 0:
                    break
                for w in watches:
                    w()
                time.sleep(min(left, 0.25))
            fn()
        for f in faults:
            if f.check:
                for v in f.check():
                    self.violate(f"round {r}: {f!r}: {v}")
            if f.verdict:
                # another fault that restarted or froze the controller: its window for
                # this silence started afresh
                others = any(g.control_plane or g.kind == "relaunch_controller_kill"
                             for g in faults if g is not f)
                for v in f.verdict(others):
                    self.violate(f"round {r}: {f!r}: {v}")
        budget = max(f.budget for f in faults)
        replaced = frozenset(k for f in faults for k in f.replaced)
        ok, took, problems = self.wait_healthy(fleet, client, budget, replaced)
        total = time.monotonic() - start - 1.0  # the confirmation look is not recovery
        if not ok:
            hard = [p for p in problems if p.startswith("VIOLATION")]
            for p in hard:
                self.violate(f"round {r}: {p}")
            if not hard:
                self.violate(f"round {r}: not recovered within {budget:.0f}s after "
                             f"{faults}: {problems[:6]}")
            return False
        for f in faults:
            self.recovered[f.kind] += 1
            self.recovery_s[f.kind].append(total)
        if len(faults) == 1 and faults[0].kind in ENGINE_SIDE:
            # one engine's fault: every stream it interrupted was continued elsewhere
            end = time.monotonic()
            cut = [c for c in client.snapshot()["cuts"] if c[1] >= start and c[1] <= end]
            for c0, c1 in cut:
                self.violate(f"round {r}: {faults[0]!r} cut a stream (started {c0 - start:+.1f}s, "
                             f"cut {c1 - start:+.1f}s from the fault): mid-stream rescheduling "
                             f"should have continued it")
            self.streams_kept["rounds"] += 1
        if all(f.control_plane for f in faults):
            after = {p.name: fleet.engine_pids(p) for p in fleet.pods}
            if after != engines_before:
                self.violate(f"round {r}: {faults} restarted engines: {engines_before} -> {after}")
            else:
                self.engines_kept["rounds"] += 1
            # ... and the controller's instances (ids, jobs, endpoints) are the same ones
            state_after = _active_state(fleet) if state_before is not None else None
            if state_before is not None and state_after != state_before:
                self.violate(f"round {r}: {faults} changed the controller's instances: "
                             f"{state_before} -> {state_after}")
        killed = [k for f in faults for k in f.killed]
        pv = fleet.process_violations(killed)
        if pv:
            time.sleep(3.5)  # zombies are only reported when they stay
            pv = fleet.process_violations(killed)
        for v in pv:
            self.violate(f"round {r}: {v}")
        snap = client.snapshot()["stats"]
        log(f"round {r}: recovered in {took:.1f}s after the last action "
            f"({total:.1f}s since the first fault); requests so far {snap.get('requests', 0)}, "
            f"ok {snap.get('ok', 0)}")
        return True

    def main(self) -> int:
        a = self.args
        self.dir = Path(tempfile.mkdtemp(prefix="motor-chaos-"))
        net, why = make_net(a.net, self.run_id)
        log(f"chaos run {self.run_id}: seed {a.seed}, modes {a.mode}, net {net.kind} ({why}), "
            f"dir {self.dir}")
        modes = {"both": ["controller", "standalone"],
                 "all": ["controller", "etcd", "etcd3", "ha", "standalone", "up"]}.get(a.mode)
        if modes is None:
            modes = [m for m in a.mode.split(",") if m]
        bad = [m for m in modes
               if m not in ("controller", "etcd", "etcd3", "ha", "standalone", "up")]
        if bad:
            raise SystemExit(f"unknown --mode {bad}")
        for needs_etcd in ("etcd", "etcd3", "ha"):
            if needs_etcd in modes and not shutil.which("etcd"):
                self.notes.append(f"etcd not installed: the {needs_etcd} fleet was skipped")
                modes.remove(needs_etcd)
        # time (and rounds) per fleet: the controller fleets have more kinds of faults
        weight = {"controller": 0.45, "etcd": 0.2, "etcd3": 0.25, "ha": 0.3, "standalone": 0.3,
                  "up": 0.3}
        end = time.monotonic() + a.duration
        try:
            n_pods = len(Fleet.PODS)
            net.setup(n_pods)
            log(net.describe())
            for i, mode in enumerate(modes):
                rest = sum(weight[m] for m in modes[i:])
                share = weight[mode] / rest
                left = end - time.monotonic()
                deadline = time.monotonic() + left * share
                rounds = max(1, round((a.rounds - self.rounds) * share))
                use_net = (net if mode in ("controller", "etcd", "etcd3", "ha")
                           else _root_net(net, self.run_id))
                self.run_mode(mode, use_net, deadline, rounds)
        finally:
            net.teardown()
            for left in net.leftovers():
                self.violate(f"network left behind: {left}")
        return self.report(net)

    def report(self, net) -> int:
        a = self.args
        total_req = Counter()
        http_status = Counter()
        for m in self.modes_run:
            total_req.update((m.get("client") or {}).get("stats", {}))
            http_status.update((m.get("client") or {}).get("http_status", {}))
        kinds = sorted(set(self.injected) | set(self.skipped))
        lines = ["", "## Chaos report", "",
                 f"seed {a.seed}, run {self.run_id}, modes {a.mode}, network faults: {net.kind}, "
                 f"{self.rounds} rounds in {time.monotonic() - T0:.0f}s", "",
                 "| fault | injected | recovered | recovery p50 s | max s |",
                 "| --- | --- | --- | --- | --- |"]
        for k in kinds:
            rs = sorted(self.recovery_s.get(k, []))
            p50 = f"{rs[len(rs) // 2]:.1f}" if rs else "-"
            mx = f"{rs[-1]:.1f}" if rs else "-"
            sk = f" (+{self.skipped[k]} skipped)" if self.skipped[k] else ""
            lines.append(f"| {k} | {self.injected[k]}{sk} | {self.recovered[k]} | {p50} | {mx} |")
        lines += ["",
                  f"faults injected: {sum(self.injected.values())}, recoveries: "
                  f"{sum(self.recovered.values())}, violations: {len(self.violations)}",
                  f"requests: {total_req.get('requests', 0)} — ok {total_req.get('ok', 0)}, "
                  f"clean HTTP errors {total_req.get('http_error', 0)} "
                  f"({dict(http_status)}), transport errors {total_req.get('transport', 0)}, "
                  f"cut streams {total_req.get('truncated', 0)}, "
                  f"corrupted {total_req.get('violation', 0)}"]
        for k, (yes, no) in sorted(self.noticed.items()):
            lines.append(f"{k}: pod withdrawn from the coordinator during the fault in {yes} "
                         f"of {yes + no} (required when silent >= {Injector.NOTICE_AFTER:.0f}s)")
        if self.engines_kept:
            lines.append(f"control-plane-only rounds that left every engine running: "
                         f"{self.engines_kept['rounds']}")
        if self.streams_kept:
            lines.append(f"single engine-fault rounds checked for cut streams (none allowed): "
                         f"{self.streams_kept['rounds']}")
        for m in self.modes_run:
            lines.append(f"[{m['mode']}] rounds {m['rounds']}, daemon restarts "
                         f"{m.get('restarts')}, node-manager 255 exits {m.get('nm_suicides', 0)}"
                         + (f", controller leadership losses {m['leadership_losses']}"
                            if m.get("leadership_losses") else ""))
        for n in self.notes:
            lines.append(f"note: {n}")
        if self.violations:
            lines += ["", "VIOLATIONS:"] + [f"  {v}" for v in self.violations]
        print("\n".join(lines), flush=True)
        result = {
            "seed": a.seed, "run_id": self.run_id, "modes": a.mode, "net": net.kind,
            "rounds": self.rounds, "faults_injected": sum(self.injected.values()),
            "recoveries": sum(self.recovered.values()), "violations": self.violations,
            "injected": dict(self.injected), "recovered": dict(self.recovered),
            "skipped": dict(self.skipped),
            "noticed": {k: {"withdrawn": v[0], "not": v[1]} for k, v in self.noticed.items()},
            "control_plane_rounds_engines_kept": self.engines_kept["rounds"],
            "engine_fault_rounds_streams_checked": self.streams_kept["rounds"],
            "recovery_seconds": {k: v for k, v in self.recovery_s.items()},
            "requests": dict(total_req), "http_status": dict(http_status),
            "per_mode": [{k: v for k, v in m.items() if k != "client"} for m in self.modes_run],
            "dir": str(self.dir),
        }
        if a.json:
            Path(a.json).write_text(json.dumps(result, indent=1))
        if self.violations or a.keep:
            print(f"logs kept in {self.dir}", flush=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        return 1 if self.violations else 0


def _root_net(net, run_id: str):
    """The standalone fleet has no controller: no cuts, pods on 127.0.0.1."""
    from chaos_net import NoNet
    return NoNet(run_id)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="RNG seed (default: random, printed)")
    ap.add_argument("--rounds", type=int, default=400, help="at most this many rounds")
    ap.add_argument("--duration", type=float, default=600, help="seconds of fault rounds")
    ap.add_argument("--mode", default=None,
                    help="fleets to run, comma-separated: controller (SQLite store), etcd "
                    "(controller with the etcd store), etcd3 (the etcd store on a 3-member "
                    "cluster: its leader and a follower killed in turn), ha (etcd store and "
                    "two coordinators, "
                    "master and standby, behind a Service), standalone (no controller), up "
                    "(`motor up` supervises); both = controller,standalone; all = the six "
                    "(default; --short: controller,ha,standalone)")
    ap.add_argument("--net", choices=["auto", "netns", "proxy", "none"], default="auto")
    ap.add_argument("--clients", type=int, default=3, help="client threads")
    ap.add_argument("--overlap", type=float, default=0.3,
                    help="probability that a round injects two faults at once")
    ap.add_argument("--min-round", type=float, default=8.0,
                    help="no new round starts with less time than this left")
    ap.add_argument("--only", help="comma-separated fault kinds to use (default: all): "
                    + ", ".join(KINDS_CONTROLLER))
    ap.add_argument("--json", help="write the report as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    ap.add_argument("--short", action="store_true",
                    help="the bounded CI version: --duration 90 --rounds 22")
    ap.add_argument("--tls", action="store_true",
                    help="every listener of the fleet on mutual TLS: the up fleet under "
                    "`motor up --tls` (implies --mode up; the other fleets are plain HTTP)")
    a = ap.parse_args(argv)
    if a.tls:
        if a.mode not in (None, "up"):
            ap.error("--tls runs the up fleet only (--mode up)")
        a.mode = "up"
    if a.mode is None:
        a.mode = "controller,ha,standalone" if a.short else "all"
    if a.short:
        a.duration = min(a.duration, 90)
        a.rounds = min(a.rounds, 22)
    if a.seed is None:
        a.seed = int.from_bytes(os.urandom(4), "little")
    return a


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    run = Run(args)

    def on_term(signum, frame):  # make sure teardown runs on Ctrl-C / SIGTERM
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    try:
        return run.main()
    except KeyboardInterrupt:
        log("interrupted")
        return 2


if __name__ == "__main__":
    sys.exit(main())
