"""Where a step's scored rollouts come from: `BatchProducer` samples and scores one batch (the rollout and reward
stages of a step); `SyncRollouts` runs it in the trainer's process, between updates (rollout.mode=sync), and
grpo.train.async_rollouts runs it in a worker process that samples ahead (rollout.mode=async).

    stream.next(P) -> P prompts -> G completions each (rollout/, episodes with a task environment) -> rewards (N,)
    DAPO's dynamic sampling (algo.drop_zero_std_groups): more rounds until P groups have reward spread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from grpo.algo import zero_std_groups
from grpo.config import ConfigError
from grpo.parallel import SINGLE, generation
from grpo.rewards.runner import RewardResult
from grpo.rewards.specs import reward_specs
from grpo.rollout.episodes import run_episodes
from grpo.train.memory_plan import release_freed_memory
from grpo.train.episodes import apply_env_rewards, env_limits, episode_columns
from grpo.types import Rollouts


@dataclass
class ScoredBatch:
    """One step's rollouts and rewards, and where they came from.

    rollouts: N = P*G completions (grpo.types.Rollouts); scores: their RewardResult, total (N,).
    generate_s, reward_s: seconds spent generating and scoring (in the worker, for async batches).
    policy_version: optimizer steps the sampling policy had taken; the trainer's step_count minus it is the batch's
        staleness (0 in sync mode).
    stream_state: the prompt stream's state after drawing this batch (async: the worker's stream; the trainer
        keeps it so that a checkpoint resumes after the last batch it trained on). None in sync mode.
    behaviour_logp: (N, T) log-probs of the sampled tokens under the sampling policy's full tempered distribution
        (async with rollout.top_p < 1, where the sampler's own log-probs are of the truncated one); else None.
    ref_logp: (N, T) log-probs of the sampled tokens under pi_ref, computed by the async worker (kl.coef > 0: the
        reference is frozen, so its forward overlaps the update too); None in sync mode.
    """

    rollouts: Rollouts
    scores: RewardResult
    generate_s: float
    reward_s: float
    policy_version: int
    stream_state: dict | None = None
    behaviour_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None


class BatchProducer:
    """Samples and scores one step's batch from a prompt stream.

    cfg: the run's Config; sampler: a rollout engine (grpo.rollout.engine) decoding with `policy`; env_factory: the
    task's EnvironmentFactory or None (single-turn); rewards: a RewardRunner; stream: a PromptStream; dist:
    grpo.parallel.Dist (several processes: each takes its shard of the same P prompts).
    """

    def __init__(self, cfg, policy, sampler, tokenizer, env_factory, rewards, stream, dist=SINGLE):
        self.cfg, self.policy, self.sampler, self.tokenizer = cfg, policy, sampler, tokenizer
        self.env_factory, self.rewards, self.stream, self.dist = env_factory, rewards, stream, dist
        self.device = next(policy.parameters()).device

    def produce(self, step: int, per_step_generators: bool = False) -> tuple[Rollouts, RewardResult, float, float]:
        """Sample and score -> (rollouts, scores, generate seconds, reward seconds); with algo.drop_zero_std_groups
        (DAPO) keep sampling until P informative groups. per_step_generators: sample from a generator seeded by
        (train.seed, step, round) instead of the global RNG (the async worker: what it samples depends on the step
        only)."""
        cfg, P, G = self.cfg, self.cfg.rollout.prompts_per_step, self.cfg.rollout.group_size
        kept_r, kept_s, gen_s, reward_s = [], [], 0.0, 0.0
        rounds = cfg.algo.max_resample_batches if cfg.algo.drop_zero_std_groups else 1
        P_rank = P // self.dist.world_size  # every rank takes its slice of the same global P prompts
        for round_ in range(rounds):
            t = time.perf_counter()
            rollouts = self.generate(self.dist.shard(self.stream.next(P)), G, step, round_, per_step_generators)
            gen_s += time.perf_counter() - t
            t = time.perf_counter()
            scores = self.score(rollouts)
            reward_s += time.perf_counter() - t
            if cfg.algo.drop_zero_std_groups:
                last = rollouts, scores
                keep = (~zero_std_groups(scores.total, G)).nonzero()[:, 0].tolist()
                rollouts, scores = rollouts.select_groups(keep), select_groups(scores, keep, G)
            kept_r.append(rollouts)
            kept_s.append(scores)
            if not cfg.algo.drop_zero_std_groups or self.dist.all(sum(len(r.prompts) for r in kept_r) >= P_rank):
                break  # resampling: the ranks stop together (one round otherwise, and no collective)
        rollouts = Rollouts.concat(kept_r, self.tokenizer.pad_token_id)
        scores = concat_scores(kept_s)
        if cfg.algo.drop_zero_std_groups and not rollouts.prompts:  # nothing informative in any round: the last
            # round's groups, whose advantages are all 0 (so the metrics and samples still describe what was drawn)
            rollouts, scores = last
        if len(rollouts.prompts) > P_rank:
            keep = list(range(P_rank))
            rollouts, scores = rollouts.select_groups(keep), select_groups(scores, keep, G)
        return rollouts, scores, gen_s, reward_s

    def generate(self, prompts, G: int, step: int, round_: int, per_step_generators: bool = False) -> Rollouts:
        """Sample G completions per prompt. rollout.seed_per_prompt: one generator per prompt, seeded by
        (train.seed, step, round, uid), so the rollouts do not depend on batching or the world size; several
        processes or per_step_generators: one generator per (step, round, rank); otherwise the global RNG."""
        d, seed = self.dist, self.cfg.train.seed
        with generation(self.policy, d):  # FSDP: weights gathered once, decoding without collectives
            if self.cfg.rollout.seed_per_prompt:  # one call; each group draws from its own generator
                gen = [d.step_generator(seed, step, round_, p.uid, self.device) for p in prompts]
            else:
                gen = d.step_generator(seed, step, round_, device=self.device) \
                    if d.enabled or per_step_generators else None
            # no environment: one turn, exactly sampler.generate
            return run_episodes(self.sampler, prompts, G, self.env_factory, generator=gen, **env_limits(self.cfg))

    def score(self, rollouts: Rollouts) -> RewardResult:
        """The reward of every completion (N,), from the rewards runner and, for episodes, the environment."""
        G = rollouts.group_size
        columns: dict[str, list] = {"answer": [p.answer for p in rollouts.prompts for _ in range(G)]}
        for key in rollouts.prompts[0].meta if rollouts.prompts else []:
            columns[key] = [p.meta.get(key) for p in rollouts.prompts for _ in range(G)]
        prompts = [p.text for p in rollouts.prompts for _ in range(G)]
        columns |= episode_columns(rollouts)  # episodes: the transcript as `messages`; final policy turn scored
        return apply_env_rewards(self.rewards(prompts, rollouts.texts, columns), rollouts)


class SyncRollouts:
    """rollout.mode=sync: each step samples its batch with the current policy, in this process."""

    def __init__(self, producer: BatchProducer):
        self.producer = producer

    def next(self, step: int) -> ScoredBatch:
        rollouts, scores, gen_s, reward_s = self.producer.produce(step)
        release_freed_memory()  # generation's KV cache and logits: their pages go back before the update
        return ScoredBatch(rollouts, scores, gen_s, reward_s, policy_version=step)

    def sync_weights(self, policy, version: int) -> None:
        """After an optimizer step: the engine samples from the new weights (vLLM; native decodes with `policy`)."""
        self.producer.sampler.sync_weights(policy)

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def behaviour_logprobs(scored: ScoredBatch, mask: torch.Tensor) -> torch.Tensor:
    """(N, T) pi_old of a batch sampled by an older policy: the log-probs of the policy that sampled it (the
    sampler's own, or those of its full distribution when rollout.top_p < 1), 0 where `mask` is 0."""
    return masked_to(scored.behaviour_logp if scored.behaviour_logp is not None else scored.rollouts.logp, mask)


def masked_to(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T') log-probs of the sampled tokens -> (N, T) on the batch's device, 0 where `mask` is 0. The batch may be
    wider than the samples (several processes pad every rank's batch to the widest rank's completions:
    parallel.align_batch); the padding is masked."""
    logp = torch.nn.functional.pad(logp, (0, mask.shape[1] - logp.shape[1]))
    return logp.to(mask.device, mask.dtype) * mask


def resolve_reward_specs(cfg, task, reward_functions) -> list:
    """(name, fn, weight) of each reward (grpo.rewards.specs): the given functions, else reward.functions, else
    the task's own; reward.weights replaces the weights."""
    if reward_functions is not None:
        specs = reward_specs(reward_functions)
    elif cfg.reward.functions is not None:
        specs = reward_specs(cfg.reward.functions)  # 'my_rewards.py:accuracy' logs as 'accuracy'
    else:
        specs = list(task.reward_functions())
    if cfg.reward.weights is not None:
        if len(cfg.reward.weights) != len(specs):
            raise ConfigError(f"reward.weights has {len(cfg.reward.weights)} entries for {len(specs)} "
                              f"reward functions {[s[0] for s in specs]}")
        specs = [(s[0], s[1], w, *s[3:]) for s, w in zip(specs, cfg.reward.weights)]
    return specs


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
