"""motor engine-sim: the tokenizer routes, logprobs and token ids in vLLM's shapes, the
context-determined generation (exact continuation of an answer from any prefix, as text
or token ids, completions and chat), and the output-quality faults with their logprob
signatures — against the real binary."""

import collections
import math

from motorlib import SSEStream, post, start_sim

FAST = ("--ttft-ms", "0", "--tokens-per-second", "0")


def tokenize(sim, **body):
    r = post(sim.url + "/tokenize", body)
    assert r.status == 200, r
    return r.json()


def detok(sim, tokens):
    r = post(sim.url + "/detokenize", {"tokens": tokens})
    assert r.status == 200, r
    return r.json()["prompt"]


# ---- /tokenize, /detokenize ---------------------------------------------------------------

def test_tokenize_detokenize_shapes(procs):
    sim = start_sim(procs, *FAST, "--max-model-len", "2048")
    out = tokenize(sim, prompt="the engine decodes", return_token_strs=True)
    assert set(out) == {"count", "max_model_len", "tokens", "token_strs"}
    assert out["count"] == 3 == len(out["tokens"]) and out["max_model_len"] == 2048
    assert out["token_strs"] == ["the", " engine", " decodes"]
    assert tokenize(sim, prompt="x")["token_strs"] is None
    # the simulator's own words round-trip; white space is kept
    text = "The engine, decodes  a\ntoken."
    ids = tokenize(sim, prompt=text)["tokens"]
    assert detok(sim, ids) == text
    # unknown words map deterministically (the same ids on another engine)
    other = start_sim(procs, *FAST, name="other")
    assert tokenize(other, prompt="zebra quokka")["tokens"] == \
        tokenize(sim, prompt="zebra quokka")["tokens"]
    # add_special_tokens changes nothing (no BOS)
    assert tokenize(sim, prompt="a b", add_special_tokens=True)["tokens"] == \
        tokenize(sim, prompt="a b", add_special_tokens=False)["tokens"]
    # chat template: content tokens + an end-of-message marker per message; with
    # continue_final_message the last message stays open
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello"}]
    chat = tokenize(sim, messages=msgs, return_token_strs=True)
    assert chat["count"] == 3 + 1 + 2 + 1
    assert chat["token_strs"][3] == "<|end_of_system|>" and chat["token_strs"][-1] == "<|end_of_user|>"
    # the count matches what a chat request reports as prompt tokens
    usage = sim.chat(messages=msgs, max_tokens=1).json()["usage"]
    assert usage["prompt_tokens"] == chat["count"]
    cont = tokenize(sim, messages=msgs + [{"role": "assistant", "content": "Hello"}],
                    add_generation_prompt=False, continue_final_message=True)
    assert cont["count"] == chat["count"] + 1
    # errors, in vLLM's shape
    r = post(sim.url + "/tokenize", {"messages": msgs, "add_generation_prompt": True,
                                     "continue_final_message": True})
    assert r.status == 400 and r.json()["error"]["type"] == "BadRequestError"
    r = post(sim.url + "/tokenize", {"prompt": "x", "model": "nope"})
    assert r.status == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = post(sim.url + "/detokenize", {"tokens": [1, 99999999]})
    assert r.status == 400 and r.json()["error"]["param"] == "tokens"
    r = post(sim.url + "/v1/completions", {"prompt": [5, 3000], "max_tokens": 1})
    assert r.status == 400 and "out of vocabulary" in r.json()["error"]["message"]


# ---- logprobs ------------------------------------------------------------------------------

def test_completions_logprobs_shape(procs):
    sim = start_sim(procs, *FAST)
    body = sim.completion(prompt="hello cluster", max_tokens=8, ignore_eos=True, logprobs=3).json()
    ch = body["choices"][0]
    lp = ch["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert len(lp["tokens"]) == 8 and "".join(lp["tokens"]) == ch["text"]
    # text_offset: where each token starts in the text (code points)
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(8)]
    for tok, tlp, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert tlp <= 0 and tok in top and top[tok] == tlp
        assert 3 <= len(top) <= 4  # the sampled token plus the top 3 (vLLM: k + 1)
        assert sum(math.exp(v) for v in top.values()) <= 1.0 + 1e-9
    # logprobs=0: the sampled token only; no logprobs field: null
    one = sim.completion(prompt="hello cluster", max_tokens=2, logprobs=0).json()
    assert all(len(t) == 1 for t in one["choices"][0]["logprobs"]["top_logprobs"])
    assert sim.completion(prompt="x", max_tokens=1).json()["choices"][0]["logprobs"] is None
    # token ids as "token_id:N" (return_tokens_as_token_ids), the same tokens
    ids = sim.completion(prompt="hello cluster", max_tokens=8, ignore_eos=True, logprobs=1,
                         return_tokens_as_token_ids=True).json()["choices"][0]
    assert ids["text"] == ch["text"]
    toks = ids["logprobs"]["tokens"]
    assert all(t.startswith("token_id:") for t in toks)
    assert detok(sim, [int(t.split(":")[1]) for t in toks]) == ch["text"]
    # vLLM's cap: max_logprobs 20
    r = sim.completion(prompt="x", logprobs=21)
    assert r.status == 400 and "max allowed: 20" in r.json()["error"]["message"]


