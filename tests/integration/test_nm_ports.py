"""motor node-manager: upstream's startup port allocator (§3.8, port_allocator_config,
on by default): busy ports are waited for (probe_timeout_seconds), then scanned upward
within scan_range; the port matrix is logged; reserved DP TCPStore ports must be free;
no free port => exit 1 with the reason."""

import os
import socket

import pytest

import motorlib
from fake_controller import FakeController, free_port_run, nm_config, start_nm, write_json


@pytest.fixture
def ctl():
    c = FakeController()
    yield c
    c.close()


def hold(port):
    """Keep port busy (listening on 127.0.0.1) until closed. SO_REUSEADDR as the
    daemons and port_is_free() use it: a connection of an earlier test in TIME_WAIT on
    this port must not make the bind fail (a listener still makes the port busy)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s


def nm_proc(procs, cfg_path, *args):
    return procs.motor("node-manager", "--config", cfg_path, "--state-file", "", *args,
                       name="node-manager", extra_env={"ROLE": "union"})


def test_busy_engine_port_moves_up_and_is_registered(procs, tmpdir_path, ctl):
    base = free_port_run(3)
    cfg = nm_config(controller_port=ctl.port, base_port=base,
                    engine_config={"data_parallel_size": 2}, endpoints=2,
                    nm={"port_allocator_config": {"probe_timeout_seconds": 0.2}})
    with hold(base):
        nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
        reg = ctl.wait_request("/controller/register", timeout=10)
    # Endpoint 0 wanted base (busy): a free port above it that endpoint 1 (base + 2) does
    # not take — base + 1 unless something else on the machine (an ephemeral client port
    # of a concurrent test) holds it right then; the same goes for endpoint 1.
    p0, p1 = (int(p) for p in reg.body["business_port"])
    assert base < p0 <= base + 100 and base + 2 <= p1 <= base + 102 and p0 != p1, reg.body
    moved = nm.find_events("port_reassigned")
    assert moved and moved[0]["requested"] == base and moved[0]["port"] == p0
    matrix = nm.find_events("port_matrix")[0]["ports"]
    assert {"what": "engine_service", "endpoint": 1, "requested": base + 2, "port": p1} in matrix


def test_busy_api_port_moves_up(procs, tmpdir_path):
    api = free_port_run(2, step=1)
    cfg = nm_config(nm={"standalone": True,
                        "api_config": {"pod_ip": "127.0.0.1", "node_manager_port": api},
                        "port_allocator_config": {"probe_timeout_seconds": 0.1}})
    with hold(api):
        p = nm_proc(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
        ev = p.wait_event("nm_listening", timeout=15)
    assert ev["port"] == api + 1
    assert motorlib.get(f"http://127.0.0.1:{api + 1}/node-manager/status").status == 200


def test_disabled_allocator_keeps_the_configured_ports(procs, tmpdir_path, ctl):
    base = free_port_run(1)
    cfg = nm_config(controller_port=ctl.port, base_port=base,
                    nm={"port_allocator_config": {"enable": False}})
    with hold(base):
        nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
        reg = ctl.wait_request("/controller/register", timeout=10)
    assert reg.body["business_port"] == [str(base)]
    assert not nm.find_events("port_matrix")


def test_no_free_port_in_range_exits_1(procs, tmpdir_path):
    base = free_port_run(1)
    cfg = nm_config(base_port=base,
                    nm={"port_allocator_config": {"scan_range": 0, "probe_timeout_seconds": 0.1}})
    with hold(base):
        p = nm_proc(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg), "--port", "0")
        assert p.wait(timeout=10) == 1
    assert f"no free port for endpoint 0 in {base}-{base}" in p.tail(50)


def test_reserved_dp_store_ports_are_never_handed_out(procs, tmpdir_path, ctl):
    """With the DP scale-down proxy on, dp_master_port .. + dp_size - 1 are reserved: an
    endpoint whose own port is busy never moves onto one of them; a busy store port is
    only a warning (rank 0's engine serves it)."""
    base = free_port_run(3)
    master = base + 1  # right where endpoint 0 would move to
    cfg = nm_config(controller_port=ctl.port, base_port=base, endpoints=2,
                    engine_config={"data_parallel_size": 2, "data_parallel_master_port": master},
                    controller_ft={"enable_fault_tolerance": True, "enable_dp_scale_down": True},
                    nm={"port_allocator_config": {"probe_timeout_seconds": 0.1}})
    with hold(base), hold(master + 1):
        nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
        reg = ctl.wait_request("/controller/register", timeout=10)
    p0 = int(reg.body["business_port"][0])
    assert p0 not in (base, master, master + 1, base + 2), reg.body
    # (master itself may be busy too: base + 1 was not checked free)
    assert master + 1 in [e["port"] for e in nm.find_events("dp_store_port_busy")]
