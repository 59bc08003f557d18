"""chaos_service — what a Kubernetes Service does in front of the coordinators, for the
two-coordinator fleet: one listening port that forwards each new TCP connection to a
backend whose readiness probe passes (kube-proxy's view: endpoints are the ready pods).

A prober thread asks every backend's GET /readiness every `period` seconds; a backend is
ready after one 200 and unready after one non-200 or failure (readinessProbe with
failureThreshold 1, as deploy/kubernetes/coordinator.yaml sets it, periodSeconds scaled
down). A connection is pinned to the backend chosen when it was accepted, as with
iptables DNAT: when that backend dies the connection breaks, and the client's retry
lands on whichever is ready then. With no ready backend a connection is closed at once
(kube-proxy rejects it). Standard library only; threads, one pair per connection.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Optional


class Service:
    def __init__(self, port: int, backends: list[tuple[int, int]], period: float = 0.1,
                 name: str = "svc"):
        """backends: (forwarded port, readiness port) pairs on 127.0.0.1."""
        self.name = name
        self.backends = backends
        self.period = period
        self.ready = [False] * len(backends)
        self.rr = 0
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(256)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.conns: set[socket.socket] = set()
        self.threads = [threading.Thread(target=self._probe, daemon=True, name=f"{name}-probe"),
                        threading.Thread(target=self._accept, daemon=True, name=f"{name}-accept")]
        for t in self.threads:
            t.start()

    # -- readiness -------------------------------------------------------------------------

    def _probe(self) -> None:
        while not self.stop_ev.wait(self.period):
            for i, (_, ready_port) in enumerate(self.backends):
                ok = False
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{ready_port}/readiness",
                                                timeout=max(self.period * 5, 0.5)) as r:
                        ok = r.status == 200
                except (urllib.error.URLError, OSError, ValueError):
                    ok = False
                except Exception:
                    ok = False
                with self.lock:
                    self.ready[i] = ok

    def ready_backends(self) -> list[int]:
        with self.lock:
            return [i for i, r in enumerate(self.ready) if r]

    def _pick(self) -> Optional[int]:
        with self.lock:
            up = [i for i, r in enumerate(self.ready) if r]
            if not up:
                return None
            self.rr += 1
            return self.backends[up[self.rr % len(up)]][0]

    # -- forwarding ------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self.stop_ev.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            port = self._pick()
            if port is None:
                c.close()  # no endpoint: rejected
                continue
            try:
                b = socket.create_connection(("127.0.0.1", port), timeout=2)
            except OSError:
                c.close()
                continue
            c.settimeout(None)
            b.settimeout(None)
            with self.lock:
                self.conns |= {c, b}
            threading.Thread(target=self._pipe, args=(c, b), daemon=True).start()
            threading.Thread(target=self._pipe, args=(b, c), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._drop(src)

    def _drop(self, s: socket.socket) -> None:
        with self.lock:
            if s not in self.conns:
                return
            self.conns.discard(s)
        # both directions ended (or one broke): close when the peer pipe is done too
        threading.Timer(1.0, s.close).start()

    def close(self) -> None:
        self.stop_ev.set()
        try:
            self.sock.close()
        except OSError:
            pass
        for t in self.threads:
            t.join(2)
        with self.lock:
            conns = list(self.conns)
            self.conns.clear()
        for s in conns:
            try:
                s.close()
            except OSError:
                pass


def wait_ready(svc: Service, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not svc.ready_backends():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{svc.name}: no ready backend")
        time.sleep(0.05)
