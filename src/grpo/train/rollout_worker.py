"""The rollout worker of rollout.mode=async: a process that samples and scores batches ahead of the trainer.

    for step = start, start + 1, ...:
        wait until the trainer has published policy version >= step - K      (K = rollout.max_staleness)
        load the newest published weights (one copy, shared memory: grpo.train.shared_weights)
        sample + score the step's batch (grpo.train.rollout_source.BatchProducer, rewards and episodes included)
        kl.coef > 0: the reference policy's log-probs of it (the worker holds pi_ref; the trainer holds none)
        send ScoredBatch(policy_version=the version it sampled with) on a one-way pipe (the trainer reads it in a thread)

Batches are sampled from generators seeded by (train.seed, step, round) (or per prompt with rollout.seed_per_prompt),
so what the worker samples depends on the step and the weights only. With K = 0 the worker waits for every update,
and the trainer's updates are bitwise those of rollout.mode=sync (tests/train/test_async_rollouts.py).

The worker owns its prompt stream (a copy of the trainer's, started at its state) and reports the stream's state
with each batch; it ignores SIGINT (Ctrl-C reaches the whole process group; the trainer decides when to stop and tells it) and exits when its
parent is gone (and is killed with it on Linux: PR_SET_PDEATHSIG). It stops after the batch of step train.steps - 1.
An exception is sent to the trainer, which raises it (grpo.train.async_rollouts).
"""

from __future__ import annotations

import os
import pickle
import signal
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.models.lora import reference_policy
from grpo.parallel.dist import Dist


@dataclass
class WorkerSpec:
    """What the worker rebuilds its side from: the config, the model directory the trainer loaded, the trainer's
    training prompts (after its checks), the task when it has an environment (None: single-turn), and the reward
    specs (None: rebuilt from cfg.reward.functions, for functions read from a file, which do not pickle); under
    torchrun, the rank the worker samples for."""

    cfg: object
    model_dir: Path
    train_prompts: list
    env_task: object | None
    reward_specs: list | None
    rank: int = 0  # under torchrun: the trainer's rank and world size (its shard of each step's prompts)
    world_size: int = 1


@dataclass
class WorkerFailure:
    """An exception in the worker: the exception itself when it pickles (the trainer raises it as it is: a user
    error stays a user error), else None, and the traceback text."""

    error: BaseException | None
    text: str


