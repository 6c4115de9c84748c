"""`grpo bench --versus-trl --learn --quick` on the built-in model: the results file has the plan's shape, its
derived figures follow from its measured ones, and both methods' accuracies are the shared evaluator's on the model
each saved (re-scored here from the kept directories, they give the same numbers)."""

from __future__ import annotations

import argparse
import json
import statistics

import pytest
import torch

from grpo.bench import learning_vs_trl as lvt


def test_the_three_splits_share_no_problem(tmp_path):
    spec = lvt.default_spec(None, quick=True)
    paths = lvt.write_splits(spec, tmp_path)
    rows = {k: [json.loads(line) for line in open(p)] for k, p in paths.items()}
    assert [len(rows[k]) for k in ("train", "val", "test")] == [spec["train_n"], spec["val_n"], spec["test_n"]]
    prompts = {k: {json.dumps(r["prompt"]) for r in v} for k, v in rows.items()}
    assert len(prompts["train"] | prompts["val"] | prompts["test"]) == spec["train_n"] + spec["val_n"] + spec["test_n"]


def test_choose_lrs_takes_the_best_validation_accuracy_and_the_smaller_rate_on_a_tie():
    def row(method, lr, acc):
        return {"method": method, "lr": lr, "after": {"val": {"accuracy": acc}}}

    sweep = [row("ours", 1e-6, 0.1), row("ours", 1e-5, 0.3), row("ours", 1e-4, 0.2),
             row("trl", 1e-6, 0.1), row("trl", 1e-5, 0.2), row("trl", 1e-4, 0.2)]
    assert lvt.choose_lrs(sweep) == {"ours": 1e-5, "trl": 1e-5}


def test_learn_without_versus_trl_is_a_usage_error(capsys):
    from grpo.cli import main

    assert main(["bench", "--learn"]) == 2
    assert "--learn" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_scores_both_methods_with_the_shared_evaluator(tmp_path, capsys):
    out, kept = tmp_path / "learn.json", tmp_path / "models"
    args = argparse.Namespace(model=None, quick=True, output=str(out), keep_models=str(kept), jobs=None, threads=None)
    assert lvt.main(args) == 0
    result = json.loads(out.read_text())
    spec = result["spec"]
    assert result["complete"] and result["versions"]["trl"]
    before = result["before"]
    assert before["val"]["n"] == spec["val_n"] and before["test"]["n"] == spec["test_n"]
    assert len(result["sweep"]) == 2 * len(spec["sweep_lrs"]) and len(result["runs"]) == 2 * len(spec["seeds"])
    best = {m: max((r["after"]["val"]["accuracy"], -r["lr"]) for r in result["sweep"] if r["method"] == m)
            for m in lvt.METHODS}
    assert result["chosen_lr"] == {m: -best[m][1] for m in lvt.METHODS}
    for r in result["sweep"] + result["runs"]:
        assert r["steps"] >= 1 and r["completions"] == r["steps"] * spec["prompts"] * spec["group"]
        assert r["train_cpu_s"] >= r["budget_s"]  # the run stops once its CPU budget is spent, not before
        for split, acc in r["after"].items():
            assert acc["accuracy"] == acc["correct"] / acc["n"]
            assert r[f"gain_{split}"] == pytest.approx(acc["accuracy"] - before[split]["accuracy"])
            assert r["gain_per_cpu_min"][split] == pytest.approx(r[f"gain_{split}"] * 60 / r["train_cpu_s"])
    for m in lvt.METHODS:
        runs = [r for r in result["runs"] if r["method"] == m]
        assert result["summary"][m]["gain_test"]["mean"] == pytest.approx(statistics.fmean(r["gain_test"] for r in runs))
        assert {r["lr"] for r in runs} == {result["chosen_lr"][m]}

    # The shared evaluator, in this process, on the same files: the untrained model and each method's saved model
    # give the numbers the workers wrote; and each saved model is a trained one (its weights moved).
    threads = torch.get_num_threads()
    torch.set_num_threads(spec["threads"])
    try:
        data = lvt.write_splits(spec, tmp_path)
        for split in ("val", "test"):
            assert lvt.score(lvt.model_dir(spec), data, split, spec["max_new_tokens"]) == before[split]
        for r in result["runs"]:
            for split in ("val", "test"):
                assert lvt.score(r["model_dir"], data, split, spec["max_new_tokens"]) == r["after"][split]
    finally:
        torch.set_num_threads(threads)
    from safetensors.torch import load_file

    untrained = load_file(lvt.model_dir(spec) / "model.safetensors")
    for r in result["runs"]:
        trained = load_file(f"{r['model_dir']}/model.safetensors")
        assert any(not torch.equal(trained[k], untrained[k]) for k in untrained if k in trained), r["method"]
    assert "gain/CPU-min" in capsys.readouterr().out
