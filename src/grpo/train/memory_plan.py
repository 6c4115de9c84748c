"""The memory a run will need, planned before the model loads, and the micro-batch size that keeps it near the floor.

    cfg, plan = plan_memory(cfg, model_dir, device, dtype, prompt_tokens, console)

The plan (bytes; `MemoryPlan.parts`):

    runtime      this process before the model loads (Python, torch, transformers, the data): measured
    weights      the policy's parameters in model.dtype (LoRA: the base in model.frozen_dtype plus the fp32 adapters;
                 the base's linear layers at 2 bytes where they are held in bf16: precision.stores_linears_bf16)
    reference    pi_ref (kl.coef > 0): a frozen copy in model.frozen_dtype for full fine-tuning (its linear layers
                 likewise); 0 with LoRA (the adapter-disabled base)
    gradients    the trainable parameters' gradients, in their dtype (LoRA's adapters: float32); during the update
                 only (freed after each step)
    optimizer    AdamW's two moments per trainable parameter, in its dtype (optim.name=adamw_8bit: 8-bit codes and a
                 float32 scale per 256 values, train/optim.py MOMENT_BYTES)
    activations  one micro-batch: optim.micro_batch_tokens x the bytes autograd keeps per token (measured on a
                 one- and two-layer copy of the architecture, grpo.models.footprint), plus the log-prob chunk's
                 float32 logits (logprob_chunk_tokens x vocabulary x 4 bytes, three of them: logits, softmax, grad),
                 and, full fine-tuning under torchrun only, the head's and the embedding's dense float32 weight
                 gradients of one backward (2 x vocabulary x hidden x 4 bytes; one process adds them to .grad in
                 place: models/forward.py lean_head_gradients); under bf16 compute (model.compute_dtype), the
                 bf16 copy of each float32 linear weight that autocast keeps for the backward (2 bytes a weight)
                 and the head's weight as its products take it (vocabulary x hidden x 2 bytes; 4 emulated)
    generation   the sampler's KV cache for P*G rows of prompt + max_new_tokens positions and a decode step's float32
                 logits (N x vocabulary x 4 bytes, three of them), or evaluation's (eval.batch_size rows), the larger
    worker       rollout.mode=async: the worker process's copy of the weights, its reference and its runtime

    peak = runtime + weights + reference + optimizer + worker + max(gradients + activations, generation)

optim.micro_batch_tokens unset (None) is chosen here: the largest micro-batch whose activations stay within
ACTIVATION_SHARE of the floor (weights, reference, gradients, optimizer: what any run of this model holds) and
within half of the memory left beside the rest of the plan, at least MIN_ACTIVATION_BYTES, at most
MAX_MICRO_BATCH_TOKENS tokens (micro-batches never change the gradient: train/update.py). A planned peak over the
memory this process can have (available now plus what it holds) is refused (ConfigError) with the settings that
would make it fit; train.memory_check=false runs it anyway.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo.errors import ConfigError

log = logging.getLogger("grpo.train")

__all__ = ["MemoryPlan", "longest_prompt", "plan_memory", "process_rss", "release_freed_memory"]

ACTIVATION_SHARE = 0.125  # of the floor: the 0.5B model's default step at <= 1.5x its floor (bench/results/memory.json)
MIN_ACTIVATION_BYTES = 256 * 2**20  # small models: a micro-batch as large as the old default's
MAX_MICRO_BATCH_TOKENS = 16_384  # past this, larger micro-batches gain nothing in speed (the old default)
ASYNC_WORKER_RUNTIME = 600 * 2**20  # a worker process's Python, torch and transformers (measured: ~0.5-0.6 GiB)
GIB = 2**30


@dataclass
class MemoryPlan:
    parts: dict[str, int]  # bytes, see the module docstring
    micro_batch_tokens: int
    per_token: int  # bytes autograd keeps per token of a micro-batch
    available: int | None  # bytes this process can have: free now plus what it holds; None when unknown
    where: str = "memory"  # "memory" (RAM) or "GPU memory"
    notes: list[str] = field(default_factory=list)
    bf16_base_saves: int = 0  # bytes model.frozen_dtype=bfloat16 would save (frozen linear layers held in bf16)
    adamw_8bit_saves: int = 0  # bytes optim.name=adamw_8bit would save (full fine-tuning with adamw)

    @property
    def peak(self) -> int:
        p = self.parts
        fixed = sum(p[k] for k in ("runtime", "weights", "reference", "optimizer", "worker"))
        return fixed + max(p["gradients"] + p["activations"], p["generation"])

    @property
    def floor(self) -> int:
        return sum(self.parts[k] for k in ("weights", "reference", "gradients", "optimizer"))

    def summary(self) -> str:
        p = self.parts
        shown = ", ".join(f"{k} {p[k] / GIB:.2f}" for k in ("runtime", "weights", "reference", "gradients",
                                                            "optimizer", "activations", "generation", "worker")
                          if p[k] or k in ("weights", "activations"))
        of = f" of {self.available / GIB:.1f} GiB available" if self.available else ""
        return (f"memory plan: peak {self.peak / GIB:.1f} GiB{of} ({shown} GiB); micro-batches of "
                f"{self.micro_batch_tokens} tokens ({self.per_token / 2**20:.2f} MiB of activations a token)")


def process_rss() -> int:
    """This process's resident memory now, bytes (0 when unknown)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # noqa: BLE001 - a plan without its runtime part is still a plan
        return 0


