"""Resume at the trainer level (issue 7 acceptance; RELIABILITY.md section 10 tests 1, 2 and 9, section 9 rows
21, 22 and 24).

Every resumed run here is compared with one reference run of E2E_STEPS = 2N steps straight through
(`straight_run`): parameters, Adam moments, learning rate, scheduler position, data position, the next prompts and
the global RNG must be bitwise equal, and metrics.jsonl must hold every step exactly once, with the same numbers.
"""

from __future__ import annotations

import logging
import shutil
import signal
import time

import pytest
import torch
from train_helpers import (
    E2E_STEPS,
    assert_same_state,
    deterministic,
    run_script,
    snapshot,
    start_script,
)

from grpo.config import ConfigError
from grpo.errors import RunDirError
from grpo.tracking.metrics import read_jsonl
from grpo.train.checkpoint import latest_checkpoint, load_checkpoint

N = E2E_STEPS // 2
SAME = ["reward/mean", "reward/std", "loss/policy", "policy/grad_norm", "policy/entropy", "optim/lr",
        "rollout/len_mean", "adv/abs_mean"]


def assert_metrics_match(run_dir, reference: list[dict]) -> None:
    """metrics.jsonl has steps 0..E2E_STEPS once each (0: the accuracy before training), and the same numbers as
    the reference run."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(0, E2E_STEPS + 1))
    assert rows[0] == reference[0] and set(rows[0]) == {"step", "eval/accuracy", "eval/val_accuracy"}
    for got, want in zip(rows[1:], reference[1:]):
        assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}, f"step {got['step']} differs"


def resume_here(make_trainer, run_dir, steps: int = E2E_STEPS):
    """Resume run_dir in this process (deterministic settings) to `steps`; returns (snapshot, summary)."""
    with deterministic():
        trainer = make_trainer(f"train.steps={steps}", run_dir=run_dir)
        summary = trainer.train(resume=True)
        return snapshot(trainer), summary


def cli(overrides: list[str]) -> str:
    """A script body running the real `grpo train` entry point with these overrides."""
    return f"""
from grpo.cli import main
sys.exit(main(["train", *{overrides!r}, "reward.functions=[test_varied]"]))
"""


def test_exact_resume_is_bitwise(straight_run, make_trainer, overrides, tmp_path):
    """2N steps straight == N steps, then a new process resuming for N more: bitwise."""
    run_dir = tmp_path / "run"
    with deterministic():
        make_trainer(f"train.steps={N}").train()
    assert latest_checkpoint(run_dir).name == f"step-{N:06d}"
    out = tmp_path / "resumed.pt"
    res = run_script(f"""
trainer = make_trainer({overrides(f"train.steps={E2E_STEPS}")!r})
trainer.train(resume=True)
torch.save(snapshot(trainer), {str(out)!r})
trainer.close()
""")
    assert res.returncode == 0, res.stdout[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'step-{N:06d}'} (step {N})" in res.stdout
    assert_same_state(torch.load(out, weights_only=False), straight_run["state"])
    assert_metrics_match(run_dir, straight_run["metrics"])


def test_sigterm_mid_step_commits_checkpoint_exits_143_and_resumes(straight_run, make_trainer, overrides, tmp_path):
    """SIGTERM while step 2 is computing its rewards: the step finishes, step 2 is committed, exit code 143, the
    resume command is printed, and resuming gives the straight run's state bitwise."""
    run_dir, mark = tmp_path / "run", tmp_path / "in-step-2"
    proc = start_script(cli(overrides(f"train.steps={E2E_STEPS}")),
                        env={"TEST_SLOW_CALL": "2", "TEST_MARK": str(mark), "TEST_SLOW_S": "1.5"})
    deadline = time.monotonic() + 150
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mark.exists(), "the run never reached step 2"
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-3000:]  # 128 + SIGTERM: a `grpo train && ...` chain stops here
    assert "received SIGTERM" in output and "Traceback" not in output
    assert "stopped by SIGTERM at step 2" in output
    assert f"Resume with: grpo train {run_dir / 'config.yaml'} --output-dir {run_dir} --resume" in output
    assert latest_checkpoint(run_dir).name == "step-000002"
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2]
    state, summary = resume_here(make_trainer, run_dir)
    assert summary["steps"] == E2E_STEPS
    assert_same_state(state, straight_run["state"])
    assert_metrics_match(run_dir, straight_run["metrics"])


KILL_POINTS = [
    pytest.param("after_model", 1, marks=pytest.mark.slow),
    ("after_optimizers", 1),
    pytest.param("before_marker", 1, marks=pytest.mark.slow),
    ("after_marker", 1),  # the marker is written but the directory not yet renamed: still not committed
    pytest.param("after_rename", 2, marks=pytest.mark.slow),  # committed; only the retention had not run
]


