"""End to end: `grpo train` for 2 steps on the built-in architecture with random weights (no warm-up),
then the run directory's contract of DESIGN.md, and `grpo eval` on the saved model."""

import json

import pytest
from helpers.precision import FLOAT32

from grpo.cli import main

METRIC_KEYS = ["step", "reward/mean", "reward/std", "reward/correct", "reward/format", "adv/zero_std_frac",
               "rollout/len_mean", "rollout/truncated_frac", "loss/policy", "loss/kl", "policy/clip_frac",
               "policy/entropy", "policy/kl", "perf/step_s", "perf/gen_tokens_per_s", "perf/peak_rss_mb"]

TINY = ["warmup.steps=0", "train.preflight=warn", "train.steps=2", "train.eval_every=2", "eval.n=20", "rollout.prompts_per_step=2",
        "rollout.group_size=3", "rollout.max_new_tokens=8", "data.train_size=100", "log.print_group_every=1",
        *FLOAT32]  # the same computation on every CPU (helpers/precision.py)


@pytest.fixture
def run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--output-dir", str(out), "--quiet"]) == 0
    out.joinpath("console.txt").write_text(capsys.readouterr().out)
    return out


def test_run_directory_contract(run):
    for name in ["config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json", "final", "plots/training.png",
                 "plots/reward.png", "plots/accuracy.png", "checkpoints/step-000002/COMMITTED"]:
        assert (run / name).exists(), name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the accuracy before training, test and validation
    summary = json.loads((run / "summary.json").read_text())
    assert rows[0] == {"step": 0, "eval/accuracy": summary["eval/accuracy_before"],
                       "eval/val_accuracy": summary["eval/val_accuracy_best"] if summary["eval/best_step"] == 0
                       else rows[0]["eval/val_accuracy"]}
    for key in METRIC_KEYS:
        assert key in rows[1], key
    assert "eval/accuracy" in rows[2] and "eval/val_accuracy" in rows[2]  # the last step: test and validation
    assert rows[2]["eval/accuracy"] == summary["eval/accuracy_after"]
    summary = json.loads((run / "summary.json").read_text())
    for key in ["eval/accuracy_before", "eval/accuracy_after", "steps", "wall_s"]:
        assert key in summary
    assert summary["steps"] == 2
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert len(sample["completions"]) == len(sample["rewards"]) == len(sample["advantages"]) == 3
    assert "mean(r)" in (run / "console.txt").read_text()  # the seed-style group print-out


def test_final_model_loads_and_eval_reproduces(run, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(run / "final")
    AutoTokenizer.from_pretrained(run / "final")
    capsys.readouterr()
    assert main(["eval", str(run / "final"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    summary = json.loads((run / "summary.json").read_text())
    assert result["n"] == 20 and result["accuracy"] == summary["eval/accuracy_after"]


def test_config_error_exit_code(capsys):
    assert main(["train", "algo.std=bogus"]) == 2
    assert "algo.std" in capsys.readouterr().err


def length_reward(prompts, completions, **kwargs):
    """A reward with variance even for a random model (whose completions all run to max_new_tokens), so every
    preset gets a non-zero gradient: a deterministic function of the sampled characters."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


length_reward.in_process = True


@pytest.mark.parametrize("preset", ["grpo", "deepseekmath", "dapo", "dr_grpo", "gspo", "rloo", "cispo"])
def test_presets_train(preset, tmp_path):
    from grpo.config import load_config
    from grpo.train.trainer import Trainer

    args = [a for a in TINY if not a.startswith(("log.print", "train.eval"))] + ["log.plots=false", "log.progress=false",
                                                                                 "optim.lr=1e-2", "optim.warmup_steps=0"]
    trainer = Trainer(load_config(preset, args), reward_functions=[length_reward], run_dir=tmp_path / preset)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    trainer.train()
    trainer.close()
    rows = [json.loads(line) for line in (tmp_path / preset / "metrics.jsonl").read_text().splitlines()][1:]
    assert len(rows) == 2  # after step 0's row (the accuracy before training)
    assert any(not (a == b).all() for a, b in zip(before, trainer.policy.parameters())), "no parameter changed"
    if preset == "deepseekmath":
        assert trainer.ref is not None
        assert rows[0]["loss/kl"] == 0.0  # first step: policy == reference
        assert rows[1]["loss/kl"] > 0.0  # after one update the policy has moved away from pi_ref
    else:
        assert trainer.ref is None  # beta = 0 loads no reference model at all


def test_report_is_self_contained(run, capsys):
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert "data:image/png;base64," in page and "eval/accuracy_after" in page and "mean(r)" not in page
    assert "<h2>Sample groups</h2>" in page


def test_summary_wall_time_counts_the_model_and_shows_its_parts(run):
    summary = json.loads((run / "summary.json").read_text())
    parts = {k: summary[f"time/{k}_s"] for k in ("model", "preflight", "eval", "rl_steps", "save", "other")}
    assert all(v >= 0 for v in parts.values())
    measured = parts["model"] + parts["preflight"] + parts["eval"] + parts["rl_steps"] + parts["save"]
    assert 0 < measured <= summary["wall_s"] + 1e-3  # the parts lie inside the wall time, the model load included
    assert abs(sum(parts.values()) - summary["wall_s"]) < 0.01
    assert summary["model_source"] == "warm-up" and parts["model"] > 0  # warmup.steps=0: built (untrained) now
    assert parts["preflight"] > 0  # train.preflight=warn: its own part, not "other"
    steps = [r["perf/step_s"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["step"] > 0]
    assert parts["rl_steps"] >= sum(steps) * 0.99  # the RL part holds every step's own time
    console = (run / "console.txt").read_text()
    assert "evaluations" in console and "RL steps" in console and "model" in console
