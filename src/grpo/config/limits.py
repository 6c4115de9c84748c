"""The bounds a setting's values keep, beside the sections that use them (schema.py): every int's largest value
and the stop strings' shape. `grpo train --list-keys` shows each int's bound."""

from __future__ import annotations

from typing import Any

# Every number a setting holds is finite (`optim.lr=inf` was accepted, and the run blamed the weights on disk for
# what the learning rate did in memory), and every int is a count a run can mean: at most MAX_COUNT, or the field's
# own bound in COUNT_LIMITS (`train.steps=1e22` was accepted). `grpo train --list-keys` shows each int's bound.
MAX_COUNT = 10**9
MAX_STEPS = 10**8
MAX_SEED = 2**32 - 1
COUNT_LIMITS: dict[str, tuple[int, str]] = {  # "section.key": (the largest value, why)
    **{k: (MAX_STEPS, "10^8 steps take 3 years at one step a second") for k in (
        "train.steps", "train.save_every", "train.eval_every", "train.max_nan_steps", "train.zero_spread_steps",
        "eval.test_every", "optim.warmup_steps", "warmup.steps", "reward.max_missing_steps",
        "log.print_group_every")},
    **{k: (MAX_SEED, "a seed is a 32-bit number") for k in ("train.seed", "warmup.seed", "data.task_seed")},
    **{k: (4096, "more threads than a machine has cores") for k in ("rollout.worker_threads", "env.step_workers")},
    "rollout.max_staleness": (1000, "each step of lag holds a batch in memory"),
    "algo.epochs": (1000, "updates of one batch: the step would not end"),
    "algo.max_resample_batches": (1000, "generation rounds of one step: the step would not end"),
    "model.lora_rank": (65536, "wider than any model"),
}
SMALLEST_LIMIT = min(limit for limit, _ in COUNT_LIMITS.values())


def count_limit(key: str) -> int:
    """The largest value of the int setting `key` ("section.key"); -limit is its lowest (a field's own `ge`
    comes first)."""
    return COUNT_LIMITS.get(key, (MAX_COUNT, ""))[0]


MAX_STOP_STRINGS, MAX_STOP_CHARS = 32, 64  # rollout.stop: each string is searched for at every sampled token


def stop_strings(v: Any) -> list[str]:
    """rollout.stop as given (None, one string, a list) -> the list of stop strings; ValueError naming what cannot
    be meant (an empty string, too many, too long, a shell's backslash-n, YAML's `Question:` read as a mapping)."""
    if v is None:
        return []
    if isinstance(v, str):  # one string: a list of it, as vLLM takes it
        v = [v]
    if isinstance(v, dict) and len(v) == 1 and None in v.values():  # rollout.stop=Question: read as a mapping
        key = next(iter(v))
        raise ValueError(f"YAML read {key}: as a mapping; quote it: rollout.stop='[\"{key}:\"]'")
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
        raise ValueError(f"must be a list of strings, e.g. [\"\\n\"], got {v!r}")
    if len(v) > MAX_STOP_STRINGS:
        raise ValueError(f"has {len(v)} strings, at most {MAX_STOP_STRINGS}: each one is searched in every "
                         "row's newest text at every sampled token")
    for k, s in enumerate(v):
        if not s:
            raise ValueError(f"rollout.stop[{k}] is empty: it would end every completion before its first token")
        if "\\n" in s or "\\t" in s:  # rollout.stop=\n from a shell: a backslash and an n, not a newline
            raise ValueError(f"rollout.stop[{k}] = {s!r} holds a backslash and a letter, not a newline or tab: "
                             "write it in YAML double quotes, rollout.stop='[\"\\n\"]'")
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"rollout.stop[{k}] has {len(s)} characters, at most {MAX_STOP_CHARS}")
    return list(v)
