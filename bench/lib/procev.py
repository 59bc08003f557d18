"""procev — process fork/exec/exit events from the kernel's netlink proc connector.

Each event carries the kernel's own timestamp (ktime_get_ns, i.e. CLOCK_MONOTONIC, the
clock of time.monotonic_ns()), so "kill → replacement exec'd" is measured without
polling and without the poller's own scheduling delay. Needs CAP_NET_ADMIN and the
initial network and PID namespaces; ProcEvents() raises OSError otherwise and the caller
falls back to polling /proc (see restart.py).

Layout (linux/connector.h, linux/cn_proc.h): nlmsghdr (16 bytes) + cn_msg (cb_id idx,val;
seq; ack; len u16; flags u16 = 20 bytes) + proc_event {u32 what; u32 cpu; u64
timestamp_ns; union event_data}.
"""

from __future__ import annotations

import errno
import select
import socket
import struct
from typing import NamedTuple, Optional

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
NLMSG_DONE = 3

PROC_EVENT_FORK = 0x00000001
PROC_EVENT_EXEC = 0x00000002
PROC_EVENT_EXIT = 0x80000000

_EV_OFF = 16 + 20  # proc_event inside the datagram


class Event(NamedTuple):
    what: int
    ts_ns: int
    # FORK: (parent_pid, parent_tgid, child_pid, child_tgid)
    # EXEC: (pid, tgid)
    # EXIT: (pid, tgid, exit_code, exit_signal)
    data: tuple


class ProcEvents:
    def __init__(self, rcvbuf: int = 8 << 20):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        try:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.bind((0, CN_IDX_PROC))
            self._control(PROC_CN_MCAST_LISTEN)
            self.sock.setblocking(False)
            self.overruns = 0
            self._selftest()
        except BaseException:
            self.sock.close()
            raise

    def _control(self, op: int) -> None:
        payload = struct.pack("=I", op)
        cn = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
        nl = struct.pack("=IHHII", 16 + len(cn), NLMSG_DONE, 0, 0, 0) + cn
        self.sock.send(nl)

    def _selftest(self) -> None:
        """Events must actually arrive and carry our own pids (a PID namespace would
        report other numbers): run /bin/true and look for its exec."""
        import subprocess
        import time
        p = subprocess.Popen(["/bin/true"])
        p.wait()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            for ev in self.read(timeout=0.1):
                if ev.what == PROC_EVENT_EXEC and ev.data[1] == p.pid:
                    return
        raise OSError(errno.ENOTSUP, "proc connector delivers no usable events here")

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self, timeout: Optional[float] = 0.0) -> list[Event]:
        """Events available now (waiting up to `timeout` s for the first one)."""
        out: list[Event] = []
        if timeout:
            r, _, _ = select.select([self.sock], [], [], timeout)
            if not r:
                return out
        while True:
            try:
                buf = self.sock.recv(65536)
            except BlockingIOError:
                return out
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    self.overruns += 1
                    continue
                raise
            off = 0
            while off + 16 <= len(buf):
                nl_len = struct.unpack_from("=I", buf, off)[0]
                if nl_len < 16 or off + nl_len > len(buf):
                    break
                ev = self._parse(buf, off)
                if ev is not None:
                    out.append(ev)
                off += (nl_len + 3) & ~3

    @staticmethod
    def _parse(buf: bytes, off: int) -> Optional[Event]:
        base = off + _EV_OFF
        if base + 16 > len(buf):
            return None
        what, _cpu, ts = struct.unpack_from("=IIQ", buf, base)
        d = base + 16
        if what == PROC_EVENT_FORK and d + 16 <= len(buf):
            return Event(what, ts, struct.unpack_from("=iiii", buf, d))
        if what == PROC_EVENT_EXEC and d + 8 <= len(buf):
            return Event(what, ts, struct.unpack_from("=ii", buf, d))
        if what == PROC_EVENT_EXIT and d + 16 <= len(buf):
            return Event(what, ts, struct.unpack_from("=iiII", buf, d))
        return None

    def close(self) -> None:
        try:
            self._control(PROC_CN_MCAST_IGNORE)
        except OSError:
            pass
        self.sock.close()


def available() -> Optional[str]:
    """None when the proc connector works here, else why not."""
    try:
        ProcEvents().close()
        return None
    except OSError as e:
        return str(e)
