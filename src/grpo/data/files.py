"""Data set files as a Task: a local JSONL, JSON or CSV file (read with the standard library, grpo.data.tables:
part of the core install), a Parquet or compressed file, a directory saved with `Dataset.save_to_disk`, or a
`datasets` Hub name where the machine has a network (these need the `datasets` extra: pip install 'grpo[data]').

    grpo train model.name=./my-model data.path=train.jsonl reward.functions=[exact_answer]

Columns (mapped with data.prompt_column / data.answer_column):
    prompt   a list of {"role", "content"} messages (a conversation), rendered with the model's chat template
             (`add_generation_prompt=True`), so `Prompt.text` is exactly what the model sees; or text, which
             data.plain_prompts decides: `template` renders it as one user message with the chat template,
             `raw` uses it as is (TRL's convention for plain text), `auto` (default) is `template` when the
             tokenizer says its template is how it reads plain prompts (the built-in model's does:
             "What is 20 + 9?" becomes "What is 20 + 9?\n", the prompt format it was warmed up on), else `raw`
    answer   the reference answer, given to the rewards as `answer` (and under its own name when the column is
             called something else, for TRL-style reward functions that expect, say, `solution`); null = none
    others   `Prompt.meta`, given to the rewards as keyword arguments (TRL convention)

Held-out rows: `data.test_path` (another file), `data.test_split` (a Hub split), or a hash split: a row is held
out when the SHA-1 of its prompt falls in the first `data.test_fraction` of the hash range. Identical prompts
hash alike, so the two splits never share a prompt, and the split does not depend on row order or machine. With
a test file, train rows whose prompt is also in the test file are dropped (logged).

Validated at load, before any model is loaded (RELIABILITY.md section 9): a missing column is a DataFileError (a
ConfigError, so a ValueError) naming the column, the file and the columns it has; an empty prompt or answer, or a
malformed conversation or a message role no chat template knows (`sytem`), names the file and the line an editor
shows (the row, counted from 1, for Parquet and Hub data). With `data.filter_long_prompts=true` empty prompts are
kept as "" for `grpo.data.validate` to drop and count. Rewards are required (`reward.functions`): a file has no
default reward. Held-out accuracy is "the first reward function gives its maximum" (`fn.max_reward`, default 1.0,
which every built-in reward gives a correct answer).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo.data.file_checks import COMPRESSED_SUFFIXES, check_file, compression_of, explain_failure
from grpo.errors import DataFileError
from grpo.rewards.base import failure_words
from grpo.rewards.specs import reward_specs
from grpo.tokens import apply_chat_template
from grpo.types import Prompt

log = logging.getLogger("grpo.data")

__all__ = ["DataFileError", "FileTask", "hash_fraction", "read_table"]


BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "csv"}
# plain (uncompressed) .jsonl/.json/.csv/.tsv are read by grpo.data.tables (no extra); the others by `datasets`
RESERVED = ("prompts", "completions")  # the reward functions' positional arguments
ROLES = ("system", "user", "assistant", "tool", "developer")  # OpenAI's and the chat templates' message roles


def read_table(path: str, *, subset: str | None = None, split: str = "train"):
    """(rows, source name) for a local file, a saved data set directory, or a Hub name; rows is a
    grpo.data.tables.Table for a plain JSONL/JSON/CSV file (no extra needed), else a datasets.Dataset."""
    from grpo.data.tables import PLAIN_SUFFIXES, read_plain

    p = Path(path).expanduser()
    if p.is_file():
        suffix = _data_suffix(p)
        builder = BUILDERS.get(suffix)
        if builder is None:
            raise DataFileError(f"data.path={path!r}: unknown file type {suffix!r}; use one of {sorted(BUILDERS)} "
                                f"(optionally compressed: {', '.join(COMPRESSED_SUFFIXES)})")
        shown = str(path)
        check_file(p, builder, shown)  # empty, not UTF-8, cut-off or mixed-type rows: named by line (file_checks)
        if suffix in PLAIN_SUFFIXES and compression_of(p) is None:
            return read_plain(p, shown), p.name
    elif not p.exists() and (p.suffix.lower() in BUILDERS or path.startswith((".", "/", "~"))):
        raise DataFileError(f"data.path={path!r} does not exist")
    datasets = _datasets(path, p)
    if p.is_file():  # Parquet, or a compressed file
        kwargs = {"delimiter": "\t"} if suffix == ".tsv" else {}
        try:
            with _quiet(datasets):
                ds = datasets.load_dataset(builder, data_files=str(p), split="train", **kwargs)
        except Exception as e:
            raise explain_failure(p, builder, shown, e) from e
        return ds, p.name
    if p.is_dir():
        try:
            ds = datasets.load_from_disk(str(p))
        except Exception as e:
            raise DataFileError(f"data.path={path!r} is a directory but not a data set saved with save_to_disk: {e}") \
                from e
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataFileError(f"data.path={path!r} has splits {sorted(ds)}; data.split={split!r} is not one")
            ds = ds[split]
        return ds, p.name
    if p.suffix.lower() in BUILDERS or path.startswith((".", "/", "~")):
        raise DataFileError(f"data.path={path!r} does not exist")
    online = _hub_answers()  # offline, `datasets` retries for half a minute: read only its cache then
    try:
        with _quiet(datasets), _hub_offline(datasets, not online):
            ds = datasets.load_dataset(path, subset, split=split)
    except Exception as e:
        why = "failed" if online else \
            f"is not in the local cache, and the Hub does not answer (within {HUB_PROBE_S:.0f} s)"
        raise DataFileError(f"data.path={path!r} is not a local file, and loading it as a `datasets` Hub data set "
                            f"(subset {subset!r}, split {split!r}) {why}: {type(e).__name__}: {e}") from e
    return ds, path


HUB_PROBE_S = 3.0


def _hub_answers() -> bool:
    """Whether the Hub's endpoint (HF_ENDPOINT) accepts a connection within HUB_PROBE_S; False when offline mode
    is set."""
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(flag, "0") not in ("", "0") for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=HUB_PROBE_S).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _hub_offline(datasets, offline: bool):
    """`datasets` in offline mode (its cache only) while the block runs, when `offline`."""
    before = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = before or offline
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = before


def _datasets(path: str, p: Path):
    """The `datasets` module, or a DataFileError saying which install reads this kind of data."""
    try:
        import datasets
    except ImportError:
        what = "a Parquet or compressed file" if p.is_file() else \
            "a saved data set directory" if p.is_dir() else "a Hub data set"
        raise DataFileError(f"data.path={path!r}: reading {what} needs the `datasets` package: "
                            "pip install 'grpo[data]' (plain JSONL, JSON and CSV files need nothing more)") from None
    return datasets


def _data_suffix(p: Path) -> str:
    """'.jsonl' for x.jsonl and x.jsonl.gz: the data format's suffix under a compression suffix."""
    suffixes = [x.lower() for x in p.suffixes]
    if len(suffixes) >= 2 and suffixes[-1] in COMPRESSED_SUFFIXES:
        return suffixes[-2]
    return p.suffix.lower()


