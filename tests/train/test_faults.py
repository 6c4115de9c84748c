"""Faults inside a run, in this process: NaN logits and non-finite gradients (skipped, counted, named, abort after
K in a row), a full disk during a save, and a stop signal raised from inside a step.

RELIABILITY.md section 10 test 8, section 9 rows 17, 18, 23 and 24 (the subprocess SIGTERM and kill -9 tests are
in test_resume_e2e.py).
"""

from __future__ import annotations

import errno
import os
import signal

import pytest
import torch
from train_helpers import varied_reward

from grpo.tracking.metrics import read_jsonl
from grpo.train.checkpoint import save as ckpt
from grpo.train import update
from grpo.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from grpo.errors import Preempted
from grpo.train.loop import NonFiniteError


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def optimizer_state(opt) -> dict:
    return {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()}


def nan_logits_at(monkeypatch, steps: set[int], trainer) -> None:
    """Make the policy-update logits NaN during the given steps (1-based) of `trainer`."""
    real = update.completion_logits

    def logits(*args, **kwargs):
        out = real(*args, **kwargs)
        return out * float("nan") if trainer.step_count + 1 in steps else out

    monkeypatch.setattr(update, "completion_logits", logits)


def test_nan_logits_skip_the_step_and_leave_everything_unchanged(make_trainer, monkeypatch):
    trainer = make_trainer("train.steps=3")
    nan_logits_at(monkeypatch, {2}, trainer)
    assert trainer.step().metrics["train/skipped_updates"] == 0
    before, moments, sched = params(trainer.policy), optimizer_state(trainer.optimizer), trainer.scheduler.last_epoch
    metrics = trainer.step().metrics
    assert metrics["train/skipped_updates"] == 1
    assert same(before, params(trainer.policy)), "a NaN step changed the parameters"
    after = optimizer_state(trainer.optimizer)
    assert all(torch.equal(moments[i][k], after[i][k]) for i in moments for k in moments[i])
    assert trainer.scheduler.last_epoch == sched
    assert all(p.grad is None for p in trainer.policy.parameters())
    assert trainer.step().metrics["train/skipped_updates"] == 0  # training continues
    assert not same(before, params(trainer.policy))


def test_non_finite_gradient_norm_skips_the_step(make_trainer):
    """A finite loss whose gradient is inf (row 18): the optimizer step is skipped and counted."""
    trainer = make_trainer("train.steps=2")
    before = params(trainer.policy)
    embedding = trainer.policy.get_input_embeddings().weight  # its update-time gradient is sparse (lean_head_gradients)
    weight = next(p for p in trainer.policy.parameters() if p is not embedding)
    hook = weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    metrics = trainer.step().metrics
    hook.remove()
    assert metrics["train/skipped_updates"] == 1
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("loss/"))
    assert same(before, params(trainer.policy))
    assert trainer.step().metrics["train/skipped_updates"] == 0
    assert not same(before, params(trainer.policy))


def test_run_counts_and_names_the_skipped_batch_and_continues(make_trainer, monkeypatch, tmp_path, capsys):
    trainer = make_trainer("train.steps=3")
    nan_logits_at(monkeypatch, {2}, trainer)
    summary = trainer.train()
    out = capsys.readouterr().out
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")[1:]  # [0]: step 0, the accuracy before training
    assert [r["train/skipped_updates"] for r in rows] == [0, 1, 0]
    assert [r["train/skipped_steps"] for r in rows] == [0, 1, 1]
    assert summary["steps"] == 3 and summary["skipped_steps"] == 1
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert "step 2: non-finite loss or gradient norm, the update was skipped (1 in a row, 1 in this run" in out
    step2 = next(r for r in samples if r["step"] == 2)["prompt"]
    uids = [p.uid for p in trainer.train_prompts if p.text == step2]
    assert uids and any(repr(u) in out for u in uids), "the message does not name the batch's prompts"


