"""motor engine-sim: the prefix cache (blocks, LRU eviction, hits, TTFT proportional to
the uncached prompt tokens, vLLM's metrics) and KV-cache events exactly as vLLM
publishes them (ZMQ PUB, msgpack KVEventBatch, sequence numbers, the replay ROUTER, the
DP-rank port offset), checked with pyzmq/msgpack and vLLM's block-hash rule recomputed
here with hashlib and a hand-written CBOR encoder (RFC 8949)."""

import hashlib
import time

import msgpack
import zmq

from motorlib import free_port, get, post, start_sim

FAST = ("--ttft-ms", "0", "--tokens-per-second", "0")


# ---- vLLM's block hash (sha256_cbor), independently -------------------------------------

def cbor_head(major: int, v: int) -> bytes:
    if v < 24:
        return bytes([major << 5 | v])
    for extra, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if v < 1 << (8 * width):
            return bytes([major << 5 | extra]) + v.to_bytes(width, "big")
    raise ValueError(v)


def cbor(obj) -> bytes:
    if obj is None:
        return b"\xf6"
    if isinstance(obj, bytes):
        return cbor_head(2, len(obj)) + obj
    if isinstance(obj, str):
        return cbor_head(3, len(obj.encode())) + obj.encode()
    if isinstance(obj, int):
        return cbor_head(0, obj)
    if isinstance(obj, (list, tuple)):
        return cbor_head(4, len(obj)) + b"".join(cbor(x) for x in obj)
    raise TypeError(obj)


def sha256_cbor(obj) -> bytes:
    return hashlib.sha256(cbor(obj)).digest()


def block_hashes(tokens, block_size, seed="0"):
    parent = sha256_cbor(seed)  # NONE_HASH with PYTHONHASHSEED set
    out = []
    for i in range(len(tokens) // block_size):
        parent = sha256_cbor((parent, tuple(tokens[i * block_size:(i + 1) * block_size]), None))
        out.append(parent)
    return out


# ---- helpers ------------------------------------------------------------------------------

class Sub:
    def __init__(self, port, topic=b""):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def recv(self, timeout_ms=3000):
        if not self.sock.poll(timeout_ms):
            return None
        topic, seq, payload = self.sock.recv_multipart()
        return topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)

    def close(self):
        self.sock.close(linger=0)
        self.ctx.term()


def replay(port, start_seq):
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.connect(f"tcp://127.0.0.1:{port}")
    d.send_multipart([b"", start_seq.to_bytes(8, "big")])
    got = []
    try:
        while True:
            assert d.poll(5000), "no replay answer"
            empty, seq, payload = d.recv_multipart()
            assert empty == b""
            s = int.from_bytes(seq, "big", signed=True)
            if s == -1:
                assert payload == b""
                return got
            got.append((s, msgpack.unpackb(payload)))
    finally:
        d.close(linger=0)
        ctx.term()


def kv_sim(procs, *extra, name="engine-sim", env_extra=None, **kw):
    port, rport = free_port(), free_port()
    cfg = ('{"enable_kv_cache_events": true, "publisher": "zmq", '
           f'"endpoint": "tcp://*:{port}", "replay_endpoint": "tcp://*:{rport}", '
           '"topic": "kv@sim"}')
    env = {"PYTHONHASHSEED": "0"}
    env.update(env_extra or {})
    sim = start_sim(procs, *FAST, "--kv-events-config", cfg, *extra, name=name,
                    extra_env=env, **kw)
    ev = sim.wait_event("sim_kv_events")
    return sim, ev["port"], ev["replay_port"]


def tokens_of(sim, prompt):
    return post(sim.url + "/tokenize", {"prompt": prompt}).json()["tokens"]


