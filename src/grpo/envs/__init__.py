"""Environments: multi-turn episodes in which the model acts, an environment answers (a tool result, a game
state, feedback), and the episode ends with a reward. See base.py for the contract."""

from grpo.envs.base import Environment, EnvReply

__all__ = ["Environment", "EnvReply"]
