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
from grpo.config import Config, ConfigError
from grpo.data import task_from_config
from grpo.data.stream import PromptStream
from grpo.data.validate import check_lengths, check_prompt_chars, check_rows
from grpo.models.loading import check_device_and_dtype, load_policy, model_tokenizer
from grpo.models.lora import reference_policy
from grpo.parallel import align_batch, check_parallel_config, generation, init_distributed, wrap_policy
from grpo.rewards.runner import RewardResult, reward_mean_std
from grpo.rewards.specs import reward_specs
from grpo.rollout.factory import build_engine
from grpo.tracking.memory import peak_rss_mb
from grpo.tracking.trackers import check_trackers
from grpo.train.budget import check_step_fits
from grpo.train.defaults import print_note, report_defaults, small_model_note
from grpo.train.optim import build_optimizer
from grpo.tracking.rundir import check_output_dir
from grpo.rollout.episodes import run_episodes
from grpo.train.evaluate import evaluate_model, held_out_pool, split_held_out
from grpo.train.episodes import apply_env_rewards, env_limits, env_metrics, episode_columns, task_environment
from grpo.warmup import policy_directory
from grpo.train.update import PolicyBatch, batch_logprobs, policy_update
from grpo.train.step_result import StepResult
from grpo.types import Rollouts

