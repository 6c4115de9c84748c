"""The contract of a rollout engine: what the trainer needs from whatever generates its completions.

`native` is grpo.rollout.Sampler (our KV-cached decoder, shared prompt per group); `vllm` is a vLLM engine in the
trainer's process (rollout.engine=vllm). Both return `Rollouts` whose `logp` are the engine's own log-probs of
the tokens it sampled (the trainer compares them with its own: `rollout/logp_diff`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from grpo.types import Prompt, Rollouts


class RolloutEngine(Protocol):
    def generate(self, prompts: list[Prompt], n: int, *,
                 generator: torch.Generator | list[torch.Generator] | None = None,
                 temperature: float | None = None) -> Rollouts:
        """G = n samples for each of P prompts, prompt-major (row i belongs to prompt i // n)."""
        ...

    def generate_from_ids(self, contexts: list[list[int]], uniforms: torch.Tensor, *,
                          temperature: float | None = None) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Multi-turn episodes' later turns (grpo.rollout.episodes): continue B token contexts as they are by at
        most T = uniforms.shape[1] tokens, one sample each; uniforms (B, T) are the rows' draws (the native sampler
        samples with them, vLLM seeds each row from its first). Returns per context the new ids, their log-probs,
        and whether EOS ended it. Both engines have it."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from `model`'s current weights (called after every optimizer step). The native
        sampler decodes with the training model itself, so it has nothing to do."""
        ...
