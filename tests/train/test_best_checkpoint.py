"""checkpoints/best/ (grpo.train.checkpoint.best): the model of the best validation evaluation is kept, survives the
rotation of `step-N` checkpoints, loads with from_pretrained, and summary.json names its step, its validation accuracy
and its test accuracy beside the test accuracy before and after; the best so far comes back on resume. The
evaluation is scripted here (a known accuracy per step and split, with test figures that would choose differently),
and the weights saved are compared with the policy's own weights at that step."""

from __future__ import annotations

import json

import pytest
import torch

import grpo.train.loop as loop
from grpo.tracking.metrics import read_jsonl
from grpo.train.checkpoint.best import read_best


def scripted(monkeypatch, val: dict[int, float], weights: dict[int, dict], test: dict[int, float] | None = None):
    """_evaluate returns val[step] on the validation problems and test[step] (default: 1 - val[step], which would
    pick another best) on the test problems, records the policy's weights at each validation, and returns the
    list of (step, split) evaluated."""
    test = test if test is not None else {k: round(1 - v, 3) for k, v in val.items()}
    calls = []

    def fake(trainer, progress=None, split="test"):
        calls.append((trainer.step_count, split))
        if split == "val":
            weights[trainer.step_count] = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
        return (val if split == "val" else test)[trainer.step_count]

    monkeypatch.setattr(loop, "_evaluate", fake)
    return calls


def test_best_is_kept_through_rotation_and_named_in_the_summary(make_trainer, monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    weights: dict[int, dict] = {}
    test = {0: 0.3, 1: 0.9, 2: 0.1, 3: 0.95, 4: 0.5}  # on test, step 3 looks best: it must not be chosen
    calls = scripted(monkeypatch, {0: 0.2, 1: 0.5, 2: 0.7, 3: 0.4, 4: 0.6}, weights, test)
    trainer = make_trainer("train.steps=4", "train.eval_every=1", "train.save_every=1", "train.keep_checkpoints=1")
    summary = trainer.train()
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best", "step-000004"]  # step 2 rotated away
    assert read_best(run) == {"step": 2, "eval/val_accuracy": 0.7, "eval/accuracy": 0.1}
    assert (summary["eval/best_step"], summary["eval/val_accuracy_best"], summary["eval/accuracy_best"]) == (2, 0.7, 0.1)
    assert (summary["eval/accuracy_before"], summary["eval/accuracy_after"]) == (0.3, 0.5)  # test, start and end
    assert summary["eval/splits"]["eval/accuracy_after"] == "test"
    assert json.loads((run / "summary.json").read_text())["eval/best_step"] == 2
    best = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "best").state_dict()
    assert all(torch.equal(best[k], weights[2][k]) for k in weights[2])
    assert any(not torch.equal(best[k], weights[4][k]) for k in weights[4])  # not the final model
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r.get("eval/val_accuracy") for r in rows] == [0.2, 0.5, 0.7, 0.4, 0.6]
    assert [r.get("eval/accuracy") for r in rows] == [0.3, None, None, None, 0.5]  # test: before and after only
    # test is measured at the start, the end, and for each new best (steps 1 and 2), never for the other steps
    assert sorted({s for s, split in calls if split == "test"}) == [0, 1, 2, 4]


def test_without_validation_problems_there_is_no_best(make_trainer, monkeypatch, tmp_path):
    calls = scripted(monkeypatch, {0: 0.2, 1: 0.5, 2: 0.7}, {})
    summary = make_trainer("train.steps=2", "train.eval_every=1", "eval.val_n=0").train()
    assert "eval/best_step" not in summary and summary["eval/val_n"] == 0
    assert calls == [(0, "test"), (2, "test")]
    assert not (tmp_path / "run" / "checkpoints" / "best").exists()


def test_no_step_beats_the_start(make_trainer, monkeypatch, tmp_path):
    scripted(monkeypatch, {0: 0.5, 1: 0.5, 2: 0.3}, {})
    summary = make_trainer("train.steps=2", "train.eval_every=1").train()
    assert (summary["eval/best_step"], summary["eval/val_accuracy_best"]) == (0, 0.5)  # a tie is not better
    assert summary["eval/accuracy_best"] == summary["eval/accuracy_before"] == 0.5  # the starting model, on test
    assert read_best(tmp_path / "run") is None and not (tmp_path / "run" / "checkpoints" / "best").exists()


