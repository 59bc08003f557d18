"""chaos_net — where the chaos fleet's pods live, and how the link between a node
manager and the controller is cut.

Two implementations with one interface (``setup(n_pods)``, ``pod_ip(g)``,
``controller_host``, ``controller_addr_for(g, port)``, ``wrap(g, argv)``, ``cut(g)``,
``heal(g)``, ``teardown()``, ``leftovers()``):

* ``NetnsNet`` (root + iproute2): every pod (one node manager and its engines) runs in
  its own network namespace ``mc<run>p<g>``, connected by a veth pair to a bridge
  ``mc<run>br`` in the root namespace. The bridge holds the controller's address
  (10.X.0.1/16); pod g is 10.X.0.(10+g). Cutting pod g sets the root end of its veth
  down: frames are silently dropped both ways (no RST, no ICMP), which is what a real
  partition looks like — established connections hang, new ones time out. The node
  manager loses the controller, and the coordinator loses that pod's engines.
  The sandbox this was written on has a default route that accepts *any* TCP connection
  (a transparent proxy), so no pod address may ever be routed outside: the /16 lives on
  the bridge, which stays up while ports come and go.
* ``ProxyNet`` (fallback when namespaces are not available): pods share 127.0.0.1; each
  node manager reaches the controller through its own blocking TCP proxy (asyncio, in a
  thread of the driver). Cutting pod g stops the proxy from moving bytes: established
  connections are held open and silent, new ones are accepted and never answered.
  Only the node manager -> controller direction goes through the proxy; the controller's
  own calls to the node manager (start, probes) are not cut.

Everything created here is named after the run id and removed by ``teardown()``;
``leftovers()`` lists what is still there (the chaos run asserts it is empty).
Standard library only.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import threading
import time
from typing import Optional

IP = shutil.which("ip") or "/usr/sbin/ip"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([IP, *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def netns_available() -> tuple[bool, str]:
    """Can we create a namespace, a bridge and a veth pair here? (root + iproute2)"""
    if os.geteuid() != 0:
        return False, "not root"
    if not os.access(IP, os.X_OK):
        return False, "iproute2 'ip' not found"
    tag = f"mcprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", tag)
        try:
            _ip("link", "add", tag[:15], "type", "bridge")
            _ip("link", "del", tag[:15])
            _ip("link", "add", f"{tag[:11]}a", "type", "veth", "peer", "name", f"{tag[:11]}b")
            _ip("link", "set", f"{tag[:11]}b", "netns", tag)
            _ip("link", "del", f"{tag[:11]}a")
        finally:
            _ip("netns", "del", tag, check=False)
        return True, "ok"
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)


class NoNet:
    """Every pod on 127.0.0.1, no network faults."""

    kind = "none"
    supports_cut = False

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.controller_host = "127.0.0.1"

    def setup(self, n_pods: int) -> None:
        self.n = n_pods

    def pod_ip(self, g: int) -> str:
        return "127.0.0.1"

    def in_root_ns(self, g: int) -> bool:
        return True

    def controller_addr_for(self, g: int, port: int) -> tuple[str, int]:
        return self.controller_host, port

    def wrap(self, g: int, argv: list[str]) -> list[str]:
        return argv

    def cut(self, g: int) -> None:
        raise RuntimeError("network faults need --net netns or --net proxy")

    def heal(self, g: int) -> None:
        pass

    def teardown(self) -> None:
        pass

    def leftovers(self) -> list[str]:
        return []

    def describe(self) -> str:
        return "all components on 127.0.0.1, no network faults"


class NetnsNet(NoNet):
    kind = "netns"
    supports_cut = True

    def __init__(self, run_id: str):
        super().__init__(run_id)
        self.tag = f"mc{run_id[:6]}"  # interface names are at most 15 characters
        self.bridge = f"{self.tag}br"
        self.created_ns: list[str] = []
        self.created_links: list[str] = []
        self.octet = 0
        self.cut_pods: set[int] = set()

    def _pick_subnet(self) -> int:
        used = _ip("-o", "addr").stdout + _ip("route").stdout
        rng = random.Random(os.getpid())
        for _ in range(100):
            x = rng.randint(200, 249)
            if f"10.{x}." not in used:
                return x
        raise RuntimeError("no free 10.x.0.0/16 for the chaos bridge")

    def ns(self, g: int) -> str:
        return f"{self.tag}p{g}"

    def veth_root(self, g: int) -> str:
        return f"{self.tag}r{g}"

    def veth_pod(self, g: int) -> str:
        return f"{self.tag}n{g}"

    def setup(self, n_pods: int) -> None:
        self.n = n_pods
        self.octet = self._pick_subnet()
        self.controller_host = f"10.{self.octet}.0.1"
        _ip("link", "add", self.bridge, "type", "bridge")
        self.created_links.append(self.bridge)
        _ip("addr", "add", f"{self.controller_host}/16", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for g in range(n_pods):
            ns, vr, vp = self.ns(g), self.veth_root(g), self.veth_pod(g)
            _ip("netns", "add", ns)
            self.created_ns.append(ns)
            _ip("link", "add", vr, "type", "veth", "peer", "name", vp)
            self.created_links.append(vr)
            _ip("link", "set", vp, "netns", ns)
            _ip("link", "set", vr, "master", self.bridge)
            _ip("link", "set", vr, "up")
            _ip("-n", ns, "addr", "add", f"{self.pod_ip(g)}/16", "dev", vp)
            _ip("-n", ns, "link", "set", vp, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def pod_ip(self, g: int) -> str:
        return f"10.{self.octet}.0.{10 + g}"

    def in_root_ns(self, g: int) -> bool:
        return False

    def wrap(self, g: int, argv: list[str]) -> list[str]:
        # `ip netns exec` execs the command: the pid we get is the program's own.
        return [IP, "netns", "exec", self.ns(g), *argv]

    def cut(self, g: int) -> None:
        _ip("link", "set", self.veth_root(g), "down")
        self.cut_pods.add(g)

    def heal(self, g: int) -> None:
        _ip("link", "set", self.veth_root(g), "up")
        self.cut_pods.discard(g)

    def teardown(self) -> None:
        for link in reversed(self.created_links):
            _ip("link", "del", link, check=False)
        for ns in self.created_ns:
            _ip("netns", "del", ns, check=False)
        # namespace and link destruction is asynchronous in the kernel
        deadline = time.monotonic() + 10
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)

    def leftovers(self) -> list[str]:
        out = []
        links = _ip("-o", "link", check=False).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(self.tag):
                out.append(f"link {name}")
        for line in _ip("netns", "list", check=False).stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(self.tag):
                out.append(f"netns {name}")
        return out

    def describe(self) -> str:
        return (f"network namespaces: pod g in {self.tag}p<g> at 10.{self.octet}.0.(10+g), "
                f"veth to bridge {self.bridge} (controller at {self.controller_host}); "
                f"a cut sets the pod's veth down (silent drop both ways)")


class _Proxy:
    """A TCP relay 127.0.0.1:port -> target that can be made to blackhole."""

    def __init__(self, loop: asyncio.AbstractEventLoop, target: tuple[str, int]):
        self.loop = loop
        self.target = target
        self.cut = False
        self.conns: set[asyncio.StreamWriter] = set()
        self.server: Optional[asyncio.AbstractServer] = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await r.read(65536)
                if not data:
                    break
                while self.cut:  # hold the bytes: a silent link
                    await asyncio.sleep(0.05)
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            try:
                w.close()
            except Exception:
                pass

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        self.conns.add(cw)
        try:
            while self.cut:  # accepted, never answered while cut
                await asyncio.sleep(0.05)
            try:
                ur, uw = await asyncio.open_connection(*self.target)
            except OSError:
                cw.close()
                return
            self.conns.add(uw)
            await asyncio.gather(self._pipe(cr, uw), self._pipe(ur, cw))
        finally:
            self.conns.discard(cw)

    def drop_all(self) -> None:
        for w in list(self.conns):
            try:
                w.transport.abort()
            except Exception:
                pass
        self.conns.clear()

    async def close(self) -> None:
        if self.server:
            self.server.close()
            await self.server.wait_closed()
        self.drop_all()


class ProxyNet(NoNet):
    kind = "proxy"
    supports_cut = True

    def __init__(self, run_id: str):
        super().__init__(run_id)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="chaos-proxy")
        self.thread.start()
        self.proxies: dict[int, _Proxy] = {}

    def _run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def controller_addr_for(self, g: int, port: int) -> tuple[str, int]:
        p = self.proxies.get(g)
        if p is None:
            p = _Proxy(self.loop, (self.controller_host, port))
            self._run(p.start())
            self.proxies[g] = p
        return "127.0.0.1", p.port

    def cut(self, g: int) -> None:
        self.proxies[g].cut = True

    def heal(self, g: int) -> None:
        p = self.proxies[g]
        # the held connections are stale by now: reset them, as a router reboot would
        self.loop.call_soon_threadsafe(p.drop_all)
        p.cut = False

    def teardown(self) -> None:
        for p in self.proxies.values():
            p.cut = False
            try:
                self._run(p.close())
            except Exception:
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def describe(self) -> str:
        return ("blocking TCP proxies between each node manager and the controller "
                "(127.0.0.1); a cut holds every byte and every new connection "
                "(node manager -> controller direction only)")


def make_net(kind: str, run_id: str) -> tuple[NoNet, str]:
    """kind: auto | netns | proxy | none. Returns (net, why it was chosen)."""
    if kind in ("auto", "netns"):
        ok, why = netns_available()
        if ok:
            return NetnsNet(run_id), "network namespaces available"
        if kind == "netns":
            raise RuntimeError(f"--net netns: namespaces unavailable ({why})")
        return ProxyNet(run_id), f"namespaces unavailable ({why}): TCP proxy"
    if kind == "proxy":
        return ProxyNet(run_id), "requested"
    return NoNet(run_id), "requested"
