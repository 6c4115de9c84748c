"""Checks of the prompts a run trains and evaluates on, done once before the first step (RELIABILITY.md
section 9, cases 12-14), so a bad row fails the run at start, naming itself, instead of at step 500.

    check_rows(train, test, reward_specs, cfg)      before the model loads: no rows, fewer rows than one step
                                                    (P), an empty prompt, a column a reward function needs
    check_prompt_chars(train, test, load_tok, cfg)  before the model loads, without tokenizing: prompts with more
                                                    characters than data.max_prompt_tokens tokens can hold
    check_lengths(train, test, tokenizer, cfg)      after the tokenizer loads: prompts over data.max_prompt_tokens

An error is a `DataError` naming the row (a data file's by the line an editor shows, e.g. `train.jsonl line 5`;
a generated task's by its uid) and the column. With `data.filter_long_prompts=true` empty and over-long prompts are
dropped instead, and the count is logged; a missing column is always an error (a reward function could not score
the row). A run that would draw each train prompt more than 1,000 times is warned about.
"""

from __future__ import annotations

import inspect
import logging

from grpo.config import ConfigError
from grpo.tokens import prompt_token_ids
from grpo.types import Prompt

log = logging.getLogger("grpo.data")

__all__ = ["DataError", "check_lengths", "check_prompt_chars", "check_rows", "max_token_chars", "required_columns"]


class DataError(ConfigError):
    """A data set row that cannot be trained on; the message names the split, the row and the column."""


def required_columns(fn) -> list[str]:
    """The keyword columns `fn(prompts, completions, **columns)` needs: its parameters without a default
    besides prompts and completions. Unknown signatures (builtins, C callables) need nothing."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in named and p.default is inspect.Parameter.empty
            and p.name not in ("prompts", "completions")]


def _row(split: str, p: Prompt) -> str:
    """A row named one way: a data file's by the line an editor shows ('train.jsonl line 5', 1-based, as every data
    message names it; its uid is 'train.jsonl:5'), a generated task's by its uid ("train prompt 'train-3'")."""
    return p.where if p.where else f"{split} prompt {p.uid!r}"


def _has(p: Prompt, column: str) -> bool:
    if column == "answer":
        return p.answer is not None
    if column == "prompt":
        return True
    return column in p.meta


def _drop(split: str, prompts: list[Prompt], bad: list[tuple[int, str]], what: str) -> list[Prompt]:
    """Prompts without the `bad` rows; logs the count and the first few rows."""
    if not bad:
        return prompts
    rows = {i for i, _ in bad}
    shown = ", ".join(f"{_row(split, prompts[i])} ({why})" for i, why in bad[:5]) + (" ..." if len(bad) > 5 else "")
    log.warning("data.filter_long_prompts: dropped %d of %d %s prompts (%s): %s", len(bad), len(prompts),
                split, what, shown)
    return [p for i, p in enumerate(prompts) if i not in rows]


def _enough(train: list[Prompt], test: list[Prompt], cfg, after: str) -> None:
    P = cfg.rollout.prompts_per_step
    if not train:
        raise DataError(f"the train split has no prompts{after}: nothing to train on")
    if len(train) < P:
        raise DataError(f"the train split has {len(train)} prompts{after}, fewer than one step's "
                        f"rollout.prompts_per_step={P}; a step would repeat prompts")
    if not test:
        raise DataError(f"the test split has no prompts{after}: nothing to evaluate on")


def check_rows(train: list[Prompt], test: list[Prompt], reward_specs, cfg) -> tuple[list[Prompt], list[Prompt]]:
    """Checks that need no tokenizer. Returns (train, test), without empty prompts when filtering is on.

    reward_specs: (name, fn, weight) tuples; every column a function needs must be in every train row
    (`answer` or a `meta` key). Raises DataError naming the first bad row and column.
    """
    _enough(train, test, cfg, "")
    needs = {}
    for name, fn, *_ in reward_specs:
        for column in required_columns(fn):
            needs.setdefault(column, name)
    for i, p in enumerate(train):
        missing = [c for c in needs if not _has(p, c)]
        if missing:
            raise DataError(f"{_row('train', p)} has no column {missing[0]!r}, which reward function "
                            f"{needs[missing[0]]!r} needs (columns it has: "
                            f"{['prompt'] + (['answer'] if p.answer is not None else []) + sorted(p.meta)})")
    out = []
    for split, prompts in (("train", train), ("test", test)):
        empty = [(i, "empty") for i, p in enumerate(prompts) if not p.text or not p.text.strip()]
        if empty and not cfg.data.filter_long_prompts:
            i = empty[0][0]
            raise DataError(f"{_row(split, prompts[i])}: column 'prompt' is empty ({len(empty)} such rows); "
                            "fix the data or set data.filter_long_prompts=true to drop them")
        out.append(_drop(split, prompts, empty, "empty"))
    _enough(out[0], out[1], cfg, " after dropping empty prompts")
    _warn_passes(out[0], cfg)
    return out[0], out[1]