@pytest.mark.parametrize(("stage", "resumes_from"), KILL_POINTS)
def test_kill_9_during_checkpoint_write_then_resume(stage, resumes_from, straight_run, make_trainer, overrides,
                                                    tmp_path, caplog):
    """kill -9 while step 2's checkpoint is being written (grpo train, save_every=1, in a subprocess): the resume
    ignores the partial directory with a warning, continues from the previous committed step, and ends bitwise
    where the straight run ends."""
    run_dir = tmp_path / "run"
    res = run_script(f"""
import grpo.train.checkpoint.save as ckpt
seen = {{}}
def crash(stage):
    seen[stage] = seen.get(stage, 0) + 1
    if stage == {stage!r} and seen[stage] == 2:  # the save of step 2
        os.kill(os.getpid(), signal.SIGKILL)
ckpt._fault_hook = crash
""" + cli(overrides(f"train.steps={E2E_STEPS}", "train.save_every=1")))
    assert res.returncode == -signal.SIGKILL, res.stdout[-3000:]
    partial = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert bool(partial) == (resumes_from == 1)
    with caplog.at_level(logging.WARNING, logger="grpo.train.checkpoint"):
        assert latest_checkpoint(run_dir).name == f"step-{resumes_from:06d}"
    if partial:
        assert f"ignoring partial checkpoint directory {run_dir / 'checkpoints' / partial[0]}" in caplog.text
    state, _ = resume_here(make_trainer, run_dir)
    assert_same_state(state, straight_run["state"])
    assert_metrics_match(run_dir, straight_run["metrics"])
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")], "partial dir left"


def test_resume_refuses_incompatible_changes_and_prints_compatible_ones(make_trainer, tmp_path, tiny_model_dir,
                                                                         capsys):
    run_dir = tmp_path / "run"
    make_trainer("train.steps=1").train()
    other_model = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other_model)
    ckpt_before = load_checkpoint(latest_checkpoint(run_dir)).manifest
    for change, field in [("rollout.group_size=4", "rollout.group_size"),
                          ("rollout.prompts_per_step=4", "rollout.prompts_per_step"),
                          (f"model.name={other_model}", "model.name"),
                          ("model.frozen_dtype=bfloat16", "model.frozen_dtype"),  # the plan may pick it: auto
                          ("optim.name=adamw_8bit", "optim.name")]:  # another optimizer state format
        trainer = make_trainer("train.steps=2", change)
        with pytest.raises(ConfigError, match="cannot resume") as err:
            trainer.train(resume=True)
        assert field in str(err.value)
        assert trainer.step_count == 0  # nothing was loaded
    assert load_checkpoint(latest_checkpoint(run_dir)).manifest == ckpt_before
    capsys.readouterr()
    summary = make_trainer("train.steps=2", "optim.lr=0.02").train(resume=True)
    assert summary["steps"] == 2
    printed = capsys.readouterr().out
    assert "resuming with changed settings: " in printed and "optim.lr (0.01 -> 0.02)" in printed
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1, 2]


def test_fresh_run_into_a_run_directory_with_checkpoints_is_refused(make_trainer):
    make_trainer("train.steps=1").train()
    with pytest.raises(RunDirError, match="is not empty.*add --resume to continue that run .newest checkpoint "
                                          "step-000001"):
        make_trainer("train.steps=2").train()


def test_resume_with_only_partial_checkpoints_is_refused_and_changes_nothing(make_trainer, tmp_path, caplog):
    """A partial `.tmp-` directory and an uncommitted `step-N` are ignored with a warning naming them, and with
    nothing intact to resume from, --resume is an error (issue #29): it never starts over in place."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / ".tmp-step-000001-4242").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-000002").mkdir()
    (run_dir / "checkpoints" / "step-000002" / "model.safetensors").write_bytes(b"half")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew')
    before = sorted((p.relative_to(run_dir), p.read_bytes() if p.is_file() else b"") for p in run_dir.rglob("*"))
    with caplog.at_level(logging.WARNING, logger="grpo.train.checkpoint"):
        with pytest.raises(RunDirError, match="no intact committed checkpoint"):
            make_trainer("train.steps=1").train(resume=True)
    assert "ignoring partial checkpoint directory" in caplog.text
    assert "step-000002 is not committed" in caplog.text
    after = sorted((p.relative_to(run_dir), p.read_bytes() if p.is_file() else b"") for p in run_dir.rglob("*"))
    assert after == before  # nothing written: no config.yaml, no step-0 row


def test_a_setting_an_older_checkpoint_lacks_counts_as_its_default():
    """A checkpoint written before optim.name existed has no such key: resuming with the default is accepted, and
    with another value refused, as if the key had been saved with its default."""
    from grpo.config import load_config
    from grpo.train.checkpoint.resume import check_resume_config

    current = load_config(None, []).to_dict()
    older = load_config(None, []).to_dict()
    del older["optim"]["name"]
    printed = []
    check_resume_config(older, current, lambda *a, **k: printed.append(a))
    assert printed == []  # nothing differs once the default fills it
    other = load_config(None, ["optim.name=adamw_8bit"]).to_dict()
    with pytest.raises(ConfigError, match=r"optim.name \('adamw' -> 'adamw_8bit'\)"):
        check_resume_config(older, other, lambda *a, **k: None)
