"""checkpoints/best/ (grpo.train.checkpoint.best): the model of the best held-out evaluation is kept, survives the rotation of
`step-N` checkpoints, loads with from_pretrained, and summary.json names its step and accuracy beside the final ones;
the best so far comes back on resume. The evaluation is scripted here (a known accuracy per step), and the weights
saved are compared with the policy's own weights at that step."""

from __future__ import annotations

import json

import torch

import grpo.train.loop as loop
from grpo.tracking.metrics import read_jsonl
from grpo.train.checkpoint.best import read_best


def scripted(monkeypatch, accuracies: dict[int, float], weights: dict[int, dict]):
    """_evaluate returns accuracies[step] and records the policy's weights at that moment."""

    def fake(trainer, progress=None):
        weights[trainer.step_count] = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
        return accuracies[trainer.step_count]

    monkeypatch.setattr(loop, "_evaluate", fake)


def test_best_is_kept_through_rotation_and_named_in_the_summary(make_trainer, monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    weights: dict[int, dict] = {}
    scripted(monkeypatch, {0: 0.2, 1: 0.5, 2: 0.7, 3: 0.4, 4: 0.6}, weights)
    trainer = make_trainer("train.steps=4", "train.eval_every=1", "train.save_every=1", "train.keep_checkpoints=1")
    summary = trainer.train()
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "step-000004"]  # step 2 rotated away
    assert read_best(run) == {"step": 2, "eval/accuracy": 0.7}
    assert (summary["eval/best_step"], summary["eval/accuracy_best"]) == (2, 0.7)
    assert (summary["eval/accuracy_before"], summary["eval/accuracy_after"]) == (0.2, 0.6)
    assert json.loads((run / "summary.json").read_text())["eval/best_step"] == 2
    best = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "best").state_dict()
    assert all(torch.equal(best[k], weights[2][k]) for k in weights[2])
    assert any(not torch.equal(best[k], weights[4][k]) for k in weights[4])  # not the final model
    assert [r.get("eval/accuracy") for r in read_jsonl(run / "metrics.jsonl")] == [0.2, 0.5, 0.7, 0.4, 0.6]


def test_no_step_beats_the_start(make_trainer, monkeypatch, tmp_path):
    scripted(monkeypatch, {0: 0.5, 1: 0.5, 2: 0.3}, {})
    summary = make_trainer("train.steps=2", "train.eval_every=1").train()
    assert (summary["eval/best_step"], summary["eval/accuracy_best"]) == (0, 0.5)  # a tie is not better
    assert read_best(tmp_path / "run") is None and not (tmp_path / "run" / "checkpoints" / "best").exists()


def test_the_best_so_far_comes_back_on_resume(make_trainer, monkeypatch, tmp_path):
    scripted(monkeypatch, {0: 0.1, 1: 0.6, 2: 0.3, 3: 0.5, 4: 0.2}, {})
    make_trainer("train.steps=2", "train.eval_every=1").train()
    summary = make_trainer("train.steps=4", "train.eval_every=1").train(resume=True)
    assert (summary["eval/best_step"], summary["eval/accuracy_best"]) == (1, 0.6)
    assert read_best(tmp_path / "run") == {"step": 1, "eval/accuracy": 0.6}
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2, 3, 4]
