"""`torchrun --nproc_per_node=2` on the CPU (gloo) trains the same parameters as one process with the same global
batch and seed (fp32 tolerance; rollout.seed_per_prompt makes the samples independent of the split), only rank 0
writes the run directory, and an FSDP2 run checkpoints and resumes on the same world size to the same result."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from helpers.precision import BF16_UNIT, FLOAT32, bf16_compute
from helpers.tiny_hf import REWARDS, save_tiny_model, write_chat_jsonl

from grpo.config import load_config
from grpo.train.trainer import Trainer

LAUNCH = Path(__file__).with_name("launch_train.py")
pytestmark = pytest.mark.slow


def overrides(model: Path, data: Path, run: Path, *extra: str) -> list[str]:
    return [f"model.name={model}", f"data.path={data}", f"train.output_dir={run}", "train.steps=2",
            "train.eval_every=0", "eval.n=3", "rollout.prompts_per_step=4", "rollout.group_size=2",
            "rollout.max_new_tokens=8", "rollout.seed_per_prompt=true", "data.test_fraction=0.2",
            "log.plots=false", "log.progress=false", "optim.lr=0.01", "optim.warmup_steps=0", *FLOAT32, *extra]


def torchrun(*runs: list[str], cwd: Path, preset: str | None = None, code: int = 0) -> str:
    """Launch 2 processes of launch_train.py; several runs go one after the other in the same launch. -> stderr,
    after checking the launch's exit code."""
    args = []
    for i, run in enumerate(runs):
        args += (["--then"] if i else []) + ([preset] if preset else []) + ["reward.functions=[varied]", *run]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(LAUNCH), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPO_CACHE": str(cwd / "cache")}
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert (res.returncode == 0) == (code == 0), res.stdout[-3000:] + res.stderr[-6000:]
    return res.stderr


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


def test_under_bf16_compute_ddp_and_fsdp_on_two_processes_equal_one_process(one_process, tmp_path):
    """The same equality with the training forwards and backwards in bf16 (bfloat16 where the CPU multiplies bf16
    natively, bfloat16_emulated elsewhere), over one step: two processes split the batch into other shapes than one,
    so their bf16 roundings differ, by BF16_UNIT-sized relative amounts (helpers/precision.py). The job's gradient
    norm and loss must agree within 4 BF16_UNIT; AdamW's first step moves each weight by about +-lr (the sign of its
    gradient), so the final weights agree where the gradient's sign does: all but the few whose gradient is within
    bf16's rounding of 0. A rank whose gradient was not averaged, or another rank's batch, fails both."""
    model, data, _ = one_process
    bf16 = (f"model.compute_dtype={bf16_compute()}", "train.steps=1")
    runs = {name: tmp_path / name for name in ("one", "ddp", "fsdp")}
    torch.manual_seed(0)
    trainer = Trainer(load_config(None, overrides(model, data, runs["one"], *bf16)), reward_functions=REWARDS)
    try:
        trainer.train()
    finally:
        trainer.close()
    torchrun(overrides(model, data, runs["ddp"], *bf16, "parallel.strategy=ddp"),
             overrides(model, data, runs["fsdp"], *bf16, "parallel.strategy=fsdp"), cwd=tmp_path)
    x, init = load_file(str(runs["one"] / "final" / "model.safetensors")), load_file(str(model / "model.safetensors"))
    a = metrics(runs["one"])[1]
    for name in ("ddp", "fsdp"):
        b = metrics(runs[name])[1]
        assert b["policy/grad_norm"] == pytest.approx(a["policy/grad_norm"], rel=4 * BF16_UNIT), name
        assert b["loss/policy"] == pytest.approx(a["loss/policy"], rel=4 * BF16_UNIT, abs=1e-4), name
        assert b["reward/mean"] == a["reward/mean"], name  # the same completions
        y = load_file(str(runs[name] / "final" / "model.safetensors"))
        moved = torch.cat([(x[k] - init[k]).flatten() for k in x])
        apart = torch.cat([(x[k] - y[k]).flatten() for k in x])
        assert float(moved.abs().max()) > 1e-3
        assert float((apart.abs() > 1e-5).float().mean()) < 0.02, name  # sign flips of near-0 gradients only


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


