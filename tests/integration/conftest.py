"""pytest fixtures shared by every integration test.

* ``tmpdir_path``: a fresh temporary directory (a str) for logs, configs, state files.
* ``procs``: a motorlib.ProcRegistry; everything started through it is killed (whole
  process group) at teardown, and the output tails are printed when the test failed.
* ``motor``: the path of the binary under test (skips cleanly when it is missing only if
  MOTOR_SKIP_MISSING=1; otherwise a missing binary is an error).
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import motorlib  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def tmpdir_path():
    d = tempfile.mkdtemp(prefix="motor-it-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def motor():
    try:
        return motorlib.motor_bin()
    except FileNotFoundError as e:
        if os.environ.get("MOTOR_SKIP_MISSING") == "1":
            pytest.skip(str(e))
        raise


@pytest.fixture
def procs(request, tmpdir_path, motor):
    reg = motorlib.ProcRegistry(tmpdir_path)
    yield reg
    failed = any(getattr(request.node, "rep_" + when, None) is not None and
                 getattr(request.node, "rep_" + when).failed for when in ("setup", "call"))
    if failed and reg.procs:
        sys.stderr.write("\n" + reg.tails() + "\n")
    reg.close_all()
    if not failed:
        # A state table refusing an event is a bug (a callback after the end, an exit path
        # taken twice): the daemons log it and go on, the test does not.
        bad = [f"{p.name}: {line.strip()}" for p in reg.procs
               for line in p.output().splitlines()
               if any(f'"event":"{e}"' in line for e in IGNORED_EVENT_LOGS)]
        if bad:
            pytest.fail("illegal state-machine events:\n" + "\n".join(bad[:20]))


# Log events of the state tables' "illegal event, ignored" path (ctl_fsm.c, reqfsm.c).
IGNORED_EVENT_LOGS = ("state_event_ignored", "request_event_ignored", "engine_event_ignored",
                      "nm_phase_event_ignored")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway PKI from tests/fixtures/mkcerts.sh: ca.crt signed srv.* (server and
    client usage) and cli.*; other-ca.crt signed other-srv.*. pki(name) is a file's path."""
    d = str(tmp_path_factory.mktemp("pki"))
    mkcerts = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures",
                           "mkcerts.sh")
    subprocess.run([mkcerts, d], check=True, timeout=60)
    return lambda name: os.path.join(d, name)


@pytest.fixture
def coord():
    """A fake coordinator recording the controller's pushes (the controller e2e tests)."""
    from ctl_fakes import FakeCoordinator
    c = FakeCoordinator()
    yield c
    c.close()