MAX_PASSES = 1000  # passes over the train prompts past which a run is warned about (train.steps' description)


def _warn_passes(train: list[Prompt], cfg) -> None:
    """A warning when train.steps x rollout.prompts_per_step draws each train prompt more than MAX_PASSES times:
    more steps than the data can hold (the model would learn the prompts by heart long before the end)."""
    steps, P = cfg.train.steps, cfg.rollout.prompts_per_step
    passes = steps * P / len(train)
    if passes > MAX_PASSES:
        log.warning("train.steps=%d x rollout.prompts_per_step=%d draws each of the %d train prompts about %.3g "
                    "times, more than %d passes over the data: lower train.steps or give more data", steps, P,
                    len(train), passes, MAX_PASSES)


def max_token_chars(tokenizer) -> int:
    """The most characters of text one token of `tokenizer` stands for: its longest vocabulary entry (added tokens
    included). Byte-level and sentencepiece entries spell each character with one symbol or more (WordPiece adds
    '##'), so a text of more than limit x this many characters has more than `limit` tokens. (A normalizer that
    deletes characters, as T5's collapses spaces, would break this; causal LM tokenizers keep every character.)"""
    return max(1, max(map(len, tokenizer.get_vocab()), default=1))


def check_prompt_chars(train: list[Prompt], test: list[Prompt], tokenizer_loader, cfg
                       ) -> tuple[list[Prompt], list[Prompt]]:
    """Prompts too long on their characters alone, found without tokenizing them (a 20 MB row took a minute to
    tokenize): more than data.max_prompt_tokens x max_token_chars characters. DataError naming the row, or
    dropped with data.filter_long_prompts=true. `tokenizer_loader()` is called only when some prompt has more
    characters than the limit itself (no prompt at or under it can be over limit x max_token_chars)."""
    limit = cfg.data.max_prompt_tokens
    if all(len(p.text) <= limit for p in (*train, *test)):
        return train, test
    per_token = max_token_chars(tokenizer_loader())
    out = []
    for split, prompts in (("train", train), ("test", test)):
        bad = [(i, f"{len(p.text)} characters") for i, p in enumerate(prompts) if len(p.text) > limit * per_token]
        if bad and not cfg.data.filter_long_prompts:
            i = bad[0][0]
            raise DataError(f"{_row(split, prompts[i])}: column 'prompt' has {bad[0][1]}, more than "
                            f"data.max_prompt_tokens={limit} tokens can hold (a token of this tokenizer stands for "
                            f"at most {per_token} characters; {len(bad)} such rows in {split}); shorten the "
                            "prompts, raise data.max_prompt_tokens or set data.filter_long_prompts=true")
        out.append(_drop(split, prompts, bad, f"over data.max_prompt_tokens={limit} on their characters"))
    _enough(out[0], out[1], cfg, f" after dropping prompts over data.max_prompt_tokens={limit}")
    return out[0], out[1]


def check_lengths(train: list[Prompt], test: list[Prompt], tokenizer, cfg) -> tuple[list[Prompt], list[Prompt]]:
    """Prompts over `data.max_prompt_tokens` tokens: DataError naming the row, or dropped with a count."""
    limit, out = cfg.data.max_prompt_tokens, []
    for split, prompts in (("train", train), ("test", test)):
        ids = prompt_token_ids(tokenizer, prompts) if prompts else []  # as the sampler will feed them
        bad = [(i, f"{len(x)} tokens") for i, x in enumerate(ids) if len(x) > limit or not x]
        if bad and not cfg.data.filter_long_prompts:
            i = bad[0][0]
            raise DataError(f"{_row(split, prompts[i])}: column 'prompt' has {bad[0][1]}, outside 1.."
                            f"data.max_prompt_tokens={limit} ({len(bad)} such rows in {split}); shorten the "
                            "prompts, raise data.max_prompt_tokens or set data.filter_long_prompts=true")
        out.append(_drop(split, prompts, bad, f"over data.max_prompt_tokens={limit} or empty after tokenisation"))
    _enough(out[0], out[1], cfg, f" after dropping prompts over data.max_prompt_tokens={limit}")
    return out[0], out[1]
