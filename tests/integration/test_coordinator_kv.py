"""Cache-aware routing against real simulators: the coordinator subscribes to each DP
rank's KV events (ZMTP SUB at the endpoint's port + rank, replay likewise),
keeps its index, tokenizes prompts through the engines' /tokenize and sends a request
where its prefix is cached; an engine that restarts is forgotten and learned again; the
index stays within max_index_blocks; a tokenizer that fails costs only the affinity."""

import time

from coord_helpers import start_coordinator, stop_clean
from motorlib import free_port, get, start_sim

FAST = ("--ttft-ms", "0", "--tokens-per-second", "0")
N = 4


def start_fleet(procs, n=N, block_size=4, extra=(), port_of=None):
    base, rbase = free_port(), free_port()
    sims = [start_rank(procs, r, n, base, rbase, block_size, extra) for r in range(n)]
    return sims, base, rbase


def start_rank(procs, r, n, base, rbase, block_size=4, extra=(), port=None):
    cfg = ('{"enable_kv_cache_events": true, '
           f'"endpoint": "tcp://*:{base}", "replay_endpoint": "tcp://*:{rbase}"}}')
    args = [*FAST, "--model", "m", "--kv-events-config", cfg, "--data-parallel-rank", str(r),
            "--data-parallel-size", str(n), "--block-size", str(block_size), *extra]
    if port:
        args += ["--port", str(port)]
    return start_sim(procs, *args, name=f"rank{r}")


def dp_instance(sims):
    """One vLLM union instance, endpoint id = DP rank (as the Controller registers it)."""
    eps = {"127.0.0.1": {str(r): {"id": r, "ip": "127.0.0.1", "business_port": str(s.port),
                                  "status": "normal", "headless": False}
                         for r, s in enumerate(sims)}}
    return {"id": 1, "role": "union", "job_name": "job", "model_name": "m",
            "engine_type": "vllm", "status": "active", "endpoints": eps}


def kv_config(base, rbase, **over):
    cfg = {"scheduler_config": {"scheduler_type": "kv_cache_affinity"},
           "prefill_kv_event_config": {"endpoint": f"tcp://*:{base}",
                                       "replay_endpoint": f"tcp://*:{rbase}"}}
    for k, v in over.items():
        blk, key = k.split("__")
        cfg.setdefault(blk, {})[key] = v
    return cfg


def kv_index(c):
    r = get(c.mgmt + "/kv_index")
    assert r.status == 200, r
    return r.json()["index"]