@pytest.fixture(scope="module")
def async_runs(one_process, tmp_path_factory):
    """One launch of 2 processes, three runs with the rank-keyed generators (rollout.seed_per_prompt=false): sync,
    async K=0 and async K=1 (3 steps) -> their run directories."""
    model, data, _ = one_process
    root = tmp_path_factory.mktemp("async-ddp")
    runs = {name: root / name for name in ("sync", "k0", "k1")}
    common = ["parallel.strategy=ddp", "rollout.seed_per_prompt=false", "log.sample_groups=2"]
    torchrun(overrides(model, data, runs["sync"], *common),
             overrides(model, data, runs["k0"], *common, "rollout.mode=async", "rollout.max_staleness=0"),
             overrides(model, data, runs["k1"], *common, "rollout.mode=async", "rollout.max_staleness=1",
                       "train.steps=3"), cwd=root)
    return runs


def test_async_rollouts_under_torchrun_sample_each_ranks_shard_in_its_own_worker(async_runs):
    """rollout.mode=async with 2 ranks: each rank's worker samples the rank's shard with the rank's generators and
    loads its trainer's weights, so K=0 trains exactly the parameters of sync mode on the same 2 ranks; K=1 trains
    with batches at most one update old."""
    sync, k0 = (load_file(str(async_runs[n] / "final" / "model.safetensors")) for n in ("sync", "k0"))
    assert sync.keys() == k0.keys() and all(torch.equal(sync[k], k0[k]) for k in sync)
    assert [r["rollout/staleness"] for r in metrics(async_runs["k0"])[1:]] == [0.0, 0.0]
    stale = [r["rollout/staleness"] for r in metrics(async_runs["k1"])[1:]]
    assert len(stale) == 3 and stale[0] == 0.0 and all(s <= 1.0 for s in stale), stale
    assert (async_runs["k1"] / "final" / "model.safetensors").exists()


def prompts_by_step(run: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], []).append(row["prompt"])
    return out


def test_a_dead_worker_on_one_rank_stops_every_rank_with_a_checkpoint_and_the_run_resumes(one_process, async_runs,
                                                                                          tmp_path):
    """Rank 1's worker exits while sampling the second batch: rank 1 finds its pipe closed, rank 0 has its batch;
    both stop at the same step (none waits in a collective for the other) with the step's checkpoint (each rank
    exits 3). The checkpoint's prompt stream is after the last batch trained on, so a --resume (new workers)
    trains on the prompts of the uninterrupted run."""
    model, data, _ = one_process
    run = tmp_path / "run"
    args = [*overrides(model, data, run, "parallel.strategy=ddp", "rollout.seed_per_prompt=false",
                       "log.sample_groups=2", "rollout.mode=async", "train.steps=3"),
            "reward.functions=[varied_rank1_worker_dies_once]"]
    err = torchrun(args, cwd=tmp_path, code=3)
    assert (tmp_path / "worker-died").exists()
    # torchrun stops the other rank once one exits, so either rank's message may be the one printed
    assert "pipe closed" in err and re.search(r"exitcode\s*:\s*3", err), err[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-")) == ["step-000001"]
    assert (run / "checkpoints" / "step-000001" / "COMMITTED").exists() and not (run / "final").exists()
    torchrun([*args, "--resume"], cwd=tmp_path)
    assert [r["step"] for r in metrics(run)] == [0, 1, 2, 3]
    assert prompts_by_step(run) == prompts_by_step(async_runs["k1"])


def test_what_async_rollouts_cannot_do_under_torchrun_is_refused():
    from grpo.config import ConfigError
    from grpo.parallel.dist import SINGLE, Dist
    from grpo.train.async_rollouts import check_async_config

    two = Dist(rank=0, world_size=2, strategy="fsdp")
    with pytest.raises(ConfigError, match="parallel.strategy=ddp"):
        check_async_config(load_config(None, ["rollout.mode=async"]), two, "cpu")
    two.strategy = "ddp"
    check_async_config(load_config(None, ["rollout.mode=async"]), two, "cpu")  # allowed
    with pytest.raises(ConfigError, match="drop_zero_std_groups"):
        check_async_config(load_config(None, ["rollout.mode=async", "algo.drop_zero_std_groups=true"]), two, "cpu")
    # the other ranks wait in a collective (1,800 s timeout) for up to the worker's start-up (600 s) + this limit
    with pytest.raises(ConfigError, match="rollout.worker_timeout_s=1200 under torchrun"):
        check_async_config(load_config(None, ["rollout.mode=async", "rollout.worker_timeout_s=1200"]), two, "cpu")
    check_async_config(load_config(None, ["rollout.mode=async", "rollout.worker_timeout_s=1199"]), two, "cpu")
    check_async_config(load_config(None, ["rollout.mode=async", "rollout.worker_timeout_s=5000"]), SINGLE, "cpu")