def test_k_consecutive_non_finite_steps_abort_with_a_message(make_trainer, monkeypatch, tmp_path):
    trainer = make_trainer("train.steps=5", "train.max_nan_steps=2", "train.save_every=1")
    nan_logits_at(monkeypatch, {2, 3, 4, 5}, trainer)
    with pytest.raises(NonFiniteError, match=r"2 consecutive steps \(the last is step 3\).*max_nan_steps=2"):
        trainer.train()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # the aborting step is logged too
    assert latest_checkpoint(tmp_path / "run").name == "step-000002"  # skipped steps leave valid weights


def disk_full_at(monkeypatch, save_number: int) -> None:
    """The `save_number`-th checkpoint save fails with ENOSPC after writing the model and optimizer."""
    seen = {"n": 0}

    def hook(stage):
        if stage == "after_optimizers":
            seen["n"] += 1
            if seen["n"] == save_number:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt, "_fault_hook", hook)


def test_disk_full_fails_loudly_and_keeps_the_previous_checkpoint(make_trainer, monkeypatch, tmp_path, capsys):
    run_dir = tmp_path / "run"
    disk_full_at(monkeypatch, 2)
    with pytest.raises(CheckpointError) as err:
        make_trainer("train.steps=3", "train.save_every=1").train()
    msg = str(err.value)
    assert "periodic checkpoint save at step 2 failed" in msg and "No space left on device" in msg
    assert f"previous checkpoint is intact: {run_dir / 'checkpoints' / 'step-000001'}" in msg
    assert "checkpoint save" not in capsys.readouterr().out  # the error is the message, printed once by its catcher
    assert load_checkpoint(latest_checkpoint(run_dir)).step == 1  # verified: manifest, sizes, hashes
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001"]  # no partial left
    monkeypatch.setattr(ckpt, "_fault_hook", lambda stage: None)  # space freed: the resume works
    assert make_trainer("train.steps=3").train(resume=True)["steps"] == 3


def test_disk_full_can_be_survived_when_configured(make_trainer, monkeypatch, tmp_path, capsys):
    disk_full_at(monkeypatch, 2)
    summary = make_trainer("train.steps=3", "train.save_every=1", "train.on_save_error=continue").train()
    assert summary["steps"] == 3
    out = capsys.readouterr().out
    assert "warning: the periodic checkpoint save at step 2 failed" in out and "training continues" in out
    assert latest_checkpoint(tmp_path / "run").name == "step-000003"


def test_final_save_failure_is_never_swallowed(make_trainer, monkeypatch):
    disk_full_at(monkeypatch, 1)
    with pytest.raises(CheckpointError, match="final checkpoint save at step 1 failed.*none"):
        make_trainer("train.steps=1", "train.on_save_error=continue").train()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stop_signal_during_a_step_saves_and_returns(sig, make_trainer, tmp_path, capsys):
    """The signal arrives while step 2 scores its rewards (from the reward thread): step 2 finishes, is saved and
    committed, the run raises Preempted (summary {"preempted": True, ...}; the CLI then exits 130 / 143), prints how
    to resume, and writes no final/ or summary.json."""
    calls = []

    def signalling(prompts, completions, **columns):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), sig)
        return varied_reward(prompts, completions)

    signalling.in_process = True
    run_dir, handler = tmp_path / "run", signal.getsignal(sig)
    with pytest.raises(Preempted) as stopped:
        make_trainer("train.steps=4", reward_functions=[("test_varied", signalling, 1.0)]).train()
    result = stopped.value.summary
    assert result == {"preempted": True, "steps": 2, "checkpoint": str(run_dir / "checkpoints" / "step-000002")}
    assert stopped.value.exit_code == 128 + sig and stopped.value.signal_name == sig.name
    assert not (run_dir / "final").exists() and not (run_dir / "summary.json").exists()
    assert load_checkpoint(latest_checkpoint(run_dir)).step == 2
    out = capsys.readouterr().out
    assert f"stopped by {sig.name} at step 2" in out and "--resume" in out
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2]
    assert signal.getsignal(sig) == handler  # the guard put the previous handler back
    assert make_trainer("train.steps=4").train(resume=True)["steps"] == 4
