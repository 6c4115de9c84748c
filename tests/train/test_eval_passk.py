"""pass@k (grpo.train.evaluate.pass_at_k: the Codex paper's unbiased estimator) against hand vectors and the
binomial formula, and `grpo eval` with --k, --output and a data set file on a local model directory."""

from __future__ import annotations

import json
from math import comb

import pytest

from grpo.train.evaluate import pass_at_k, pass_at_k_report


@pytest.mark.parametrize("n, c, k, want", [
    (5, 0, 1, 0.0), (5, 5, 3, 1.0), (10, 3, 1, 0.3),
    (4, 1, 2, 0.5),                 # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (10, 2, 5, 1 - 56 / 252),       # 1 - C(8,5)/C(10,5)
    (3, 1, 3, 1.0),                 # n - c < k: every draw of 3 includes the correct one
    (200, 1, 1, 0.005), (200, 0, 100, 0.0),
])
def test_pass_at_k_hand_vectors(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_equals_the_binomial_formula_everywhere():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                want = 1.0 if n - c < k else 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12), (n, c, k)


def test_pass_at_k_rejects_impossible_arguments():
    for n, c, k in [(3, 1, 4), (3, 4, 1), (3, 1, 0), (0, 0, 1)]:
        with pytest.raises(ValueError, match="pass_at_k needs"):
            pass_at_k(n, c, k)


def test_report_averages_over_problems():
    samples = [{"correct": [True, False, False, False]}, {"correct": [False] * 4}, {"correct": [True] * 4}]
    got = pass_at_k_report(samples, [1, 2, 4])
    assert got == pytest.approx({"pass@1": (0.25 + 0 + 1) / 3, "pass@2": (0.5 + 0 + 1) / 3, "pass@4": (1 + 0 + 1) / 3})


def test_grpo_eval_pass_at_k_on_a_data_file_with_a_reward_file(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A local model directory (no run around it), a JSONL file and a reward from a file: the per-problem file holds
    every sampled completion and its verdict (recomputed here with the reward's own rule), and the JSON's pass@k are
    the estimator over those counts."""
    from grpo.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "judge.py").write_text("def even(prompts, completions, **kw):\n"
                                       "    return [float(len(c) % 2 == 0) for c in completions]\n")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"What is {i} + 1?\n", "answer": str(i + 1)})
                                              + "\n" for i in range(60)))
    out = tmp_path / "problems.jsonl"
    assert main(["eval", str(tiny_model_dir), "reward.functions=[judge.py:even]", "data.test_fraction=0.2",
                 "rollout.max_new_tokens=5", "--data", "d.jsonl", "--n", "5", "--k", "3", "--samples", "4",
                 "--output", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert res["n"] == len(rows) == 5 and res["k"] == 3 and res["samples"] == 4 and res["data"] == "d.jsonl"
    for r in rows:
        assert len(r["samples"]) == len(r["samples_correct"]) == 4
        assert r["samples_correct"] == [len(c) % 2 == 0 for c in r["samples"]]
        assert r["greedy_correct"] == (len(r["greedy"]) % 2 == 0) and r["c"] == sum(r["samples_correct"])
    for k in (1, 2, 3):
        want = sum(1.0 if 4 - r["c"] < k else 1 - comb(4 - r["c"], k) / comb(4, k) for r in rows) / 5
        assert res[f"pass@{k}"] == pytest.approx(want)
    assert res["accuracy"] == pytest.approx(sum(r["greedy_correct"] for r in rows) / 5)
    # the same seed gives the same samples; batching does not change them
    assert main(["eval", str(tiny_model_dir), "reward.functions=[judge.py:even]", "data.test_fraction=0.2",
                 "rollout.max_new_tokens=5", "eval.batch_size=3", "--data", "d.jsonl", "--n", "5", "--k", "3",
                 "--samples", "4", "--output", str(tmp_path / "again.jsonl")]) == 0
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()
    assert "pass@3" in capsys.readouterr().out


def test_grpo_eval_builtin_task_and_bad_k(tiny_model_dir, capsys):
    from grpo.cli import main

    assert main(["eval", str(tiny_model_dir), "rollout.max_new_tokens=4", "--task", "arithmetic", "--n", "4",
                 "--k", "2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["task"] == "arithmetic" and set(res) >= {"accuracy", "pass@1", "pass@2"}
    assert 0.0 <= res["pass@1"] <= res["pass@2"] <= 1.0
    assert main(["eval", str(tiny_model_dir), "--n", "2", "--k", "3", "--samples", "2"]) == 2
    assert "--k must be between 1 and the number of samples per problem (2), got 3" in capsys.readouterr().err
