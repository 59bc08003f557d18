"""motor register set|add|del|list against a real coordinator and simulated engines:
the instance id formula, order independence, health checks, collision checks, deletion
by endpoints and by id, the management key, --dry-run."""

import json
import subprocess
import time
import zlib

from coord_helpers import FAST, ext_instance, start_coordinator, stop_clean
from motorlib import free_port, motor_bin, start_sim


def reg(*args, timeout=30):
    return subprocess.run([motor_bin(), "register", *[str(a) for a in args]],
                          capture_output=True, text=True, timeout=timeout)


def expected_id(role, endpoints):
    eps = sorted(endpoints, key=lambda e: (e[0], int(e[1])))
    text = role + "".join(f"|{ip}:{port}" for ip, port in eps)
    return 0x40000000 | (zlib.crc32(text.encode()) & 0x3FFFFFFF)


def test_register_set_add_del_list(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="p")
    d1 = start_sim(procs, "--model", "m", *FAST, name="d1")
    d2 = start_sim(procs, "--model", "m", *FAST, name="d2")
    u = start_sim(procs, "--model", "m", *FAST, name="u")
    c = start_coordinator(procs, tmpdir_path)
    mp = ("--mgmt-port", c.mgmt_port)
    dspec_a = f"127.0.0.1:{d2.port},127.0.0.1:{d1.port}"
    dspec_b = f"127.0.0.1:{d1.port}, 127.0.0.1:{d2.port}"

    # --dry-run prints the body; the order of the endpoints does not matter
    a = reg("--dry-run", "--prefill", f"127.0.0.1:{p.port}", "--decode", dspec_a)
    b = reg("--dry-run", "--prefill", f"127.0.0.1:{p.port}", "--decode", dspec_b)
    assert a.returncode == 0, a.stderr
    body = json.loads(a.stdout)
    assert body == json.loads(b.stdout)
    assert body["event"] == "set"
    pid = expected_id("prefill", [("127.0.0.1", p.port)])
    did = expected_id("decode", [("127.0.0.1", d1.port), ("127.0.0.1", d2.port)])
    assert [i["id"] for i in body["instances"]] == [pid, did]
    dec = body["instances"][1]
    first = min([d1.port, d2.port])
    assert dec["job_name"] == f"m-decode-127.0.0.1-{first}"
    assert dec["model_name"] == "m" and dec["status"] == "active"
    eps = dec["endpoints"]["127.0.0.1"]
    assert [eps[k]["business_port"] for k in ("0", "1")] == [str(first), str(max(d1.port, d2.port))]
    assert c.instances()["count"] == 0  # nothing was sent

    # set
    r = reg("set", *mp, "--prefill", f"127.0.0.1:{p.port}", "--decode", dspec_a)
    assert r.returncode == 0, r.stderr
    assert '"ready":true' in r.stdout
    view = {i["id"]: i for i in c.instances()["instances"]}
    assert set(view) == {pid, did}
    assert view[did]["role"] == "decode" and len(view[did]["endpoints"]) == 2
    got = c.completion(model="m", prompt="hello", max_tokens=4)
    assert got.status == 200, got
    assert got.json()["choices"][0]["text"] == \
        u.completion(model="m", prompt="hello", max_tokens=4).json()["choices"][0]["text"]

    # add: a union instance joins; adding it again is idempotent
    uid = expected_id("union", [("127.0.0.1", u.port)])
    for _ in range(2):
        r = reg("add", *mp, "--union", f"127.0.0.1:{u.port}", "--model-name", "m")
        assert r.returncode == 0, r.stderr
    assert {i["id"] for i in c.instances()["instances"]} == {pid, did, uid}

    # list: a readable table
    r = reg("list", *mp)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "ROLE", "MODEL"]
    row = [ln for ln in lines if ln.startswith(str(did))][0]
    assert "decode" in row and "yes" in row and f"127.0.0.1:{d1.port}" in row
    assert lines[-1] == "3 instance(s)"
    # the coordinator may also be named with its port, or as a bare host
    r = reg("list", "--coordinator", f"http://127.0.0.1:{c.mgmt_port}/")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "3 instance(s)", r.stderr
    r = reg("list", "--coordinator", "127.0.0.1", *mp)
    assert r.returncode == 0, r.stderr

    # del by endpoints (any order), then by id; an unknown id is refused
    r = reg("del", *mp, "--decode", dspec_b)
    assert r.returncode == 0, r.stderr
    assert {i["id"] for i in c.instances()["instances"]} == {pid, uid}
    r = reg("del", *mp, "--id", 12345)
    assert r.returncode == 1 and "12345" in r.stderr
    r = reg("del", *mp, "--decode", dspec_b)
    assert r.returncode == 1
    r = reg("del", *mp, "--id", pid, "--id", uid)
    assert r.returncode == 0, r.stderr
    assert c.instances()["count"] == 0
    stop_clean(c)


def test_register_checks(procs, tmpdir_path):
    s = start_sim(procs, "--model", "m", *FAST)
    other = start_sim(procs, "--model", "x", "--served-model-name", "x", "y", *FAST, name="two")
    keyfile = f"{tmpdir_path}/key"
    with open(keyfile, "w") as f:
        f.write("k3y\n")
    c = start_coordinator(procs, tmpdir_path, {"mgmt_api_key_config": {
        "enable_api_key": True, "api_key_file": keyfile}})
    mp = ("--mgmt-port", c.mgmt_port, "--mgmt-api-key-file", keyfile)

    # the management key is required
    r = reg("set", "--mgmt-port", c.mgmt_port, "--prefill", f"127.0.0.1:{s.port}")
    assert r.returncode == 1 and "401" in r.stderr

    # health check: a model the engine does not serve, an engine that is not there
    r = reg("set", *mp, "--prefill", f"127.0.0.1:{s.port}", "--model-name", "nope")
    assert r.returncode == 1 and "does not serve model 'nope'" in r.stderr
    dead = free_port()
    r = reg("set", *mp, "--union", f"127.0.0.1:{dead}", "--model-name", "m")
    assert r.returncode == 1 and "health check failed" in r.stderr
    # ... unless skipped
    r = reg("set", *mp, "--union", f"127.0.0.1:{dead}", "--model-name", "m", "--no-health-check")
    assert r.returncode == 0, r.stderr
    # no model name and an engine listing two: ask for --model-name
    r = reg("set", *mp, "--union", f"127.0.0.1:{other.port}")
    assert r.returncode == 1 and "--model-name" in r.stderr

    # id collision: another identity already holds the id this group maps to
    cid = expected_id("prefill", [("127.0.0.1", s.port)])
    hold = ext_instance(cid, "decode", s)
    assert c.refresh({"event": "set", "model_name": "m", "instances": [hold]},
                     key="k3y").status == 200
    r = reg("add", *mp, "--prefill", f"127.0.0.1:{s.port}")
    assert r.returncode == 1 and "collide" in r.stderr
    assert c.instances(key="k3y")["instances"][0]["role"] == "decode"

    # usage errors
    assert reg("set", "--prefill", "nohost").returncode == 2
    assert reg("frobnicate").returncode == 2
    assert reg("set", "--prefill", f"127.0.0.1:{s.port}", "--decode",
               f"127.0.0.1:{s.port}").returncode == 2
    assert reg("add").returncode == 2

    # a coordinator that is not there: give up after --timeout
    t0 = time.monotonic()
    r = reg("list", "--mgmt-port", free_port(), "--timeout", "1")
    assert r.returncode == 1 and "not live" in r.stderr
    assert time.monotonic() - t0 < 10
    stop_clean(c)