def test_chat_logprobs_shape_stream_and_not(procs):
    sim = start_sim(procs, *FAST)
    msgs = [{"role": "user", "content": "hello"}]
    body = sim.chat(messages=msgs, max_tokens=6, ignore_eos=True, logprobs=True,
                    top_logprobs=2).json()
    ch = body["choices"][0]
    content = ch["logprobs"]["content"]
    assert len(content) == 6
    assert "".join(e["token"] for e in content) == ch["message"]["content"]
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert e["bytes"] == list(e["token"].encode())
        assert len(e["top_logprobs"]) == 2
        # vLLM's order: the sampled token first, then the best others
        assert e["top_logprobs"][0]["token"] == e["token"]
        assert all(set(t) == {"token", "logprob", "bytes"} for t in e["top_logprobs"])
    # streamed: the same tokens and logprobs, chunk by chunk
    s = SSEStream(sim.url + "/v1/chat/completions",
                  {"messages": msgs, "max_tokens": 6, "ignore_eos": True, "stream": True,
                   "logprobs": True, "top_logprobs": 2})
    chunks = s.all()
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == ch["message"]["content"]
    # top_logprobs without logprobs: vLLM's 400
    r = sim.chat(messages=msgs, top_logprobs=2)
    assert r.status == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_completion_stream_logprobs_offsets(procs):
    sim = start_sim(procs, *FAST)
    ref = sim.completion(prompt="a b c", max_tokens=10, ignore_eos=True, logprobs=2).json()
    s = SSEStream(sim.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 10,
                                                "ignore_eos": True, "logprobs": 2,
                                                "stream": True})
    lps = [c["choices"][0]["logprobs"] for c in s.all() if c["choices"]]
    assert [t for lp in lps for t in lp["tokens"]] == ref["choices"][0]["logprobs"]["tokens"]
    # offsets continue across chunks, as vLLM counts the text already sent
    assert [o for lp in lps for o in lp["text_offset"]] == \
        ref["choices"][0]["logprobs"]["text_offset"]


# ---- deterministic continuation ---------------------------------------------------------

def test_completion_continuation_is_exact_for_every_prefix(procs):
    sim = start_sim(procs, *FAST)
    P = "tell me about the cluster"
    full = sim.completion(prompt=P, max_tokens=300, logprobs=0,
                          return_tokens_as_token_ids=True).json()["choices"][0]
    assert full["finish_reason"] == "stop"  # its natural end
    ids = [int(t.split(":")[1]) for t in full["logprobs"]["tokens"]]
    n = len(ids)
    assert 8 <= n < 128
    prompt_ids = tokenize(sim, prompt=P)["tokens"]
    for m in range(n + 1):
        head = "".join(full["logprobs"]["tokens"][:0]) + detok(sim, ids[:m])
        want = full["text"][len(head):]
        # as text
        r = sim.completion(prompt=P + head, max_tokens=300).json()["choices"][0]
        assert r["text"] == want and r["finish_reason"] == "stop", m
        # as token ids
        r = sim.completion(prompt=prompt_ids + ids[:m], max_tokens=300).json()["choices"][0]
        assert r["text"] == want and r["finish_reason"] == "stop", m
    # max_tokens adjusted by the tokens already there ends at the same "length" point
    short = sim.completion(prompt=P, max_tokens=5, ignore_eos=True).json()["choices"][0]
    head = detok(sim, ids[:2])
    r = sim.completion(prompt=P + head, max_tokens=3, ignore_eos=True).json()["choices"][0]
    assert head + r["text"] == short["text"] and r["finish_reason"] == "length"


