"""Interop of src/common/zmtp (+ msgpk shapes) with code nobody here wrote: Debian's
pyzmq (libzmq) and python3-msgpack.

* a pyzmq PUB publishing vLLM-shaped KV-event batches ([topic, seq, payload]) to our
  SUB (tests/tools/zmtp_peer.c): topic filtering, frames byte-exact;
* our PUB to pyzmq SUBs (prefix subscriptions honoured, the other topic filtered);
* our DEALER asking a pyzmq ROUTER that answers like vLLM's replay endpoint
  (ZmqEventPublisher._service_replay).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from motorlib import REPO, free_port

TOPIC = b"kv-events"


def peer_bin() -> str:
    path = os.environ.get("MOTOR_ZMTP_PEER") or str(REPO / "build-asan" / "motor-zmtp-peer")
    if not os.access(path, os.X_OK):
        pytest.skip(f"motor-zmtp-peer not built: {path}")
    return path


def vllm_batch(seq: int) -> bytes:
    """A KVEventBatch as msgspec encodes it with array_like=True (tag first)."""
    h = seq.to_bytes(8, "big") * 4  # a 32-byte sha256-like block hash
    stored = ["BlockStored", [h], None, list(range(seq, seq + 16)), 16, None, "GPU", None]
    removed = ["BlockRemoved", [h], "GPU"]
    return msgpack.packb([time.time(), [stored, removed, ["AllBlocksCleared"]], 0],
                         use_bin_type=True)


def parts_of(line: str) -> list[bytes]:
    return [bytes.fromhex(p) for p in json.loads(line)["parts"]]


def test_pyzmq_pub_to_our_sub():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def publish():
        seq = 0
        while not stop.is_set():
            pub.send_multipart((b"other-topic", seq.to_bytes(8, "big"), b"x"))
            pub.send_multipart((TOPIC, seq.to_bytes(8, "big"), vllm_batch(seq)))
            seq += 1
            time.sleep(0.01)

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    try:
        out = subprocess.run([peer_bin(), "sub", f"tcp://127.0.0.1:{port}", "kv-events", "20"],
                             capture_output=True, text=True, timeout=30)
    finally:
        stop.set()
        t.join()
        pub.close(linger=0)
        ctx.term()
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 20
    last = -1
    for line in lines:
        topic, seq_b, payload = parts_of(line)
        assert topic == TOPIC  # "other-topic" filtered by the subscription
        seq = int.from_bytes(seq_b, "big")
        assert seq > last
        last = seq
        batch = msgpack.unpackb(payload, raw=False)
        assert batch[1][0][0] == "BlockStored" and batch[1][0][3] == list(range(seq, seq + 16))
        assert batch[1][0][1] == [seq.to_bytes(8, "big") * 4]
        assert batch[1][2] == ["AllBlocksCleared"] and batch[2] == 0


def test_heartbeats_answered():
    """A libzmq PUB with ZMTP 3.1 heartbeats (PING every 100 ms, 300 ms timeout) keeps
    our SUB connected: we answer PONG, so no disconnect while 2 s of messages flow."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.HEARTBEAT_IVL, 100)
    pub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 300)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def publish():
        while not stop.is_set():
            pub.send_multipart((TOPIC, b"x"))
            time.sleep(0.01)

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    try:
        out = subprocess.run([peer_bin(), "sub", f"tcp://127.0.0.1:{port}", "kv", "200"],
                             capture_output=True, text=True, timeout=30)
    finally:
        stop.set()
        t.join()
        pub.close(linger=0)
        ctx.term()
    assert out.returncode == 0, out.stderr[-2000:]
    events = [l for l in out.stderr.splitlines() if l.startswith("event ")]
    assert events == ["event 0 "], events  # connected once, never dropped


def test_our_pub_to_pyzmq_sub():
    proc = subprocess.Popen([peer_bin(), "pub", "tcp://127.0.0.1:0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    try:
        port = json.loads(proc.stdout.readline())["port"]
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(f"tcp://127.0.0.1:{port}")
        other = ctx.socket(zmq.SUB)
        other.setsockopt(zmq.SUBSCRIBE, b"zz")
        other.connect(f"tcp://127.0.0.1:{port}")
        payload = vllm_batch(7)
        big = bytes(range(256)) * 400  # a long (8-byte size) frame
        line = f"{TOPIC.hex()} {(7).to_bytes(8, 'big').hex()} {payload.hex()} - {big.hex()}\n"
        got = None
        deadline = time.monotonic() + 10
        while got is None and time.monotonic() < deadline:
            proc.stdin.write(line)
            proc.stdin.flush()
            if sub.poll(50):
                got = sub.recv_multipart()
        assert got is not None, "our PUB never delivered to the pyzmq SUB"
        assert got == [TOPIC, (7).to_bytes(8, "big"), payload, b"", big]
        assert msgpack.unpackb(got[2])[1][0][0] == "BlockStored"
        assert other.poll(200) == 0  # prefix "zz" does not match "kv-events"
        sub.close(linger=0)
        other.close(linger=0)
    finally:
        ctx.term()
        proc.stdin.close()
        proc.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr.read()[-2000:]


def test_our_dealer_to_pyzmq_router_replay():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    served = {}

    def serve():
        if not router.poll(15000):
            return
        frames = router.recv_multipart()
        served["frames"] = frames
        client_id, _, start = frames  # vLLM insists on exactly 3 frames
        start_seq = int.from_bytes(start, "big")
        for seq in range(start_seq, start_seq + 3):
            router.send_multipart((client_id, b"", seq.to_bytes(8, "big"), vllm_batch(seq)))
        router.send_multipart((client_id, b"", (-1).to_bytes(8, "big", signed=True), b""))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        out = subprocess.run([peer_bin(), "dealer", f"tcp://127.0.0.1:{port}", "5"],
                             capture_output=True, text=True, timeout=30)
    finally:
        t.join(timeout=20)
        router.close(linger=0)
        ctx.term()
    assert out.returncode == 0, out.stderr[-2000:]
    assert served["frames"][1:] == [b"", (5).to_bytes(8, "big")]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4
    for i, line in enumerate(lines[:3]):
        empty, seq_b, payload = parts_of(line)
        assert empty == b"" and int.from_bytes(seq_b, "big") == 5 + i
        assert msgpack.unpackb(payload)[1][0][3] == list(range(5 + i, 5 + i + 16))
    assert parts_of(lines[3]) == [b"", b"\xff" * 8, b""]