def metric(sim, name):
    for line in get(sim.url + "/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def collect_events(sub, want_blocks, timeout=5.0):
    """BlockStored hashes (and the raw events) until want_blocks were seen."""
    stored, events = [], []
    end = time.monotonic() + timeout
    while len(stored) < want_blocks and time.monotonic() < end:
        got = sub.recv(200)
        if not got:
            continue
        _, seq, batch = got
        for e in batch[1]:
            events.append((seq, e))
            if e[0] == "BlockStored":
                stored.extend(e[1])
    return stored, events


# ---- tests -----------------------------------------------------------------------------------

def test_kv_events_wire_format_and_hashes(procs):
    sim, port, rport = kv_sim(procs, "--block-size", "4", "--data-parallel-rank", "0")
    # at start: AllBlocksCleared as seq 0, kept for replay
    first = replay(rport, 0)
    assert first[0][0] == 0 and first[0][1][1] == [["AllBlocksCleared"]]
    sub = Sub(port, b"kv@sim")
    time.sleep(0.3)  # the subscription reaches the publisher (ZMQ's slow joiner)
    prompt = "the engine decodes a token while prefill cache blocks move between nodes and"
    toks = tokens_of(sim, prompt)
    assert len(toks) == 13
    r = sim.completion(prompt=prompt, max_tokens=3, ignore_eos=True, logprobs=0,
                       return_tokens_as_token_ids=True).json()
    gen = [int(t.split(":")[1]) for t in r["choices"][0]["logprobs"]["tokens"]]
    # 13 prompt + 3 generated = 16 tokens = 4 full blocks of 4
    stored, events = collect_events(sub, 4)
    assert stored == block_hashes(toks + gen, 4)
    seq0, e0 = events[0]
    assert seq0 >= 1
    # ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, lora_name]
    assert e0[0] == "BlockStored" and len(e0) == 8
    # the first batch holds the prompt's blocks, and the generated one too when the
    # answer finished before the batch was flushed (a loaded machine)
    assert e0[2] is None and e0[3] == (toks + gen)[:len(e0[1]) * 4] and e0[4] == 4
    assert e0[5] is None and e0[6] == "GPU" and e0[7] is None
    _, later = events[-1]
    assert later[2] == stored[len(stored) - len(later[1]) - 1]  # chained to its parent
    # the batch itself: [ts, events, data_parallel_rank]
    got = replay(rport, seq0)
    assert [s for s, _ in got][0] == seq0
    ts, evs, rank = got[0][1]
    assert abs(ts - time.time()) < 60 and rank == 0 and evs[0] == e0
    # a second identical request hits the cache: no new block stored
    before = metric(sim, "vllm:prefix_cache_hits_total")
    sim.completion(prompt=prompt, max_tokens=3, ignore_eos=True)
    assert metric(sim, "vllm:prefix_cache_hits_total") - before == 12
    assert metric(sim, "vllm:prefix_cache_queries_total") == 26
    assert sub.recv(300) is None
    sub.close()


def test_eviction_removed_events_and_reset(procs):
    sim, port, rport = kv_sim(procs, "--block-size", "4", "--num-gpu-blocks-override", "4")
    sub = Sub(port)
    time.sleep(0.3)
    a = "a b c d e f g h"  # 2 blocks
    b = "i j k l m n o p"
    c = "q r s t u v w x"
    for p in (a, b, c):
        sim.completion(prompt=p, max_tokens=1)
    seen = []
    end = time.monotonic() + 5
    while time.monotonic() < end and not any(e[0] == "BlockRemoved" for e in seen):
        got = sub.recv(200)
        if got:
            seen.extend(got[2][1])
    removed = [h for e in seen if e[0] == "BlockRemoved" for h in e[1]]
    # capacity 4: the third prompt evicts the least recently used blocks (a's; a
    # request's tail goes first, its head — a shared prefix — last)
    assert removed == block_hashes(tokens_of(sim, a), 4)[::-1]
    assert all(e[2] == "GPU" for e in seen if e[0] == "BlockRemoved")
    st = sim.status()["prefix_cache"]
    assert st["cached"] == 4 and st["evicted"] == 2 and st["capacity"] == 4
    # POST /reset_prefix_cache: AllBlocksCleared
    assert post(sim.url + "/reset_prefix_cache", {}).status == 200
    got = None
    end = time.monotonic() + 5
    while time.monotonic() < end:
        got = sub.recv(200)
        if got and got[2][1] == [["AllBlocksCleared"]]:
            break
    assert got and got[2][1] == [["AllBlocksCleared"]]
    assert sim.status()["prefix_cache"]["cached"] == 0
    sub.close()


def test_restart_restarts_sequence_with_cleared(procs):
    sim, port, rport = kv_sim(procs, "--block-size", "4")
    sim.completion(prompt="a b c d e f g h", max_tokens=1)
    assert len(replay(rport, 0)) >= 2
    sim.proc.stop()
    # same endpoints: a fresh process starts again at seq 0 with AllBlocksCleared
    cfg = ('{"enable_kv_cache_events": true, '
           f'"endpoint": "tcp://*:{port}", "replay_endpoint": "tcp://*:{rport}"}}')
    again = start_sim(procs, *FAST, "--kv-events-config", cfg, name="again",
                      extra_env={"PYTHONHASHSEED": "0"})
    got = replay(rport, 0)
    assert got[0][0] == 0 and got[0][1][1] == [["AllBlocksCleared"]]
    assert len(got) == 1
    assert again.status()["kv_events"]["next_seq"] == 1


def test_dp_rank_offsets_ports_int_hashes_and_map_encoding(procs):
    base, rbase = free_port(), free_port()
    cfg = ('{"enable_kv_cache_events": true, '
           f'"endpoint": "tcp://*:{base}", "replay_endpoint": "tcp://*:{rbase}"}}')
    sim = start_sim(procs, *FAST, "--kv-events-config", cfg, "--data-parallel-rank", "3",
                    "--data-parallel-size", "4", "--block-size", "4",
                    "--kv-events-encoding", "map",
                    extra_env={"PYTHONHASHSEED": "0", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1"})
    ev = sim.wait_event("sim_kv_events")
    assert ev["port"] == base + 3 and ev["replay_port"] == rbase + 3  # vLLM's offset
    toks = tokens_of(sim, "a b c d")
    sim.completion(prompt="a b c d", max_tokens=1)
    batches = replay(rbase + 3, 0)
    stored = [e for _, b in batches for e in b["events"] if e["type"] == "BlockStored"]
    assert batches[0][1]["data_parallel_rank"] == 3
    e = stored[0]
    assert set(e) == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                      "lora_id", "medium", "lora_name"}
    # int hashes: the low 64 bits of the sha256 (vLLM's maybe_convert_block_hash)
    want = int.from_bytes(block_hashes(toks, 4)[0], "big") & ((1 << 64) - 1)
    assert e["block_hashes"] == [want] and e["token_ids"] == toks


def test_ttft_follows_uncached_tokens(procs):
    sim = start_sim(procs, "--ttft-ms", "0", "--tokens-per-second", "0",
                    "--prefill-ms-per-token", "2")
    prompt = " ".join(["word"] * 400)

    def ttft():
        t0 = time.monotonic()
        r = sim.completion(prompt=prompt, max_tokens=1, timeout=30)
        assert r.status == 200
        return time.monotonic() - t0

    cold = ttft()
    warm = ttft()
    assert cold >= 0.7  # 400 uncached tokens x 2 ms
    assert warm < cold / 3  # all but one cached
    # all 25 blocks cached; vLLM still computes the last prompt token
    assert metric(sim, "vllm:prefix_cache_hits_total") == 399
    assert metric(sim, "vllm:gpu_prefix_cache_hits_total") == 399
    text = get(sim.url + "/metrics").text
    assert 'vllm:cache_config_info{block_size="16",num_gpu_blocks="8192",' \
           'enable_prefix_caching="True"} 1' in text
    # without prefix caching every request pays the whole prompt
    nocache = start_sim(procs, "--ttft-ms", "0", "--tokens-per-second", "0",
                        "--prefill-ms-per-token", "2", "--no-enable-prefix-caching",
                        name="nocache")
    for _ in range(2):
        t0 = time.monotonic()
        assert nocache.completion(prompt=prompt, max_tokens=1, timeout=30).status == 200
        assert time.monotonic() - t0 >= 0.7


def test_kv_cache_usage_while_running(procs):
    sim = start_sim(procs, "--ttft-ms", "0", "--tokens-per-second", "20", "--block-size", "4",
                    "--num-gpu-blocks-override", "100")
    from motorlib import SSEStream
    s = SSEStream(sim.url + "/v1/completions",
                  {"prompt": " ".join(["x"] * 40), "max_tokens": 40, "ignore_eos": True,
                   "stream": True})
    it = s.chunks()
    next(it)
    usage = metric(sim, "vllm:kv_cache_usage_perc")
    assert 0.09 <= usage <= 0.2  # 10 pinned blocks of 100 (and growing)
    assert metric(sim, "vllm:num_requests_running") == 1
    s.close()


def test_bad_kv_events_config(procs):
    import subprocess
    from motorlib import motor_bin
    for bad, needle in (('{"enable_kv_cache_events": true, "bogus": 1}', "unknown key 'bogus'"),
                        ('{"publisher": "kafka"}', "publisher"),
                        ("[1]", "JSON object")):
        out = subprocess.run([motor_bin(), "engine-sim", "--kv-events-config", bad],
                             capture_output=True, text=True, timeout=20)
        assert out.returncode == 2 and needle in out.stderr, out.stderr
