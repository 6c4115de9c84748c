"""Samplers: generate(prompts, n) -> Rollouts. They never compute rewards or advantages."""

from grpo.rollout.sampler import Sampler, encode_prompts

__all__ = ["Sampler", "encode_prompts"]
