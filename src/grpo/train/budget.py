"""What one step needs, checked against the model and the machine before the model loads.

    check_step_fits(cfg, device, dtype, printer)   ConfigError when rollout.max_new_tokens (or eval's) does not fit
                                                   the model's positions, or one step's rollouts cannot fit in this
                                                   machine's memory; a printed estimate when they may not fit in
                                                   what is free now

The memory figure is a lower bound of the sampler's own tensors for one step (rollout/sampler.py decodes all
N = P*G rows at once): the keys and values of the generated tokens, N x T positions x layers x 2 x kv_heads x
head_dim x the dtype's bytes, plus one decode step's float32 log-softmax over the vocabulary (N x V x 4 bytes,
twice: the logits and their log-softmax). The weights, the prompt's cache and the update come on top, so a run
refused here would run out of memory for certain; a run that passes may still need more.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from grpo.errors import ConfigError

__all__ = ["check_step_fits", "machine_memory", "model_shape", "rollout_bytes"]


def model_shape(cfg) -> dict | None:
    """The transformers config of model.name as a dict (config.json; the built-in model's own sizes and vocabulary),
    or None when it cannot be read here (the model checks report that)."""
    if cfg.model.name.startswith("builtin:"):
        from grpo.models.builtin import TINY, build_tokenizer

        return {**TINY, "vocab_size": len(build_tokenizer())}
    try:
        config = json.loads((Path(cfg.model.name).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")  # a multimodal model's language part
    return text if isinstance(text, dict) and "hidden_size" in text else config


def rollout_bytes(cfg, shape: dict, dtype_bytes: int) -> dict[str, int]:
    """{"kv_cache": bytes, "logits": bytes}: the lower bound described in the module docstring."""
    P, G, T = cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    N = P * G
    heads = int(shape.get("num_attention_heads") or 1)
    head_dim = int(shape.get("head_dim") or int(shape.get("hidden_size", 0)) // heads)
    kv_heads = int(shape.get("num_key_value_heads") or heads)
    layers = int(shape.get("num_hidden_layers") or 0)
    return {"kv_cache": N * T * layers * 2 * kv_heads * head_dim * dtype_bytes,
            "logits": N * int(shape.get("vocab_size") or 0) * 4 * 2}


def machine_memory(device: torch.device) -> tuple[int, int] | None:
    """(total, available now) bytes of the memory the rollouts live in: the GPU's for cuda, else the machine's
    RAM (/proc/meminfo); None when unknown."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        kib = lambda key: int(info[key].split()[0]) * 1024  # noqa: E731
        return kib("MemTotal"), kib("MemAvailable")
    except (OSError, KeyError, ValueError):
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
        return total, total


def _gb(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_step_fits(cfg, device: torch.device, dtype: torch.dtype, printer=None) -> None:
    """Refuse (ConfigError naming the fields) what cannot run: a completion longer than the model's positions, or
    a step whose rollouts alone exceed the machine's memory; print the estimate when it exceeds what is free."""
    shape = model_shape(cfg)
    if shape is None:
        return
    positions = shape.get("max_position_embeddings")
    for key, T in (("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
                   ("eval.max_new_tokens", cfg.eval.max_new_tokens)):
        if isinstance(positions, int) and T is not None and T >= positions:
            raise ConfigError(f"{key}={T}, but the model has {positions} positions (max_position_embeddings), "
                              "and the prompt takes some of them; lower it below "
                              f"{positions} - the prompt length")
    memory = machine_memory(device)
    if memory is None or cfg.rollout.engine != "native":  # vLLM pages its KV cache within its own memory share
        return
    total, available = memory
    parts = rollout_bytes(cfg, shape, torch.finfo(dtype).bits // 8)
    need = sum(parts.values())
    what = (f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} x rollout.group_size="
            f"{cfg.rollout.group_size} = {cfg.rollout.prompts_per_step * cfg.rollout.group_size} completions of up "
            f"to rollout.max_new_tokens={cfg.rollout.max_new_tokens} tokens need at least {_gb(need)} per step "
            f"(KV cache {_gb(parts['kv_cache'])}, logits {_gb(parts['logits'])})")
    where = "GPU memory" if device.type == "cuda" else "memory"
    if need > total:
        raise ConfigError(f"{what}, more than this machine's {_gb(total)} of {where}; lower rollout.group_size, "
                          "rollout.prompts_per_step or rollout.max_new_tokens")
    if need > available and printer is not None:
        printer(f"[grpo] warning: {what}, more than the {_gb(available)} of {where} free now; the run may swap "
                "or run out of memory")
