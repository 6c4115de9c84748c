"""What one Trainer.step() returns and the run loop logs: its own module so that the loop (train/loop.py) needs
nothing from the trainer but this type, and the trainer's `train()` can call the loop without an import circle."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.rewards.runner import RewardResult
from grpo.types import Rollouts


@dataclass
class StepResult:
    """What one `Trainer.step()` did; the loop logs it (metrics.jsonl, samples.jsonl, the guards).

    rollouts: the `Rollouts` trained on (P groups of G, N = P*G completions; this process's share).
    scores: their `RewardResult` (total (N,), NaN = missing; per_function; metrics).
    advantages: (N,) group advantages, or (N, T) per token for PPO (GAE).
    metrics: the step's floats (the job's, the same on every rank with several processes).
    """

    rollouts: Rollouts
    scores: RewardResult
    advantages: torch.Tensor
    metrics: dict[str, float]