def release_freed_memory() -> None:
    """Give the pages the C heap holds free back to the system (glibc's malloc_trim; milliseconds).

    glibc keeps what a phase freed (a micro-batch's activations and gradients, generation's KV cache) in its heap,
    fragmented, so the process's resident memory carried each phase's high-water mark into the next and the peak of a
    step crept up micro-batch by micro-batch (bench/results/memory.json). Called between phases; a no-op on a C library
    without malloc_trim (macOS, musl)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def longest_prompt(tokenizer, prompts, sample: int = 512) -> int:
    """The most tokens among (up to `sample` evenly spaced) prompts, as the sampler feeds them."""
    from grpo.tokens import prompt_token_ids

    step = max(1, len(prompts) // sample)
    ids = prompt_token_ids(tokenizer, prompts[::step][:sample]) if prompts else []
    return max((len(x) for x in ids), default=1)


def _memory(device: torch.device) -> tuple[int | None, str]:
    from grpo.train.budget import machine_memory

    mem = machine_memory(device)
    if device.type == "cuda":
        return (mem[1] if mem else None), "GPU memory"
    return ((mem[1] + process_rss()) if mem else None), "memory"


def _generation_bytes(rows: int, positions: int, shape: dict, dtype_bytes: int) -> int:
    """KV cache of rows x positions, and three float32 (rows, vocabulary) tensors of a decode step."""
    heads = int(shape.get("num_attention_heads") or 1)
    head_dim = int(shape.get("head_dim") or int(shape.get("hidden_size", 0)) // heads)
    kv_heads = int(shape.get("num_key_value_heads") or heads)
    layers = int(shape.get("num_hidden_layers") or 0)
    kv = rows * positions * layers * 2 * kv_heads * head_dim * dtype_bytes
    return kv + rows * int(shape.get("vocab_size") or 0) * 4 * 3


def plan_memory(cfg, model_dir: Path, device: torch.device, dtype: torch.dtype, prompt_tokens: int,
                console=None):
    """(cfg with optim.micro_batch_tokens resolved, the MemoryPlan), printed; ConfigError when the plan exceeds
    the memory this process can have and train.memory_check is on. prompt_tokens: the longest prompt's tokens.

    model.frozen_dtype=auto whose float32 frozen weights (LoRA's base, the reference copy) would not fit while
    their linear layers held in bf16 would: cfg comes back with model.frozen_dtype=bfloat16, said in a note (it
    slows generation on a CPU without native bf16, so it is taken only where float32 cannot run)."""
    asked = cfg
    cfg, plan = _plan(asked, model_dir, device, dtype, prompt_tokens)
    if (asked.model.frozen_dtype == "auto" and plan.bf16_base_saves and plan.available is not None
            and plan.peak > plan.available):
        held = asked.model_copy(deep=True)  # the micro-batch, when unset, chosen again for the smaller plan
        held.model.frozen_dtype = "bfloat16"
        held, held_plan = _plan(held, model_dir, device, dtype, prompt_tokens)
        if held_plan.peak <= held_plan.available:
            held_plan.notes.insert(0, f"model.frozen_dtype=bfloat16 (from the memory plan: with float32 frozen "
                                      f"weights the peak, {plan.peak / GIB:.1f} GiB, is over the "
                                      f"{plan.available / GIB:.1f} GiB available; their linear layers are held "
                                      "in bf16 and computed in float32, generation is slower; set "
                                      "model.frozen_dtype to change)")
            cfg, plan = held, held_plan
    _report(plan, cfg, console)
    return cfg, plan


def _plan(cfg, model_dir: Path, device: torch.device, dtype: torch.dtype, prompt_tokens: int):
    """plan_memory's (cfg, plan) for cfg as it is, unprinted."""
    from transformers import AutoConfig

    from grpo.models.compute import resolve_compute
    from grpo.models.footprint import parameter_counts, saved_bytes_per_token
    from grpo.models.precision import frozen_dtype, stores_linears_bf16

    config = AutoConfig.from_pretrained(model_dir)
    text = getattr(config, "text_config", None) or config
    shape = text.to_dict()
    lora = cfg.model if cfg.model.lora_rank > 0 else None
    counts = parameter_counts(config, lora)
    frozen = frozen_dtype(cfg, device, dtype)  # LoRA's base and the reference copy (models/precision.py)
    compute = resolve_compute(cfg, device, dtype)  # model.compute_dtype (models/compute.py)
    stored = stores_linears_bf16(cfg, device, dtype)  # their linear layers held in bf16, computed in float32
    if lora:
        dtype = frozen  # the base's dtype is what its activations are computed in
    dtype_bytes, frozen_bytes = torch.finfo(dtype).bits // 8, torch.finfo(frozen).bits // 8
    trainable = counts.trainable
    base = counts.total - (trainable if lora else 0)
    frozen_base = base * frozen_bytes - (counts.linear * (frozen_bytes - 2) if stored else 0)
    weights = frozen_base + trainable * 4 if lora else base * dtype_bytes
    reference = frozen_base if cfg.kl.coef > 0 and not lora else 0
    frozen_linears = counts.linear * (bool(lora) + bool(reference))  # held by LoRA's base and a reference copy
    bf16_base_saves = frozen_linears * (frozen_bytes - 2) if frozen_bytes > 2 and not stored else 0
    per_token = saved_bytes_per_token(config, dtype, lora, cfg.model.gradient_checkpointing, compute)
    # bf16 compute keeps a cast copy of each float32 linear weight for the backward (autocast's cache; emulated:
    # float32 copies of the rounded values); a bf16 base is used as it is
    cast_bytes = 0 if compute == "weights" or dtype_bytes == 2 or stored else \
        counts.linear * (2 if compute == "bfloat16" else 4)
    vocab, hidden = int(shape.get("vocab_size") or 0), int(shape.get("hidden_size") or 0)
    head = cfg.optim.logprob_chunk_tokens * vocab * 4 * 3
    if compute != "weights":  # the head's weight as its bf16 products take it (algo/logprobs.py _operand)
        head += vocab * hidden * (2 if compute == "bfloat16" else 4)
    if not lora and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # several processes: autograd's dense (V, H)
        head += 2 * vocab * hidden * 4  # gradients of the head and the embedding (one process: lean_head_gradients)
    P, G, T = cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    eval_T = cfg.eval.max_new_tokens or T
    generation = 0 if cfg.rollout.engine != "native" else max(
        _generation_bytes(P * G, prompt_tokens + T, shape, dtype_bytes),
        _generation_bytes(min(cfg.eval.batch_size, max(cfg.eval.n, 1)), prompt_tokens + eval_T, shape, dtype_bytes))
    worker = weights + reference + generation + ASYNC_WORKER_RUNTIME if cfg.rollout.mode == "async" else 0
    train_bytes = 4 if lora else dtype_bytes  # gradients and AdamW's moments take the trained weights' dtype
    parts = {"runtime": process_rss() if device.type == "cpu" else 0, "weights": weights, "reference": reference,
             "gradients": trainable * train_bytes, "optimizer": optimizer_bytes(cfg.optim.name, trainable, train_bytes),
             "generation": generation,
             "worker": worker}
    available, where = _memory(device)
    adamw_8bit_saves = 0 if lora or cfg.optim.name != "adamw" else (
        parts["optimizer"] - optimizer_bytes("adamw_8bit", trainable, train_bytes))
    plan = MemoryPlan(parts | {"activations": 0}, 0, per_token, available, where, bf16_base_saves=bf16_base_saves,
                      adamw_8bit_saves=adamw_8bit_saves)
    tokens = cfg.optim.micro_batch_tokens
    if tokens is None:
        budget = max(ACTIVATION_SHARE * plan.floor, MIN_ACTIVATION_BYTES)
        fixed = plan.peak + head + cast_bytes
        if available is not None and available > fixed:  # at most half of what the rest leaves
            budget = min(budget, (available - fixed) / 2)
        tokens = int(min(max(budget // max(per_token, 1), 1), MAX_MICRO_BATCH_TOKENS))
        plan.notes.append(f"optim.micro_batch_tokens={tokens} (from the memory plan; set it to change)")
    # a micro-batch holds whole groups or a part of one (train/update.py group_chunks): at most `tokens`, at
    # least the prompt and one row
    plan.micro_batch_tokens = tokens
    plan.parts["activations"] = max(tokens, prompt_tokens + T) * per_token + head + cast_bytes
    if cfg.optim.micro_batch_tokens is None:
        cfg = cfg.model_copy(deep=True)
        cfg.optim.micro_batch_tokens = tokens  # saved in config.yaml: a resume micro-batches the same way
    return cfg, plan


def optimizer_bytes(name: str, trainable: int, train_bytes: int) -> int:
    """Bytes of the two AdamW moments of `trainable` parameters trained in `train_bytes`-byte floats."""
    from grpo.train.optim import MOMENT_BYTES

    per_moment = train_bytes if name == "adamw" else MOMENT_BYTES[name]
    return int(2 * trainable * per_moment)


def _report(plan: MemoryPlan, cfg, console) -> None:
    from grpo.train.defaults import print_note

    print_note(plan.summary(), console)
    for note in plan.notes:
        print_note(note, console)
    if plan.available is None or plan.peak <= plan.available:
        return
    fixes = _fixes(plan, cfg)
    msg = (f"the run's {plan.summary()}: more than the {plan.where} available. It would fit with: "
           f"{'; '.join(fixes)}")
    if cfg.train.memory_check:
        raise ConfigError(msg + ". train.memory_check=false runs it anyway")
    print_note("warning: " + msg, console)


def _fixes(plan: MemoryPlan, cfg) -> list[str]:
    """The settings that lower the plan the most, each with what it saves."""
    p, out = plan.parts, []
    if cfg.model.lora_rank == 0:
        out.append(f"model.lora_rank=16 (LoRA: no gradients or optimizer state for the base, about "
                   f"{(p['gradients'] + p['optimizer']) / GIB:.1f} GiB less)")
    if plan.adamw_8bit_saves >= 0.1 * plan.peak and cfg.parallel.strategy != "fsdp":  # moments a large part
        out.append(f"optim.name=adamw_8bit (8-bit AdamW moments, {plan.adamw_8bit_saves / GIB:.1f} GiB less; "
                   "pip install 'grpo[torchao]')")
    if plan.bf16_base_saves:
        out.append(f"model.frozen_dtype=bfloat16 (the frozen linear layers held in bf16, "
                   f"{plan.bf16_base_saves / GIB:.1f} GiB less)")
    if p["reference"]:
        out.append(f"kl.coef=0 (no reference copy, {p['reference'] / GIB:.1f} GiB less)")
    if p["activations"] > p["generation"] and plan.micro_batch_tokens > 1:
        out.append(f"optim.micro_batch_tokens={max(plan.micro_batch_tokens // 4, 1)} or "
                   "model.gradient_checkpointing=true (smaller activations)")
    if p["generation"] >= p["activations"]:
        out.append("fewer rollout.prompts_per_step x rollout.group_size, or a smaller rollout.max_new_tokens / "
                   "eval.batch_size (the KV cache and logits of generation)")
    if p["worker"]:
        out.append(f"rollout.mode=sync (no worker process, {p['worker'] / GIB:.1f} GiB less)")
    return out