class _quiet:
    """Silence the `datasets` progress bars and log while reading a file."""

    def __init__(self, datasets):
        self.utils = datasets.utils.logging

    def __enter__(self):
        self.was, self.verbosity = self.utils.is_progress_bar_enabled(), self.utils.get_verbosity()
        self.utils.disable_progress_bar()
        self.utils.set_verbosity(logging.CRITICAL)  # its "Failed to read file" lines: our error says it once

    def __exit__(self, *exc):
        self.utils.set_verbosity(self.verbosity)
        if self.was:
            self.utils.enable_progress_bar()


def hash_fraction(value: Any) -> float:
    """A stable number in [0, 1) for a prompt value (text or messages): its SHA-1, scaled."""
    key = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big") / 2**64


class FileTask:
    """Prompts, answers and extra columns of a data set file; see the module docstring."""

    name = "file"
    has_demonstrations = False  # the built-in model's warm-up uses the built-in task instead

    def __init__(self, path: str, *, reward_functions, prompt_column: str = "prompt",
                 answer_column: str | None = "answer", test_path: str | None = None, test_fraction: float = 0.1,
                 subset: str | None = None, split: str = "train", test_split: str | None = None,
                 tokenizer=None, tokenizer_loader: Callable[[], Any] | None = None, keep_empty: bool = False,
                 plain_prompts: str = "auto", reward_limits: dict | None = None):
        if plain_prompts not in ("auto", "template", "raw"):
            raise DataFileError(f"data.plain_prompts must be auto, template or raw, got {plain_prompts!r}")
        self.path, self.prompt_column, self.answer_column = path, prompt_column, answer_column
        self.plain_prompts = plain_prompts
        self.auto_templated = False  # data.plain_prompts=auto put a plain prompt through the chat template
        self.keep_empty = keep_empty
        self.reward_limits = dict(reward_limits or {})  # RewardRunner's timeout_s, max_abs, max_failure_frac
        self._judge_logged: set = set()  # failures the judge logged: each traceback once, not once per evaluation
        self.judge_counts = {"completions": 0, "error": 0, "timeout": 0, "invalid": 0}  # over every judged batch
        self._where: dict[str, str] = {}  # uid -> "file line N", for messages
        self._tokenizer, self._tokenizer_loader = tokenizer, tokenizer_loader
        self._specs = _reward_specs(reward_functions)
        self._judge = self._specs[0]
        train, source = read_table(path, subset=subset, split=split)
        self._rows = {"train": self._read(train, source)}
        if test_path is not None:
            test, test_source = read_table(test_path, subset=subset, split=split)
            self._rows["test"] = self._read(test, test_source)
            self._drop_overlap()
        elif test_split is not None:
            test, test_source = read_table(path, subset=subset, split=test_split)
            self._rows["test"] = self._read(test, f"{test_source}[{test_split}]")
            self._drop_overlap()
        else:
            rows = self._rows["train"]
            held = [hash_fraction(r[1]) < test_fraction for r in rows]
            self._rows = {"train": [r for r, h in zip(rows, held) if not h],
                          "test": [r for r, h in zip(rows, held) if h]}
        for split_name, rows in self._rows.items():
            if not rows:
                raise DataFileError(f"data.path={path!r}: the {split_name} split has no rows"
                                 + ("" if test_path or test_split else
                                    f" (data.test_fraction={test_fraction} of {len(train)} rows); raise "
                                    "data.test_fraction or give data.test_path"))
        self._cache: dict[str, list[Prompt]] = {}

    @classmethod
    def from_config(cls, cfg, reward_functions=None, tokenizer=None, tokenizer_loader=None) -> FileTask:
        """The task of `data.path`. The tokenizer of model.name renders chat templates: `tokenizer`, or
        `tokenizer_loader()` called when first needed (data/ never loads a model: the caller knows how; the Trainer
        passes grpo.models.loading.model_tokenizer)."""
        d = cfg.data
        rewards = reward_functions if reward_functions is not None else cfg.reward.functions
        if not rewards:
            raise DataFileError(f"data.path={d.path!r} needs reward.functions: a data set file has no default reward "
                             "(e.g. reward.functions=[exact_answer])")
        return cls(d.path, reward_functions=rewards, prompt_column=d.prompt_column, answer_column=d.answer_column,
                   test_path=d.test_path, test_fraction=d.test_fraction, subset=d.subset, split=d.split,
                   test_split=d.test_split, tokenizer=tokenizer, tokenizer_loader=tokenizer_loader,
                   keep_empty=getattr(d, "filter_long_prompts", False), plain_prompts=d.plain_prompts,
                   reward_limits={"timeout_s": cfg.reward.timeout_s, "max_abs": cfg.reward.max_abs,
                                  "max_failure_frac": cfg.reward.max_failure_frac})

    # ------------------------------------------------------------------ reading and validation
    def _read(self, ds, source: str) -> list[tuple[str, Any, Any, dict]]:
        """[(uid, prompt value, answer, meta)] of every row, validated."""
        columns = list(ds.column_names)
        wanted = [self.prompt_column] + ([self.answer_column] if self.answer_column else [])
        for col, key in zip(wanted, ("data.prompt_column", "data.answer_column")):
            if col not in columns:
                raise DataFileError(f"{source}: no column {col!r} ({key}); its columns are {columns}: name yours, "
                                    f"e.g. {key}={_likely_column(columns, key, wanted)}")
        others = [c for c in columns if c not in wanted]
        for c in others:
            if c in RESERVED or c == "answer":
                raise DataFileError(f"{source}: column {c!r} would clash with the reward functions' `{c}` argument; "
                                 "rename it" + (" or map it with data.answer_column=answer" if c == "answer" else ""))
        extra = others + ([self.answer_column] if self.answer_column not in (None, "answer") else [])
        out = []
        lines = getattr(ds, "lines", None)  # a plain file's line of each row (grpo.data.tables); else row numbers
        for i, row in enumerate(ds):
            where = f"{source} line {lines[i]}" if lines else f"{source} row {i + 1}"  # as an editor / a viewer counts
            prompt = _prompt_value(row[self.prompt_column], where, self.prompt_column, self.keep_empty)
            answer = None
            if self.answer_column:
                answer = row[self.answer_column]
                if answer is None or (isinstance(answer, str) and not answer.strip()):
                    raise DataFileError(f"{where}: column {self.answer_column!r} (the answer) is empty; fix the row, "
                                     "or set data.answer_column=null if the rewards need no answer")
                answer = str(answer) if isinstance(answer, (int, float)) else answer
            uid = f"{source}:{lines[i] if lines else i + 1}"  # file:line, the same number as `where`
            out.append((uid, prompt, answer, {c: row[c] for c in extra}))
            self._where[uid] = where
        return out

    def _drop_overlap(self) -> None:
        held = {json.dumps(r[1], sort_keys=True, ensure_ascii=False) for r in self._rows["test"]}
        train = self._rows["train"]
        kept = [r for r in train if json.dumps(r[1], sort_keys=True, ensure_ascii=False) not in held]
        if len(kept) < len(train):
            log.warning("%s: dropped %d train rows whose prompt is also a held-out prompt", self.path,
                        len(train) - len(kept))
        self._rows["train"] = kept

    # ------------------------------------------------------------------ the Task protocol
    def split(self, name: str, n: int) -> list[Prompt]:
        """The first n rows of split `name` ('train' or 'test') in file order (fewer when the file is smaller)."""
        if name not in self._rows:
            raise DataFileError(f"split must be 'train' or 'test', got {name!r}")
        done = self._cache.setdefault(name, [])
        for uid, prompt, answer, meta in self._rows[name][len(done):n]:
            where = self._where.get(uid, uid)
            done.append(Prompt(uid=uid, text=self.render(prompt, where), answer=answer, meta=meta,
                               templated=self._templated(prompt, where),  # a template wrote its special tokens
                               where=self._where.get(uid)))
        return done[:n]

    def render(self, prompt, where: str = "") -> str:
        """A conversation through the tokenizer's chat template, ending with the assistant's turn; text as one user
        message through the template or as is (data.plain_prompts). Errors name the row as `where` (file line N)."""
        if isinstance(prompt, str):
            if not self._template_plain_text(where):
                return prompt
            prompt = [{"role": "user", "content": prompt}]
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            raise DataFileError(f"{where}: the prompt is a conversation (a list of messages) but the tokenizer of "
                             "model.name has no chat_template; give plain-text prompts or a model with a template")
        return apply_chat_template(tok, prompt, where, add_generation_prompt=True)

    def _template_plain_text(self, where: str) -> bool:
        if self.plain_prompts == "raw":
            return False
        if self.plain_prompts == "template":
            if not getattr(self.tokenizer, "chat_template", None):
                raise DataFileError(f"{where}: data.plain_prompts=template but the tokenizer of model.name has no "
                                    "chat_template; use data.plain_prompts=raw or a model with a template")
            return True
        use = plain_prompts_use_template(self.tokenizer)
        self.auto_templated = self.auto_templated or use  # the trainer says so once (data.plain_prompts=raw: off)
        return use

    @property
    def tokenizer(self):
        if self._tokenizer is None and self._tokenizer_loader is not None:
            self._tokenizer = self._tokenizer_loader()
        return self._tokenizer

    def _templated(self, prompt, where: str = "") -> bool:
        """Whether render() put `prompt` through the chat template (then its text holds the special tokens, and
        grpo.tokens adds none): a conversation always; plain text when data.plain_prompts sends it there."""
        if not isinstance(prompt, str):
            return True
        via_template = getattr(self, "_template_plain_text", None)  # data.plain_prompts, where it exists
        return bool(via_template is not None and via_template(where))

    def reward_functions(self):
        """The rewards the task was built with (reward.functions), weight 1 each unless given."""
        return list(self._specs)

    def is_correct_batch(self, prompts: list[Prompt], completions: list[str]) -> list[bool]:
        """Whether the first reward function gives each completion its maximum (`fn.max_reward`, default 1),
        called through grpo.rewards.RewardRunner as training calls it: a sample on which it raises, returns NaN/inf
        or hangs past reward.timeout_s is missing (logged with the reason), so not correct; a wrong count or
        a non-number is a RewardOutputError naming the function. The count of samples it could not judge is
        logged (evaluation goes on whatever their share: reward.max_failure_frac is a training limit)."""
        from grpo.rewards.runner import RewardRunner

        name, fn, _weight, *options = self._judge
        keys = sorted({k for p in prompts for k in p.meta})
        columns = {"answer": [p.answer for p in prompts], **{k: [p.meta.get(k) for p in prompts] for k in keys}}
        limits = {**self.reward_limits, "max_failure_frac": 1.0}  # judging goes on: a failed sample is not correct
        with RewardRunner([(name, fn, 1.0, *options)], **limits, logged=self._judge_logged) as runner:
            res = runner([p.text for p in prompts], list(completions), columns)
        values, status = res.per_function[name].tolist(), res.status[name]
        failed = {c: status.count(c) for c in ("error", "timeout", "invalid") if status.count(c)}
        self.judge_counts["completions"] += len(values)
        for c, k in failed.items():
            self.judge_counts[c] += k
        if failed:
            log.warning("reward %r could not judge %d of %d held-out completions (%s); they count as not correct",
                        name, sum(failed.values()), len(values), failure_words(failed))
        top = float(getattr(fn, "max_reward", 1.0)) - 1e-9
        return [v == v and v >= top for v in values]  # v != v: NaN, the sample is missing

    def is_correct(self, prompt: Prompt, completion: str) -> bool:
        return self.is_correct_batch([prompt], [completion])[0]

    def unjudged(self) -> str | None:
        """When the judge (the first reward function) gave no value for any completion it was asked about (it
        raised, timed out or returned NaN/inf on every one): what to say instead of an accuracy of 0, which
        would not be a measurement; else None. `grpo eval` stops with it, as the preflight and training stop on a
        reward that never gives a value (training's evaluations go on: its reward guard stops the run)."""
        counts = dict(self.judge_counts)
        n = counts.pop("completions")
        if not n or sum(counts.values()) < n:
            return None
        return (f"reward {self._judge[0]!r} could not judge any of the {n} held-out completions "
                f"({failure_words({c: k for c, k in counts.items() if k})}; logged above): no accuracy was measured. "
                "Fix the function, or raise reward.timeout_s if it timed out")

    def demonstration(self, prompt: Prompt, rng=None) -> str:
        raise NotImplementedError("a data set file has no demonstrations (only the built-in model's warm-up "
                                  "uses them)")


