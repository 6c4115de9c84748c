"""reasoning-gym's procedural tasks: `data.task=reasoning_gym:<name>` (pip install 'grpo[gym]').

Each of reasoning-gym's generators (`reasoning_gym.create_dataset(name, seed=, size=, **options)`) gives entries
{question, answer, metadata}, and scores an answer with its own `score_answer(answer, entry)` (a float in [0, 1]).

Prompts are built the way reasoning-gym's own training examples build them: its system prompt
(`reasoning_gym.utils.SYSTEM_PROMPTS[data.task_system_prompt]`, "default" asks for the answer in <answer> tags)
and the entry's question as the user's message, through the model's chat template where it has one
(grpo.envs.render). The reward `reasoning_gym` is `score_answer(extract_answer(completion), entry)`:
reasoning-gym's own answer extraction (the last <answer>...</answer>) and its own scorer. Held-out accuracy counts
an answer correct when it scores 1.

Splits never overlap: the held-out split is the first data.test_size distinct questions drawn from seeds of its
own (derived from data.task_seed and "test"); the training split is drawn from other seeds and skips every
question of the held-out pool (questions compared as text), so a question is in one split at most. Entries come in
chunks of CHUNK indices, each chunk a generator instance with its own derived seed (some generators precompute
`size` items), so `split(name, n)` is a prefix of `split(name, m)` for n < m. Generating costs what the generator
costs: most take well under a millisecond an entry, a few (countdown, sudoku) about 30 ms, so give those a
data.train_size near what the run draws (train.steps x rollout.prompts_per_step).
"""

from __future__ import annotations

import difflib
import hashlib
from typing import Any

from grpo.errors import ConfigError, MissingExtraError
from grpo.types import Prompt

PREFIX = "reasoning_gym:"
CHUNK = 500  # entries per generator instance (reasoning-gym's own default size)
MAX_EMPTY_CHUNKS = 20  # chunks in a row that add no new question: the generator's space is exhausted


def _rg():
    try:
        import reasoning_gym
        import reasoning_gym.utils
    except ImportError as e:
        raise MissingExtraError("data.task=reasoning_gym:<name> needs the reasoning-gym package: "
                                "pip install 'grpo[gym]'") from e
    return reasoning_gym


def dataset_names() -> list[str]:
    """The names reasoning-gym registers (each usable as data.task=reasoning_gym:<name>)."""
    from reasoning_gym.factory import DATASETS

    _rg()
    return sorted(DATASETS)


def _chunk_seed(seed: int, split: str, k: int) -> int:
    return int.from_bytes(hashlib.sha1(f"{seed}-{split}-{k}".encode()).digest()[:4], "big")


