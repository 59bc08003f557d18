"""The Vercel AI SDK (`ai` + `@ai-sdk/openai`, installed by this test into a cache
directory next to the motor binary) through the coordinator in PD mode: its default
provider speaks the Responses API — generateText and streamText — and its chat provider
chat completions; each answer equals what one engine gives (issue 19, done-when)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from coord_helpers import FAST, ext_instance, start_coordinator, stop_clean
from motorlib import motor_bin, post, start_sim

SCRIPT = r"""
const { generateText, streamText } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');
(async () => {
  const openai = createOpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-none' });
  const out = {};
  const r = await generateText({ model: openai('m'), prompt: 'hello there', maxOutputTokens: 6,
                                 maxRetries: 0 });
  out.text = r.text; out.output_tokens = r.usage.outputTokens; out.finish = r.finishReason;
  const s = streamText({ model: openai('m'), prompt: 'hello there', maxOutputTokens: 6,
                         maxRetries: 0 });
  let t = '';
  for await (const p of s.textStream) t += p;
  out.stream = t;
  const c = await generateText({ model: openai.chat('m'), prompt: 'hello there',
                                 maxOutputTokens: 6, maxRetries: 0 });
  out.chat = c.text;
  console.log(JSON.stringify(out));
})().catch(e => { console.error(e && e.stack || e); process.exit(3); });
"""


def aisdk_dir() -> Path:
    base = Path(motor_bin()).resolve().parent / "npm-aisdk"
    if (base / "node_modules" / "@ai-sdk" / "openai" / "package.json").exists():
        return base
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node/npm not installed")
    base.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["npm", "install", "--prefix", str(base), "ai", "@ai-sdk/openai",
                        "--no-audit", "--no-fund", "--loglevel", "error"],
                       capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        text = r.stdout + r.stderr
        if any(k in text for k in ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT",
                                   "ECONNRESET", "network", "proxy")):
            pytest.skip(f"npm registry unreachable: {text.strip()[-300:]}")
        raise AssertionError(f"npm install ai @ai-sdk/openai failed:\n{text}")
    return base


def test_ai_sdk_default_provider_in_pd_mode(procs, tmpdir_path):
    mods = aisdk_dir()
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
    want = post(ref.url + "/v1/responses", {"model": "m", "input": "hello there",
                                            "max_output_tokens": 6}).json()
    text = want["output"][0]["content"][0]["text"]
    assert out["text"] == text and out["stream"] == text, out
    assert out["output_tokens"] == 6 and out["finish"] == "length", out
    chat = ref.chat(model="m", messages=[{"role": "user", "content": "hello there"}],
                    max_tokens=6).json()["choices"][0]["message"]["content"]
    assert out["chat"] == chat, out
    assert d.status()["tokens_total"] >= 18  # the decode engine generated all three answers
    stop_clean(c)
