"""Memory that comes back (issue 20, deliverable 5): the coordinator after bursts of
streaming chats and aborted streams returns to about its fresh size, and does not creep
from round to round.

Shape of the issue's soak (10 rounds; each round N streaming chats opened at once and
read to the end, then N more dropped by the client after the first chunk), sized for
make test: N = 800 instead of 2,000 (about 40 s). 800 is still well above what makes the
unfixed coordinator fail: without the trim (git 0e60441) 600 streams a round took it
from 3.1 MB fresh to 15.9 MB after round 1 and 24.8 MB after round 10 (+56 %, 8x fresh).

The floor a trim cannot lower: glibc's per-thread tcache keeps up to 7 freed chunks of
every size class up to 1 KiB per thread (3 threads here) outside the arenas' free lists,
and each pins its page. It fills as request ids and buffers take new sizes: heap "in
use" after the trims went 131 -> 271 KiB over 20 rounds of 800, RSS after them 3.5 ->
4.2 MB, while with GLIBC_TUNABLES=glibc.malloc.tcache_count=0 in use stayed at 73 KiB
every round. That floor is bounded (64 classes x 7 chunks x 3 threads), and where a trim
leaves it varies by +-0.6 MB from round to round (seen: 3.6-4.8 MB), so a round may end
up to TCACHE_SLACK_KIB above the first round's when that is more than the 10 % (at a
3.6 MB floor 10 % is 0.36 MB; the unfixed coordinator is +9 MB by round 3).

Runs the plain (not sanitized) binary, MOTOR_PLAIN_BIN: ASan replaces glibc's malloc,
whose behaviour this measures. RSS from /proc after each round, once the coordinator
reports no request in flight, its trim counter moved (the idle trim after the round;
at most 15 s) and 1.5 s more.
"""

from __future__ import annotations

import os

import pytest

import motorlib
import streamload
from coord_helpers import ext_instance, start_coordinator

STREAMS = 800
ROUNDS = 10
TCACHE_SLACK_KIB = 1536


@pytest.fixture
def plain(monkeypatch):
    path = os.environ.get("MOTOR_PLAIN_BIN") or str(motorlib.REPO / "build-asan" / "plain" /
                                                    "motor")
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"plain motor binary not found: {path} (set MOTOR_PLAIN_BIN; "
                                f"the sanitized tree builds it as target motor_plain)")
    monkeypatch.setenv("MOTOR_BIN", path)
    return path


def test_soak_rss_per_round_and_idle(plain, procs, tmpdir_path):
    # 20 tokens/s x 16 tokens: every stream of a round is open at the same time.
    sim = motorlib.start_sim(procs, "--model", "m", "--ttft-ms", "50", "--tokens-per-second",
                             "20", "--max-num-seqs", "8192")
    c = start_coordinator(procs, tmpdir_path, workers=2)
    c.set_instances([ext_instance(1, "union", sim)])
    motorlib.wait_for(lambda: c.completion(model="m", prompt="x", max_tokens=1).status == 200,
                      timeout=10)
    fresh = streamload.rss_kib(c.pid)
    rounds = streamload.soak(c.infer_port, c.pid, STREAMS, ROUNDS, metrics_url=c.url + "/metrics",
                             settle=1.5, trim_metric="motor_coordinator_memory_trims_total")
    summary = [(r["round"], r["peak_kib"], r["rss_kib"]) for r in rounds]
    print(f"fresh {fresh} KiB; (round, peak, after) KiB: {summary}")
    for r in rounds:
        assert r["done"] == {"done": STREAMS}, r
        assert r["aborted"] == {"aborted": STREAMS}, r
    # The streams were really open together: the peak is well above the fresh process.
    assert rounds[0]["peak_kib"] > fresh + STREAMS * 4, summary
    first = rounds[0]["rss_kib"]
    for r in rounds[1:]:
        assert r["rss_kib"] <= max(first * 1.10, first + TCACHE_SLACK_KIB), (fresh, summary)
    assert rounds[-1]["rss_kib"] <= 2 * fresh, (fresh, summary)
    # What gave it back: the management thread's malloc_trim, counted.
    assert c.metric("motor_coordinator_memory_trims_total") >= 1
    assert c.metric("motor_coordinator_memory_trimmed_bytes_total") > 0
