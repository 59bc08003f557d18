"""The chaos suite over TLS (issue 13): tests/chaos/chaos.py --tls — the `motor up` fleet
under `motor up --tls` (coordinator, controller, node managers and engines all on mutual
TLS with the throwaway CA), SIGKILL/SIGSTOP of every kind of process (motor up itself
included: it comes back with --keep-state and the same certificates), engine hangs and
errors, network partitions, while a client sends requests over https. Zero violations,
every fault recovered, nothing left behind. Docs: docs/chaos.md."""

from __future__ import annotations

from test_chaos_short import run_chaos


def test_chaos_tls_short(tmp_path):
    rep, text = run_chaos(tmp_path, ["--tls", "--duration", "80", "--rounds", "8"], 240)
    assert rep["modes"] == "up"
    assert "motor up --tls ready" in text
    assert rep["faults_injected"] >= 5, rep
    assert rep["requests"].get("ok", 0) >= 50, rep["requests"]
