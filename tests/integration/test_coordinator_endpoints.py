"""Every endpoint the engines serve, through the coordinator in PD mode (issue 19,
deliverables 5 and 6): the Responses API (non-streamed and streamed), Anthropic-style
messages, embeddings, the tokenizer routes, model cards; and OpenAI-shaped error bodies
for the answers the server makes itself (404, 413, 414, 431, 503, 504), 128 headers
served."""

import json
import socket

from coord_helpers import FAST, ext_instance, no_internal_fields, start_coordinator, stop_clean
from motorlib import get, post, start_sim


def raw_request(port, data, timeout=10):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
            head, _, body = out.partition(b"\r\n\r\n")
            if b"Content-Length:" in head:
                n = int(head.split(b"Content-Length:")[1].split(b"\r\n")[0])
                if len(body) >= n:
                    break
    finally:
        s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def openai_shape(body, status):
    err = json.loads(body)["error"]
    assert err["code"] == status and isinstance(err["message"], str) and err["type"], err
    return err


def test_every_endpoint_in_pd_mode(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    ref = start_sim(procs, "--model", "m", *FAST, name="reference")
    c = start_coordinator(procs, tmpdir_path, workers=1)
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["prefill_handoff_decode"])
    served_d = get(d.url + "/sim/status").json()["tokens_total"]

    # Responses API: a PD hand-off, the same text as one engine gives
    body = {"model": "m", "input": "hello responses", "max_output_tokens": 6}
    want = post(ref.url + "/v1/responses", body).json()
    r = post(c.url + "/v1/responses", body)
    assert r.status == 200, r
    got = r.json()
    no_internal_fields(got)
    assert got["object"] == "response"
    assert got["output"][0]["content"][0]["text"] == want["output"][0]["content"][0]["text"]
    assert got["usage"]["output_tokens"] == 6
    assert get(d.url + "/sim/status").json()["tokens_total"] > served_d  # decode generated
    # streamed: named events, ends with response.completed / incomplete (no [DONE])
    r = post(c.url + "/v1/responses", dict(body, stream=True), timeout=10)
    assert r.status == 200, r
    events = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ")]
    for ev in events:
        no_internal_fields(ev)
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    text = "".join(ev["delta"] for ev in events if ev["type"] == "response.output_text.delta")
    assert text == want["output"][0]["content"][0]["text"]
    assert "event: response.created" in r.text

    # Anthropic-style messages
    mb = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    r = post(c.url + "/v1/messages", mb)
    assert r.status == 200, r
    assert r.json()["content"][0]["text"] == \
        post(ref.url + "/v1/messages", mb).json()["content"][0]["text"]
    r = post(c.url + "/v1/messages", dict(mb, stream=True))
    assert r.status == 200 and "message_stop" in r.text, r

    # routes any instance serves
    for path, b in [("/v1/embeddings", {"model": "m", "input": ["a b", "c"], "dimensions": 8}),
                    ("/tokenize", {"model": "m", "prompt": "the quick brown fox"}),
                    ("/detokenize", {"model": "m", "tokens": [104, 105]})]:
        r = post(c.url + path, b)
        assert r.status == 200, (path, r)
        w = post(ref.url + path, b).json()
        got = r.json()
        for k in ("id", "created"):
            got.pop(k, None)
            w.pop(k, None)
        assert got == w, path

    # model cards
    r = get(c.url + "/v1/models/m")
    assert r.status == 200 and r.json()["id"] == "m" and r.json()["object"] == "model"
    openai_shape(get(c.url + "/v1/models/nope").body, 404)
    openai_shape(get(c.url + "/v1/models/org/nope").body, 404)
    # an unknown route: OpenAI's shape too
    openai_shape(get(c.url + "/v1/nothing-here").body, 404)
    stop_clean(c)


def test_openai_error_bodies_and_header_limits(procs, tmpdir_path):
    sim = start_sim(procs, "--model", "m", "--fault", "hang", name="hung")
    c = start_coordinator(procs, tmpdir_path, {
        "api_config": {"max_request_body_bytes": 4096},
        "timeout_config": {"first_token_timeout": 0.3}}, workers=1)
    port = c.infer_port
    # 503: nothing registered
    r = c.completion(model="m", prompt="x", max_tokens=1)
    openai_shape(r.body, 503)
    c.set_instances([ext_instance(1, "union", sim)])
    # 504: first_token_timeout on a hung engine
    r = c.completion(model="m", prompt="x", max_tokens=1)
    openai_shape(r.body, 504)
    # 413: over max_request_body_bytes
    big = json.dumps({"model": "m", "prompt": "x" * 8000}).encode()
    st, body = raw_request(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nContent-Length: " + str(len(big)).encode() +
                           b"\r\n\r\n" + big)
    assert st == 413
    openai_shape(body, 413)
    # 414: a 16 KiB URI
    st, body = raw_request(port, b"GET /v1/models?" + b"q" * 16384 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert st == 414
    openai_shape(body, 414)
    # 431: a header block over the 16 KiB cap
    st, body = raw_request(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 17000 +
                           b"\r\n\r\n")
    assert st == 431
    openai_shape(body, 431)
    # 128 headers (what clients behind corporate proxies send) are served
    hdrs = b"".join(b"X-Proxy-%d: value-%d\r\n" % (i, i) for i in range(127))
    st, body = raw_request(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + hdrs + b"\r\n")
    assert st == 200, body
    sim.proc.signal(9)
    stop_clean(c)
