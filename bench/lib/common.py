"""common — what every bench row needs: processes that never outlive the run, ports,
waiting with deadlines, statistics, and /proc readers.

Cleanup model: every process is started through a Session, in its own session (its own
process group). Session.close() asks each one to stop (its `stop` callback, e.g.
`s6-svscanctl -t`, or SIGTERM), then SIGKILLs the groups, then sweeps: any process whose
cwd or command line points into the session's temp dir, or whose command line is one the
row registered with `track_cmdline()`, is SIGKILLed (supervised children often live in
sessions of their own, so killing our groups is not enough). The temp dir is removed last.
Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

REPO = Path(__file__).resolve().parent.parent.parent


# ---------------------------------------------------------------------------------------
# configuration from the environment


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "no", "false")


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    v = os.environ.get(name, "")
    try:
        return int(v) if v else default
    except ValueError:
        raise SystemExit(f"{name} must be an integer, got {v!r}")


def env_float(name: str, default: float) -> float:
    v = os.environ.get(name, "")
    try:
        return float(v) if v else default
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {v!r}")


def motor_bin() -> str:
    return os.environ.get("MOTOR_BIN") or str(REPO / "build" / "motor")


def which(name: str) -> Optional[str]:
    """A tool on PATH or in the sbin directories (nginx lives in /usr/sbin)."""
    p = shutil.which(name)
    if p:
        return p
    for d in ("/usr/sbin", "/sbin", "/usr/local/sbin"):
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return None


def motor_commands(motor: str) -> set[str]:
    """The subcommands `motor help` lists (empty when the binary is missing)."""
    try:
        out = subprocess.run([motor, "help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    cmds, in_list = set(), False
    for line in (out.stdout + out.stderr).splitlines():
        if line.strip() == "commands:":
            in_list = True
            continue
        if in_list:
            if not line.startswith("  "):
                in_list = bool(line.strip() == "")
                if not in_list:
                    break
                continue
            cmds.add(line.split()[0])
    return cmds


# ---------------------------------------------------------------------------------------
# statistics


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return s[int(k)]
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: Iterable[Optional[float]]) -> Optional[dict]:
    """{median, min, max, n, values} over the runs' figures; None when nothing measured."""
    v = [float(x) for x in values if x is not None and not math.isnan(x)]
    if not v:
        return None
    return {"median": percentile(v, 50), "min": min(v), "max": max(v), "n": len(v),
            "values": v}


# ---------------------------------------------------------------------------------------
# ports and waiting


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_run(n: int, step: int = 1, lo: int = 12000, hi: int = 32000) -> int:
    """A base port b such that b, b+step, ..., b+(n-1)*step are all free right now. The
    default range stays below Linux's ephemeral ports (32768+), which outgoing
    connections and port-0 listeners of other programs take at any moment."""
    import random
    for _ in range(200):
        b = random.randrange(lo, hi - n * step)
        if all(port_free(b + i * step) for i in range(n)):
            return b
    raise RuntimeError(f"no run of {n} free ports")


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.01,
             proc: Optional[subprocess.Popen] = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: {proc.args[0]} exited with {proc.returncode}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_port(port: int, timeout: float = 15, proc: Optional[subprocess.Popen] = None) -> None:
    wait_for(lambda: port_open(port), timeout, f"port {port}", 0.01, proc)


