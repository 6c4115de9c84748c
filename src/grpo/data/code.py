"""The built-in code task: write a Python function from two of its values, checked by test cases in the sandbox.

    prompt       "Write f(x) with f(3) = 11 and f(4) = 14.\\n"
    completion   "```python\\ndef f(x):\\n    return (14 - 11) * (x - 3) + 11\\n```"

The hidden function is linear, f(x) = a*x + b. The completion's last ```python block is checked by the
`code_tests` reward against four assertions `assert f(x) == y`: the two values in the prompt and two the prompt
does not show (f(0) and f(9)), so a program that hard-codes the examples fails. The assertions are in the form
code_tests judges outside the sandbox (grpo.sandbox.checks): the sandbox evaluates only the calls `f(x)` and
returns plain values; the expected `y` never enters it, and `==` runs in the trainer's process on those values.
No program code runs in the trainer's process: the program is untrusted model output.

Rewards (summed with weights):
  tests   1.0 if the program passes every assertion, else 0.0        (code_tests: run in the sandbox, judged outside)
  format  1.0 if the completion is exactly one ```python block defining f(x), else 0.0   (weight 0.1)

The built-in model's warm-up shows two correct styles (probability `worked_frac` for the first):
  worked  "return (14 - 11) * (x - 3) + 11"   (let the program do the arithmetic: copy the numbers)
  direct  "return 3 * x + 2"                  (do the subtraction in the head)
so, as in the arithmetic task, GRPO has a better strategy to discover among the model's own samples.

Splits never overlap: each problem (a, b, x0) is hashed (SHA-1) into one of 10 buckets; bucket 0 is held out.
"""

from __future__ import annotations

import hashlib
import random
import re

from grpo.data.base import register_task
from grpo.errors import ConfigError
from grpo.types import Prompt

# difficulty -> (slopes a, intercepts b, first shown x)
LEVELS: dict[str, tuple[range, range, range]] = {
    "easy": (range(1, 10), range(0, 31), range(0, 1)),
    "default": (range(-9, 10), range(-30, 31), range(0, 5)),
    "hard": (range(-19, 20), range(-99, 100), range(0, 10)),
}
HIDDEN_POINTS = (0, 9)  # test inputs the prompt does not show

_FORMAT = re.compile(r"^```python\ndef f\(x\):\n    return [^\n]+\n```$")


def _bucket(a: int, b: int, x0: int) -> int:
    return hashlib.sha1(f"code:{a}:{b}:{x0}".encode()).digest()[0] % 10


def _linear(a: int, b: int) -> str:
    """'3 * x + 2', '-3 * x - 2', 'x', '7' in the form a person would write."""
    if a == 0:
        return str(b)
    head = "x" if a == 1 else "-x" if a == -1 else f"{a} * x"
    return head if b == 0 else f"{head} {'+' if b > 0 else '-'} {abs(b)}"


def _fenced(body: str) -> str:
    return f"```python\ndef f(x):\n    return {body}\n```"


def format_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the completion is exactly one ```python block with `def f(x):` and a one-line return."""
    return [float(bool(_FORMAT.match(_text(c).strip()))) for c in completions]


format_reward.in_process = True  # a regex: nothing to kill


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


class CodeTask:
    name = "code"

    def __init__(self, difficulty: str = "default", seed: int = 1234, worked_frac: float = 0.35,
                 timeout: float = 5.0, memory_mb: int = 512):
        if difficulty not in LEVELS:
            raise ConfigError(f"data.difficulty for code must be one of {sorted(LEVELS)}, got {difficulty!r}")
        self.difficulty = difficulty
        self.seed = seed
        self.worked_frac = worked_frac
        self.timeout = timeout
        self.memory_mb = memory_mb
        self._splits: dict[str, list[Prompt]] = {}

    def _problems(self, split: str) -> list[Prompt]:
        if split not in self._splits:
            slopes, intercepts, starts = LEVELS[self.difficulty]
            keys = sorted((a, b, x0) for a in slopes if a != 0 for b in intercepts for x0 in starts
                          if (_bucket(a, b, x0) == 0) == (split == "test"))
            random.Random(f"{self.seed}-code-{self.difficulty}-{split}").shuffle(keys)
            self._splits[split] = [self._prompt(f"{split}-{i}", a, b, x0) for i, (a, b, x0) in enumerate(keys)]
        return self._splits[split]

    @staticmethod
    def _prompt(uid: str, a: int, b: int, x0: int) -> Prompt:
        y0, y1 = a * x0 + b, a * (x0 + 1) + b
        points = [x0, x0 + 1, *HIDDEN_POINTS]
        tests = [f"assert f({x}) == {a * x + b}" for x in points]
        return Prompt(uid=uid, text=f"Write f(x) with f({x0}) = {y0} and f({x0 + 1}) = {y1}.\n",
                      answer=_linear(a, b), meta={"tests": tests, "a": a, "b": b, "x0": x0})

    def split(self, name: str, n: int) -> list[Prompt]:
        if name not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {name!r}")
        problems = self._problems(name)
        if len(problems) < n and name == "test":
            raise ValueError(f"code/{self.difficulty} has only {len(problems)} held-out problems, fewer than "
                             f"eval.n={n}")
        return problems[:n]

    def reward_functions(self):
        from functools import partial, update_wrapper

        from grpo.rewards.code_exec import code_tests

        # the programs are arithmetic on one argument: the standard library is all they need, and it starts faster
        tests = update_wrapper(partial(code_tests, timeout=self.timeout, memory_mb=self.memory_mb,
                                       site_packages=False), code_tests)
        return [("tests", tests, 1.0), ("format", format_reward, 0.1)]

    def is_correct_batch(self, prompts: list[Prompt], completions: list[str]) -> list[bool]:
        """Every test passes (the programs run concurrently in the sandbox and are judged outside it)."""
        from grpo.rewards.code_exec import code_tests

        scores = code_tests([p.text for p in prompts], completions, [p.meta["tests"] for p in prompts],
                            timeout=self.timeout, memory_mb=self.memory_mb, site_packages=False)
        return [s is not None and s >= 1.0 for s in scores]

    def is_correct(self, prompt: Prompt, completion: str) -> bool:
        return self.is_correct_batch([prompt], [completion])[0]

    def demonstration(self, prompt: Prompt, rng: random.Random | None = None) -> str:
        m = prompt.meta
        if (rng or random).random() < self.worked_frac:
            y0, y1, x0 = m["a"] * m["x0"] + m["b"], m["a"] * (m["x0"] + 1) + m["b"], m["x0"]
            shift = "x" if x0 == 0 else f"(x - {x0})"
            return _fenced(f"({y1} - {y0}) * {shift} + {y0}")  # numbers copied verbatim, signs included
        return _fenced(_linear(m["a"], m["b"]))


register_task("code")(CodeTask)