def wait_connected(c, n, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        idx = kv_index(c)
        subs = (idx or {}).get("subscriptions", [])
        if len(subs) == n and all(s["connected"] for s in subs):
            return idx
        time.sleep(0.05)
    raise AssertionError(f"subscriptions not connected: {kv_index(c)}")


def slot_blocks(c, sim):
    for s in kv_index(c)["subscriptions"]:
        if s["hostport"] == f"127.0.0.1:{sim.port}":
            return s["blocks"]
    raise AssertionError(f"no subscription for {sim.port}")


def wait_blocks(c, sim, at_least, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if slot_blocks(c, sim) >= at_least:
            return
        time.sleep(0.02)
    raise AssertionError(f"index has {slot_blocks(c, sim)} blocks for {sim.port}")


def served(sim):
    return sim.status()["prefix_cache"]["queries"]


def hits(sim):
    return sim.status()["prefix_cache"]["hits"]


def who_served(sims, before):
    now = [served(s) for s in sims]
    moved = [i for i, (a, b) in enumerate(zip(before, now)) if b > a]
    assert len(moved) == 1, (before, now)
    return moved[0]


def session_prompt(k, turns):
    """A chat-like prompt: a per-session head, then `turns` turns of growth."""
    head = f"session {k} system prompt " + " ".join(f"w{k}x{i}" for i in range(40))
    return head + "".join(f" turn {t} " + " ".join(f"t{k}y{t}z{i}" for i in range(12))
                          for t in range(turns))


def test_affinity_follows_the_cache(procs, tmp_path):
    sims, base, rbase = start_fleet(procs)
    c = start_coordinator(procs, str(tmp_path), kv_config(base, rbase))
    c.set_instances([dp_instance(sims)])
    wait_connected(c, N)
    assert not c.find_events("scheduler_degraded")
    # Eight sessions, three turns each: every follow-up turn lands where its session's
    # prefix is cached, and hits there.
    home = {}
    for turn in range(3):
        for k in range(8):
            before = [served(s) for s in sims]
            h0 = [hits(s) for s in sims]
            r = c.completion(model="m", prompt=session_prompt(k, turn), max_tokens=2)
            assert r.status == 200, r
            i = who_served(sims, before)
            if turn == 0:
                home[k] = i
                wait_blocks(c, sims[i], 10)
            else:
                assert i == home[k], (k, turn, home)
                assert hits(sims[i]) > h0[i]
    # The sessions were spread (load counts too), not all on one engine.
    assert len(set(home.values())) >= 2, home
    prompt = c.metric("motor_coordinator_prefix_prompt_tokens_total")
    matched = c.metric("motor_coordinator_prefix_matched_tokens_total")
    assert prompt > 0 and matched / prompt > 0.4, (matched, prompt)
    assert c.metric("motor_coordinator_tokenize_requests_total", {"result": "ok"}) >= 24
    # Chat requests too (the engine's chat template through /tokenize).
    msgs = [{"role": "system", "content": session_prompt(99, 0)},
            {"role": "user", "content": "hello there"}]
    before = [served(s) for s in sims]
    assert c.chat(model="m", messages=msgs, max_tokens=2).status == 200
    first = who_served(sims, before)
    wait_blocks(c, sims[first], 10)
    msgs2 = msgs + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    before = [served(s) for s in sims]
    assert c.chat(model="m", messages=msgs2, max_tokens=2).status == 200
    assert who_served(sims, before) == first
    stop_clean(c)


def test_engine_restart_and_replay(procs, tmp_path):
    sims, base, rbase = start_fleet(procs)
    c = start_coordinator(procs, str(tmp_path), kv_config(base, rbase))
    c.set_instances([dp_instance(sims)])
    wait_connected(c, N)
    before = [served(s) for s in sims]
    assert c.completion(model="m", prompt=session_prompt(1, 2), max_tokens=2).status == 200
    i = who_served(sims, before)
    wait_blocks(c, sims[i], 10)
    # The engine goes away and comes back empty on the same ports: its blocks are
    # forgotten (replay from 0 of the new process says AllBlocksCleared).
    port = sims[i].port
    sims[i].kill()
    sims[i].wait()
    again = start_rank(procs, i, N, base, rbase, port=port)
    sims[i] = again
    end = time.monotonic() + 10
    while time.monotonic() < end and slot_blocks(c, again) != 0:
        time.sleep(0.05)
    assert slot_blocks(c, again) == 0
    wait_connected(c, N)
    # Requests keep working, and the engine's new cache is learned again.
    before = [served(s) for s in sims]
    assert c.completion(model="m", prompt=session_prompt(1, 2), max_tokens=2).status == 200
    j = who_served(sims, before)
    wait_blocks(c, sims[j], 10)
    before = [served(s) for s in sims]
    assert c.completion(model="m", prompt=session_prompt(1, 3), max_tokens=2).status == 200
    assert who_served(sims, before) == j
    assert c.find_events("kv_events_connected")
    stop_clean(c)


def test_index_memory_bound(procs, tmp_path):
    sims, base, rbase = start_fleet(procs, n=2)
    c = start_coordinator(procs, str(tmp_path),
                          kv_config(base, rbase, prefill_kv_event_config__max_index_blocks=32))
    c.set_instances([dp_instance(sims)])
    wait_connected(c, 2)
    for k in range(12):
        assert c.completion(model="m", prompt=session_prompt(k, 1), max_tokens=2).status == 200
    end = time.monotonic() + 5
    while time.monotonic() < end and kv_index(c)["events"]["evicted"] == 0:
        time.sleep(0.05)
    idx = kv_index(c)
    assert idx["max_blocks"] == 32
    assert 0 < idx["blocks"] <= 32
    assert idx["events"]["evicted"] > 0
    assert idx["bytes"] < 1 << 20
    # The most recent session is still known and routed to.
    before = [served(s) for s in sims]
    assert c.completion(model="m", prompt=session_prompt(11, 1), max_tokens=2).status == 200
    assert c.metric("motor_coordinator_prefix_matched_tokens_total") > 0
    stop_clean(c)


def test_tokenizer_failure_and_compute_length(procs, tmp_path):
    sims, base, rbase = start_fleet(procs, n=2)
    # One engine is gone (nothing listens on its port): the prompts it is asked to
    # tokenize fail, those requests are balanced on load alone, and every client gets
    # its answer (the dead endpoint's legs are retried elsewhere).
    dead = free_port()
    c = start_coordinator(procs, str(tmp_path), kv_config(base, rbase), name="late",
                          workers=1)
    gone = {"id": 2, "role": "union", "job_name": "job2", "model_name": "m",
            "engine_type": "vllm", "status": "active",
            "endpoints": {"127.0.0.1": {"0": {"id": 0, "ip": "127.0.0.1",
                                              "business_port": str(dead), "status": "normal",
                                              "headless": False}}}}
    c.set_instances([dp_instance(sims), gone])
    for k in range(6):
        assert c.completion(model="m", prompt=session_prompt(k, 0), max_tokens=2).status == 200
    assert c.metric("motor_coordinator_tokenize_requests_total", {"result": "failed"}) >= 1
    assert c.metric("motor_coordinator_tokenize_requests_total", {"result": "ok"}) >= 1
    assert c.find_events("tokenize_failed")
    stop_clean(c)
    # compute_length: real token counts from /tokenize, no scheduler_degraded.
    c = start_coordinator(procs, str(tmp_path),
                          {"scheduler_config": {"scheduler_type": "compute_length"}},
                          name="cl")
    c.set_instances([dp_instance(sims)])
    for k in range(4):
        assert c.completion(model="m", prompt=session_prompt(k, 0), max_tokens=2).status == 200
    # Integer prompts need no /tokenize.
    assert c.completion(model="m", prompt=[1, 2, 3, 4, 5], max_tokens=2).status == 200
    assert c.metric("motor_coordinator_tokenize_requests_total", {"result": "ok"}) == 4
    assert not c.find_events("scheduler_degraded")
    assert kv_index(c) is None  # no index without kv_cache_affinity
    stop_clean(c)


def test_approximate_prefixes_without_events(procs, tmp_path):
    """Engines that publish nothing: the coordinator remembers what it sent where."""
    sims = [start_sim(procs, *FAST, "--model", "m", "--block-size", "4", name=f"plain{i}")
            for i in range(N)]
    c = start_coordinator(procs, str(tmp_path), {
        "scheduler_config": {"scheduler_type": "kv_cache_affinity",
                             "kv_cache_affinity_source": "approximate",
                             "kv_cache_affinity_mode": "load_gated"}})
    eps = {"127.0.0.1": {str(r): {"id": r, "ip": "127.0.0.1", "business_port": str(s.port),
                                  "status": "normal", "headless": False}
                         for r, s in enumerate(sims)}}
    c.set_instances([{"id": 1, "role": "union", "job_name": "job", "model_name": "m",
                      "engine_type": "vllm", "status": "active", "endpoints": eps}])
    home = {}
    for turn in range(3):
        for k in range(8):
            before = [served(s) for s in sims]
            h0 = [hits(s) for s in sims]
            msgs = [{"role": "system", "content": session_prompt(k, 0)},
                    {"role": "user", "content": session_prompt(k, turn)[-200:]}]
            r = c.chat(model="m", messages=msgs if turn else msgs[:1], max_tokens=2)
            assert r.status == 200, r
            i = who_served(sims, before)
            if turn == 0:
                home[k] = i
            else:
                assert i == home[k], (k, turn, home)
                assert hits(sims[i]) > h0[i]
    assert len(set(home.values())) >= 2, home
    assert c.metric("motor_coordinator_tokenize_requests_total", {"result": "ok"}) == 0
    assert not c.find_events("kv_events_subscribed")
    idx = kv_index(c)
    assert idx["blocks"] > 0 and idx["slots"] == N
    # An endpoint that leaves the table leaves the index.
    c.set_instances([{"id": 1, "role": "union", "job_name": "job", "model_name": "m",
                      "engine_type": "vllm", "status": "active",
                      "endpoints": {"127.0.0.1": {"0": eps["127.0.0.1"]["0"]}}}])
    assert kv_index(c)["slots"] <= 1
    stop_clean(c)


def test_engine_metrics_count_as_load(procs, tmp_path):
    """Requests an engine runs that this coordinator did not send (another gateway,
    direct clients) come from its /metrics: load_balance sends new work elsewhere."""
    import threading
    from coord_helpers import ext_instance
    from motorlib import post

    busy = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "4",
                     name="busy")
    idle = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "50",
                     name="idle")

    def foreign():
        try:
            post(busy.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 40},
                 timeout=30)
        except OSError:
            pass
    threads = [threading.Thread(target=foreign, daemon=True) for _ in range(6)]
    for t in threads:
        t.start()
    end = time.monotonic() + 5
    while time.monotonic() < end and busy.status()["running"] < 6:
        time.sleep(0.02)
    assert busy.status()["running"] >= 6

    def count_on_busy(interval):
        c = start_coordinator(procs, str(tmp_path), {"scheduler_config": {
            "engine_metrics_interval": interval}}, name=f"scrape{interval}", workers=1)
        c.set_instances([ext_instance(1, "union", busy), ext_instance(2, "union", idle)])
        time.sleep(0.5)  # a few scrapes
        before = served(busy)
        for _ in range(6):
            assert c.completion(model="m", prompt="hello there", max_tokens=1).status == 200
        n = served(busy) - before
        stop_clean(c)
        return n
    assert count_on_busy(0.1) == 0      # the engine's 6 running requests weigh
    assert count_on_busy(0) >= 2        # without its /metrics they are invisible