class ReasoningGymTask:
    """One reasoning-gym generator as a grpo task (grpo.data.base.Task)."""

    has_demonstrations = False  # no worked solutions: the built-in model cannot be warmed up on it

    def __init__(self, dataset: str, *, options: dict[str, Any] | None = None, seed: int = 0, test_size: int = 500,
                 system_prompt: str | None = "default", tokenizer=None, tokenizer_loader=None):
        rg = _rg()
        names = dataset_names()
        if dataset not in names:
            close = difflib.get_close_matches(dataset, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"data.task: reasoning-gym has no task {dataset!r}{hint} ({len(names)} tasks: "
                              f"python -c 'from grpo.data.reasoning_gym import dataset_names; print(dataset_names())')")
        self.dataset, self.name = dataset, PREFIX + dataset
        self.options = dict(options or {})
        for key in ("seed", "size"):
            if key in self.options:
                instead = "data.task_seed" if key == "seed" else "data.train_size / data.test_size"
                raise ConfigError(f"data.task_options.{key}: set {instead} instead (the splits derive their "
                                  "generators' seeds and sizes from them)")
        self.seed, self.test_size = seed, test_size
        self.system_prompt = self._system_prompt(rg, system_prompt)
        self._tokenizer, self._tokenizer_loader = tokenizer, tokenizer_loader
        self._generators: dict[tuple[str, int], Any] = {}
        self._entries: dict[str, list[dict]] = {"train": [], "test": []}
        self._next: dict[str, tuple[int, int]] = {"train": (0, 0), "test": (0, 0)}  # (chunk, index in chunk)
        self._seen: dict[str, set[str]] = {"train": set(), "test": set()}
        self._prompts: dict[str, list[Prompt]] = {"train": [], "test": []}
        self._scorer = self._generator("test", 0)  # score_answer's instance; bad options fail here, naming them

    @staticmethod
    def _system_prompt(rg, choice: str | None) -> str | None:
        if choice is None or choice == "":
            return None
        return rg.utils.SYSTEM_PROMPTS.get(choice, choice)  # a name of reasoning-gym's prompts, else the text

    # ------------------------------------------------------------------ entries
    def _generator(self, split: str, k: int):
        key = (split, k)
        if key not in self._generators:
            rg = _rg()
            try:
                self._generators[key] = rg.create_dataset(self.dataset, seed=_chunk_seed(self.seed, split, k),
                                                          size=CHUNK, **self.options)
            except (TypeError, ValueError, AssertionError) as e:
                raise ConfigError(f"data.task_options for reasoning_gym:{self.dataset}: {e}") from e
            if len(self._generators) > 4:  # keep the latest few: some generators hold precomputed items
                self._generators.pop(next(iter(self._generators)))
        return self._generators[key]

    def _fill(self, split: str, n: int) -> None:
        """Extend the split's entries to n distinct questions (train: none of the held-out pool's)."""
        entries, seen = self._entries[split], self._seen[split]
        banned = self._seen["test"] if split == "train" else set()
        if split == "train":
            self._fill("test", self.test_size)
        chunk, idx = self._next[split]
        empty = 0
        while len(entries) < n and empty < MAX_EMPTY_CHUNKS:
            gen, before = self._generator(split, chunk), len(entries)
            while idx < CHUNK and len(entries) < n:
                entry = gen[idx]
                idx += 1
                q = entry["question"]
                if q not in seen and q not in banned:
                    seen.add(q)
                    entries.append(entry)
            if idx >= CHUNK:
                chunk, idx = chunk + 1, 0
                empty = empty + 1 if len(entries) == before else 0
        self._next[split] = (chunk, idx)

    def entry(self, split: str, index: int) -> dict:
        """The reasoning-gym entry behind prompt `index` of `split`."""
        self._fill(split, index + 1)
        return self._entries[split][index]

    # ------------------------------------------------------------------ the Task protocol
    def split(self, name: str, n: int) -> list[Prompt]:
        if name not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {name!r}")
        if name == "test" and n > self.test_size:
            raise ConfigError(f"eval.n={n} is more than the held-out pool of reasoning_gym:{self.dataset} "
                              f"(data.test_size={self.test_size}); raise data.test_size or lower eval.n")
        self._fill(name, n)
        entries = self._entries[name]
        if name == "test" and len(entries) < n:
            raise ConfigError(f"reasoning_gym:{self.dataset} gave only {len(entries)} distinct held-out questions, "
                              f"fewer than {n}; lower eval.n / data.test_size or widen data.task_options")
        if not entries:
            raise ConfigError(f"reasoning_gym:{self.dataset} gave no training question outside the held-out pool; "
                              "lower data.test_size or widen data.task_options")
        prompts = self._prompts[name]
        for i in range(len(prompts), min(n, len(entries))):
            prompts.append(self._prompt(name, i, entries[i]))
        return prompts[:n]

    def _prompt(self, split: str, i: int, entry: dict) -> Prompt:
        from grpo.envs.render import render_messages

        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        messages.append({"role": "user", "content": entry["question"]})
        text, templated = render_messages(self.tokenizer, messages, where=f"{split} prompt '{split}-{i}'")
        return Prompt(uid=f"{split}-{i}", text=text, answer=str(entry["answer"]),
                      meta={"rg_split": split, "rg_index": i}, templated=templated)

    @property
    def tokenizer(self):
        if self._tokenizer is None and self._tokenizer_loader is not None:
            self._tokenizer = self._tokenizer_loader()
        return self._tokenizer

    def score(self, split: str, index: int, completion: str) -> float:
        """reasoning-gym's score of a completion: score_answer(extract_answer(completion), entry), in [0, 1]."""
        from reasoning_gym.utils import extract_answer

        entry = self.entry(split, index)
        return float(self._scorer.score_answer(extract_answer(completion), entry))

    def reward_functions(self):
        task = self

        def reasoning_gym(prompts, completions, rg_split, rg_index, **columns) -> list[float]:
            """reasoning-gym's own scorer on the answer in <answer> tags (TRL signature)."""
            return [task.score(s, int(i), _text(c)) for c, s, i in zip(completions, rg_split, rg_index)]

        reasoning_gym.__name__ = "reasoning_gym"
        return [("reasoning_gym", reasoning_gym, 1.0)]

    def is_correct(self, prompt: Prompt, completion: str) -> bool:
        return self.score(prompt.meta["rg_split"], int(prompt.meta["rg_index"]), completion) >= 1.0

    def demonstration(self, prompt: Prompt, rng=None) -> str:
        raise ConfigError(f"{self.name} has no demonstrations: the built-in model cannot be warmed up on it; "
                          "use model.name=<a local Hugging Face model directory>")


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def task_from_config(cfg, tokenizer=None, tokenizer_loader=None) -> ReasoningGymTask:
    """The reasoning-gym task of `data.task=reasoning_gym:<name>` with data.task_options / task_seed /
    task_system_prompt / test_size. The built-in model (a 128-position character model warmed up on arithmetic)
    cannot read these prompts: a ConfigError says to name a model directory."""
    name = cfg.data.task[len(PREFIX):]
    if not name:
        raise ConfigError("data.task=reasoning_gym:<name> needs a task name, e.g. reasoning_gym:basic_arithmetic")
    if cfg.model.name == "builtin:tiny":
        raise ConfigError(f"data.task={cfg.data.task}: the built-in model (128 positions, warmed up on arithmetic) "
                          "cannot read reasoning-gym prompts; use model.name=<a local Hugging Face model directory>")
    return ReasoningGymTask(name, options=cfg.data.task_options, seed=cfg.data.task_seed,
                            test_size=cfg.data.test_size, system_prompt=cfg.data.task_system_prompt,
                            tokenizer=tokenizer, tokenizer_loader=tokenizer_loader)
