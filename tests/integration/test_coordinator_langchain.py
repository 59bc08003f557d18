"""LangChain's OpenAI clients (`@langchain/openai`, installed by this test into a cache
directory next to the motor binary) through the coordinator in PD mode: ChatOpenAI with
n=3, and OpenAI (completions) with a batch of prompts and with n=2 — shapes a hand-off
cannot carry, served by fan-out (issue 19, done-when)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from coord_helpers import FAST, ext_instance, start_coordinator, stop_clean
from motorlib import motor_bin, start_sim

SCRIPT = r"""
const { ChatOpenAI, OpenAI } = require('@langchain/openai');
(async () => {
  const cfg = { configuration: { baseURL: process.env.BASE_URL }, apiKey: 'sk-none',
                maxRetries: 0 };
  const out = {};
  const chat = new ChatOpenAI({ model: 'm', maxTokens: 4, n: 3, ...cfg });
  const g = await chat.generate([[['human', 'hello there']]]);
  out.chat_n3 = g.generations[0].map(x => x.text);
  const llm = new OpenAI({ model: 'm', maxTokens: 5, ...cfg });
  const b = await llm.generate(['hello', 'good morning']);
  out.batch = b.generations.map(gs => gs[0].text);
  const llm2 = new OpenAI({ model: 'm', maxTokens: 5, n: 2, ...cfg });
  const b2 = await llm2.generate(['hello']);
  out.completion_n2 = b2.generations[0].map(x => x.text);
  console.log(JSON.stringify(out));
})().catch(e => { console.error(e && e.stack || e); process.exit(3); });
"""


def langchain_dir() -> Path:
    base = Path(motor_bin()).resolve().parent / "npm-langchain"
    if (base / "node_modules" / "@langchain" / "openai" / "package.json").exists():
        return base
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node/npm not installed")
    base.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["npm", "install", "--prefix", str(base), "@langchain/openai",
                        "@langchain/core", "--no-audit", "--no-fund", "--loglevel", "error"],
                       capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        text = r.stdout + r.stderr
        if any(k in text for k in ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT",
                                   "ECONNRESET", "network", "proxy")):
            pytest.skip(f"npm registry unreachable: {text.strip()[-300:]}")
        raise AssertionError(f"npm install @langchain/openai failed:\n{text}")
    return base


def test_langchain_n_and_batch_in_pd_mode(procs, tmpdir_path):
    mods = langchain_dir()
    p = start_sim(procs, "--model", "m", *FAST, name="prefill")
    d = start_sim(procs, "--model", "m", *FAST, name="decode")
    ref = start_sim(procs, "--model", "m", *FAST, name="reference")
    c = start_coordinator(procs, tmpdir_path, workers=1)
    c.set_instances([ext_instance(1, "prefill", p), ext_instance(2, "decode", d)],
                    dispatch_capabilities=["prefill_handoff_decode"])
    script = Path(tmpdir_path) / "client.js"
    script.write_text(SCRIPT)
    env = dict(os.environ, NODE_PATH=str(mods / "node_modules"), BASE_URL=c.url + "/v1")
    r = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    out = json.loads(r.stdout.strip().splitlines()[-1])
    chat = ref.chat(model="m", messages=[{"role": "user", "content": "hello there"}],
                    max_tokens=4).json()["choices"][0]["message"]["content"]
    assert out["chat_n3"] == [chat] * 3, out
    refs = [ref.completion(model="m", prompt=x, max_tokens=5).json()["choices"][0]["text"]
            for x in ("hello", "good morning")]
    assert out["batch"] == refs, out
    assert out["completion_n2"] == [refs[0]] * 2, out
    assert len(c.proc.find_events("fanout")) == 3
    stop_clean(c)
