"""The data contract between the pipeline stages.

Shape letters used everywhere: P prompts, G group size (completions per prompt), N = P*G completions,
T completion tokens (padded), L prompt tokens (padded), V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Prompt:
    """One training or evaluation problem.

    uid: stable identifier; groups are keyed by it, never by text (duplicate prompts stay separate groups).
    text: the prompt as the model sees it (after any chat template).
    answer: the reference answer, given only to reward functions, never to the policy.
    meta: the data set row's other columns, passed to reward functions as keyword arguments.
    """

    uid: str
    text: str
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rollouts:
    """G sampled completions for each of P prompts, in prompt-major order (row i belongs to prompt i // G).

    prompt_ids: (P, L) left-padded prompt tokens; prompt_mask: (P, L) 1 where a real token.
    completion_ids: (N, T) right-padded sampled tokens (EOS included when sampled); completion_mask: (N, T).
    logp: (N, T) log-probabilities of the sampled tokens under the sampling policy (temperature applied
        as sampled; 0 at padding). Kept for diagnostics; the trainer recomputes pi_old when mu > 1.
    truncated: (N,) bool, True when the completion hit max_new_tokens without EOS.
    texts: N decoded completions (without EOS / padding).
    """

    prompts: list[Prompt]
    group_size: int
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logp: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]

    @property
    def num_completions(self) -> int:
        return self.completion_ids.shape[0]

    def prompt_of(self, i: int) -> Prompt:
        return self.prompts[i // self.group_size]