def log_event(path: str | Path, event: str) -> Optional[dict]:
    """The first JSON log line of `event` in the file, or None."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("{") and f'"event":"{event}"' in line:
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def wait_log_event(path: str | Path, event: str, timeout: float = 15,
                   proc: Optional[subprocess.Popen] = None) -> dict:
    return wait_for(lambda: log_event(path, event), timeout, f"log event {event}", 0.01, proc)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post_json(url: str, body: Any, timeout: float = 10.0,
                   headers: Optional[dict] = None) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request
    h = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ---------------------------------------------------------------------------------------
# /proc


def all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def read_cmdline(pid: int) -> Optional[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def cmdline_bytes(argv: list[str]) -> bytes:
    return b"".join(a.encode() + b"\0" for a in argv)


def proc_stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state, ppid, pgid) or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rfind(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2])


def pid_alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] != "Z"


def children(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


def mem_kib(pid: int) -> Optional[dict]:
    """{'rss': VmRSS, 'pss': Pss (smaps_rollup), 'rss_anon', 'rss_file'} in KiB, or None."""
    rss = pss = None
    anon = filed = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
                elif line.startswith("RssFile:"):
                    filed = int(line.split()[1])
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                    break
    except OSError:
        return None
    if rss is None:
        return None
    return {"rss": rss, "pss": pss, "rss_anon": anon, "rss_file": filed}


def distinct_kib(pids: Iterable[int]) -> Optional[int]:
    """KiB of distinct physical pages mapped by the processes together (from
    /proc/PID/pagemap; needs root for the frame numbers): the group's RSS as if it were one
    process — a page shared by 17 s6-supervise processes counts once, not 17 times. None
    when the frame numbers are not readable here."""
    import array
    page = os.sysconf("SC_PAGE_SIZE")
    frames: set[int] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as mf, open(f"/proc/{pid}/pagemap", "rb") as pm:
                for line in mf:
                    rng = line.split(None, 1)[0]
                    lo, hi = (int(x, 16) for x in rng.split("-"))
                    if lo >= 0xffffffffff600000:  # [vsyscall]
                        continue
                    n = (hi - lo) // page
                    pm.seek(lo // page * 8)
                    done = 0
                    while done < n:
                        chunk = min(n - done, 1 << 16)
                        buf = pm.read(chunk * 8)
                        if not buf:
                            break
                        a = array.array("Q")
                        a.frombytes(buf[: len(buf) // 8 * 8])
                        for e in a:
                            if e >> 63:
                                pfn = e & ((1 << 55) - 1)
                                if pfn == 0:
                                    return None  # frame numbers hidden (not root)
                                frames.add(pfn)
                        done += chunk
        except OSError:
            return None
    return len(frames) * page // 1024


def mem_sum(pids: Iterable[int]) -> Optional[dict]:
    pids = list(pids)
    tot = {"rss": 0, "pss": 0, "rss_anon": 0, "rss_file": 0, "procs": 0}
    for p in pids:
        m = mem_kib(p)
        if m is None:
            return None
        for k in ("rss", "pss", "rss_anon", "rss_file"):
            tot[k] += m[k] or 0
        tot["procs"] += 1
    tot["distinct"] = distinct_kib(pids)
    return tot


# ---------------------------------------------------------------------------------------
# processes


class Session:
    """Owns the temp dir and every process a row starts; close() leaves nothing behind."""

    def __init__(self, name: str):
        self.tmp = tempfile.mkdtemp(prefix=f"motor-bench-{name}-")
        self.procs: list[tuple[subprocess.Popen, Optional[Callable[[], None]]]] = []
        self.cmdlines: set[bytes] = set()
        self.extra_pids: set[int] = set()

    def path(self, *parts: str) -> str:
        return os.path.join(self.tmp, *parts)

    def start(self, argv: list[str], log: str, stop: Optional[Callable[[], None]] = None,
              cwd: Optional[str] = None, env: Optional[dict] = None) -> subprocess.Popen:
        """Start argv in its own session, stdout+stderr to <tmp>/<log>. `stop` is the
        orderly shutdown (default SIGTERM to the group)."""
        f = open(self.path(log), "ab")
        try:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 cwd=cwd, env=env)
        finally:
            f.close()
        self.procs.append((p, stop))
        return p

    def pids(self) -> list[int]:
        """Every live process this session started, with all their descendants."""
        children: dict[int, list[int]] = {}
        for pid in all_pids():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(pid)
        out, todo = [], [p.pid for p, _ in self.procs if p.poll() is None]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    def set_affinity(self, cpus: Optional[set[int]] = None) -> None:
        """Run every thread of every process of this session on cpus (None: all CPUs)."""
        cpus = cpus or set(range(os.cpu_count() or 1))
        for pid in self.pids():
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                try:
                    os.sched_setaffinity(tid, cpus)
                except OSError:
                    pass  # the thread ended meanwhile

    def track_cmdline(self, argv: list[str]) -> bytes:
        """Sweep any process running exactly argv at close (supervised children)."""
        b = cmdline_bytes(argv)
        self.cmdlines.add(b)
        return b

    def track_pid(self, pid: int) -> None:
        self.extra_pids.add(pid)

    def _ours(self, pid: int) -> bool:
        if pid == os.getpid():
            return False
        cl = read_cmdline(pid)
        if cl is None:
            return False
        if cl in self.cmdlines or self.tmp.encode() in cl:
            return True
        try:
            return os.readlink(f"/proc/{pid}/cwd").startswith(self.tmp)
        except OSError:
            return False

    def _tracked_alive(self) -> bool:
        if not self.cmdlines:
            return False
        for pid in all_pids():
            if read_cmdline(pid) in self.cmdlines and pid_alive(pid):
                return True
        return False

    def sweep(self) -> list[int]:
        """SIGKILL every leftover process of this session; the pids found."""
        found = []
        for pid in all_pids():
            if self._ours(pid) and pid_alive(pid):
                found.append(pid)
        for pid in self.extra_pids:
            # only if it still looks like ours (pids get reused)
            if pid not in found and pid_alive(pid) and self._ours(pid):
                found.append(pid)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return found

    def close(self, grace: float = 5.0) -> list[int]:
        """Stop everything; returns the pids the final sweep had to kill (should be
        empty after an orderly stop, informative otherwise)."""
        for p, stop in self.procs:
            if p.poll() is not None:
                continue
            try:
                if stop:
                    stop()
                else:
                    os.killpg(p.pid, signal.SIGTERM)
            except Exception:
                pass
        # orderly: wait for our processes and for the supervised ones they stop
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p, _ in self.procs) and not self._tracked_alive():
                break
            time.sleep(0.02)
        for p, _ in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        swept: list[int] = []
        # supervised children may be respawned by a supervisor we are still killing:
        # repeat until a pass finds nothing
        for _ in range(50):
            got = self.sweep()
            if not got:
                break
            swept.extend(got)
            time.sleep(0.05)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return swept

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def log(msg: str) -> None:
    """Progress to stderr (the table goes to stdout)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