class FakeConductor:
    """A KV Conductor as the coordinator speaks to it (docs/coordinator.md, "With a KV
    Conductor"): records registrations, answers prefix queries with fixed scores."""

    def __init__(self):
        import http.server
        import json as _json
        import threading
        self.registered, self.unregistered, self.queries = [], [], []
        self.scores = {}
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = _json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/register":
                    outer.registered.append(body)
                    out = {}
                elif self.path == "/unregister":
                    outer.unregistered.append(body)
                    out = {}
                elif self.path == "/query":
                    outer.queries.append(body)
                    out = {"scores": outer.scores}
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = _json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.port = free_port()
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


def test_kv_conductor_register_query_and_down(procs, tmp_path):
    sims, base, rbase = start_fleet(procs, n=2)
    cond = FakeConductor()
    try:
        c = start_coordinator(procs, str(tmp_path), kv_config(
            base, rbase, prefill_kv_event_config__conductor_service=f"127.0.0.1:{cond.port}"))
        c.set_instances([dp_instance(sims)])
        end = time.monotonic() + 5
        while time.monotonic() < end and len(cond.registered) < 2:
            time.sleep(0.02)
        regs = sorted(cond.registered, key=lambda r: r["endpoint_id"])
        assert [r["address"] for r in regs] == [f"127.0.0.1:{s.port}" for s in sims]
        assert [r["kv_event_endpoint"] for r in regs] == [f"tcp://127.0.0.1:{base + i}"
                                                          for i in range(2)]
        assert regs[1]["replay_endpoint"] == f"tcp://127.0.0.1:{rbase + 1}"
        assert regs[0]["instance_id"] == 1 and regs[0]["role"] == "union"
        # No subscriptions of our own: the conductor has the events.
        assert kv_index(c) is None and not c.find_events("kv_events_subscribed")
        # The conductor says rank 1 holds the prompts: they go there.
        cond.scores = {f"127.0.0.1:{sims[1].port}": 100000}
        before = [served(s) for s in sims]
        for k in range(4):
            assert c.completion(model="m", prompt=session_prompt(k, 1), max_tokens=2).status == 200
        assert [served(s) - b for s, b in zip(sims, before)][0] == 0
        assert cond.queries and cond.queries[0]["model"] == "m" and "prompt" in cond.queries[0]
        assert c.metric("motor_coordinator_conductor_queries_total", {"result": "ok"}) == 4
        # The conductor goes down: requests are balanced on load, no client error.
        cond.stop()
        before = [served(s) for s in sims]
        for k in range(4):
            assert c.completion(model="m", prompt=session_prompt(k, 1), max_tokens=2).status == 200
        assert all(served(s) > b for s, b in zip(sims, before))
        assert c.metric("motor_coordinator_conductor_queries_total", {"result": "failed"}) == 4
        assert c.find_events("kv_conductor_unreachable")
        stop_clean(c)
    finally:
        try:
            cond.stop()
        except Exception:
            pass


