"""Reward functions (TRL signature), their registry, the runner (weights, timeouts, isolation) and the code sandbox.

    from grpo.rewards import RewardRunner, get_reward_function
    runner = RewardRunner([("exact_answer", get_reward_function("exact_answer"), 1.0),
                           ("format", get_reward_function("format_tags"), 0.1)], timeout_s=10.0)
    res = runner(prompts, completions, {"answer": answers})   # res.total (N,), NaN where missing

See docs/rewards.md for the protocol, the failure semantics, the built-ins and what the sandbox covers.
"""

# Importing the built-ins registers them (none of them imports transformers or math-verify at import time).
from grpo.rewards.answers import countdown, exact_answer, math_verify
from grpo.rewards.base import (
    REWARD_FUNCTIONS,
    RewardFunctionError,
    RewardValues,
    UnknownRewardFunction,
    completion_text,
    get_reward_function,
    prompt_text,
    register_reward,
)
from grpo.rewards.code_exec import code_tests
from grpo.rewards.formatting import format_tags, overlong_reward, regex_format
from grpo.rewards.reward_model import RewardModel
from grpo.rewards.runner import RewardResult, RewardRunner, RewardSpec

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunctionError",
    "RewardValues",
    "UnknownRewardFunction",
    "RewardResult",
    "RewardRunner",
    "RewardSpec",
    "RewardModel",
    "get_reward_function",
    "register_reward",
    "completion_text",
    "prompt_text",
    "exact_answer",
    "math_verify",
    "countdown",
    "format_tags",
    "regex_format",
    "overlong_reward",
    "code_tests",
]