def test_the_best_so_far_comes_back_on_resume(make_trainer, monkeypatch, tmp_path):
    scripted(monkeypatch, {0: 0.1, 1: 0.6, 2: 0.3, 3: 0.5, 4: 0.2}, {})
    make_trainer("train.steps=2", "train.eval_every=1").train()
    summary = make_trainer("train.steps=4", "train.eval_every=1").train(resume=True)
    assert (summary["eval/best_step"], summary["eval/val_accuracy_best"], summary["eval/accuracy_best"]) == (1, 0.6, 0.4)
    assert read_best(tmp_path / "run") == {"step": 1, "eval/val_accuracy": 0.6, "eval/accuracy": 0.4}
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_held_out_pool_is_cut_into_disjoint_test_and_validation():
    from grpo.train.evaluate import split_held_out

    pool = list(range(10))
    assert split_held_out(pool, 4, 3) == ([0, 1, 2, 3], [4, 5, 6])  # test = the first n, as `grpo eval` takes them
    assert split_held_out(pool, 8, 4) == ([0, 1, 2, 3, 4, 5, 6, 7], [8, 9])  # the pool ends: fewer for validation
    assert split_held_out(pool, 10, 4) == ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9])  # no more than n: val from its end
    assert split_held_out(pool, 10, 0) == (pool, [])
    assert split_held_out([0, 1, 2], 5, 4) == ([0, 1], [2])


def test_the_trainer_never_evaluates_validation_on_test_problems(make_trainer):
    trainer = make_trainer("eval.n=5", "eval.val_n=7")
    test, val = [p.uid for p in trainer.eval_prompts], [p.uid for p in trainer.val_prompts]
    assert len(test) == 5 and len(val) == 7 and not set(test) & set(val)
    assert test == [p.uid for p in trainer.task.split("test", 5)]  # the problems `grpo eval --n 5` scores
    assert not {p.text for p in trainer.val_prompts + trainer.eval_prompts} & {p.text for p in trainer.train_prompts}


def test_test_every_draws_a_test_curve_that_chooses_nothing(make_trainer, monkeypatch, tmp_path):
    test = {0: 0.3, 1: 0.9, 2: 0.95, 3: 0.2, 4: 0.4}  # test peaks at step 2, validation at step 3
    calls = scripted(monkeypatch, {0: 0.2, 1: 0.3, 2: 0.4, 3: 0.7, 4: 0.5}, {}, test)
    summary = make_trainer("train.steps=4", "train.eval_every=1", "eval.test_every=2").train()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r.get("eval/accuracy") for r in rows] == [0.3, None, 0.95, None, 0.4]
    assert (summary["eval/best_step"], summary["eval/accuracy_best"], summary["eval/accuracy_after"]) == (3, 0.2, 0.4)
    assert sorted({s for s, split in calls if split == "test"}) == [0, 1, 2, 3, 4]  # 1, 3: new bests; 2: the curve


def test_a_small_pool_that_refuses_larger_requests_gives_what_it_has():
    """A task that raises past its pool (the built-in tasks, reasoning-gym) is asked for the most it can give:
    the test problems stay its first eval.n, validation takes the rest."""
    from grpo.train.evaluate import held_out_pool, split_held_out, test_problems

    class Pool:
        def split(self, name, n):
            if n > 7:
                raise ValueError(f"only 7 held-out problems, fewer than {n}")
            return list(range(n))

    assert held_out_pool(Pool(), 2, 200) == list(range(7))
    assert split_held_out(held_out_pool(Pool(), 2, 200), 2, 200) == ([0, 1], [2, 3, 4, 5, 6])
    assert test_problems(Pool(), 2, 200) == [0, 1]
    with pytest.raises(ValueError, match="fewer than 9"):
        held_out_pool(Pool(), 9, 0)
