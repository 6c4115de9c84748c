"""`python -m grpo.bench.optimizer_learning` on the shipped arithmetic model, one step a run, in a fresh process: both
optimizers run for the seed, their held-out gain is the evaluator's accuracy after minus before, the 8-bit state is
under a third of float32's, and the results file holds the summary the docs quote from."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torchao", reason="the 8-bit arm needs torchao (pip install 'grpo[torchao]')")


@pytest.mark.slow
def test_both_optimizers_run_and_the_results_file_holds_what_the_docs_quote(tmp_path):
    from grpo.models.builtin import SHIPPED_DIR

    out = tmp_path / "optimizer_learning.json"
    proc = subprocess.run([sys.executable, "-m", "grpo.bench.optimizer_learning", "--model",
                           str(SHIPPED_DIR / "arithmetic"), "--steps", "1", "--seeds", "0", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["complete"] and [r["optimizer"] for r in res["runs"]] == ["adamw", "adamw_8bit"]
    for r in res["runs"]:
        assert r["steps"] == 1 and len(r["reward_per_step"]) == 1
        for split in ("val", "test"):
            assert r[f"gain_{split}"] == pytest.approx(r["after"][split]["accuracy"]
                                                       - res["before"][split]["accuracy"])
    adamw, eight = res["runs"]
    assert eight["optimizer_state_bytes"] < adamw["optimizer_state_bytes"] / 3
    s = res["summary"]
    assert s["difference_8bit_minus_float32"]["gain_test"]["values"] == [pytest.approx(
        eight["gain_test"] - adamw["gain_test"])]
