"""`grpo train rollout.engine=vllm` end to end, in fresh processes (one vLLM engine per process): 5 steps on the
built-in model, then a resume from the step-3 checkpoint that reproduces steps 4 and 5 of the straight run. Needs
vLLM (scripts/test_vllm.sh runs these in its virtual environment); skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (pip install 'grpo[vllm]'; CI: scripts/test_vllm.sh)")

import grpo  # noqa: E402
from helpers.precision import FLOAT32  # noqa: E402

pytestmark = pytest.mark.slow
SRC = str(Path(grpo.__file__).resolve().parents[1])
ARGS = ["rollout.engine=vllm", "train.steps=5", "train.save_every=3", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "eval.n=4", "train.eval_every=0", "log.progress=false", "log.plots=false",
        "train.preflight=off", *FLOAT32]  # float32: the engine's log-probs are the trainer's (below 1e-4), a sync claim


def grpo_train(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-m", "grpo.cli", "train", *ARGS, f"train.output_dir={run_dir}", *extra]
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_five_steps_then_a_resume_that_repeats_them(tmp_path):
    straight = tmp_path / "straight"
    proc = grpo_train(straight)
    assert proc.returncode == 0, proc.stdout[-3000:]
    steps = [r for r in rows(straight) if r.get("step", 0) >= 1 and "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    assert all(r["rollout/logp_diff"] < 1e-4 for r in steps)  # the engine samples from the trainer's weights
    assert (straight / "final" / "config.json").is_file()
    # the run stopped after the step-3 checkpoint: everything later removed, then --resume
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000005")
    shutil.rmtree(resumed / "final")
    (resumed / "summary.json").unlink()
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(straight)
                                                   if r.get("step", 0) <= 3))
    proc = grpo_train(resumed, "--resume")
    assert proc.returncode == 0, proc.stdout[-3000:]
    again = {r["step"]: r for r in rows(resumed) if "reward/mean" in r}
    for r in steps[3:]:  # the same rollouts (seeds from the restored RNG) and the same update
        assert again[r["step"]]["reward/mean"] == r["reward/mean"]
        assert again[r["step"]]["loss/policy"] == pytest.approx(r["loss/policy"], abs=1e-6)


def test_the_tool_task_trains_with_multi_turn_episodes_on_the_engine(tmp_path):
    """`grpo train tools rollout.engine=vllm`: the calculator episodes' later turns come from the engine too
    (generate_from_ids), and the trainer's log-probs of the episodes' policy tokens are the engine's."""
    run = tmp_path / "tools"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-m", "grpo.cli", "train", "tools", "rollout.engine=vllm", "train.steps=2",
            "rollout.prompts_per_step=4", "eval.n=4", "train.eval_every=0", "log.progress=false", "log.plots=false",
            "train.preflight=off", *FLOAT32, f"train.output_dir={run}"]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    steps = [r for r in rows(run) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["env/turns_mean"] > 1 and r["env/tool_calls_mean"] > 0 for r in steps)
    assert all(r["rollout/logp_diff"] < 1e-4 for r in steps)
