"""The built-in task: integer arithmetic in the seed's style ("What is 13 × 17?").

A completion is judged by two rewards, summed with weights (the seed's "correct answer +10, format +2"):
  correct  1.0 if the last integer in the completion equals the answer, else 0.0
  format   1.0 if the completion is exactly "<a> <op> <b> = <integer>", else 0.0   (weight 0.1)

Splits never overlap by construction: each problem (a, op, b) is hashed (SHA-1, stable across runs and
machines) into one of 10 buckets; bucket 0 is the held-out test split, the others are the training split.
Within a split the order is fixed by a seeded generator, so `split("test", 500)` is always the same 500.
"""

from __future__ import annotations

import hashlib
import random
import re

from grpo.data.base import register_task
from grpo.errors import ConfigError
from grpo.types import Prompt

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "×": lambda a, b: a * b}

# difficulty -> list of (op, a_range, b_range, weight)
LEVELS: dict[str, list[tuple[str, tuple[int, int], tuple[int, int], float]]] = {
    "easy": [("+", (0, 29), (0, 29), 1.0), ("-", (0, 29), (0, 29), 1.0)],
    "default": [("+", (0, 59), (0, 59), 1.0), ("-", (0, 59), (0, 59), 1.0)],
    "medium": [("+", (0, 99), (0, 99), 1.0), ("-", (0, 99), (0, 99), 1.0)],
    "hard": [("+", (10, 999), (10, 999), 1.0), ("-", (10, 999), (10, 999), 1.0), ("×", (2, 9), (10, 99), 1.0)],
    "seed": [("×", (10, 99), (10, 99), 1.0)],  # the seed's "What is 13 × 17?"
}

_INT = re.compile(r"-?\d+")
_FORMAT = re.compile(r"^\d+ [+\-×] \d+ = (-?\d+ [+-] \d+ = )?-?\d+$")


def _bucket(a: int, op: str, b: int) -> int:
    return hashlib.sha1(f"{a}{op}{b}".encode()).digest()[0] % 10


def worked_solution(a: int, op: str, b: int) -> str:
    """'47 + 38 = 70 + 15 = 85': tens and units combined separately, then summed (× keeps one step)."""
    if op == "×":
        return f"{a} × {b} = {a * b}"
    ta, ua, tb, ub = a - a % 10, a % 10, b - b % 10, b % 10
    tens, units = (ta + tb, ua + ub) if op == "+" else (ta - tb, ua - ub)
    sign = "+" if units >= 0 else "-"
    return f"{a} {op} {b} = {tens} {sign} {abs(units)} = {OPS[op](a, b)}"


def last_integer(text: str) -> int | None:
    found = _INT.findall(text)
    return int(found[-1]) if found else None


def correct_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the last integer of the completion equals the reference answer (TRL signature)."""
    return [float(last_integer(_text(c)) == int(a)) for c, a in zip(completions, answer)]


def format_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 when the completion is exactly '<a> <op> <b> = <n>' (the seed's 'good format')."""
    return [float(bool(_FORMAT.match(_text(c).strip()))) for c in completions]


# Pure and instant: run inside the trainer's process rather than in a killable child (no fork per step).
correct_reward.in_process = True
format_reward.in_process = True


def _text(completion) -> str:
    # Conversational completions (lists of messages) carry the text in the last message's content.
    return completion[-1]["content"] if isinstance(completion, list) else completion


class ArithmeticTask:
    name = "arithmetic"

    def __init__(self, difficulty: str = "default", seed: int = 1234, worked_frac: float = 0.35):
        if difficulty not in LEVELS:
            raise ConfigError(f"data.difficulty for arithmetic must be one of {sorted(LEVELS)}, got {difficulty!r}")
        self.difficulty = difficulty
        self.seed = seed
        self.worked_frac = worked_frac
        self._cache: dict[str, list[Prompt]] = {}
        self._cached_n: dict[str, int] = {}

    def _space_size(self) -> int:
        return sum((ahi - alo + 1) * (bhi - blo + 1) for _, (alo, ahi), (blo, bhi), _ in LEVELS[self.difficulty])

    def _all_problems(self, rng: random.Random, want_test: bool) -> list[tuple[int, str, int]]:
        """Every distinct problem of the level in this split, shuffled (used when the space is small)."""
        keys = {
            (max(a, b), op, min(a, b)) if op == "-" else (a, op, b)
            for op, (alo, ahi), (blo, bhi), _ in LEVELS[self.difficulty]
            for a in range(alo, ahi + 1) for b in range(blo, bhi + 1)
        }
        keys = sorted(k for k in keys if (_bucket(*k) == 0) == want_test)
        rng.shuffle(keys)
        return keys

    def _sampled_problems(self, rng: random.Random, want_test: bool, n: int) -> list[tuple[int, str, int]]:
        kinds = LEVELS[self.difficulty]
        weights = [k[3] for k in kinds]
        seen: dict[tuple[int, str, int], None] = {}
        while len(seen) < n:
            op, (alo, ahi), (blo, bhi), _ = rng.choices(kinds, weights)[0]
            a, b = rng.randint(alo, ahi), rng.randint(blo, bhi)
            if op == "-" and b > a:
                a, b = b, a  # keep answers non-negative
            if (_bucket(a, op, b) == 0) == want_test:
                seen.setdefault((a, op, b))
        return list(seen)

    def _generate(self, split: str, n: int) -> list[Prompt]:
        want_test = split == "test"
        rng = random.Random(f"{self.seed}-{self.difficulty}-{split}")
        if self._space_size() <= 20 * n or self._space_size() <= 400_000:
            keys = self._all_problems(rng, want_test)
        else:
            keys = self._sampled_problems(rng, want_test, n)
        if len(keys) < n and want_test:
            raise ValueError(
                f"arithmetic/{self.difficulty} has only {len(keys)} held-out problems, fewer than eval.n={n}"
            )
        return [
            Prompt(uid=f"{split}-{i}", text=f"What is {a} {op} {b}?\n", answer=str(OPS[op](a, b)),
                   meta={"a": a, "op": op, "b": b})
            for i, (a, op, b) in enumerate(keys[:n])
        ]

    def split(self, name: str, n: int) -> list[Prompt]:
        if name not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {name!r}")
        if self._cached_n.get(name, -1) < n:  # generation is prefix-stable: a longer list extends a shorter one
            self._cache[name] = self._generate(name, n)
            self._cached_n[name] = n
        return self._cache[name][:n]

    def reward_functions(self):
        return [("correct", correct_reward, 1.0), ("format", format_reward, 0.1)]

    def is_correct(self, prompt: Prompt, completion: str) -> bool:
        return last_integer(completion) == int(prompt.answer)

    def demonstration(self, prompt: Prompt, rng: random.Random | None = None) -> str:
        """A correct completion in one of two styles, drawn with probability `worked_frac` for the first:
        worked  "47 + 38 = 70 + 15 = 85"   (tens and units first: the seed's well-formatted answer)
        direct  "Let me think... 85"        (the seed's "correct but poorly formatted" answer)"""
        m = prompt.meta
        if (rng or random).random() < self.worked_frac:
            return worked_solution(m["a"], m["op"], m["b"])
        return f"Let me think... {prompt.answer}"


register_task("arithmetic")(ArithmeticTask)
