"""Every daemon sets its process title as upstream's does (setproctitle: "NodeManager",
...): the kernel's comm, what ps -o comm and top show. The command line stays as given."""

from __future__ import annotations

import os

import motorlib
from ctl_fakes import Controller, FakeCoordinator, controller_config
from fake_controller import nm_config, start_nm, write_json


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def test_daemons_have_their_titles(procs, tmpdir_path):
    coord = FakeCoordinator()
    try:
        c = Controller(procs, controller_config(tmpdir_path, coord.port))
        assert comm(c.proc.pid) == "Controller"
        nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "nm.json"),
                                        nm_config(controller_port=c.port)))
        assert comm(nm.proc.pid) == "NodeManager"
        assert cmdline(nm.proc.pid)[1] == "node-manager"  # argv untouched
        co = procs.motor("coordinator", "--port", 0, "--mgmt-port", 0, "--workers", 1,
                         name="coordinator")
        co.wait_event("coordinator_listening", timeout=15)
        assert comm(co.pid) == "Coordinator"
        # a command that is no daemon keeps the binary's name
        sim = motorlib.start_sim(procs)
        assert comm(sim.proc.pid) == "motor"
    finally:
        coord.close()