def worker_main(spec: WorkerSpec, weights, writer, stop, ready, start_step: int, stream_state: dict,
                threads: int) -> None:
    """The worker process's entry point (multiprocessing spawn). writer: the sending end of a one-way pipe, of
    pickled ScoredBatch | WorkerFailure; stop: an Event the trainer sets to end the worker; ready: set once the
    model is loaded."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the trainer handles it
    _die_with_parent()
    parent = os.getppid()

    def should_stop() -> bool:
        return stop.is_set() or os.getppid() != parent

    try:
        torch.set_num_threads(threads)
        producer, policy = build_producer(spec, stream_state)
        ref = reference_policy(policy, spec.cfg)  # before any published weights: the model directory's, as the
        ready.set()                               # trainer's reference is in sync mode (LoRA: adapters disabled)
        run_worker(producer, policy, spec.cfg, weights, writer, should_stop, start_step, ref)
    except BaseException as e:  # noqa: BLE001 - everything goes to the trainer, which decides
        if not should_stop():
            _send(writer, WorkerFailure(_picklable(e), traceback.format_exc()))


def run_worker(producer, policy, cfg, weights, writer, should_stop, start_step: int, ref=None) -> None:
    """Produce batches start_step, start_step + 1, ... up to train.steps - 1, until should_stop() (see the module's
    docstring). ref: the reference policy (kl.coef > 0) whose log-probs go with each batch, else None."""
    from grpo.models.compute import resolve_compute
    from grpo.models.loading import check_device_and_dtype
    from grpo.rollout.sampler import TRAINED_STEPS
    from grpo.train.rollout_source import ScoredBatch

    K, version = cfg.rollout.max_staleness, None
    compute = resolve_compute(cfg, *check_device_and_dtype(cfg))  # the trainer's forwards' precision, once
    for step in range(start_step, cfg.train.steps):
        if not weights.wait_for(step - K, should_stop):
            return
        if weights.current() != version:
            version = weights.load_into(policy, should_stop)
            setattr(policy, TRAINED_STEPS, version or 0)  # trained weights: the sampler's check says so
        rollouts, scores, gen_s, reward_s = producer.produce(step, per_step_generators=True)
        behaviour = ref_logp = None
        if cfg.rollout.top_p < 1.0:  # the sampler's log-probs are of the truncated distribution: the full one
            behaviour = sequence_logprobs(policy, rollouts, cfg, compute)
        if ref is not None:
            with ref.active() as ref_model:
                ref_logp = sequence_logprobs(ref_model, rollouts, cfg, compute)
        if should_stop():
            return
        _send(writer, ScoredBatch(rollouts, scores, gen_s, reward_s, policy_version=version,
                                  stream_state=producer.stream.state_dict(), behaviour_logp=behaviour,
                                  ref_logp=ref_logp))


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (a trainer killed by the OOM killer leaves no worker)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent check in should_stop() remains
        pass


def build_producer(spec: WorkerSpec, stream_state: dict):
    """The worker's BatchProducer and policy, built as the trainer built its own (same config, model directory,
    prompts and rewards)."""
    from grpo.data.stream import PromptStream
    from grpo.models.compute import resolve_compute
    from grpo.models.loading import check_device_and_dtype, load_policy
    from grpo.rewards import RewardRunner
    from grpo.rewards.code_exec import prepare_code_rewards
    from grpo.rollout.factory import build_engine
    from grpo.train.episodes import task_environment
    from grpo.train.rollout_source import BatchProducer, resolve_reward_specs

    cfg = spec.cfg
    policy, tokenizer = load_policy(cfg, spec.model_dir)
    policy.eval()
    specs = spec.reward_specs if spec.reward_specs is not None else resolve_reward_specs(cfg, None, None)
    prepare_code_rewards(specs, spec.train_prompts, cfg.reward.sandbox)  # the sandbox mode is per process
    rewards = RewardRunner(functions=specs, timeout_s=cfg.reward.timeout_s, max_abs=cfg.reward.max_abs,
                           max_failure_frac=cfg.reward.max_failure_frac)
    stream = PromptStream(spec.train_prompts, cfg.train.seed)
    stream.load_state_dict(stream_state)
    sampler = build_engine(cfg, policy, tokenizer, spec.model_dir,  # computing as the trainer's sampler would
                           compute=resolve_compute(cfg, *check_device_and_dtype(cfg)))
    env = task_environment(spec.env_task, tokenizer) if spec.env_task is not None else None
    dist = RankWithoutGroup(rank=spec.rank, world_size=spec.world_size)
    return BatchProducer(cfg, policy, sampler, tokenizer, env, rewards, stream, dist), policy


class RankWithoutGroup(Dist):
    """The rank a worker samples for under torchrun: its trainer's rank and world size, for the shard of each step's
    prompts and the per-rank generators, exactly as the trainer would sample in rollout.mode=sync. The worker is not
    in the job's process group (one worker per rank, each fed by its own trainer), so a collective is refused."""

    def reduce(self, values: list[float], op: str = "sum") -> list[float]:
        return values if not self.enabled else self._refuse()

    def gather(self, obj) -> list:
        return [obj] if not self.enabled else self._refuse()

    def barrier(self) -> None:
        if self.enabled:
            self._refuse()

    @staticmethod
    def _refuse():
        raise RuntimeError("the rollout worker is not in the job's process group: no collectives in the worker")


@torch.no_grad()
def sequence_logprobs(model, rollouts, cfg, compute: str = "weights") -> torch.Tensor:
    """(N, T) log-probs of the sampled tokens under `model`'s full tempered distribution, by the trainer's forward
    (the policy's with top_p < 1, the reference's with kl.coef > 0), computed as `compute` (models/compute.py)."""
    from grpo.train.update import PolicyBatch, batch_logprobs

    batch = PolicyBatch.from_rollouts(rollouts, cfg, next(model.parameters()).device)
    return batch_logprobs(model, batch, cfg.optim.micro_batch_tokens, cfg.rollout.temperature,
                          cfg.optim.logprob_chunk_tokens, compute)


def _send(writer, item) -> None:
    """One message on the pipe: plain pickled bytes (not torch's shared-memory tensors, which are handed over through
    this process and would be lost with it). The trainer's reading thread takes it whenever it comes."""
    writer.send_bytes(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))


def _picklable(e: BaseException) -> BaseException | None:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any failure to pickle: send the text only
        return None
