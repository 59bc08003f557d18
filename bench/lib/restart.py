"""restart — SIGKILL supervised processes one at a time and time each replacement.

Per kill: t_kill = CLOCK_MONOTONIC right before kill(2); the replacement is the first new
process that runs exactly the victim's command line. Its time is the kernel's timestamp
of the replacement's (last) exec — from the netlink proc connector, no polling — or, when
the connector is unavailable, the moment a /proc poll of the supervisor's children
(every `poll_interval` s) first sees it. The fork timestamp and the victim's exit
timestamp are kept too (JSON only).

Pacing, the same for every supervisor: one kill every `interval` s, round robin over the
services (the one that has run longest goes next), and never a process younger than
`min_age` s (runsv delays the restart of a service that ran < 1 s). When the replacement
comes faster than `interval`, kills never overlap; a supervisor that takes longer has
several restarts in flight at once, each timed on its own — unless `max_inflight` caps
them (1 = a lone death: the next kill waits for the previous replacement + `interval`).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Optional

from . import common as C
from . import procev


@dataclass
class Svc:
    cmdline: bytes
    pid: int
    parent: int
    started_ns: int


@dataclass
class Kill:
    svc: Svc
    victim: int
    t_kill: int
    new_pid: Optional[int] = None
    t_exec: Optional[int] = None
    t_fork: Optional[int] = None
    t_exit: Optional[int] = None
    lost: bool = False

    def ms(self, which: str = "exec") -> Optional[float]:
        t = {"exec": self.t_exec, "fork": self.t_fork, "exit": self.t_exit}[which]
        return None if t is None else (t - self.t_kill) / 1e6


@dataclass
class Result:
    kills: list[Kill] = field(default_factory=list)
    method: str = ""
    overruns: int = 0

    def latencies(self, which: str = "exec") -> list[float]:
        return [v for k in self.kills if (v := k.ms(which)) is not None]

    @property
    def lost(self) -> int:
        return sum(1 for k in self.kills if k.lost)


def _find(cmdline: bytes, not_pid: int) -> Optional[int]:
    for pid in C.all_pids():
        if pid != not_pid and C.read_cmdline(pid) == cmdline and C.pid_alive(pid):
            return pid
    return None


def kill_loop(found: dict[bytes, int], n_kills: int, interval: float = 0.04,
              min_age: float = 1.1, timeout: float = 15.0, poll_interval: float = 0.0005,
              use_events: bool = True, max_inflight: int = 0) -> Result:
    now = time.monotonic_ns()
    svcs = []
    for cl, pid in found.items():
        st = C.proc_stat(pid)
        svcs.append(Svc(cl, pid, st[1] if st else 0, now))
    ev = None
    if use_events and not C.env_flag("BENCH_NO_PROCEV"):
        try:
            ev = procev.ProcEvents()
        except OSError:
            ev = None
    res = Result(method="netlink proc connector (kernel exec timestamp)" if ev else
                 f"/proc polling every {poll_interval * 1e3:g} ms")
    pending: dict[int, Kill] = {}  # victim pid -> kill
    by_svc: dict[bytes, Kill] = {}  # service -> its kill in flight
    late: dict[int, Kill] = {}  # replacement tgid -> its kill (a later exec updates it)
    forks: dict[int, int] = {}  # child tgid -> fork ts
    killed = 0
    min_age_ns = int(min_age * 1e9)
    interval_ns = int(interval * 1e9)
    next_kill = 0

    def found_replacement(k: Kill, pid: int, ts: int) -> None:
        nonlocal next_kill
        if max_inflight == 1:  # a lone death: the next kill comes `interval` after this
            next_kill = max(next_kill, ts + interval_ns)
        k.new_pid, k.t_exec = pid, ts
        k.t_fork = forks.get(pid)
        k.svc.pid, k.svc.started_ns = pid, ts
        st = C.proc_stat(pid)
        if st:
            k.svc.parent = st[1]
        pending.pop(k.victim, None)
        by_svc.pop(k.svc.cmdline, None)
        late[pid] = k
        if len(late) > 256:
            late.pop(next(iter(late)))

    try:
        while killed < n_kills or pending:
            now = time.monotonic_ns()
            # next kill: the oldest service without a kill in flight, once old enough
            wait_s = 0.05
            if killed < n_kills and (max_inflight <= 0 or len(pending) < max_inflight):
                cand = [s for s in svcs if s.cmdline not in by_svc]
                if cand:
                    s = min(cand, key=lambda x: x.started_ns)
                    ready = max(s.started_ns + min_age_ns, next_kill)
                    if now >= ready:
                        k = Kill(s, s.pid, 0)
                        k.t_kill = time.monotonic_ns()
                        try:
                            os.kill(s.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            # died on its own (or the supervisor replaced it): find it again
                            s.pid = _find(s.cmdline, -1) or s.pid
                            s.started_ns = time.monotonic_ns()
                            continue
                        pending[s.pid] = k
                        by_svc[s.cmdline] = k
                        res.kills.append(k)
                        killed += 1
                        next_kill = k.t_kill + interval_ns
                        continue
                    wait_s = min(wait_s, (ready - now) / 1e9)
            # replacements
            if ev is not None:
                for e in ev.read(timeout=max(wait_s, 0.0005)):
                    if e.what == procev.PROC_EVENT_FORK:
                        if e.data[2] == e.data[3]:
                            forks[e.data[3]] = e.ts_ns
                            if len(forks) > 4096:
                                for key in list(forks)[:2048]:
                                    forks.pop(key, None)
                    elif e.what == procev.PROC_EVENT_EXEC:
                        tgid = e.data[1]
                        lk = late.get(tgid)
                        if lk is not None:
                            lk.t_exec = e.ts_ns  # e.g. /bin/sh run script -> the command
                            continue
                        if not by_svc:
                            continue
                        cl = C.read_cmdline(tgid)
                        k = by_svc.get(cl) if cl else None
                        if k is not None and tgid != k.victim:
                            found_replacement(k, tgid, e.ts_ns)
                    elif e.what == procev.PROC_EVENT_EXIT:
                        k = pending.get(e.data[1])
                        if k is not None and e.data[0] == e.data[1]:
                            k.t_exit = e.ts_ns
                res.overruns = ev.overruns
            else:
                deadline = time.monotonic() + max(wait_s, 0.0)
                while True:
                    for k in list(pending.values()):
                        for pid in C.children(k.svc.parent):
                            if pid != k.victim and C.read_cmdline(pid) == k.svc.cmdline:
                                found_replacement(k, pid, time.monotonic_ns())
                                break
                    if not pending or time.monotonic() >= deadline:
                        break
                    time.sleep(poll_interval)
            # give up on a kill after `timeout`
            now = time.monotonic_ns()
            for k in list(pending.values()):
                if now - k.t_kill > timeout * 1e9:
                    k.lost = True
                    pending.pop(k.victim, None)
                    by_svc.pop(k.svc.cmdline, None)
                    pid = _find(k.svc.cmdline, k.victim)
                    if pid is None:
                        raise RuntimeError(f"service {k.svc.cmdline!r} not restarted within "
                                           f"{timeout:g}s and not running")
                    k.svc.pid, k.svc.started_ns = pid, now
        # a late second exec (run script -> command) is at most a few ms away
        if ev is not None:
            end = time.monotonic() + 0.05
            while time.monotonic() < end:
                for e in ev.read(timeout=0.01):
                    if e.what == procev.PROC_EVENT_EXEC and e.data[1] in late:
                        late[e.data[1]].t_exec = e.ts_ns
    finally:
        if ev is not None:
            ev.close()
    return res
