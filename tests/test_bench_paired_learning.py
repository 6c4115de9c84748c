"""`python -m grpo.bench.optimizer_learning` and `precision_learning` (grpo.bench.paired_learning) on the shipped
arithmetic model, one step a run, in a fresh process: both arms run for the seed with the settings they name (as the
trainer resolved them), their held-out gain is the evaluator's accuracy after minus before, and the results file
holds the summary the docs quote from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _bench(name: str, tmp_path) -> dict:
    from grpo.models.builtin import SHIPPED_DIR

    out = tmp_path / f"{name}_learning.json"
    proc = subprocess.run([sys.executable, "-m", f"grpo.bench.{name}_learning", "--model",
                           str(SHIPPED_DIR / "arithmetic"), "--steps", "1", "--seeds", "0", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["complete"]
    for r in res["runs"]:
        assert r["steps"] == 1 and len(r["reward_per_step"]) == 1
        assert len(r["step_generate_s"]) == len(r["step_update_s"]) == 1 and r["step_update_s"][0] > 0
        for split in ("val", "test"):
            assert r[f"gain_{split}"] == pytest.approx(r["after"][split]["accuracy"]
                                                       - res["before"][split]["accuracy"])
    return res


@pytest.mark.slow
def test_both_optimizers_run_and_the_results_file_holds_what_the_docs_quote(tmp_path):
    pytest.importorskip("torchao", reason="the 8-bit arm needs torchao (pip install 'grpo[torchao]')")
    res = _bench("optimizer", tmp_path)
    assert [r["optimizer"] for r in res["runs"]] == ["adamw", "adamw_8bit"]
    assert [r["resolved"]["optim.name"] for r in res["runs"]] == ["adamw", "adamw_8bit"]
    adamw, eight = res["runs"]
    assert eight["optimizer_state_bytes"] < adamw["optimizer_state_bytes"] / 3
    s = res["summary"]
    assert s["difference_8bit_minus_float32"]["gain_test"]["values"] == [pytest.approx(
        eight["gain_test"] - adamw["gain_test"])]


@pytest.mark.slow
def test_float32_and_bf16_compute_run_and_the_file_says_which_bf16_ran(tmp_path):
    from grpo.models.precision import cpu_native_bf16

    res = _bench("precision", tmp_path)
    bf16 = "bfloat16" if cpu_native_bf16() else "bfloat16_emulated"  # this CPU's, read as the bench reads it
    assert res["cpu_native_bf16"] == cpu_native_bf16()
    assert [r["compute"] for r in res["runs"]] == ["float32", "bfloat16"]
    assert [r["resolved"]["compute"] for r in res["runs"]] == ["weights", bf16]
    fp32, half = res["runs"]
    s = res["summary"]
    assert s["bfloat16"]["update_s_median"]["values"] == half["step_update_s"]  # the phases reported apart
    assert s["difference_bf16_minus_float32"]["gain_test"]["values"] == [pytest.approx(
        half["gain_test"] - fp32["gain_test"])]
