"""The trainer's side of multi-turn episodes (grpo.rollout.episodes): which environment a task has, the transcript
column and the environment's rewards for scoring, and the env/ metrics.

A task has an environment when it defines `environment_factory(tokenizer) -> EnvironmentFactory | None` (the
built-in `tools` task does; grpo.envs.base has the contract). Without one, rollouts are single-turn.
"""

from __future__ import annotations

import torch

from grpo.rollout.episodes import episode_messages


def task_environment(task, tokenizer):
    """The task's EnvironmentFactory for `tokenizer`, or None for a single-turn task."""
    make = getattr(task, "environment_factory", None)
    return make(tokenizer) if callable(make) else None


def env_limits(cfg) -> dict:
    """run_episodes' keyword limits from cfg.env."""
    return {"max_turns": cfg.env.max_turns, "max_tokens": cfg.env.max_tokens, "step_workers": cfg.env.step_workers}


def episode_columns(rollouts) -> dict[str, list]:
    """{'messages': each episode's transcript as chat messages} for the reward functions (none for single-turn)."""
    if rollouts.episodes is None:
        return {}
    G = rollouts.group_size
    return {"messages": [None if e is None else episode_messages(rollouts.prompts[i // G], e)
                         for i, e in enumerate(rollouts.episodes)]}


def apply_env_rewards(scores, rollouts):
    """Episodes whose environment ended them with a reward get that reward as their total (and are not missing)."""
    if rollouts.episodes is None:
        return scores
    rows = [i for i, e in enumerate(rollouts.episodes) if e is not None and e.get("env_reward") is not None]
    if rows:
        idx = torch.tensor(rows, dtype=torch.long)
        values = torch.tensor([float(rollouts.episodes[i]["env_reward"]) for i in rows], dtype=scores.total.dtype)
        scores.total[idx] = values
        scores.missing[idx] = False
    return scores


def env_metrics(rollouts) -> dict[str, float]:
    """env/turns_mean (policy turns per episode), env/tool_calls_mean (per episode), env/tool_errors_frac (failed
    calls / calls; an environment that raised counts as one failed call), env/truncated_frac; plus
    env/tool_use_frac (episodes with at least one call). Empty for single-turn rollouts."""
    eps = [e for e in (rollouts.episodes or []) if e is not None]
    if not eps:
        return {}
    n = len(eps)
    calls = sum(e["tool_calls"] for e in eps)
    errors = sum(e["tool_errors"] for e in eps)
    return {"env/turns_mean": sum(sum(t["role"] == "policy" for t in e["turns"]) for e in eps) / n,
            "env/tool_calls_mean": calls / n,
            "env/tool_errors_frac": errors / max(calls, errors, 1),
            "env/truncated_frac": sum(bool(e["truncated"]) for e in eps) / n,
            "env/tool_use_frac": sum(e["tool_calls"] > 0 for e in eps) / n}
