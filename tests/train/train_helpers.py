"""Helpers of the trainer-level tests (imported by their conftest and by the tests themselves, under a name no other
test directory uses): a small config, a deterministic reward with a learning signal, a snapshot of everything an
exact resume must reproduce, and helpers to run training code in a fresh Python process.

The model is the built-in model's architecture and character tokenizer at a much smaller size, saved with
`save_pretrained` and passed as `model.name=<dir>`: the trainer loads it like any local checkpoint, with no
warm-up, so a step takes a fraction of a second on one CPU core.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import grpo
from helpers.precision import FLOAT32

SRC = str(Path(grpo.__file__).resolve().parents[1])
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 2, "max_position_embeddings": 128}
E2E_STEPS = 4  # the reference run: 2N steps with N = 2


def base_overrides(model_dir: Path, run_dir: Path) -> list[str]:
    """Overrides of a run small enough for a unit test (P=2, G=2, 6 new tokens, 4 held-out problems).
    The 3 warm-up steps make the learning rate change across a resume at step 2."""
    return [f"model.name={model_dir}", f"train.output_dir={run_dir}", "train.steps=2", "train.eval_every=0",
            "eval.n=4", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6",
            "data.train_size=50", "log.progress=false", "log.plots=false", "log.sample_groups=1",
            "optim.lr=0.01", "optim.warmup_steps=3", "reward.timeout_s=2",
            "train.preflight=off",  # so the k-th reward call is step k (test_preflight.py checks the preflight)
            *FLOAT32]  # the same computation on every CPU (tests of `auto` replace the probe: helpers/precision.py)


def varied_reward(prompts, completions, **columns):
    """A deterministic reward that differs between completions, so advantages and gradients are not 0."""
    return [(sum(map(ord, c)) % 11) / 10 for c in completions]


varied_reward.in_process = True
VARIED = [("test_varied", varied_reward, 1.0)]


def eos_logit(trainer, value: float):
    """Force the EOS logit of every forward pass to `value` (+50: EOS first; -inf: never ends)."""
    eos = trainer.tokenizer.eos_token_id

    def hook(module, args, out):
        out = out.clone()
        out[..., eos] = value
        return out

    return trainer.policy.get_output_embeddings().register_forward_hook(hook)

def snapshot(trainer) -> dict:
    """What an exact resume must reproduce: parameters, optimizer moments, learning rate, scheduler position,
    step, data position, the next P prompts and the global torch RNG. Consumes P prompts of trainer.stream."""
    import torch

    opt = trainer.optimizer.state_dict()
    return {"params": {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()},
            "opt_state": opt["state"], "lr": [g["lr"] for g in trainer.optimizer.param_groups],
            "sched": trainer.scheduler.state_dict()["last_epoch"], "step": trainer.step_count,
            "stream": trainer.stream.state_dict(), "rng": torch.get_rng_state(),
            "next": [p.uid for p in trainer.stream.next(trainer.cfg.rollout.prompts_per_step)]}


SNAPSHOT_SRC = inspect.getsource(snapshot)  # the same function in the subprocess scripts

# Prepended to every subprocess script: deterministic settings, the reward (registered as `test_varied` so the CLI
# can name it in reward.functions), snapshot() and make_trainer().
HELPERS = f"""
import os, sys, signal, json, time
sys.path.insert(0, {SRC!r})
import torch
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
from grpo.config import load_config
from grpo.rewards import register_reward
from grpo.train.trainer import Trainer

_calls = [0]
def varied_reward(prompts, completions, **columns):
    # TEST_SLOW_CALL=k: the k-th call (step k) touches TEST_MARK, then takes TEST_SLOW_S seconds (a step to signal)
    _calls[0] += 1
    if str(_calls[0]) == os.environ.get("TEST_SLOW_CALL"):
        open(os.environ["TEST_MARK"], "w").close()
        time.sleep(float(os.environ.get("TEST_SLOW_S", "1")))
    return [(sum(map(ord, c)) % 11) / 10 for c in completions]
varied_reward.in_process = True
register_reward("test_varied", varied_reward)
{SNAPSHOT_SRC}
def make_trainer(overrides):
    return Trainer(load_config(None, overrides), reward_functions=[("test_varied", varied_reward, 1.0)])
"""


@contextmanager
def deterministic():
    """The subprocesses' settings (one thread, deterministic algorithms) in this process, restored after."""
    import torch

    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)


def assert_same_state(a: dict, b: dict) -> None:
    """Bitwise equality of two snapshot() results, naming the first difference."""
    import torch

    assert a["step"] == b["step"]
    assert a["params"].keys() == b["params"].keys()
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), f"parameter {k} differs"
    assert a["opt_state"].keys() == b["opt_state"].keys()
    for i in a["opt_state"]:
        for k, v in a["opt_state"][i].items():
            assert torch.equal(v, b["opt_state"][i][k]), f"optimizer state {i}.{k} differs"
    assert a["lr"] == b["lr"], "learning rate differs"
    assert a["sched"] == b["sched"], "scheduler position differs"
    assert a["stream"] == b["stream"], "data position differs"
    assert a["next"] == b["next"], "next prompts differ"
    assert torch.equal(a["rng"], b["rng"]), "the global torch RNG state differs"


def new_trainer(model_dir: Path, run_dir: Path, *extra: str, **kwargs):
    from grpo.config import load_config
    from grpo.train.trainer import Trainer

    kwargs.setdefault("reward_functions", VARIED)
    return Trainer(load_config(None, base_overrides(model_dir, run_dir) + list(extra)), **kwargs)


def _script(body: str, env: dict | None):
    return ([sys.executable, "-c", HELPERS + textwrap.dedent(body)],
            {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def run_script(body: str, *, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run HELPERS + body in a new Python process; returns the CompletedProcess (stdout and stderr merged)."""
    argv, full_env = _script(body, env)
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                          env=full_env, check=False)


def start_script(body: str, *, env: dict | None = None) -> subprocess.Popen:
    """Start HELPERS + body in a new Python process (stdout and stderr merged, text)."""
    argv, full_env = _script(body, env)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env)


def dies_in_worker_reward(prompts, completions, **columns):
    """test_varied's values, but the call that runs in a rollout worker whose parent asked for it (ASYNC_KILL_AT:
    the k-th call of that process) kills its own process, as the OOM killer would."""
    import signal

    dies_in_worker_reward.calls = getattr(dies_in_worker_reward, "calls", 0) + 1
    if os.environ.get("ASYNC_KILL_AT") == str(dies_in_worker_reward.calls) and os.getpid() != int(
            os.environ.get("ASYNC_TRAINER_PID", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
    return varied_reward(prompts, completions)


dies_in_worker_reward.in_process = True


def wrong_count_reward(prompts, completions, **columns):
    """One value too few: the runner's RewardOutputError, whichever process calls it."""
    return [0.0] * (len(completions) - 1)


wrong_count_reward.in_process = True
