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
    templated: True when `text` came out of a chat template, which wrote the model's special tokens (BOS) itself:
        it is tokenized without adding them again; plain text gets them as `tokenizer(text)` adds them
        (grpo.tokens holds the rule).
    where: where the row is in its data file, as an editor shows it ("train.jsonl line 42"), for messages; None
        for built-in tasks.
    """

    uid: str
    text: str
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    templated: bool = False
    where: str | None = None


@dataclass
class Rollouts:
    """G sampled completions for each of P prompts, in prompt-major order (row i belongs to prompt i // G).

    prompt_ids: (P, L) left-padded prompt tokens; prompt_mask: (P, L) 1 where a real token.
    completion_ids: (N, T) right-padded sampled tokens (EOS included when sampled); completion_mask: (N, T).
    logp: (N, T) log-probabilities of the sampled tokens under the sampling policy (temperature applied
        as sampled; 0 at padding). Kept for diagnostics; the trainer recomputes pi_old when mu > 1.
    truncated: (N,) bool, True when the completion hit max_new_tokens without EOS.
    texts: N decoded completions (without EOS / padding); of an episode, its final policy turn.
    loss_mask: (N, T) or None: 1 at the policy's own tokens of multi-turn episodes (environment tokens are attended,
        completion_mask, but carry no loss and no KL); None means completion_mask (grpo.rollout.episodes).
    episodes: N per-episode records (turns with their role and text, tool calls/errors, the environment's reward,
        how it ended) or None for single-turn rollouts.
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
    loss_mask: torch.Tensor | None = None
    episodes: list[dict] | None = None

    @property
    def num_completions(self) -> int:
        return self.completion_ids.shape[0]

    def prompt_of(self, i: int) -> Prompt:
        return self.prompts[i // self.group_size]

    def select_groups(self, groups: list[int]) -> "Rollouts":
        """The rollouts of the given prompt indices (whole groups), in that order."""
        G = self.group_size
        rows = [g * G + j for g in groups for j in range(G)]
        idx = torch.tensor(rows, dtype=torch.long, device=self.completion_ids.device)
        gidx = torch.tensor(groups, dtype=torch.long, device=self.prompt_ids.device)
        return Rollouts(
            prompts=[self.prompts[g] for g in groups], group_size=G, prompt_ids=self.prompt_ids[gidx],
            prompt_mask=self.prompt_mask[gidx], completion_ids=self.completion_ids[idx],
            completion_mask=self.completion_mask[idx], logp=self.logp[idx], truncated=self.truncated[idx],
            texts=[self.texts[i] for i in rows],
            loss_mask=None if self.loss_mask is None else self.loss_mask[idx],
            episodes=None if self.episodes is None else [self.episodes[i] for i in rows],
        )

    @staticmethod
    def concat(parts: list["Rollouts"], pad_id: int) -> "Rollouts":
        """Join rollouts of several generation rounds (left-padding prompts, right-padding completions)."""
        if len(parts) == 1:
            return parts[0]
        L = max(p.prompt_ids.shape[1] for p in parts)
        T = max(p.completion_ids.shape[1] for p in parts)

        def left(x, width, value):
            return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

        def right(x, width, value):
            return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

        return Rollouts(
            prompts=[q for p in parts for q in p.prompts], group_size=parts[0].group_size,
            prompt_ids=torch.cat([left(p.prompt_ids, L, pad_id) for p in parts]),
            prompt_mask=torch.cat([left(p.prompt_mask, L, 0) for p in parts]),
            completion_ids=torch.cat([right(p.completion_ids, T, pad_id) for p in parts]),
            completion_mask=torch.cat([right(p.completion_mask, T, 0) for p in parts]),
            logp=torch.cat([right(p.logp, T, 0.0) for p in parts]),
            truncated=torch.cat([p.truncated for p in parts]),
            texts=[t for p in parts for t in p.texts],
            loss_mask=None if all(p.loss_mask is None for p in parts) else torch.cat(
                [right(p.completion_mask if p.loss_mask is None else p.loss_mask, T, 0) for p in parts]),
            episodes=None if all(p.episodes is None for p in parts) else [
                e for p in parts for e in (p.episodes or [None] * p.num_completions)],
        )
