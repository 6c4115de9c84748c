"""Load the policy (and, when needed, a frozen reference) from `model.name`: the built-in model or a local
Hugging Face directory. Devices and dtypes are resolved here and nowhere else."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch

from grpo.errors import ModelDirError

log = logging.getLogger("grpo.models")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def builtin_spec(cfg) -> dict:
    from grpo.models.builtin import TINY

    return {
        "version": 3,
        "size": TINY,
        "task": cfg.data.task,
        "difficulty": cfg.data.difficulty,
        "warmup": cfg.warmup.model_dump(),  # its seed included; train.seed is not: it seeds the RL only
    }


def model_directory(cfg, task=None, console=None) -> Path:
    """The directory holding the policy's weights and tokenizer (building the built-in model if needed)."""
    name = cfg.model.name
    if name == "builtin:tiny":
        from grpo.models.builtin import cached_model_dir

        def build(path: Path) -> None:
            from grpo.train.warmup import build_warm_model

            if console is not None:
                console.print(f"[grpo] building the built-in model (supervised warm-up, {cfg.warmup.steps} steps) ...")
            warm_task = task
            if not getattr(task, "has_demonstrations", True):  # a data set file: warm up on the built-in task
                from grpo.data import get_task

                warm_task = get_task(cfg.data.task, difficulty=cfg.data.difficulty)
            build_warm_model(cfg, warm_task, path, report=console.print if console is not None else None)

        return cached_model_dir(builtin_spec(cfg), build)
    if name.startswith("builtin:"):
        raise ModelDirError(f"model.name: unknown built-in model {name!r}; the built-in one is 'builtin:tiny'")
    from grpo.models.checks import check_model_dir

    return check_model_dir(name, field="model.name")  # config, complete weights, tokenizer: ModelDirError if not


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.eos_token is None:
        raise ModelDirError(f"tokenizer at {path} has no eos_token; generation could not stop")
    return tok


def load_policy(cfg, task=None, console=None):
    """(model, tokenizer) ready to train on the configured device and dtype."""
    from transformers import AutoModelForCausalLM

    path = model_directory(cfg, task, console)
    device = resolve_device(cfg.model.device)
    dtype = resolve_dtype(cfg.model.dtype, device)
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = True
    if cfg.model.lora_rank > 0:
        from grpo.models.lora import apply_lora

        model = apply_lora(model, cfg.model)
    return model, tokenizer


def frozen_copy(model):
    """A frozen copy (eval mode, no gradients) for the reference model pi_ref."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref
