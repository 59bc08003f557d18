"""Every request shape in PD mode (issue 19, deliverable 3): n > 1, batch prompts and
best_of fan out into one hand-off per (prompt, choice), merged in order with summed usage;
streams interleave with correct indices; the client leaving cancels every part."""

import json
import socket
import ssl
import time

from coord_helpers import (FAST, ext_instance, no_internal_fields, sim_aborted, sim_served,
                           start_coordinator, stop_clean)
from motorlib import SSEStream, start_sim, wait_for


def pd(procs, tmpdir_path, decode_args=FAST):
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *decode_args, name="decode")
    ref = start_sim(procs, "--model", "m", *FAST, name="reference")
    c = start_coordinator(procs, tmpdir_path, {"exception_config": {"retry_delay": 0.01}},
                          workers=2)
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["prefill_handoff_decode"])
    return c, p, d, ref


def test_n_batch_and_best_of(procs, tmpdir_path):
    c, p, d, ref = pd(procs, tmpdir_path)
    one = ref.completion(model="m", prompt="fan me out", max_tokens=6).json()
    # n = 3
    r = c.completion(model="m", prompt="fan me out", max_tokens=6, n=3)
    assert r.status == 200, r
    j = r.json()
    no_internal_fields(j)
    assert [ch["index"] for ch in j["choices"]] == [0, 1, 2]
    assert all(ch["text"] == one["choices"][0]["text"] for ch in j["choices"])
    assert j["usage"] == {"prompt_tokens": one["usage"]["prompt_tokens"],
                          "completion_tokens": 18,
                          "total_tokens": one["usage"]["prompt_tokens"] + 18}
    # a batch of two prompts, n = 2: index = prompt * n + choice
    prompts = ["first prompt", "second prompt here"]
    refs = [ref.completion(model="m", prompt=x, max_tokens=4).json() for x in prompts]
    r = c.completion(model="m", prompt=prompts, max_tokens=4, n=2)
    assert r.status == 200, r
    j = r.json()
    assert [ch["index"] for ch in j["choices"]] == [0, 1, 2, 3]
    assert [ch["text"] for ch in j["choices"]] == \
        [refs[0]["choices"][0]["text"]] * 2 + [refs[1]["choices"][0]["text"]] * 2
    assert j["usage"]["prompt_tokens"] == sum(x["usage"]["prompt_tokens"] for x in refs)
    assert j["usage"]["completion_tokens"] == 16
    # token-id lists are a batch too
    ids = [[104, 105], [106, 107, 108]]
    r = c.completion(model="m", prompt=ids, max_tokens=3)
    assert r.status == 200 and len(r.json()["choices"]) == 2, r
    # best_of: candidates generated, the n best kept, logprobs only when asked
    r = c.completion(model="m", prompt="pick the best", max_tokens=5, n=2, best_of=3)
    assert r.status == 200, r
    j = r.json()
    assert [ch["index"] for ch in j["choices"]] == [0, 1]
    assert all(ch["logprobs"] is None for ch in j["choices"])
    assert j["usage"]["completion_tokens"] == 10
    # chat n = 2, streamed: indices interleave, one usage chunk, one [DONE]
    s = SSEStream(c.url + "/v1/chat/completions",
                  {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2,
                   "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}})
    assert s.status == 200
    chunks = s.all()
    texts, usage = {}, []
    for ch in chunks:
        no_internal_fields(ch)
        if ch.get("usage"):
            usage.append(ch["usage"])
        for x in ch["choices"]:
            texts[x["index"]] = texts.get(x["index"], "") + (x["delta"].get("content") or "")
    assert sorted(texts) == [0, 1]
    chat_one = ref.chat(model="m", messages=[{"role": "user", "content": "hi"}],
                        max_tokens=5).json()
    assert texts[0] == texts[1] == chat_one["choices"][0]["message"]["content"]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 10
    assert len({ch["id"] for ch in chunks}) == 1
    # a part the engine refuses: its error is the answer
    r = c.completion(model="m", prompt="x", max_tokens=100000, n=2)
    assert r.status == 400, r
    assert "error" in r.json()
    # a streamed best_of is refused as vLLM does
    r = c.completion(model="m", prompt="x", max_tokens=3, n=1, best_of=2, stream=True)
    assert r.status == 400, r
    stop_clean(c)


def test_fan_out_over_a_mutual_tls_inference_port(procs, tmpdir_path, pki):
    """The inference port is mutual TLS (engines plain): the parts are https requests to
    that port presenting its own certificate (signed by its ca_file), so n > 1, batches
    and streamed n work as on a plain port (they used to be refused with 400)."""
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    ref = start_sim(procs, "--model", "m", *FAST, name="reference")
    tls = {"enable_tls": True, "cert_file": pki("srv.crt"), "key_file": pki("srv.key"),
           "ca_file": pki("ca.crt"), "engine_tls": False}
    c = start_coordinator(procs, tmpdir_path, {}, workers=2,
                          root={"motor_deploy_config": {"tls_config": {"infer_tls_config": tls}}})
    cli = ssl.create_default_context(cafile=pki("ca.crt"))
    cli.load_cert_chain(pki("cli.crt"), pki("cli.key"))
    c.use_tls(cli)
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["prefill_handoff_decode"])
    one = ref.completion(model="m", prompt="fan me out", max_tokens=6).json()
    r = c.completion(model="m", prompt=["fan me out", "fan me out"], max_tokens=6, n=2)
    assert r.status == 200, r
    j = r.json()
    assert [ch["index"] for ch in j["choices"]] == [0, 1, 2, 3]
    assert all(ch["text"] == one["choices"][0]["text"] for ch in j["choices"])
    assert j["usage"]["completion_tokens"] == 24
    s = SSEStream(c.url + "/v1/chat/completions",
                  {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2,
                   "max_tokens": 5, "stream": True}, context=cli)
    assert s.status == 200
    texts = {}
    for ch in s.all():
        for x in ch["choices"]:
            texts[x["index"]] = texts.get(x["index"], "") + (x["delta"].get("content") or "")
    chat_one = ref.chat(model="m", messages=[{"role": "user", "content": "hi"}],
                        max_tokens=5).json()
    assert texts == {0: chat_one["choices"][0]["message"]["content"],
                     1: chat_one["choices"][0]["message"]["content"]}
    # every part went through the PD route: 4 + 2 decode legs
    wait_for(lambda: sim_served(d) >= 6, 5, what="six decode legs")
    stop_clean(c)


def test_client_leaving_cancels_every_part(procs, tmpdir_path):
    c, p, d, ref = pd(procs, tmpdir_path, ("--ttft-ms", "0", "--tokens-per-second", "5"))
    body = json.dumps({"model": "m", "prompt": "a slow fan-out", "max_tokens": 100, "n": 3,
                       "ignore_eos": True, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", c.infer_port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    wait_for(lambda: d.status()["running"] == 3, 10, what="three decode legs running")
    s.close()
    wait_for(lambda: d.status()["running"] == 0, 10, what="every part cancelled")
    assert sim_aborted(d) >= 3
    time.sleep(0.2)
    stop_clean(c)