PLAIN_PROMPTS_KEY = "grpo_plain_prompts"  # = grpo.models.builtin.PLAIN_PROMPTS_KEY (data/ does not import models/)


def plain_prompts_use_template(tokenizer) -> bool:
    """data.plain_prompts=auto: True when the tokenizer has a chat template. A question written as plain text is
    what a user asks an instruct model, which expects it as a user turn (a real instruct model answered nothing
    right given the raw text, 8% given the turn: issue #27); a model without a template (a base model) reads it as
    is. tokenizer_config.json's `grpo_plain_prompts: raw` keeps a model's plain text as is."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return False
    return getattr(tokenizer, "init_kwargs", {}).get(PLAIN_PROMPTS_KEY) != "raw"


def _prompt_value(value, where: str, column: str, keep_empty: bool):
    """The prompt column's value checked: non-empty text, or a non-empty list of {role, content} messages."""
    if value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value):
        if keep_empty:
            return ""
        raise DataFileError(f"{where}: column {column!r} (the prompt) is empty; fix the row or set "
                         "data.filter_long_prompts=true to drop such rows")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for j, m in enumerate(value, 1):  # counted as a reader counts: the first message is message 1
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise DataFileError(f"{where}: message {j} of column {column!r} is not a "
                                    f"{{'role': str, 'content': str}} mapping: {m!r}")
            if m["role"] not in ROLES:
                import difflib

                close = difflib.get_close_matches(m["role"], ROLES, 1)
                raise DataFileError(f"{where}: message {j} of column {column!r} has role {m['role']!r}"
                                    + (f" (did you mean {close[0]!r}?)" if close else "")
                                    + f"; a chat template knows the roles {', '.join(ROLES)}")
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DataFileError(f"{where}: column {column!r} must be text or a list of {{'role', 'content'}} messages, got "
                     f"{type(value).__name__}")


def _reward_specs(reward_functions) -> list[tuple]:
    """(name, fn, weight) of each reward (grpo.rewards.specs: a name, a function or a (name, fn[, weight]) tuple)."""
    if not reward_functions:
        raise DataFileError("a data set file needs reward functions (reward.functions)")
    return reward_specs(reward_functions)




# the column names data sets commonly use for a prompt and for its answer, most likely first
_COMMON_COLUMNS = {"data.prompt_column": ("question", "problem", "query", "input", "instruction", "prompt", "text"),
                   "data.answer_column": ("answer", "solution", "target", "output", "label", "ground_truth")}


def _likely_column(columns: list[str], key: str, taken: list[str]) -> str:
    """The column of `columns` a missing `key` most likely means (a common name for it, else the first column not
    mapped to the other key), for the error's example: ['question', 'solution'], data.prompt_column -> 'question'."""
    free = [c for c in columns if c not in taken] or list(columns) or ["<column>"]
    return next((c for name in _COMMON_COLUMNS[key] for c in free if c.lower() == name), free[0])