def test_chat_continuation_with_continue_final_message(procs):
    sim = start_sim(procs, *FAST)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    full = sim.chat(messages=msgs, max_tokens=300, logprobs=True).json()["choices"][0]
    tokens = [e["token"] for e in full["logprobs"]["content"]]
    text = full["message"]["content"]
    assert "".join(tokens) == text and full["finish_reason"] == "stop"
    for m in range(1, len(tokens) + 1):
        part = "".join(tokens[:m])
        r = sim.chat(messages=msgs + [{"role": "assistant", "content": part}],
                     continue_final_message=True, add_generation_prompt=False,
                     max_tokens=300).json()
        assert part + r["choices"][0]["message"]["content"] == text, m
        assert r["choices"][0]["finish_reason"] == "stop"
        # prompt tokens: the conversation + the open assistant message
        assert r["usage"]["prompt_tokens"] == \
            sim.chat(messages=msgs, max_tokens=1).json()["usage"]["prompt_tokens"] + m
    # the second choice of n=2 is continued too (its own seed)
    two = sim.chat(messages=msgs, max_tokens=300, n=2).json()["choices"]
    t1 = two[1]["message"]["content"]
    first = t1.split(" ")[0]
    r = sim.chat(messages=msgs + [{"role": "assistant", "content": first}],
                 continue_final_message=True, add_generation_prompt=False,
                 max_tokens=300).json()
    assert first + r["choices"][0]["message"]["content"] == t1
    # a new turn after the answer is a fresh answer, not a continuation
    turn = sim.chat(messages=msgs + [{"role": "assistant", "content": text},
                                     {"role": "user", "content": "more"}],
                    max_tokens=20).json()["choices"][0]["message"]["content"]
    assert not text.endswith(turn)


def test_good_output_has_no_long_repeats(procs):
    sim = start_sim(procs, *FAST)
    worst = 0
    for i in range(60):
        body = sim.completion(prompt=f"prompt number {i}", max_tokens=128, ignore_eos=True,
                              logprobs=0, return_tokens_as_token_ids=True).json()
        toks = body["choices"][0]["logprobs"]["tokens"]
        grams = collections.Counter(tuple(toks[j:j + 4]) for j in range(len(toks) - 3))
        worst = max(worst, max(grams.values()))
        lps = body["choices"][0]["logprobs"]["token_logprobs"]
        assert sum(lps) / len(lps) > -1.0  # confident
    assert worst <= 2


# ---- output-quality faults -----------------------------------------------------------

def lp_stats(sim, **extra):
    body = sim.chat(messages=[{"role": "user", "content": "probe"}], max_tokens=64,
                    logprobs=True, top_logprobs=5, return_tokens_as_token_ids=True,
                    **extra).json()
    content = body["choices"][0]["logprobs"]["content"]
    ids = [int(e["token"].split(":")[1]) for e in content]
    mean_lp = sum(e["logprob"] for e in content) / len(content)
    # entropy of the (renormalised) top-5 of each position
    ents = []
    for e in content:
        ps = [math.exp(t["logprob"]) for t in e["top_logprobs"]]
        z = sum(ps)
        ents.append(-sum(p / z * math.log(p / z) for p in ps))
    return body, ids, mean_lp, sum(ents) / len(ents)


def test_quality_faults_and_recover(procs):
    sim = start_sim(procs, *FAST)
    good, good_ids, good_lp, good_ent = lp_stats(sim)
    assert good_lp > -1.0 and good_ent < 1.2

    assert sim.fault("repeat").json() == {"mode": "repeat", "previous": "none"}
    body, ids, lp, ent = lp_stats(sim)
    assert body["choices"][0]["finish_reason"] == "length"  # a loop does not stop
    tail = ids[3:]
    period = next(p for p in range(1, 10) if all(tail[i] == tail[i % p] for i in range(len(tail))))
    assert 2 <= period <= 6
    assert lp > -0.1 and ent < 0.1  # near-certain

    sim.fault("garbled")
    body, ids, lp, ent = lp_stats(sim)
    assert lp < -4.0 and ent > 1.4  # low confidence, flat top-k
    assert "\ufffd" in body["choices"][0]["message"]["content"]

    sim.fault("rare_chars")
    body, ids, lp, ent = lp_stats(sim)
    rare = [i for i in ids if 4096 <= i < 4096 + 512]
    assert len(rare) / len(ids) > 0.6
    assert any(ord(ch) > 0xFFFF or 0xA000 <= ord(ch) < 0xA500
               for ch in body["choices"][0]["message"]["content"])

    assert sim.fault("recover").json()["previous"] == "rare_chars"
    again, again_ids, _, _ = lp_stats(sim)
    assert again_ids == good_ids  # back to the deterministic good text
    # a fault can be the start state too
    bad = start_sim(procs, *FAST, "--fault", "garbled", name="garbled")
    assert lp_stats(bad)[2] < -4.0
