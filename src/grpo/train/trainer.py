"""The GRPO trainer. One step is the pipeline of DESIGN.md, one line a stage:

    prompts (P) -> rollouts (N = P*G) -> rewards (N,) -> advantages (N,) -> per-token loss -> update

PPO differs in one visible place: its advantages come from GAE with a critic, which gets its own update.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from grpo.algo import zero_std_groups
from grpo.algo.registry import advantage_estimator
from grpo.config import Config
from grpo.data import task_from_config
from grpo.data.stream import PromptStream
from grpo.data.validate import check_lengths, check_prompt_chars, check_rows
from grpo.errors import DiskFullError
from grpo.models.compute import resolve_compute
from grpo.models.loading import check_device_and_dtype, load_policy, model_tokenizer
from grpo.models.lora import reference_policy
from grpo.parallel import align_batch, check_parallel_config, generation, init_distributed, wrap_policy
from grpo.rewards.runner import reward_mean_std
from grpo.rollout.decode import check_lean_paths
from grpo.rollout.factory import build_engine
from grpo.rollout.sampler import TRAINED_STEPS, check_model_logits
from grpo.tracking.console import SMALL_N
from grpo.tracking.memory import peak_rss_mb
from grpo.tracking.progress import Phase
from grpo.tracking.trackers import check_trackers
from grpo.train.budget import check_step_fits
from grpo.train.memory_plan import longest_prompt, plan_memory
from grpo.train.defaults import lr_note, print_note, report_defaults, tis_cap_for
from grpo.train.optim import build_optimizer
from grpo.tracking.rundir import check_output_dir
from grpo.train.evaluate import evaluate_model, held_out_pool, split_held_out
from grpo.train.episodes import env_limits, env_metrics, task_environment
from grpo.warmup import policy_directory
from grpo.train.update import PolicyBatch, batch_logprobs, policy_update
from grpo.train.step_result import StepResult
from grpo.train.rollout_source import (BatchProducer, ScoredBatch, SyncRollouts, behaviour_logprobs, masked_to,
                                       resolve_reward_specs)
from grpo.types import Rollouts

log = logging.getLogger("grpo.train")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _producer_part(name: str, doc: str) -> property:
    """The trainer's name for a part of its BatchProducer (one owner; setting it replaces the producer's)."""
    return property(lambda self: getattr(self.producer, name), lambda self, v: setattr(self.producer, name, v),
                    doc=doc)


class Trainer:
    """Builds every stage from a `Config` and runs them. `train()` is the whole job; `step()` one step."""

    def __init__(self, cfg: Config, *, task=None, reward_functions=None, run_dir: str | Path | None = None,
                 console=None):
        from grpo.rewards import RewardRunner

        from grpo.train.async_rollouts import refuse_in_worker

        refuse_in_worker()  # a script without a __main__ guard, imported by an async rollout worker
        t_setup = time.perf_counter()
        self.cfg, default_notes = report_defaults(cfg, console)  # a model directory's own defaults (train/defaults.py)
        cfg = self.cfg
        device, dtype = check_device_and_dtype(cfg)  # model.device=cuda without a GPU, float16 on the CPU
        self.compute = resolve_compute(cfg, device, dtype)  # model.compute_dtype: the update's forwards, backwards
        if self.compute == "bfloat16" and cfg.model.compute_dtype == "auto":
            print_note("model.compute_dtype=auto: this CPU multiplies bf16 natively, so the training forwards and "
                       "backwards run bf16 products (float32 weights, log-softmax and loss); model.compute_dtype="
                       "float32 turns it off", console)
        self.cfg, note = tis_cap_for(cfg, self.compute)  # algo.tis_cap=auto: on where the sampler rounds otherwise
        if note is not None:
            print_note(note, console)
        cfg = self.cfg
        check_step_fits(cfg, device, dtype, console.print if console is not None else None)  # positions, memory
        self.dist = init_distributed(cfg.parallel, cfg.model.device)  # torchrun: this rank's place; else 1 process
        check_parallel_config(cfg, self.dist)
        if self.dist.rank == 0:
            check_trackers(cfg)  # a missing package, W&B online without a key, an MLflow server down: in seconds
        set_seed(cfg.train.seed)
        self.console = console
        tokenizer = functools.cache(lambda: model_tokenizer(cfg))  # loaded once, when the data needs it first
        self.task = task or task_from_config(cfg, reward_functions,  # data.path: a data set file (data/files.py)
                                             tokenizer_loader=tokenizer)
        self.run_dir = check_output_dir(run_dir or cfg.train.output_dir or default_run_dir(cfg))  # a file: ConfigError
        # Splits come before the model: a data problem fails fast, before any warm-up or load.
        self.train_prompts = self.task.split("train", cfg.data.train_size)
        held_out = held_out_pool(self.task, cfg.eval.n, cfg.eval.val_n)  # test, then validation (split_held_out)
        self.reward_specs = reward_specs = resolve_reward_specs(cfg, self.task, reward_functions)
        self.train_prompts, held_out = check_rows(self.train_prompts, held_out, reward_specs, cfg)
        self.train_prompts, held_out = check_prompt_chars(self.train_prompts, held_out, tokenizer, cfg)  # 20 MB rows
        from grpo.rewards.code_exec import prepare_code_rewards  # reward.sandbox; no sandbox: refuse before loading

        prepare_code_rewards(reward_specs, self.train_prompts, cfg.reward.sandbox)
        t_model = time.perf_counter()
        path, self.model_source = policy_directory(cfg, self.task, console)  # the built-in model: shipped or warm-up
        # the planned peak (printed), optim.micro_batch_tokens from it when unset; refused when it cannot fit
        episodes = callable(getattr(self.task, "environment_factory", None))  # an environment adds tokens: unknown
        cfg, self.memory_plan = plan_memory(cfg, path, device, dtype, longest_prompt(tokenizer(), self.train_prompts),
                                            console, completion_tokens=None if episodes else -1)
        self.cfg = cfg
        with Phase("loading the model", console=console if self.dist.rank == 0 else None):  # a log: a line a 10 s
            self.policy, self.tokenizer = load_policy(cfg, path)
        self.model_s = time.perf_counter() - t_model  # summary.json: time/model_s
        if console is not None and self.dist.rank == 0:
            console.print(f"[grpo] model {cfg.model.name} ({self.model_source}: {path}) loaded in {self.model_s:.1f} s",
                          soft_wrap=True, markup=False, highlight=False)
        if getattr(self.task, "auto_templated", False) and cfg.model.name != "builtin:tiny":
            print_note("data.plain_prompts=auto: the model's tokenizer has a chat template, so each plain-text prompt "
                       "is one user turn through it, as the model sees a question at inference (evaluation and "
                       "rewards see the same text); data.plain_prompts=raw feeds the text as it is", console)
        note = lr_note(cfg, default_notes, sum(p.numel() for p in self.policy.parameters()))  # final before the
        if note is not None:  # optimizer is built: a model under 200M parameters learns at 1e-5 (train/defaults.py)
            print_note(note, console)
        self.train_prompts, held_out = check_lengths(self.train_prompts, held_out, self.tokenizer, cfg)
        if self.train_prompts:  # a model with NaN/inf logits is named now, before the run directory is written
            check_model_logits(self.policy, self.tokenizer, self.train_prompts[:1])
        sampler_here = cfg.rollout.engine == "native" and cfg.rollout.mode == "sync"  # else the decoder is not ours
        for note in check_lean_paths(self.policy, decoder=sampler_here):  # against the model's forward, on a probe
            print_note(note, console)
        self.eval_prompts, self.val_prompts = split_held_out(held_out, cfg.eval.n, cfg.eval.val_n)
        note = held_out_note(cfg, len(held_out), len(self.eval_prompts), len(self.val_prompts))
        if note is not None:
            print_note(note, console)
        self.device = next(self.policy.parameters()).device
        # None at beta = 0, and in rollout.mode=async (the worker holds it and sends pi_ref's log-probs with each
        # batch); LoRA: the adapter-disabled policy
        self.ref = reference_policy(self.policy, cfg) if cfg.rollout.mode == "sync" else None
        self.train_model = wrap_policy(self.policy, self.dist, self.ref)  # DDP / FSDP2 under torchrun, else policy
        # one step's rollouts and rewards (rollout_source.py); sampler, env_factory, rewards and stream are its parts
        self.producer = BatchProducer(
            cfg, self.policy, build_engine(cfg, self.policy, self.tokenizer, path, self.dist,  # native | vllm
                                           compute=self.compute),  # the sampler computes as the update does
            self.tokenizer, task_environment(self.task, self.tokenizer),  # None: single-turn (train/episodes.py)
            RewardRunner(functions=reward_specs, timeout_s=cfg.reward.timeout_s, max_abs=cfg.reward.max_abs,
                         max_failure_frac=cfg.reward.max_failure_frac),
            PromptStream(self.train_prompts, cfg.train.seed), self.dist)
        total_updates = cfg.train.steps * cfg.algo.epochs
        self.optimizer, self.scheduler = build_optimizer(self.policy.parameters(), cfg.optim, total_updates)
        self.critic = None
        if cfg.algo.advantage == "gae":
            from grpo.train.ppo import Critic

            self.critic = Critic(self.policy, cfg, total_updates, self.dist, self.compute)
        self.rollouts = rollout_source(self, path)  # rollout.mode: sync (here, between updates) or async (a worker)
        self.step_count = 0
        self.setup_s = time.perf_counter() - t_setup  # counted in the run's wall time (train/loop.py)

    sampler = _producer_part("sampler", "the rollout engine (rollout.engine)")
    env_factory = _producer_part("env_factory", "the task's EnvironmentFactory, None for a single-turn task")
    rewards = _producer_part("rewards", "the RewardRunner")
    stream = _producer_part("stream", "the PromptStream of the training prompts (its state is checkpointed)")

    # ------------------------------------------------------------------ one step
    def step(self) -> StepResult:
        """One GRPO (or PPO) step on the next P prompts, one line a stage (docs/ARCHITECTURE.md walks through it)."""
        t0 = time.perf_counter()
        scored = self.rollouts.next(self.step_count)  # rollout/ + rewards/; async: sampled ahead, <= K steps old
        rollouts, scores = scored.rollouts, scored.scores
        batch = self._policy_batch(rollouts)                           # the update's tensors, on the training device
        self._old_and_ref_logprobs(batch, scored)                      # pi_old (mu > 1, PPO, async), pi_ref (beta > 0)
        t1 = time.perf_counter()
        batch.adv, metrics = self._advantages(batch, scores.total)     # algo/registry.py; PPO: GAE with the critic
        metrics |= policy_update(self.train_model, self.optimizer, self.scheduler, batch, self.cfg, self.dist,
                                 kl_in_loss=self.critic is None,       # PPO: the KL is in the reward, not the loss
                                 compute=self.compute)                 # model.compute_dtype (models/compute.py)
        if self.critic is not None:
            metrics |= self.critic.update(batch)                       # PPO: the critic's own optimizer step
        self.step_count += 1
        setattr(self.policy, TRAINED_STEPS, self.step_count)           # its weights are no longer the disk's
        self.rollouts.sync_weights(self.policy, self.step_count)       # vLLM engine / async worker: the new weights
        metrics |= self._reward_metrics(scores, batch.adv) | self._rollout_metrics(rollouts)
        metrics |= self._perf_metrics(rollouts, t0, t1, scored.generate_s, scored.reward_s) | self.rollouts.metrics()
        metrics["perf/update_tokens"] = float(batch.forward_tokens(self.train_model,  # for the bench's GFLOP/s
                                                                    self.cfg.optim.micro_batch_tokens))
        # several processes: the job's metrics, the same on every rank
        return StepResult(rollouts, scores, batch.adv, self.dist.reduce_metrics(metrics))

    def _policy_batch(self, rollouts: Rollouts) -> PolicyBatch:
        batch = PolicyBatch.from_rollouts(rollouts, self.cfg, self.device)
        align_batch(batch, self.dist, self.tokenizer.pad_token_id)  # several processes: equal shapes on all ranks
        return batch

    def _old_and_ref_logprobs(self, batch: PolicyBatch, scored: ScoredBatch) -> None:
        """Fill batch.old_logp (pi_old) and batch.ref_logp (pi_ref: kl.coef > 0), each (N, T), without gradients.

        pi_old is the policy that sampled the batch. A batch sampled by an older policy (async, staleness > 0) takes
        the sampler's own log-probs, so the clipped ratio is pi_theta / pi_sampler as in the seed's formula; a batch of
        the current policy takes them from this policy when mu > 1 or PPO, and mu = 1 leaves old_logp None (the ratio
        is 1 and pi_old is logp.detach())."""
        cfg = self.cfg
        budget, temp, chunk = cfg.optim.micro_batch_tokens, cfg.rollout.temperature, cfg.optim.logprob_chunk_tokens
        if self.step_count > scored.policy_version:
            batch.old_logp = behaviour_logprobs(scored, batch.mask)
        elif cfg.algo.epochs > 1 or self.critic is not None:
            batch.old_logp = batch_logprobs(self.policy, batch, budget, temp, chunk, self.compute)
        if scored.ref_logp is not None:  # async: computed by the worker while the previous update ran
            batch.ref_logp = masked_to(scored.ref_logp, batch.mask)
        elif self.ref is not None:
            with self.ref.active() as ref_model:
                batch.ref_logp = batch_logprobs(ref_model, batch, budget, temp, chunk, self.compute)
        elif cfg.kl.coef > 0:  # async: the worker holds pi_ref; a batch without its log-probs would drop the KL term
            raise RuntimeError(f"kl.coef={cfg.kl.coef:g} but the batch of step {self.step_count + 1} came without "
                               "pi_ref's log-probs and this trainer holds no reference")

    def _advantages(self, batch: PolicyBatch, rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """(N,) rewards -> advantages and their metrics: (N,) from the group estimator algo.advantage, or PPO's
        (N, T) GAE from the critic (it reads batch.old_logp and batch.ref_logp for the KL in the reward)."""
        if self.critic is not None:
            return self.critic.advantages(batch, rewards)
        return self._group_advantages(rewards), {}

    def _group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """(N,) rewards -> (N,) advantages from the registered estimator algo.advantage (grpo.algo.registry)."""
        a = self.cfg.algo
        estimator = advantage_estimator(a.advantage)
        return estimator(rewards.to(self.device), group_size=self.cfg.rollout.group_size, std=a.std, scale=a.scale,
                         eps=a.eps)

    def _reward_metrics(self, scores, adv: torch.Tensor) -> dict[str, float]:
        total, adv = self.dist.gather_cat(scores.total), self.dist.gather_cat(adv)  # the job's, with several ranks
        G = self.cfg.rollout.group_size
        out = dict(scores.metrics)
        out["reward/mean"], out["reward/std"] = reward_mean_std(total)
        out["adv/zero_std_frac"] = float(zero_std_groups(total, G).float().mean())
        out["adv/abs_mean"] = float(adv.abs().mean())
        return out

    def _perf_metrics(self, rollouts: Rollouts, t0: float, t1: float, gen_s: float, reward_s: float) -> dict:
        """perf/*: the step's seconds (t0: its start, t1: the update's start), generation speed, peak memory."""
        gen_tokens = int(rollouts.completion_mask.sum())
        return {"perf/step_s": time.perf_counter() - t0, "perf/generate_s": gen_s, "perf/reward_s": reward_s,
                "perf/update_s": time.perf_counter() - t1, "perf/gen_tokens_per_s": gen_tokens / max(gen_s, 1e-9),
                "perf/peak_rss_mb": peak_rss_mb()}

    @staticmethod
    def _rollout_metrics(rollouts: Rollouts) -> dict[str, float]:
        lengths = rollouts.completion_mask.sum(-1).float()
        return {"rollout/len_mean": float(lengths.mean()), "rollout/len_max": float(lengths.max()),
                "rollout/truncated_frac": float(rollouts.truncated.float().mean()),
                "rollout/groups": float(len(rollouts.prompts))} | env_metrics(rollouts)

    # ------------------------------------------------------------------ evaluation and the whole run
    def evaluate(self, progress=None, split: str = "test") -> dict:
        """Greedy pass@1 on the test problems (split="test", the reported result) or the validation problems
        ("val", for choosing); `progress(done, total)` after each batch of this process's share."""
        prompts = {"test": self.eval_prompts, "val": self.val_prompts}[split]
        d = self.dist  # several processes: each evaluates every world_size-th problem; the results are joined
        with generation(self.policy, d):
            res = evaluate_model(self.policy, self.tokenizer, self.task, d.shard_strided(prompts),
                                 batch_size=self.cfg.eval.batch_size,
                                 max_new_tokens=self.cfg.eval.max_new_tokens or self.cfg.rollout.max_new_tokens,
                                 max_prompt_tokens=self.cfg.data.max_prompt_tokens, progress=progress,
                                 compute=self.compute, stop=tuple(self.cfg.rollout.stop), **env_limits(self.cfg))
        if d.enabled:
            parts = d.gather((res["correct"], res["completions"]))
            correct, completions = d.unstride([c for c, _ in parts]), d.unstride([x for _, x in parts])
            res = {"accuracy": sum(correct) / max(len(correct), 1), "n": len(correct), "correct": correct,
                   "completions": completions}
        return res

    def train(self, resume: bool = False, overwrite: bool = False) -> dict:
        """The whole run (train/loop.py). resume: continue from the run directory's newest checkpoint; overwrite:
        move a non-empty run directory aside first (a new run never writes over another)."""
        from grpo.train.checkpoint.resume import disk_full_note
        from grpo.train.loop import run_training

        try:
            return run_training(self, resume=resume, overwrite=overwrite)
        except DiskFullError as e:  # any write of the run: what is intact, and the command that finishes it
            raise DiskFullError(f"{e}. {disk_full_note(self.run_dir)}") from e

    def close(self) -> None:
        self.rollouts.close()
        self.rewards.close()
        self.dist.close()


def rollout_source(trainer: Trainer, model_dir):
    """The trainer's source of scored batches for rollout.mode: SyncRollouts, or AsyncRollouts (a worker process
    started at the first step; train/async_rollouts.py)."""
    if trainer.cfg.rollout.mode == "sync":
        return SyncRollouts(trainer.producer)
    from grpo.train.async_rollouts import AsyncRollouts

    return AsyncRollouts(trainer, model_dir)


def held_out_note(cfg: Config, pool: int, n: int, val_n: int) -> str | None:
    """The note when the data has fewer held-out problems than eval.n (test) and eval.val_n (validation) ask for,
    with the numbers the run will use; None when both are met."""
    if n >= cfg.eval.n and val_n >= cfg.eval.val_n:
        return None
    more = (" (more: raise data.test_fraction or give data.test_path)" if cfg.data.path is not None else "")
    return (f"eval.n={cfg.eval.n} and eval.val_n={cfg.eval.val_n} ask for {cfg.eval.n + cfg.eval.val_n} held-out "
            f"problems, and the data has {pool}{more}: this run tests on {n} and validates on {val_n}; an accuracy "
            f"on fewer than {SMALL_N} problems is printed with its standard error (± sqrt(p (1 - p) / n), "
            f"{_worst_se(min(n, val_n or n)):.3f} at worst here)")


def _worst_se(n: int) -> float:
    """The largest standard error of an accuracy on n problems (at p = 0.5)."""
    return (0.25 / max(n, 1)) ** 0.5


def default_run_dir(cfg: Config) -> Path:
    return Path("runs") / f"{cfg.preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
