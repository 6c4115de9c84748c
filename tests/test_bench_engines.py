"""The engine axis of `grpo bench` (bench_engines.py) on its quick plan, in a fresh process: every engine that is
installed is measured on the same fixed token count, vLLM is listed as skipped, with the reason, where it is not
installed (scripts/test_vllm.sh runs this file in vLLM's environment too). Timings live in the benchmark, never in
these assertions."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import grpo

SRC = str(Path(grpo.__file__).resolve().parents[1])


@pytest.mark.slow
def test_engine_axis_quick(tmp_path):
    out = tmp_path / "engines.json"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "grpo.bench.engines", "--quick", "--output", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    have_vllm = importlib.util.find_spec("vllm") is not None
    assert list(res["engines"]) == (["native", "vllm", "hf"] if have_vllm else ["native", "hf"])
    if not have_vllm:
        assert "grpo[vllm]" in res["skipped"]["vllm"]
    else:
        assert res["vllm"] and res["vllm_start_s"] > 0
    p = res["plan"]
    assert res["gen_tokens"] == p["prompts"] * p["group_size"] * p["completion_tokens"]
    for name, e in res["engines"].items():
        assert e["generate_s"] > 0 and e["update_s"] > 0 and e["step_s"] >= e["generate_s"] + e["update_s"] - 1e-9
        assert e["gen_tokens_per_s"] == pytest.approx(res["gen_tokens"] / e["generate_s"], rel=1e-6)
        assert ("tokens_per_s_over_native" in e) == (name != "native")
    assert "rollout engines" in proc.stdout and "native" in proc.stdout
