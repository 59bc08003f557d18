"""ctx — the run's settings, from the environment (see bench/README.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import common as C


@dataclass
class Ctx:
    motor: str
    quick: bool
    reps: int  # repetitions of every row
    kills: int  # SIGKILLs per run of the restart row
    services: int  # supervised processes in the restart row
    interval: float  # s between two kills
    min_age: float  # s a process must have run before it is killed
    lone_kills: int  # kills per run of the one-death-at-a-time variant (0 = skip it)
    mem_engines: int  # engines supervised in the memory row
    wrk_seconds: int  # wrk duration, management API row
    gw_seconds: int  # wrk duration, gateway row
    gw_requests: int  # motor-latprobe timed requests per target, mode and repetition
    gw_batch: int  # motor-latprobe batch size (requests to one target before the next)
    wrk_threads: int
    wrk_connections: int
    rows: set[str] = field(default_factory=set)  # empty = all
    motor_cmds: set[str] = field(default_factory=set)

    @staticmethod
    def from_env() -> "Ctx":
        quick = C.env_flag("BENCH_QUICK")
        motor = os.path.abspath(C.motor_bin())
        rows = {r.strip() for r in C.env_str("BENCH_ROWS").split(",") if r.strip()}
        return Ctx(
            motor=motor,
            quick=quick,
            reps=C.env_int("BENCH_REPS", 1 if quick else 3),
            kills=C.env_int("BENCH_KILLS", 100 if quick else 200),
            services=C.env_int("BENCH_SERVICES", 64),
            interval=C.env_float("BENCH_KILL_INTERVAL_MS", 30) / 1000.0,
            min_age=C.env_float("BENCH_MIN_AGE_MS", 1100) / 1000.0,
            lone_kills=C.env_int("BENCH_LONE_KILLS", 5),
            mem_engines=C.env_int("BENCH_MEM_ENGINES", 16),
            wrk_seconds=C.env_int("BENCH_WRK_SECONDS", 3 if quick else 10),
            gw_seconds=C.env_int("BENCH_GW_SECONDS", 3),
            gw_requests=C.env_int("BENCH_GW_REQUESTS", 5000 if quick else 20000),
            gw_batch=C.env_int("BENCH_GW_BATCH", 50),
            wrk_threads=C.env_int("BENCH_WRK_THREADS", 2),
            wrk_connections=C.env_int("BENCH_WRK_CONNECTIONS", 16),
            rows=rows,
            motor_cmds=C.motor_commands(motor),
        )

    def want(self, row: str) -> bool:
        return not self.rows or row in self.rows

    def settings(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("motor_cmds", "rows")}
        d["rows"] = sorted(self.rows) or "all"
        d["mode"] = "quick" if self.quick else "full"
        return d
