"""motorlib — the shared harness of Motor's integration tests.

Real processes on 127.0.0.1, driven over HTTP, never left behind:

* ``motor_bin()``: the binary under test (env ``MOTOR_BIN``, else ``build-asan/motor``
  at the repository root).
* ``Proc``: a process started in its own session (its own process group), with stdout
  and stderr captured to a file; wait for a JSON log event, read the tail, signal or kill
  the whole group. Every ``Proc`` is also registered for an ``atexit`` sweep, so even a
  crashed test run leaves nothing behind.
* ``ProcRegistry``: what the ``procs`` fixture hands out; kills everything it started at
  teardown.
* HTTP helpers on urllib: ``http()``, ``get_json()``, ``post_json()``, ``wait_http()``,
  and ``SSEStream`` that checks SSE framing while it yields parsed chunks.
* Process-tree helpers from /proc: ``group_pids()``, ``children_of()``,
  ``assert_no_process()``, ``pid_alive()``, ``port_is_free()``, ``free_port()``.
* ``wait_for()``: poll a predicate with a deadline (use it instead of sleeps).
* ``start_sim()``: an engine simulator on an ephemeral port, ready to use.

Standard library only (Debian's /usr/bin/python3 + pytest run it).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# ---------------------------------------------------------------------------------------
# binary, ports, polling


def motor_bin() -> str:
    """Path of the motor binary under test (MOTOR_BIN, else <repo>/build-asan/motor)."""
    path = os.environ.get("MOTOR_BIN") or str(REPO / "build-asan" / "motor")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"motor binary not found or not executable: {path} "
                                f"(set MOTOR_BIN)")
    return path


# Ports handed out by free_port(): blocks of PORT_BLOCK consecutive ports above the
# kernel's ephemeral range (32768-60999 on Linux), leased through a lock file per block
# in a directory every test process of the machine shares. A port chosen by binding to
# port 0 and releasing it could be taken before the daemon binds it — by an outgoing
# connection's source port or by a concurrent test (seen under ctest -j2: an engine's DP
# RPC port, a simulator's KV-event replay port). Outside the ephemeral range only
# explicit binds compete, and the leases keep concurrent tests (also of other checkouts)
# apart. Callers may use base + 0..PORT_BLOCK-1 (DP rank offsets, replay ports).
PORT_LEASE_DIR = Path(tempfile.gettempdir()) / "motor-port-leases"
PORT_RANGE = (61000, 65528)
PORT_BLOCK = 8
_leased: list[Path] = []


def _lease_holder_alive(path: Path) -> bool:
    try:
        pid = int(path.read_text().strip() or "0")
    except (OSError, ValueError):
        return True  # being written right now: treat as held
    return pid > 0 and pid_alive(pid)


def _release_leases() -> None:
    for p in _leased:
        try:
            p.unlink()
        except OSError:
            pass
    _leased.clear()


def free_port(host: str = "127.0.0.1") -> int:
    """The first port of a block of PORT_BLOCK free ports, leased to this process until it
    exits (see PORT_LEASE_DIR)."""
    PORT_LEASE_DIR.mkdir(parents=True, exist_ok=True)
    blocks = list(range(PORT_RANGE[0], PORT_RANGE[1], PORT_BLOCK))
    start = (os.getpid() * 7919 + time.monotonic_ns() // 1000) % len(blocks)
    for k in range(len(blocks)):
        base = blocks[(start + k) % len(blocks)]
        lease = PORT_LEASE_DIR / str(base)
        try:
            fd = os.open(lease, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _lease_holder_alive(lease):
                continue
            try:
                lease.unlink()  # its holder is gone: take it over
                fd = os.open(lease, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError:
                continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        if not all(port_is_free(base + i, host) for i in range(PORT_BLOCK)):
            lease.unlink()
            continue
        if not _leased:
            atexit.register(_release_leases)
        _leased.append(lease)
        return base
    raise RuntimeError(f"no free port block in {PORT_RANGE} ({PORT_LEASE_DIR})")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nobody listens on (host, port): we can bind it ourselves."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
        return True


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02,
             what: str = "condition") -> Any:
    """Poll pred() until it returns something truthy; return that. TimeoutError after
    `timeout` seconds (the message names `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------------------
# /proc helpers


def _stat(pid: int) -> Optional[tuple[str, int, int]]:
    """(state, ppid, pgrp) of pid, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses: fields start after the last ')'.
    rest = data[data.rfind(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2])


def _all_pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def pid_alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def group_pids(pgid: int, include_zombies: bool = False) -> list[int]:
    """Pids whose process group is pgid (zombies left out: they are dead already)."""
    out = []
    for pid in _all_pids():
        st = _stat(pid)
        if st and st[2] == pgid and (include_zombies or st[0] not in ("Z", "X")):
            out.append(pid)
    return sorted(out)


def children_of(pid: int) -> list[int]:
    """Live direct children of pid."""
    out = []
    for p in _all_pids():
        st = _stat(p)
        if st and st[1] == pid and st[0] not in ("Z", "X"):
            out.append(p)
    return sorted(out)


def assert_no_process(pgid: int, timeout: float = 5.0, pids: Optional[list[int]] = None) -> None:
    """Wait until no live process is left in group pgid (and none of `pids` lives);
    AssertionError naming the survivors otherwise."""
    def gone() -> bool:
        return not group_pids(pgid) and not [p for p in (pids or []) if pid_alive(p)]
    try:
        wait_for(gone, timeout, what=f"process group {pgid} to be empty")
    except TimeoutError:
        left = group_pids(pgid) + [p for p in (pids or []) if pid_alive(p)]
        raise AssertionError(f"processes still alive after {timeout}s: {sorted(set(left))}")


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------------------
# processes

_LIVE: "weakref.WeakSet[Proc]" = weakref.WeakSet()


class ProcessExited(RuntimeError):
    """The process ended while we were waiting for something from it."""


class Proc:
    """A child process in its own session, output captured to `log_path`.

    ``Proc(argv, name="sim", log_dir=tmp)``; use as a context manager or through a
    ``ProcRegistry`` so it is always cleaned up. ``close()`` kills the whole process
    group and reaps the leader; it is idempotent."""

    def __init__(self, argv: list[str], name: Optional[str] = None,
                 log_dir: Optional[str] = None, env: Optional[dict[str, str]] = None,
                 cwd: Optional[str] = None, extra_env: Optional[dict[str, str]] = None,
                 stdin: Any = subprocess.DEVNULL):
        self.argv = [str(a) for a in argv]
        self.name = name or Path(self.argv[0]).name
        if log_dir is None:
            log_dir = tempfile.mkdtemp(prefix="motor-it-")
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, f"{self.name}-{os.getpid()}-{id(self):x}.log")
        full_env = dict(os.environ if env is None else env)
        full_env.update(extra_env or {})
        self._log = open(self.log_path, "wb")
        try:
            self.popen = subprocess.Popen(self.argv, stdin=stdin, stdout=self._log,
                                          stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                                          start_new_session=True)
        except BaseException:
            self._log.close()
            raise
        self.pid = self.popen.pid
        self.pgid = self.pid  # start_new_session: the leader of a fresh group
        self._closed = False
        _LIVE.add(self)

    # -- state ---------------------------------------------------------------------------

    @property
    def returncode(self) -> Optional[int]:
        """Exit code, -signal when killed by a signal, None while running."""
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float = 10.0) -> int:
        """Wait for the leader to exit; its return code. TimeoutError if it does not."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.name} (pid {self.pid}) still running after {timeout}s\n"
                               f"{self.tail()}") from None

    # -- output ----------------------------------------------------------------------------

    def output(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def tail(self, lines: int = 40) -> str:
        text = self.output().splitlines()[-lines:]
        return f"--- last {len(text)} lines of {self.name} ({self.log_path}) ---\n" + \
            "\n".join(text)

    def events(self) -> list[dict]:
        """Every JSON-object line of the output, in order (other lines are skipped)."""
        out = []
        for line in self.output().splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def find_events(self, event: str, **fields: Any) -> list[dict]:
        return [e for e in self.events() if e.get("event") == event and
                all(e.get(k) == v for k, v in fields.items())]

    def wait_event(self, event: str, timeout: float = 10.0, after: int = 0,
                   **fields: Any) -> dict:
        """Wait for a log line {"event": event, **fields}; return it. `after` skips the
        first matches (after=1 waits for the second one). Raises ProcessExited if the
        process ends first, TimeoutError at the deadline (both with the output tail)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.find_events(event, **fields)
            if len(found) > after:
                return found[after]
            if not self.alive():
                found = self.find_events(event, **fields)  # lines written just before exit
                if len(found) > after:
                    return found[after]
                raise ProcessExited(f"{self.name} exited with {self.returncode} before "
                                    f"logging {event} {fields or ''}\n{self.tail()}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.name}: no {event} {fields or ''} within "
                                   f"{timeout}s\n{self.tail()}")
            time.sleep(0.02)

    # -- signals and cleanup -----------------------------------------------------------------

    def signal(self, sig: int, group: bool = False) -> None:
        if group:
            _killpg(self.pgid, sig)
        elif self.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self, group: bool = True) -> None:
        self.signal(signal.SIGTERM, group)

    def kill(self, group: bool = True) -> None:
        self.signal(signal.SIGKILL, group)

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM the leader, wait, then SIGKILL the group if needed; the return code."""
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            return self.popen.wait()

    def close(self) -> None:
        """Kill the whole group, reap the leader, close the log. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _killpg(self.pgid, signal.SIGKILL)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # Members that moved to another group are not ours to hunt; the group is swept.
        deadline = time.monotonic() + 5
        while group_pids(self.pgid) and time.monotonic() < deadline:
            _killpg(self.pgid, signal.SIGKILL)
            time.sleep(0.02)
        self._log.close()
        _LIVE.discard(self)

    def __enter__(self) -> "Proc":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Proc {self.name} pid={self.pid} rc={self.returncode}>"


@atexit.register
def _sweep_live() -> None:
    """Safety net: nothing started by a test outlives the test run."""
    for p in list(_LIVE):
        try:
            p.close()
        except Exception:
            pass


class ProcRegistry:
    """Starts processes for one test and kills them all at the end."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def start(self, argv: list[str], name: Optional[str] = None, **kw: Any) -> Proc:
        p = Proc(argv, name=name, log_dir=self.log_dir, **kw)
        self.procs.append(p)
        return p

    def motor(self, *args: Any, name: Optional[str] = None, **kw: Any) -> Proc:
        """Start `motor <args>`."""
        return self.start([motor_bin(), *[str(a) for a in args]],
                          name=name or (str(args[0]) if args else "motor"), **kw)

    def tails(self, lines: int = 30) -> str:
        return "\n".join(p.tail(lines) for p in self.procs)

    def close_all(self) -> None:
        for p in reversed(self.procs):
            p.close()


# ---------------------------------------------------------------------------------------
# HTTP


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.text[:200]!r}>"


def http(method: str, url: str, body: Any = None, headers: Optional[dict[str, str]] = None,
         timeout: float = 5.0, raw: Optional[bytes] = None, context: Any = None) -> Response:
    """One request. `body` is sent as JSON, `raw` as is; `context`: an ssl.SSLContext for
    https:// URLs. HTTP errors are returned, not raised; transport failures raise
    (URLError, ConnectionError, socket.timeout)."""
    data = raw
    hdrs = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return Response(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        with e:
            return Response(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def get(url: str, timeout: float = 5.0, **kw: Any) -> Response:
    return http("GET", url, timeout=timeout, **kw)


def post(url: str, body: Any = None, timeout: float = 5.0, **kw: Any) -> Response:
    return http("POST", url, body=body, timeout=timeout, **kw)


def get_json(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    r = get(url, timeout)
    return r.status, (r.json() if r.body else None)


def post_json(url: str, body: Any, timeout: float = 5.0) -> tuple[int, Any]:
    r = post(url, body, timeout)
    return r.status, (r.json() if r.body else None)


def try_get(url: str, timeout: float = 1.0) -> Optional[Response]:
    """GET that answers None instead of raising on transport errors."""
    try:
        return get(url, timeout)
    except (OSError, urllib.error.URLError):
        return None


def wait_http(url: str, status: int = 200, timeout: float = 10.0,
              proc: Optional[Proc] = None) -> Response:
    """Poll GET url until it answers `status`. With proc, fail fast when it dies."""
    last: list[Any] = [None]

    def check() -> Optional[Response]:
        if proc is not None and not proc.alive():
            raise ProcessExited(f"{proc.name} exited with {proc.returncode} while waiting "
                                f"for {url}\n{proc.tail()}")
        r = try_get(url, timeout=1.0)
        last[0] = r
        return r if r is not None and r.status == status else None
    try:
        return wait_for(check, timeout, what=f"GET {url} -> {status}")
    except TimeoutError as e:
        raise TimeoutError(f"{e}; last answer: {last[0]!r}") from None


class SSEStream:
    """A POST answered with Server-Sent Events, checked as it is read.

    Framing enforced: every event is exactly one "data: <payload>" line followed by a
    blank line; payloads are JSON objects except the final "[DONE]". `chunks()` yields
    the parsed objects; `times` holds the monotonic arrival time of each event."""

    def __init__(self, url: str, body: Any, timeout: float = 10.0,
                 headers: Optional[dict[str, str]] = None, context: Any = None):
        hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        hdrs.update(headers or {})
        req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers=hdrs)
        self.status = 0
        self.error_body: Optional[bytes] = None
        self.events: list[str] = []
        self.times: list[float] = []
        self.done = False
        try:
            self.resp = urllib.request.urlopen(req, timeout=timeout, context=context)
            self.status = self.resp.status
            self.content_type = self.resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            self.resp = None
            self.status = e.code
            self.content_type = e.headers.get("Content-Type", "")
            self.error_body = e.read()
            e.close()

    def raw_events(self) -> Iterator[str]:
        """Payloads of the events, in order, validating the framing."""
        if self.resp is None:
            return
        with self.resp:
            while True:
                line = self.resp.readline()
                if not line:
                    break  # the server ended the stream
                if not line.endswith(b"\n"):
                    raise AssertionError(f"SSE line not terminated: {line!r}")
                if not line.startswith(b"data: "):
                    raise AssertionError(f"SSE line is not 'data: ...': {line!r}")
                blank = self.resp.readline()
                if blank != b"\n":
                    raise AssertionError(f"SSE event not followed by a blank line: {blank!r}")
                payload = line[6:-1].decode()
                self.events.append(payload)
                self.times.append(time.monotonic())
                if self.done:
                    raise AssertionError(f"event after [DONE]: {payload!r}")
                if payload == "[DONE]":
                    self.done = True
                yield payload

    def chunks(self) -> Iterator[dict]:
        """Parsed JSON chunks up to [DONE] (which is required at the end)."""
        for payload in self.raw_events():
            if payload == "[DONE]":
                continue
            obj = json.loads(payload)
            if not isinstance(obj, dict):
                raise AssertionError(f"SSE payload is not a JSON object: {payload!r}")
            yield obj
        if not self.done:
            raise AssertionError("stream ended without data: [DONE]")

    def all(self) -> list[dict]:
        return list(self.chunks())

    def close(self) -> None:
        if self.resp is not None:
            self.resp.close()


# ---------------------------------------------------------------------------------------
# the engine simulator


class Sim:
    """A running `motor engine-sim`: its Proc, port and base URL."""

    def __init__(self, proc: Proc, port: int, host: str = "127.0.0.1"):
        self.proc = proc
        self.port = port
        self.host = host
        self.url = f"http://{host}:{port}"

    def __getattr__(self, name: str) -> Any:  # sim.pid, sim.wait_event(...), ...
        return getattr(self.proc, name)

    def completion(self, timeout: float = 10.0, **body: Any) -> Response:
        return post(self.url + "/v1/completions", body, timeout)

    def chat(self, timeout: float = 10.0, **body: Any) -> Response:
        return post(self.url + "/v1/chat/completions", body, timeout)

    def fault(self, mode: str, timeout: float = 5.0, **extra: Any) -> Response:
        return post(self.url + "/sim/fault", {"mode": mode, **extra}, timeout)

    def status(self) -> dict:
        return get(self.url + "/sim/status").json()


def start_sim(procs: ProcRegistry, *args: Any, name: str = "engine-sim", ready: bool = True,
              timeout: float = 15.0, **kw: Any) -> Sim:
    """Start `motor engine-sim --port 0 <args>` and wait until it listens (and, with
    ready=True, until it logged sim_ready). Pass --port yourself to pick one."""
    argv = ["engine-sim", *[str(a) for a in args]]
    if "--port" not in argv and not any(a.startswith("--port=") for a in argv):
        argv += ["--port", "0"]
    p = procs.motor(*argv, name=name, **kw)
    ev = p.wait_event("sim_listening", timeout=timeout)
    host = ev.get("host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    sim = Sim(p, int(ev["port"]), host)
    if ready:
        p.wait_event("sim_ready", timeout=timeout)
    return sim
