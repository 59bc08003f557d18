"""A real OpenAI client — the `openai` npm package, installed by this test into a cache
directory next to the motor binary — doing a non-streamed and a streamed chat completion
(and a completion) through the coordinator, with an inference API key, over a PD pair."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from coord_helpers import FAST, ext_instance, start_coordinator, stop_clean
from motorlib import motor_bin, start_sim

SCRIPT = r"""
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;
(async () => {
  const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY,
                              maxRetries: 0, timeout: 20000 });
  const messages = [{ role: 'user', content: 'say something about gateways' }];
  const out = {};
  const r = await client.chat.completions.create({ model: 'm', messages, max_tokens: 10 });
  out.chat = r.choices[0].message.content;
  out.chat_usage = r.usage;
  out.chat_keys = Object.keys(r);
  const stream = await client.chat.completions.create({ model: 'm', messages, max_tokens: 10,
                                                        stream: true,
                                                        stream_options: { include_usage: true } });
  let text = '', chunks = 0, usage = null;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.choices && chunk.choices.length) text += chunk.choices[0].delta.content || '';
    if (chunk.usage) usage = chunk.usage;
  }
  out.stream = text; out.stream_chunks = chunks; out.stream_usage = usage;
  const c = await client.completions.create({ model: 'm', prompt: 'hello', max_tokens: 5 });
  out.completion = c.choices[0].text;
  // n > 1 and batch prompts over the PD pair: fanned out, merged (issue 19)
  const n3 = await client.chat.completions.create({ model: 'm', messages, max_tokens: 4, n: 3 });
  out.n3 = n3.choices.map(ch => [ch.index, ch.message.content]);
  out.n3_usage = n3.usage;
  const s3 = await client.chat.completions.create({ model: 'm', messages, max_tokens: 4, n: 3,
                                                    stream: true,
                                                    stream_options: { include_usage: true } });
  const parts = {};
  let s3usage = null;
  for await (const chunk of s3) {
    for (const ch of chunk.choices || []) parts[ch.index] = (parts[ch.index] || '') + (ch.delta.content || '');
    if (chunk.usage) s3usage = chunk.usage;
  }
  out.s3 = parts; out.s3_usage = s3usage;
  const b = await client.completions.create({ model: 'm', prompt: ['hello', 'good morning'],
                                              max_tokens: 5 });
  out.batch = b.choices.map(ch => [ch.index, ch.text]);
  out.batch_usage = b.usage;
  const models = await client.models.list();
  out.models = models.data.map(m => m.id);
  try {
    await new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'wrong', maxRetries: 0 })
      .chat.completions.create({ model: 'm', messages, max_tokens: 1 });
    out.bad_key = 'accepted';
  } catch (e) { out.bad_key = e.status; }
  console.log(JSON.stringify(out));
})().catch(e => { console.error(e && e.stack || e); process.exit(3); });
"""


def openai_dir() -> Path:
    """node_modules with `openai`, installed once per build tree."""
    base = Path(motor_bin()).resolve().parent / "npm-openai"
    if (base / "node_modules" / "openai" / "package.json").exists():
        return base
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node/npm not installed")
    base.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["npm", "install", "--prefix", str(base), "openai", "--no-audit",
                        "--no-fund", "--loglevel", "error"],
                       capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        text = r.stdout + r.stderr
        network = any(k in text for k in ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT",
                                           "ECONNRESET", "network", "proxy"))
        if network:
            pytest.skip(f"npm registry unreachable, cannot install the openai package: "
                        f"{text.strip()[-300:]}")
        raise AssertionError(f"npm install openai failed:\n{text}")
    return base


def test_openai_node_client(procs, tmpdir_path):
    mods = openai_dir()
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "200",
                  name="decode")
    u = start_sim(procs, "--model", "m", *FAST, name="reference")
    c = start_coordinator(procs, tmpdir_path, {"api_key_config": {
        "enable_api_key": True, "api_keys": ["sk-motor-test"]}})
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)])
    script = Path(tmpdir_path) / "client.js"
    script.write_text(SCRIPT)
    env = dict(os.environ, NODE_PATH=str(mods / "node_modules"), BASE_URL=c.url + "/v1",
               API_KEY="sk-motor-test")
    r = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=45,
                       env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    out = json.loads(r.stdout.strip().splitlines()[-1])
    msgs = [{"role": "user", "content": "say something about gateways"}]
    want = u.chat(model="m", messages=msgs, max_tokens=10).json()["choices"][0]["message"]["content"]
    assert out["chat"] == want
    assert out["chat_usage"]["completion_tokens"] == 10
    assert "kv_transfer_params" not in out["chat_keys"]
    assert out["stream"] == want
    assert out["stream_chunks"] >= 10
    assert out["stream_usage"]["completion_tokens"] == 10
    assert out["completion"] == \
        u.completion(model="m", prompt="hello", max_tokens=5).json()["choices"][0]["text"]
    assert out["models"] == ["m"]
    # n=3: three choices in order; each an independent n=1 hand-off (the simulator is
    # deterministic, so each equals the n=1 answer), usage summed, the prompt once
    one = u.chat(model="m", messages=msgs, max_tokens=4).json()
    assert out["n3"] == [[k, one["choices"][0]["message"]["content"]] for k in range(3)]
    assert out["n3_usage"]["completion_tokens"] == 12
    assert out["n3_usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert out["s3"] == {str(k): one["choices"][0]["message"]["content"] for k in range(3)}
    assert out["s3_usage"]["completion_tokens"] == 12
    refs = [u.completion(model="m", prompt=p_, max_tokens=5).json() for p_ in
            ("hello", "good morning")]
    assert out["batch"] == [[i, r_["choices"][0]["text"]] for i, r_ in enumerate(refs)]
    assert out["batch_usage"]["prompt_tokens"] == sum(r_["usage"]["prompt_tokens"] for r_ in refs)
    assert out["batch_usage"]["completion_tokens"] == 10
    assert c.proc.find_events("fanout")
    assert out["bad_key"] == 401
    stop_clean(c)
