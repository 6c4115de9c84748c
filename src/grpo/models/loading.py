"""Load the policy (and, when needed, a frozen reference) from a model directory: the built-in model's (shipped
or cached) or a local Hugging Face directory. Devices and dtypes are resolved here and nowhere else. This module
only loads directories; building the built-in model (a warm-up with an optimizer) is grpo.warmup's job."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch

from grpo.errors import ModelDirError
from grpo.models.lora import apply_lora
from grpo.models.precision import frozen_dtype, store_linears_bf16, stores_linears_bf16, to_dtype_lean

log = logging.getLogger("grpo.models")


def resolve_device(name: str) -> torch.device:
    """model.device as a torch.device; ConfigError for a name torch does not know or a device this machine lacks
    (model.device=cuda without a CUDA GPU), before anything is loaded onto it."""
    from grpo.errors import ConfigError

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"model.device={name!r} is not a device; use auto, cpu, cuda or cuda:<index>") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU"
            raise ConfigError(f"model.device={name!r}, but {why}; use model.device=auto (the GPU when there is one) "
                              "or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"model.device={name!r}, but there are {torch.cuda.device_count()} CUDA devices "
                              f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"model.device={name!r}, but MPS is not available here; use auto or cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """model.dtype on `device`; float16 on the CPU is a ConfigError: its narrow range overflows in training
    (non-finite losses within a few steps, accuracy to 0)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name == "float16" and device.type == "cpu":
        from grpo.errors import ConfigError

        raise ConfigError("model.dtype=float16 on the CPU: float16 training overflows there (non-finite losses "
                          "within a few steps); use float32 (or auto), or bfloat16")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def check_device_and_dtype(cfg) -> tuple[torch.device, torch.dtype]:
    """model.device and model.dtype checked against this machine before any model loads (ConfigError)."""
    device = resolve_device(cfg.model.device)
    return device, resolve_dtype(cfg.model.dtype, device)


def builtin_spec(cfg) -> dict:
    """Everything that determines the built-in model: its size, the task and split it is warmed up on, and the
    warm-up settings (warmup.seed included; train.seed is not: it seeds the RL only)."""
    from grpo.models.builtin import TINY

    return {
        "version": 4,  # 4: the tokenizer carries the chat template
        "size": TINY,
        "task": cfg.data.task,
        "difficulty": cfg.data.difficulty,
        "train_size": cfg.data.train_size,
        "warmup": cfg.warmup.model_dump(),
    }


def model_directory(cfg, build: Callable[[Path], None] | None = None) -> Path:
    """The directory holding the policy's weights and tokenizer. For the built-in model: the shipped one when
    the package has this config's model, else the cached one, made by `build(tmp_dir)` when missing (the
    warm-up of grpo.warmup; without `build` a missing model is a ConfigError). A `.gguf` file: its dequantized
    directory in $GRPO_CACHE (imported on first use)."""
    name = cfg.model.name
    if name == "builtin:tiny":
        from grpo.models.builtin import cached_model_dir, shipped_model_dir

        spec = builtin_spec(cfg)
        shipped = shipped_model_dir(spec)
        if shipped is not None:
            return shipped

        def missing(path: Path) -> None:
            from grpo.errors import ConfigError

            raise ConfigError("the built-in model of these warmup.* / data.* settings is not built yet: "
                              "`grpo train` or `grpo warmup` builds it")

        return cached_model_dir(spec, build or missing)
    if name.startswith("builtin:"):
        raise ModelDirError(f"model.name: unknown built-in model {name!r}; the built-in one is 'builtin:tiny'")
    if name.lower().endswith(".gguf"):  # a GGUF file: imported once into the cache (grpo.models.gguf)
        from grpo.models.builtin import cache_root
        from grpo.models.gguf import gguf_model_dir

        return gguf_model_dir(name, cache_root())
    from grpo.models.checks import check_model_dir

    return check_model_dir(name, field="model.name")  # config, complete weights, tokenizer: ModelDirError if not


def load_causal_lm(path: Path, **kwargs):
    """AutoModelForCausalLM.from_pretrained(path, **kwargs); a directory it cannot load is a ModelDirError naming
    it (check_model_dir has caught the known damage before; this is the net for the rest)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ModelDirError(f"the model in {path} cannot be loaded ({type(e).__name__}: {first}); the directory is "
                            "damaged or not a causal language model: copy or save it again") from e


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ModelDirError(f"the tokenizer in {path} cannot be loaded ({type(e).__name__}: {first}); its "
                            "tokenizer files are damaged: copy or save them again") from e
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.eos_token is None:
        raise ModelDirError(f"tokenizer at {path} has no eos_token; generation could not stop")
    return tok


def model_tokenizer(cfg):
    """The tokenizer of model.name, without loading (or, for the built-in model, building) the model."""
    if cfg.model.name.startswith("builtin:"):
        from grpo.models.builtin import build_tokenizer

        return build_tokenizer()
    return load_tokenizer(model_directory(cfg))


def load_policy(cfg, path: Path):
    """(model, tokenizer) from the model directory `path` (see model_directory), on the configured device and
    dtype, with LoRA adapters when model.lora_rank > 0 (the frozen base in `frozen_dtype`)."""
    device = resolve_device(cfg.model.device)
    dtype = resolve_dtype(cfg.model.dtype, device)
    lora = cfg.model.lora_rank > 0
    stored = lora and stores_linears_bf16(cfg, device, dtype)
    if lora:  # the base never trains: it may be held leaner (peft keeps the adapters in float32)
        dtype = frozen_dtype(cfg, device, dtype)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path, dtype="auto")  # read in the file's dtype
    if stored:  # before the conversion: a bf16 file's linear layers are never float32 (Bf16StoredLinear._apply)
        store_linears_bf16(model)
    model = to_dtype_lean(model, dtype).to(device)
    if cfg.model.gradient_checkpointing is True:  # auto: the memory plan resolved it (train/memory_plan.py)
        model.gradient_checkpointing_enable()
    model.config.use_cache = True
    if cfg.model.lora_rank > 0:
        model = apply_lora(model, cfg.model)
    return model, tokenizer
