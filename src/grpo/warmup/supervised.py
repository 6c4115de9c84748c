"""Supervised warm-up that creates the built-in model: next-token loss on the completion tokens of the
task's demonstrations, training split only. No supervised loss ever runs during the RL phase.

The warm models of the default settings ship with the package (grpo/models/weights/<task>/, made by this code
with warmup.seed=0: `grpo warmup --task arithmetic --output src/grpo/models/weights/arithmetic`), so `grpo train`
starts RL from the same weights on every machine. Any other warmup.* / data.* setting runs the warm-up once and
caches the result (grpo.models.builtin). This module owns the optimizer; grpo.models only loads directories.
"""

from __future__ import annotations

import logging
import math
import random
from pathlib import Path

import torch

from grpo.models.forward import position_ids_from_mask
from grpo.tokens import prompt_token_ids

log = logging.getLogger("grpo.warmup")


def demonstration_batch(tokenizer, task, prompts, rng=None):
    """Left-padded (B, S) ids/mask of prompt + demonstration + EOS, and labels (-100 except completion tokens)."""
    rows = []
    for p, prompt in zip(prompts, prompt_token_ids(tokenizer, prompts)):  # as the sampler feeds them in RL
        ids, labels = demonstration_ids(tokenizer, p, task.demonstration(p, rng))
        rows.append((prompt + ids, [-100] * len(prompt) + labels))
    S = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), S), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), S), dtype=torch.long)
    labels = torch.full((len(rows), S), -100, dtype=torch.long)
    for i, (seq, lab) in enumerate(rows):
        ids[i, S - len(seq):] = torch.tensor(seq)
        mask[i, S - len(seq):] = 1
        labels[i, S - len(seq):] = torch.tensor(lab)
    return ids, mask, labels


def demonstration_ids(tokenizer, prompt, demo) -> tuple[list[int], list[int]]:
    """(ids, labels) of a demonstration after its prompt. A string is one policy turn; a list of (role, text) is an
    episode (tasks with an environment): 'policy' turns are trained on, each ending with EOS; any other role is an
    environment message, tokenized as the rollout appends it (grpo.envs.chat) and not trained on (-100)."""
    from grpo.envs.chat import env_message_ids

    eos = tokenizer.eos_token_id
    ids: list[int] = []
    labels: list[int] = []
    for role, text in ([("policy", demo)] if isinstance(demo, str) else demo):
        if role == "policy":
            turn = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
            ids, labels = ids + turn, labels + turn
        else:
            turn = env_message_ids(tokenizer, text, role, prompt.templated, True)
            ids, labels = ids + turn, labels + [-100] * len(turn)
    return ids, labels


def warm_up(model, tokenizer, task, *, steps: int, batch_size: int, lr: float, seed: int, train_size: int,
            on_step=None) -> list[float]:
    """Train `model` in place for `steps` AdamW steps (cosine LR); returns the loss curve.
    `on_step(step, loss)` is called after every step (progress)."""
    prompts = task.split("train", train_size)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / max(steps, 1)))
    )
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask, labels = demonstration_batch(tokenizer, task, rng.sample(prompts, batch_size), rng)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(len(losses), losses[-1])
    return losses


def build_warm_model(cfg, task, out_dir: Path, console=None) -> None:
    """Create, warm up and save the built-in model into `out_dir` (save_pretrained format); progress with an ETA
    on `console` (a rich Console; None: silent)."""
    from grpo.data import get_task
    from grpo.models.builtin import build_model, build_tokenizer
    from grpo.tracking.progress import Phase

    task = task or get_task(cfg.data.task, difficulty=cfg.data.difficulty)
    tokenizer = build_tokenizer()
    start = getattr(task, "warm_start", None)  # a task may start from another task's shipped warm model
    model = shipped_task_model(start) if start else build_model(tokenizer, seed=cfg.warmup.seed)
    w = cfg.warmup
    with Phase(f"warm-up of the built-in model ({task.name})", w.steps, "steps", console=console) as ph, \
            torch.random.fork_rng():
        torch.manual_seed(w.seed)
        losses = warm_up(model, tokenizer, task, steps=w.steps, batch_size=w.batch_size, lr=w.lr, seed=w.seed,
                         train_size=cfg.data.train_size, on_step=lambda i, loss: ph.update(i, info=f"loss {loss:.3f}"))
    if losses:
        log.info("warm-up: loss %.3f -> %.3f over %d steps", losses[0], losses[-1], len(losses))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def shipped_task_model(name: str):
    """The shipped warm model of built-in task `name` (grpo/models/weights/<name>), its weights checked against the
    sha256 its recipe records (ValueError naming the directory when they differ or it is missing)."""
    from transformers import AutoModelForCausalLM

    from grpo.models.builtin import SHIPPED_DIR, read_recipe, sha256_file

    path = SHIPPED_DIR / name
    recipe = read_recipe(path)
    weights = path / "model.safetensors"
    if recipe is None or not weights.is_file() or sha256_file(weights) != recipe.get("sha256"):
        raise ValueError(f"the shipped warm model {path} (the warm-up's starting point) is missing or does not match "
                         "its recorded sha256")
    return AutoModelForCausalLM.from_pretrained(path)


def warm_task(cfg, task=None):
    """The task the built-in model is warmed up on: `task` when it has demonstrations, else (a data set file)
    the built-in data.task."""
    from grpo.data import get_task

    if task is not None and getattr(task, "has_demonstrations", True):
        return task
    return get_task(cfg.data.task, difficulty=cfg.data.difficulty)


def policy_directory(cfg, task=None, console=None) -> tuple[Path, str]:
    """(model directory, where it came from) for model.name: for the built-in model 'shipped' (the package's
    weights), 'cache' or 'warm-up' (built now); for a user's model 'directory'."""
    from grpo.models.loading import model_directory

    if cfg.model.name != "builtin:tiny":
        return model_directory(cfg), "directory"
    built = []

    def build(path: Path) -> None:
        if console is not None:
            console.print(f"[grpo] building the built-in model: supervised warm-up, {cfg.warmup.steps} steps (once; "
                          "then cached). The default settings need none: their warm model ships with grpo",
                          soft_wrap=True, markup=False, highlight=False)
        build_warm_model(cfg, warm_task(cfg, task), path, console=console)
        built.append(path)

    path = model_directory(cfg, build=build)
    from grpo.models.builtin import SHIPPED_DIR

    source = "warm-up" if built else "shipped" if SHIPPED_DIR in path.parents else "cache"
    return path, source
