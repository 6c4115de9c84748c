"""The built-in tool task `tools`: products of a 3-digit and a 2-digit number, with a `calculator` tool.

    What is 347 × 56?                                   the prompt (plain text, as the arithmetic task's)
    <call>calculator("347*56")</call><eos>              a policy turn calling the tool (grpo.envs.tools, tag format)
    <result>19432</result>\n                            the environment's reply (no loss)
    19432<eos>                                          the final policy turn, scored: correct = its last integer
or, answering directly (the arithmetic task's direct style):
    Let me think... 19432<eos>

The built-in model cannot multiply such numbers in its head (its direct answers are almost never right), so the
reward says that calling pays. Its warm-up (grpo.warmup) mixes the two styles: with probability `call_frac`
(0.3) a demonstration calls the calculator and copies the result; otherwise it answers directly with the right
product. Both styles start with a fixed text ("<call>", "Let me think"), so the warm model calls in about a third
of its samples and answers directly when greedy (the likelier first token); GRPO
has to find out from the rewards that calling is what pays (docs/tasks.md "Tools and multi-turn episodes").

Splits never overlap: each (a, b) is hashed into one of 10 buckets, bucket 0 held out (as the arithmetic task).
"""

from __future__ import annotations

import hashlib
import random

from grpo.data.arithmetic import correct_reward
from grpo.data.base import register_task
from grpo.errors import ConfigError
from grpo.types import Prompt

A_RANGE, B_RANGE = (100, 999), (10, 99)


def _bucket(a: int, b: int) -> int:
    return hashlib.sha1(f"{a}×{b}".encode()).digest()[0] % 10


class ToolsTask:
    name = "tools"
    # the warm-up starts from the shipped arithmetic model (it already reads "What is a × b?" and copies operands),
    # not from random weights: a shorter warm-up (grpo.warmup.build_warm_model)
    warm_start = "arithmetic"

    def __init__(self, difficulty: str = "default", seed: int = 1234, call_frac: float = 0.3):
        if difficulty != "default":
            raise ConfigError(f"data.difficulty for tools must be 'default', got {difficulty!r}")
        if not 0.0 <= call_frac <= 1.0:
            raise ValueError(f"call_frac must be in [0, 1], got {call_frac!r}")
        self.difficulty, self.seed, self.call_frac = difficulty, seed, call_frac
        self._cache: dict[str, list[Prompt]] = {}

    def split(self, name: str, n: int) -> list[Prompt]:
        if name not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {name!r}")
        if len(self._cache.get(name, [])) < n:
            want_test = name == "test"
            keys = [(a, b) for a in range(A_RANGE[0], A_RANGE[1] + 1) for b in range(B_RANGE[0], B_RANGE[1] + 1)
                    if (_bucket(a, b) == 0) == want_test]
            random.Random(f"{self.seed}-tools-{name}").shuffle(keys)
            if len(keys) < n:
                raise ValueError(f"tools has only {len(keys)} {name} problems, fewer than the {n} asked for")
            self._cache[name] = [Prompt(uid=f"{name}-{i}", text=f"What is {a} × {b}?\n", answer=str(a * b),
                                        meta={"a": a, "op": "×", "b": b}) for i, (a, b) in enumerate(keys[:n])]
        return self._cache[name][:n]

    def reward_functions(self):
        return [("correct", correct_reward, 1.0)]

    def is_correct(self, prompt: Prompt, completion: str) -> bool:
        return correct_reward(None, [completion], [prompt.answer])[0] == 1.0

    def environment_factory(self, tokenizer):
        """One ToolEnvironment with the calculator per episode, in the tokenizer's call format."""
        from grpo.envs.calculator import calculator
        from grpo.envs.tools import ToolEnvironment, call_format_for

        fmt = call_format_for(tokenizer)
        return lambda prompt: ToolEnvironment([calculator], fmt)

    def demonstration(self, prompt: Prompt, rng: random.Random | None = None):
        """A correct episode as [(role, text)]: 'policy' turns (trained on, EOS appended) and environment turns
        (role 'tool', tokenized as the rollout appends them, no loss). With probability call_frac it calls the
        calculator, else it answers directly."""
        a, b = prompt.meta["a"], prompt.meta["b"]
        if (rng or random).random() < self.call_frac:
            return [("policy", f'<call>calculator("{a}*{b}")</call>'), ("tool", f"<result>{a * b}</result>\n"),
                    ("policy", str(a * b))]
        return [("policy", f"Let me think... {a * b}")]


register_task("tools")(ToolsTask)