log = logging.getLogger("grpo.train")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Builds every stage from a `Config` and runs them. `train()` is the whole job; `step()` one step."""

    def __init__(self, cfg: Config, *, task=None, reward_functions=None, run_dir: str | Path | None = None,
                 console=None):
        from grpo.rewards import RewardRunner

        t_setup = time.perf_counter()
        self.cfg, default_notes = report_defaults(cfg, console)  # a model directory's own defaults (train/defaults.py)
        cfg = self.cfg
        device, dtype = check_device_and_dtype(cfg)  # model.device=cuda without a GPU, float16 on the CPU
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
        reward_specs = self._reward_specs(reward_functions)
        self.train_prompts, held_out = check_rows(self.train_prompts, held_out, reward_specs, cfg)
        self.train_prompts, held_out = check_prompt_chars(self.train_prompts, held_out, tokenizer, cfg)  # 20 MB rows
        from grpo.rewards.code_exec import prepare_code_rewards  # reward.sandbox; no sandbox: refuse before loading

        prepare_code_rewards(reward_specs, self.train_prompts, cfg.reward.sandbox)
        t_model = time.perf_counter()
        path, self.model_source = policy_directory(cfg, self.task, console)  # the built-in model: shipped or warm-up
        self.policy, self.tokenizer = load_policy(cfg, path)
        self.model_s = time.perf_counter() - t_model  # summary.json: time/model_s
        if console is not None and self.dist.rank == 0:
            console.print(f"[grpo] model {cfg.model.name} ({self.model_source}: {path}) loaded in {self.model_s:.1f} s",
                          soft_wrap=True, markup=False, highlight=False)
        if getattr(self.task, "auto_templated", False) and cfg.model.name != "builtin:tiny":
            print_note("data.plain_prompts=auto: the model's tokenizer has a chat template, so each plain-text prompt "
                       "is one user turn through it, as the model sees a question at inference (evaluation and "
                       "rewards see the same text); data.plain_prompts=raw feeds the text as it is", console)
        hint = small_model_note(default_notes, sum(p.numel() for p in self.policy.parameters()), cfg.model.lora_rank > 0)
        if hint is not None:
            print_note(hint, console)
        self.train_prompts, held_out = check_lengths(self.train_prompts, held_out, self.tokenizer, cfg)
        self.eval_prompts, self.val_prompts = split_held_out(held_out, cfg.eval.n, cfg.eval.val_n)
        self.device = next(self.policy.parameters()).device
        self.ref = reference_policy(self.policy, cfg)  # None at beta = 0; LoRA: the adapter-disabled policy
        self.train_model = wrap_policy(self.policy, self.dist, self.ref)  # DDP / FSDP2 under torchrun, else policy
        self.sampler = build_engine(cfg, self.policy, self.tokenizer, path, self.dist)  # rollout.engine: native|vllm
        self.env_factory = task_environment(self.task, self.tokenizer)  # None: single-turn (train/episodes.py)
        self.rewards = RewardRunner(functions=reward_specs, timeout_s=cfg.reward.timeout_s, max_abs=cfg.reward.max_abs,
                                    max_failure_frac=cfg.reward.max_failure_frac)
        total_updates = cfg.train.steps * cfg.algo.epochs
        self.optimizer, self.scheduler = build_optimizer(self.policy.parameters(), cfg.optim, total_updates)
        self.critic = None
        if cfg.algo.advantage == "gae":
            from grpo.train.ppo import Critic

            self.critic = Critic(self.policy, cfg, total_updates, self.dist)
        self.stream = PromptStream(self.train_prompts, cfg.train.seed)
        self.step_count = 0
        self.setup_s = time.perf_counter() - t_setup  # counted in the run's wall time (train/loop.py)

    # ------------------------------------------------------------------ one step
    def step(self) -> StepResult:
        """One GRPO (or PPO) step on the next P prompts, one line a stage (docs/ARCHITECTURE.md walks through it)."""
        t0 = time.perf_counter()
        rollouts, scores, gen_s, reward_s = self._sample_and_score()  # rollout/ + rewards/ (DAPO: resample)
        batch = self._policy_batch(rollouts)                           # the update's tensors, on the training device
        self._old_and_ref_logprobs(batch)                              # pi_old (mu > 1, PPO), pi_ref (beta > 0)
        t1 = time.perf_counter()
        batch.adv, metrics = self._advantages(batch, scores.total)     # algo/registry.py; PPO: GAE with the critic
        metrics |= policy_update(self.train_model, self.optimizer, self.scheduler, batch, self.cfg, self.dist,
                                 kl_in_loss=self.critic is None)       # PPO: the KL is in the reward, not the loss
        self.sampler.sync_weights(self.policy)                         # vLLM: the engine gets the new weights
        if self.critic is not None:
            metrics |= self.critic.update(batch)                       # PPO: the critic's own optimizer step
        self.step_count += 1
        metrics |= self._reward_metrics(scores, batch.adv) | self._rollout_metrics(rollouts)
        metrics |= self._perf_metrics(rollouts, t0, t1, gen_s, reward_s)
        # several processes: the job's metrics, the same on every rank
        return StepResult(rollouts, scores, batch.adv, self.dist.reduce_metrics(metrics))

    def _sample_and_score(self):
        """Sample and score -> (rollouts, scores, generate seconds, reward seconds); with algo.drop_zero_std_groups
        (DAPO) keep sampling until P informative groups."""
        cfg, P, G = self.cfg, self.cfg.rollout.prompts_per_step, self.cfg.rollout.group_size
        kept_r, kept_s, gen_s, reward_s = [], [], 0.0, 0.0
        rounds = cfg.algo.max_resample_batches if cfg.algo.drop_zero_std_groups else 1
        P_rank = P // self.dist.world_size  # every rank takes its slice of the same global P prompts
        for round_ in range(rounds):
            t = time.perf_counter()
            rollouts = self._generate(self.dist.shard(self.stream.next(P)), G, round_)
            gen_s += time.perf_counter() - t
            t = time.perf_counter()
            scores = self._score(rollouts)
            reward_s += time.perf_counter() - t
            if cfg.algo.drop_zero_std_groups:
                last = rollouts, scores
                keep = (~zero_std_groups(scores.total, G)).nonzero()[:, 0].tolist()
                rollouts, scores = rollouts.select_groups(keep), select_groups(scores, keep, G)
            kept_r.append(rollouts)
            kept_s.append(scores)
            if self.dist.all(sum(len(r.prompts) for r in kept_r) >= P_rank):  # ranks stop together
                break
        rollouts = Rollouts.concat(kept_r, self.tokenizer.pad_token_id)
        scores = concat_scores(kept_s)
        if cfg.algo.drop_zero_std_groups and not rollouts.prompts:  # nothing informative in any round: the last
            # round's groups, whose advantages are all 0 (so the metrics and samples still describe what was drawn)
            rollouts, scores = last
        if len(rollouts.prompts) > P_rank:
            keep = list(range(P_rank))
            rollouts, scores = rollouts.select_groups(keep), select_groups(scores, keep, G)
        return rollouts, scores, gen_s, reward_s

    def _generate(self, prompts, G: int, round_: int) -> Rollouts:
        """Sample G completions per prompt. rollout.seed_per_prompt: one generator per prompt, seeded by
        (train.seed, step, round, uid), so the rollouts do not depend on batching or the world size; several
        processes: one generator per (step, round, rank); otherwise the global RNG."""
        d, seed, step = self.dist, self.cfg.train.seed, self.step_count
        with generation(self.policy, d):  # FSDP: weights gathered once, decoding without collectives
            if self.cfg.rollout.seed_per_prompt:  # one call; each group draws from its own generator
                gen = [d.step_generator(seed, step, round_, p.uid, self.device) for p in prompts]
            else:
                gen = d.step_generator(seed, step, round_, device=self.device) if d.enabled else None
            # no environment: one turn, exactly sampler.generate
            return run_episodes(self.sampler, prompts, G, self.env_factory, generator=gen, **env_limits(self.cfg))

    def _score(self, rollouts: Rollouts):
        G = rollouts.group_size
        columns: dict[str, list] = {"answer": [p.answer for p in rollouts.prompts for _ in range(G)]}
        for key in rollouts.prompts[0].meta if rollouts.prompts else []:
            columns[key] = [p.meta.get(key) for p in rollouts.prompts for _ in range(G)]
        prompts = [p.text for p in rollouts.prompts for _ in range(G)]
        columns |= episode_columns(rollouts)  # episodes: the transcript as `messages`; final policy turn scored
        return apply_env_rewards(self.rewards(prompts, rollouts.texts, columns), rollouts)

    def _policy_batch(self, rollouts: Rollouts) -> PolicyBatch:
        cfg = self.cfg
        mask = (rollouts.completion_mask if rollouts.loss_mask is None else rollouts.loss_mask).float()  # episodes:
        # the policy's tokens only; the environment's are attended (attention_mask) but carry no loss and no KL
        if cfg.algo.mask_truncated:  # a cut-off completion's reward says little about its tokens (DAPO section 3.3)
            mask = mask * (~rollouts.truncated).to(mask.dtype)[:, None]
        batch = PolicyBatch(prompt_ids=rollouts.prompt_ids, prompt_mask=rollouts.prompt_mask,
                            completion_ids=rollouts.completion_ids, mask=mask,
                            adv=torch.zeros(rollouts.num_completions, device=self.device),
                            group_size=rollouts.group_size,
                            # top-p renormalises the sampler's distribution: its log-probs are not comparable then
                            sampler_logp=rollouts.logp if cfg.rollout.top_p == 1.0 else None,
                            attention_mask=None if rollouts.loss_mask is None else rollouts.completion_mask)
        align_batch(batch, self.dist, self.tokenizer.pad_token_id)  # several processes: equal shapes on all ranks
        return batch

    def _old_and_ref_logprobs(self, batch: PolicyBatch) -> None:
        """Fill batch.old_logp (pi_old: mu > 1 or PPO; mu = 1 leaves it None, the ratio is 1 and pi_old is
        logp.detach()) and batch.ref_logp (pi_ref: kl.coef > 0), each (N, T), without gradients."""
        cfg = self.cfg
        budget, temp, chunk = cfg.optim.micro_batch_tokens, cfg.rollout.temperature, cfg.optim.logprob_chunk_tokens
        if cfg.algo.epochs > 1 or self.critic is not None:
            batch.old_logp = batch_logprobs(self.policy, batch, budget, temp, chunk)
        if self.ref is not None:
            with self.ref.active() as ref_model:
                batch.ref_logp = batch_logprobs(ref_model, batch, budget, temp, chunk)

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

    def _reward_specs(self, reward_functions):
        """(name, fn, weight) of each reward (grpo.rewards.specs): the given functions, else reward.functions, else
        the task's own; reward.weights replaces the weights."""
        if reward_functions is not None:
            specs = reward_specs(reward_functions)
        elif self.cfg.reward.functions is not None:
            specs = reward_specs(self.cfg.reward.functions)  # 'my_rewards.py:accuracy' logs as 'accuracy'
        else:
            specs = list(self.task.reward_functions())
        if self.cfg.reward.weights is not None:
            if len(self.cfg.reward.weights) != len(specs):
                raise ConfigError(f"reward.weights has {len(self.cfg.reward.weights)} entries for {len(specs)} "
                                  f"reward functions {[s[0] for s in specs]}")
            specs = [(s[0], s[1], w, *s[3:]) for s, w in zip(specs, self.cfg.reward.weights)]
        return specs

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
                                 **env_limits(self.cfg))
        if d.enabled:
            parts = d.gather((res["correct"], res["completions"]))
            correct, completions = d.unstride([c for c, _ in parts]), d.unstride([x for _, x in parts])
            res = {"accuracy": sum(correct) / max(len(correct), 1), "n": len(correct), "correct": correct,
                   "completions": completions}
        return res

    def train(self, resume: bool = False, overwrite: bool = False) -> dict:
        """The whole run (train/loop.py). resume: continue from the run directory's newest checkpoint; overwrite:
        move a non-empty run directory aside first (a new run never writes over another)."""
        from grpo.train.loop import run_training

        return run_training(self, resume=resume, overwrite=overwrite)

    def close(self) -> None:
        self.rewards.close()
        self.dist.close()


def select_groups(scores, groups: list[int], group_size: int):
    """The RewardResult rows of the given groups (dynamic sampling keeps only informative groups)."""
    rows = torch.tensor([g * group_size + j for g in groups for j in range(group_size)], dtype=torch.long)
    return RewardResult(total=scores.total[rows], per_function={k: v[rows] for k, v in scores.per_function.items()},
                        missing=scores.missing[rows], metrics=scores.metrics)


def concat_scores(parts):
    """Join the RewardResults of several generation rounds; metrics are those of the first round."""
    if len(parts) == 1:
        return parts[0]
    return RewardResult(total=torch.cat([p.total for p in parts]), missing=torch.cat([p.missing for p in parts]),
                        per_function={k: torch.cat([p.per_function[k] for p in parts]) for k in parts[0].per_function},
                        metrics=parts[0].metrics)


def default_run_dir(cfg: Config) -> Path:
    return Path("runs") / f"{cfg.preset}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
