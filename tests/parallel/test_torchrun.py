"""`torchrun --nproc_per_node=2` on the CPU (gloo) trains the same parameters as one process with the same global
batch and seed (fp32 tolerance; rollout.seed_per_prompt makes the samples independent of the split), only rank 0
writes the run directory, and an FSDP2 run checkpoints and resumes on the same world size to the same result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from helpers.tiny_hf import REWARDS, save_tiny_model, write_chat_jsonl

from grpo.config import load_config
from grpo.train.trainer import Trainer

LAUNCH = Path(__file__).with_name("launch_train.py")
pytestmark = pytest.mark.slow


def overrides(model: Path, data: Path, run: Path, *extra: str) -> list[str]:
    return [f"model.name={model}", f"data.path={data}", f"train.output_dir={run}", "train.steps=2",
            "train.eval_every=0", "eval.n=3", "rollout.prompts_per_step=4", "rollout.group_size=2",
            "rollout.max_new_tokens=8", "rollout.seed_per_prompt=true", "data.test_fraction=0.2",
            "log.plots=false", "log.progress=false", "optim.lr=0.01", "optim.warmup_steps=0", *extra]


def torchrun(*runs: list[str], cwd: Path, preset: str | None = None) -> None:
    """Launch 2 processes of launch_train.py; several runs go one after the other in the same launch."""
    args = []
    for i, run in enumerate(runs):
        args += (["--then"] if i else []) + ([preset] if preset else []) + ["reward.functions=[varied]", *run]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(LAUNCH), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPO_CACHE": str(cwd / "cache")}
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """(model dir, data, the 1-process run directory) after 2 steps of a global batch of 4 prompts x 2."""
    root = tmp_path_factory.mktemp("dp")
    model, data = save_tiny_model(root / "model", "qwen2"), write_chat_jsonl(root / "d.jsonl", 20)
    torch.manual_seed(0)
    trainer = Trainer(load_config(None, overrides(model, data, root / "one")), reward_functions=REWARDS)
    try:
        trainer.train()
    finally:
        trainer.close()
    return model, data, root / "one"


def assert_same_parameters(a: Path, b: Path, start: Path) -> None:
    x, y, init = (load_file(str(p / "model.safetensors")) for p in (a, b, start))
    assert x.keys() == y.keys()
    moved = max(float((x[k] - init[k]).abs().max()) for k in x)
    diff = max(float((x[k] - y[k]).abs().max()) for k in x)
    assert moved > 1e-3 and diff < 1e-5, (moved, diff)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_ddp_on_two_processes_equals_one_process(one_process, tmp_path):
    model, data, one = one_process
    two = tmp_path / "two"
    torchrun(overrides(model, data, two, "parallel.strategy=ddp"), cwd=tmp_path)
    assert_same_parameters(one / "final", two / "final", model)
    m1, m2 = metrics(one), metrics(two)
    assert [r["step"] for r in m2] == [0, 1, 2]  # rank 0 alone writes: one line per step (0: before training)
    assert m2[0]["eval/accuracy"] == m1[0]["eval/accuracy"]
    m1, m2 = m1[1:], m2[1:]
    for a, b in zip(m1, m2):
        for key in ("reward/mean", "reward/std", "adv/abs_mean", "loss/policy", "rollout/len_mean", "rollout/groups"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), key
        assert b["policy/grad_norm"] == pytest.approx(a["policy/grad_norm"], rel=1e-4)
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    assert json.loads((two / "summary.json").read_text())["steps"] == 2


def test_fsdp_checkpoint_resumes_on_the_same_world_size(one_process, tmp_path):
    model, data, one = one_process
    run = tmp_path / "fsdp"
    # a 1-step run (its final checkpoint is step 1), then --resume to step 2; both in one launch to save time
    torchrun(overrides(model, data, run, "parallel.strategy=fsdp", "train.steps=1", "train.keep_checkpoints=5"),
             [*overrides(model, data, run, "parallel.strategy=fsdp"), "--resume"], cwd=tmp_path)
    assert (run / "checkpoints" / "step-000001" / "COMMITTED").exists()
    assert [r["step"] for r in metrics(run)] == [0, 1, 2]
    assert_same_parameters(one / "final", run / "final", model)


def test_ppo_ddp_on_two_processes_equals_one_process(one_process, tmp_path):
    """PPO's critic is data-parallel too: gradients summed over the ranks, the job's token count, and advantages
    whitened over the whole batch; the policy (which PPO trains on the critic's advantages) ends the same."""
    model, data, _ = one_process
    one, two = tmp_path / "ppo-one", tmp_path / "ppo-two"
    torch.manual_seed(0)
    trainer = Trainer(load_config("ppo", overrides(model, data, one)), reward_functions=REWARDS)
    try:
        trainer.train()
    finally:
        trainer.close()
    torchrun(overrides(model, data, two, "parallel.strategy=ddp"), cwd=tmp_path, preset="ppo")
    assert_same_parameters(one / "final", two / "final", model)
    for a, b in zip(metrics(one)[1:], metrics(two)[1:]):  # [0]: step 0, the accuracy before training
        for key in ("loss/value", "critic/grad_norm", "loss/policy"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_ppo_with_fsdp_is_refused_naming_the_setting():
    from grpo.parallel.dist import Dist, check_parallel_config

    cfg = load_config("ppo", ["rollout.prompts_per_step=4"])
    with pytest.raises(ValueError, match="parallel.strategy=ddp"):
        check_parallel_config(cfg, Dist(rank=0, world_size=2, strategy="fsdp"))
    check_parallel_config(cfg, Dist(rank=0, world_size=2, strategy="ddp"))  # allowed