def test_kv_conductor_unregister(procs, tmp_path):
    sims, base, rbase = start_fleet(procs, n=2)
    cond = FakeConductor()
    try:
        c = start_coordinator(procs, str(tmp_path), kv_config(
            base, rbase, prefill_kv_event_config__conductor_service=f"http://127.0.0.1:{cond.port}/"))
        c.set_instances([dp_instance(sims)])
        end = time.monotonic() + 5
        while time.monotonic() < end and len(cond.registered) < 2:
            time.sleep(0.02)
        assert len(cond.registered) == 2
        c.set_instances([dp_instance(sims[:1])])
        end = time.monotonic() + 5
        while time.monotonic() < end and not cond.unregistered:
            time.sleep(0.02)
        assert cond.unregistered == [{"instance_id": 1, "endpoint_id": 1,
                                      "address": f"127.0.0.1:{sims[1].port}"}]
        stop_clean(c)
    finally:
        cond.stop()


def test_restart_without_replay_and_live_reload(procs, tmp_path):
    """No replay endpoint: an engine's restart shows in its sequence numbers (from 0
    again) and its old blocks are dropped. And kv_cache_affinity can be switched on by a
    hot reload: the subscriptions start then."""
    import json
    import signal
    base = free_port()
    cfg = f'{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{base}"}}'

    def rank(r, port=None):
        args = [*FAST, "--model", "m", "--kv-events-config", cfg, "--data-parallel-rank",
                str(r), "--data-parallel-size", "2", "--block-size", "4"]
        if port:
            args += ["--port", str(port)]
        return start_sim(procs, *args, name=f"norep{r}")
    sims = [rank(0), rank(1)]
    path = tmp_path / "coordinator-user_config.json"
    c = start_coordinator(procs, str(tmp_path), {"scheduler_config": {
        "scheduler_type": "load_balance"}})
    c.set_instances([dp_instance(sims)])
    assert kv_index(c) is None
    conf = {"motor_coordinator_config": {
        "scheduler_config": {"scheduler_type": "kv_cache_affinity"},
        "prefill_kv_event_config": {"endpoint": f"tcp://*:{base}"}}}
    path.write_text(json.dumps(conf))
    c.proc.signal(signal.SIGHUP)
    wait_connected(c, 2)
    time.sleep(0.2)  # a SUB connected late misses what was published before
    for k in range(2):
        assert c.completion(model="m", prompt=session_prompt(k, 1), max_tokens=2).status == 200
    end = time.monotonic() + 5
    while time.monotonic() < end and sum(slot_blocks(c, s) for s in sims) < 20:
        time.sleep(0.02)
    victim = max(range(2), key=lambda i: slot_blocks(c, sims[i]))
    old = slot_blocks(c, sims[victim])
    assert old >= 10
    port = sims[victim].port
    sims[victim].kill()
    sims[victim].wait()
    sims[victim] = rank(victim, port)
    wait_connected(c, 2)
    time.sleep(0.2)
    # The new process's first batches (seq 1, 2, ...) are below what was expected: the
    # slot is cleared, then fills with what the new engine stores.
    before = [served(s) for s in sims]
    k = 0
    while served(sims[victim]) == before[victim] and k < 20:
        assert c.completion(model="m", prompt=session_prompt(100 + k, 0),
                            max_tokens=2).status == 200
        k += 1
    end = time.monotonic() + 5
    while time.monotonic() < end and not c.find_events("kv_events_engine_restarted"):
        time.sleep(0.02)
    assert c.find_events("kv_events_engine_restarted")
    assert slot_blocks(c, sims[victim]) < old
    assert kv_index(c)["events"]["restarts"] >= 1
    stop_clean(c)
