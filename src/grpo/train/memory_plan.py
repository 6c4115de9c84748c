"""The memory a run will need, planned before the model loads, and the fastest layout of the update within the limit.

    cfg, plan = plan_memory(cfg, model_dir, device, dtype, prompt_tokens, console, completion_tokens)

The plan (bytes; `MemoryPlan.parts`):

    runtime      this process before the model loads (Python, torch, transformers, the data): measured, plus
                 RUNTIME_GROWTH (what loading and the first steps add beside the tensors)
    weights      the policy's parameters in model.dtype (LoRA: the base in model.frozen_dtype plus the fp32 adapters;
                 the base's linear layers at 2 bytes where they are held in bf16: precision.stores_linears_bf16)
    reference    pi_ref (kl.coef > 0): a frozen copy in model.frozen_dtype for full fine-tuning (its linear layers
                 likewise); 0 with LoRA (the adapter-disabled base)
    gradients    the trainable parameters' gradients, in their dtype (LoRA's adapters: float32); during the update
                 only (freed after each step)
    optimizer    AdamW's two moments per trainable parameter, in its dtype (optim.name=adamw_8bit: 8-bit codes and a
                 float32 scale per 256 values, train/optim.py MOMENT_BYTES)
    activations  one micro-batch: its tokens x the bytes autograd keeps per token (measured on a one- and two-layer
                 copy of the architecture, grpo.models.footprint) x ACTIVATION_SLACK, plus the log-prob chunk's
                 float32 logits (logprob_chunk_tokens x vocabulary x 4 bytes, three of them: logits, softmax, grad),
                 and, full fine-tuning under torchrun only, the head's and the embedding's dense float32 weight
                 gradients of one backward (2 x vocabulary x hidden x 4 bytes; one process adds them to .grad in
                 place: models/forward.py lean_head_gradients); under bf16 compute (model.compute_dtype), the
                 bf16 copy of each float32 linear weight that autocast keeps for the backward (2 bytes a weight),
                 the head's weight as its products take it and a chunk's weight-gradient product (twice vocabulary x
                 hidden x 2 bytes; 4 emulated)
    generation   the sampler's KV cache for P*G rows of prompt + max_new_tokens positions and a decode step's float32
                 logits (N x vocabulary x 4 bytes, three of them), or evaluation's (eval.batch_size rows), the larger;
                 under bf16 compute, the bf16 copies of the weights its products take (models/compute.py)
    worker       rollout.mode=async: the worker process's copy of the weights, its reference and its runtime

    peak = runtime + weights + reference + optimizer + worker + max(gradients + activations, generation)

The limit is train.memory_limit (train/memory_limit.py: GiB, or auto: what this process can have at start less a
margin). optim.micro_batch_tokens unset (None) is chosen here for speed within it: the step's whole batch when its
activations fit (P prompts once each and P*G completions of max_new_tokens: the tokens the update really has; larger
micro-batches would plan memory no step uses), capped at MAX_MICRO_BATCH_TOKENS, past which a larger micro-batch is no
faster (bench/results/update_speed.json); else the most tokens that fit, at least one completion row; else,
when even one row does not fit, gradient checkpointing (model.gradient_checkpointing=auto) if that makes it fit.
Micro-batches never change the gradient (train/update.py). A planned peak over the limit is refused (ConfigError)
with the settings that would make it fit; train.memory_check=false runs it anyway.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo.errors import ConfigError
from grpo.train.memory_limit import MemoryLimit, process_rss

log = logging.getLogger("grpo.train")

__all__ = ["MemoryPlan", "longest_prompt", "plan_memory", "release_freed_memory", "step_tokens"]

# past this a larger micro-batch is no faster: SmolLM2-135M's bf16 update of one P=8 G=8 T=48 batch (3,392 tokens)
# took 0.96x the whole batch's seconds in micro-batches of 2,048 tokens, 1.09x in 1,024, 1.75x in 293
# (bench/results/update_speed.json), and activations grow with the micro-batch
MAX_MICRO_BATCH_TOKENS = 2_048
ACTIVATION_SLACK = 1.25  # what autograd's saved tensors leave out: transient buffers of the forward and backward
# what the process adds beside its tensors once the model is loaded and the first steps have run (the model's code,
# the kernels' scratch, the C heap's arenas): the built-in model's `grpo train` grew 180 MiB past its planned tensors
# (56 MiB of it at load), SmolLM2-135M's similarly; counted in the runtime part (CPU)
RUNTIME_GROWTH = 128 * 2**20
ASYNC_WORKER_RUNTIME = 600 * 2**20  # a worker process's Python, torch and transformers (measured: ~0.5-0.6 GiB)
GIB = 2**30


@dataclass
class MemoryPlan:
    parts: dict[str, int]  # bytes, see the module docstring
    micro_batch_tokens: int
    per_token: int  # bytes autograd keeps per token of a micro-batch (ACTIVATION_SLACK not included)
    limit: MemoryLimit  # train.memory_limit resolved (train/memory_limit.py)
    step_tokens: int | None = None  # the update's tokens in one step (None: unknown, multi-turn episodes)
    notes: list[str] = field(default_factory=list)
    bf16_base_saves: int = 0  # bytes model.frozen_dtype=bfloat16 would save (frozen linear layers held in bf16)
    adamw_8bit_saves: int = 0  # bytes optim.name=adamw_8bit would save (full fine-tuning with adamw)

    @property
    def peak(self) -> int:
        p = self.parts
        return self.fixed + max(p["gradients"] + p["activations"], p["generation"])

    @property
    def fixed(self) -> int:
        """What the whole step holds: runtime, weights, reference, optimizer, worker."""
        return sum(self.parts[k] for k in ("runtime", "weights", "reference", "optimizer", "worker"))

    @property
    def floor(self) -> int:
        return sum(self.parts[k] for k in ("weights", "reference", "gradients", "optimizer"))

    @property
    def fits(self) -> bool:
        return self.limit.bytes is None or self.peak <= self.limit.bytes

    @property
    def where(self) -> str:
        return self.limit.where

    def summary(self) -> str:
        p = self.parts
        shown = ", ".join(f"{k} {p[k] / GIB:.2f}" for k in ("runtime", "weights", "reference", "gradients",
                                                            "optimizer", "activations", "generation", "worker")
                          if p[k] or k in ("weights", "activations"))
        of = f" of the {self.limit.gib()} limit" if self.limit.bytes is not None else ""
        return (f"memory plan: peak {self.peak / GIB:.1f} GiB{of} ({shown} GiB); micro-batches of "
                f"{self.micro_batch_tokens:,} tokens ({self.per_token / 2**20:.2f} MiB of activations a token)")


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


def step_tokens(cfg, prompt_tokens: int, completion_tokens: int, shared: bool = True) -> int:
    """The tokens one process's update computes in a step: P prompts of `prompt_tokens` and P*G completions of
    `completion_tokens` (each prompt computed once for its group when `shared`, train/update.py group_chunks, else
    repeated G times: FSDP2, gradient checkpointing). P is this process's share under torchrun."""
    world = max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    P, G = -(-cfg.rollout.prompts_per_step // world), cfg.rollout.group_size
    return P * prompt_tokens + P * G * completion_tokens if shared else P * G * (prompt_tokens + completion_tokens)


def _generation_bytes(rows: int, positions: int, shape: dict, dtype_bytes: int) -> int:
    """KV cache of rows x positions, and three float32 (rows, vocabulary) tensors of a decode step."""
    heads = int(shape.get("num_attention_heads") or 1)
    head_dim = int(shape.get("head_dim") or int(shape.get("hidden_size", 0)) // heads)
    kv_heads = int(shape.get("num_key_value_heads") or heads)
    layers = int(shape.get("num_hidden_layers") or 0)
    kv = rows * positions * layers * 2 * kv_heads * head_dim * dtype_bytes
    return kv + rows * int(shape.get("vocab_size") or 0) * 4 * 3


def plan_memory(cfg, model_dir: Path, device: torch.device, dtype: torch.dtype, prompt_tokens: int,
                console=None, completion_tokens: int | None = -1):
    """(cfg with optim.micro_batch_tokens and model.gradient_checkpointing resolved, the MemoryPlan), printed;
    ConfigError when the plan exceeds train.memory_limit and train.memory_check is on. prompt_tokens: the longest
    prompt's tokens; completion_tokens: the longest completion the update sees (-1: rollout.max_new_tokens; None:
    unknown, a multi-turn episode whose environment adds tokens: the micro-batch is then not capped by the step).

    model.frozen_dtype=auto whose float32 frozen weights (LoRA's base, the reference copy) would not fit while
    their linear layers held in bf16 would: cfg comes back with model.frozen_dtype=bfloat16, said in a note (it
    slows generation on a CPU without native bf16, so it is taken only where float32 cannot run)."""
    from grpo.train.memory_limit import memory_limit

    limit = memory_limit(cfg, device)
    if completion_tokens == -1:
        completion_tokens = cfg.rollout.max_new_tokens
    asked = cfg
    cfg, plan = _plan(asked, model_dir, device, dtype, prompt_tokens, completion_tokens, limit)
    if asked.model.frozen_dtype == "auto" and plan.bf16_base_saves and not plan.fits:
        held = asked.model_copy(deep=True)  # the micro-batch, when unset, chosen again for the smaller plan
        held.model.frozen_dtype = "bfloat16"
        held, held_plan = _plan(held, model_dir, device, dtype, prompt_tokens, completion_tokens, limit)
        if held_plan.fits:
            held_plan.notes.insert(0, f"model.frozen_dtype=bfloat16 (from the memory plan: with float32 frozen "
                                      f"weights the peak, {plan.peak / GIB:.1f} GiB, is over the "
                                      f"{limit.gib()} limit; their linear layers are held in bf16 and computed in "
                                      "float32, generation is slower; set model.frozen_dtype to change)")
            cfg, plan = held, held_plan
    _report(plan, cfg, console)
    return cfg, plan


def _plan(cfg, model_dir: Path, device: torch.device, dtype: torch.dtype, prompt_tokens: int,
          completion_tokens: int | None, limit: MemoryLimit):
    """plan_memory's (cfg, plan) for cfg as it is, unprinted."""
    from transformers import AutoConfig

    from grpo.models.compute import resolve_compute
    from grpo.models.footprint import parameter_counts, saved_bytes_per_token
    from grpo.models.forward import config_shares_prompt
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
    # bf16 compute keeps a cast copy of each float32 linear weight (autocast's cache: the update's backward, and
    # generation's decode steps; emulated: float32 copies of the rounded values); a bf16 base is used as it is
    cast_bytes = 0 if compute == "weights" or dtype_bytes == 2 or stored else \
        counts.linear * (2 if compute == "bfloat16" else 4)
    vocab, hidden = int(shape.get("vocab_size") or 0), int(shape.get("hidden_size") or 0)
    head = cfg.optim.logprob_chunk_tokens * vocab * 4 * 3
    head_cast = 0 if compute == "weights" else vocab * hidden * (2 if compute == "bfloat16" else 4)
    head += 2 * head_cast  # the head's weight as its bf16 products take it, and a chunk's weight-gradient product
    if not lora and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # several processes: autograd's dense (V, H)
        head += 2 * vocab * hidden * 4  # gradients of the head and the embedding (one process: lean_head_gradients)
    P, G, T = cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    eval_T = cfg.eval.max_new_tokens or T
    kv_bytes = 2 if compute != "weights" else dtype_bytes  # bf16 compute samples with a bf16 KV cache
    generation = 0 if cfg.rollout.engine != "native" else max(
        _generation_bytes(P * G, prompt_tokens + T, shape, kv_bytes),
        _generation_bytes(min(cfg.eval.batch_size, max(cfg.eval.n, 1)), prompt_tokens + eval_T, shape, kv_bytes)) \
        + cast_bytes + head_cast
    worker = weights + reference + generation + ASYNC_WORKER_RUNTIME if cfg.rollout.mode == "async" else 0
    train_bytes = 4 if lora else dtype_bytes  # gradients and AdamW's moments take the trained weights' dtype
    parts = {"runtime": process_rss() + RUNTIME_GROWTH if device.type == "cpu" else 0, "weights": weights,
             "reference": reference,
             "gradients": trainable * train_bytes, "optimizer": optimizer_bytes(cfg.optim.name, trainable, train_bytes),
             "generation": generation, "worker": worker, "activations": 0}
    adamw_8bit_saves = 0 if lora or cfg.optim.name != "adamw" else (
        parts["optimizer"] - optimizer_bytes("adamw_8bit", trainable, train_bytes))
    plan = MemoryPlan(parts, 0, 0, limit, bf16_base_saves=bf16_base_saves, adamw_8bit_saves=adamw_8bit_saves)
    fixed_activations = head + cast_bytes  # a micro-batch's activations beside its tokens' own

    def per_token_of(checkpointing: bool) -> int:
        return saved_bytes_per_token(config, dtype, lora, checkpointing, compute)

    checkpointing = cfg.model.gradient_checkpointing
    # each prompt computed once for its group (models/forward.py completion_logits) unless the model's cache cannot
    # share it or FSDP2 shards the layers (train/update.py _shared_prefix); checkpointing, below, repeats it too
    shares = config_shares_prompt(config) and cfg.parallel.strategy != "fsdp"
    choosing = cfg.optim.micro_batch_tokens is None
    one_row = prompt_tokens + (completion_tokens or T)  # a micro-batch holds at least one completion and its prompt
    if choosing or checkpointing == "auto":
        tokens, checkpointing, why = _fastest_layout(cfg, plan, per_token_of, fixed_activations, prompt_tokens,
                                                     completion_tokens, one_row, shares)
        if choosing:
            plan.notes.append(f"optim.micro_batch_tokens={tokens:,} (from the memory plan: {why}; set it to change)")
        if cfg.model.gradient_checkpointing == "auto" and checkpointing:
            plan.notes.append("model.gradient_checkpointing=true (from the memory plan: without it not even one "
                              "completion's activations fit the limit; each layer is computed twice, and each prompt "
                              "G times; set model.gradient_checkpointing=false to change)")
        if not choosing:
            tokens = cfg.optim.micro_batch_tokens
    else:
        tokens = cfg.optim.micro_batch_tokens
    plan.per_token = per_token_of(bool(checkpointing))
    shared = shares and not checkpointing
    plan.step_tokens = None if completion_tokens is None else step_tokens(cfg, prompt_tokens, completion_tokens, shared)
    plan.micro_batch_tokens = tokens
    used = max(min(tokens, plan.step_tokens or tokens), one_row)  # never more than the step has, at least one row
    plan.parts["activations"] = int(used * plan.per_token * ACTIVATION_SLACK) + fixed_activations
    if choosing or cfg.model.gradient_checkpointing == "auto":
        cfg = cfg.model_copy(deep=True)  # saved in config.yaml: a resume micro-batches the same way
        cfg.optim.micro_batch_tokens = tokens
        cfg.model.gradient_checkpointing = bool(checkpointing)
    return cfg, plan


def _fastest_layout(cfg, plan: MemoryPlan, per_token_of, fixed_activations: int, prompt_tokens: int,
                    completion_tokens: int | None, one_row: int, shares: bool) -> tuple[int, bool, str]:
    """(micro-batch tokens, gradient checkpointing, why) that make the update fastest within plan.limit: the step's
    whole batch (at most MAX_MICRO_BATCH_TOKENS) without checkpointing when it fits; else the most tokens that fit;
    else, where one completion row does not fit, checkpointing (when model.gradient_checkpointing=auto and the
    compute allows it) with the most tokens that then fit."""
    asked = cfg.model.gradient_checkpointing
    room = None if plan.limit.bytes is None else plan.limit.bytes - plan.fixed - plan.parts["gradients"] \
        - fixed_activations
    for checkpointing in ((False, True) if asked == "auto" else (bool(asked),)):
        if checkpointing and cfg.model.compute_dtype == "bfloat16_emulated":
            break  # the emulation refuses checkpointing (models/compute.py)
        per_token = per_token_of(checkpointing) * ACTIVATION_SLACK
        whole = None if completion_tokens is None else step_tokens(cfg, prompt_tokens, completion_tokens,
                                                                   shared=shares and not checkpointing)
        useful = min(whole or MAX_MICRO_BATCH_TOKENS, MAX_MICRO_BATCH_TOKENS)
        fit = useful if room is None else int(max(room, 0) // max(per_token, 1))
        limit = "no limit known" if room is None else f"the {plan.limit.gib()} limit"
        if fit >= useful:
            why = (f"the whole batch fits in {limit}" if useful == whole else
                   f"past {useful:,} tokens a micro-batch is no faster, and that fits in {limit}")
            return useful, checkpointing, why
        if fit >= one_row or checkpointing or asked != "auto":
            return max(fit, 1), checkpointing, (f"the most tokens whose activations fit in {limit} beside the "
                                                f"rest of the plan ({(whole or 0):,} in the whole batch)")
    return one_row, False, f"one completion row; even that does not fit in the {plan.limit.gib()} limit"


def optimizer_bytes(name: str, trainable: int, train_bytes: int) -> int:
    """Bytes of the two AdamW moments of `trainable` parameters trained in `train_bytes`-byte floats."""
    from grpo.train.optim import MOMENT_BYTES

    per_moment = train_bytes if name == "adamw" else MOMENT_BYTES[name]
    return int(2 * trainable * per_moment)


def _report(plan: MemoryPlan, cfg, console) -> None:
    from grpo.train.defaults import print_note

    print_note(f"{plan.summary()}; {plan.limit.how}", console)
    for note in plan.notes:
        print_note(note, console)
    if plan.fits:
        return
    fixes = _fixes(plan, cfg)
    msg = (f"the run's {plan.summary()}: more than the {plan.limit.gib()} limit ({plan.limit.how}). It would fit "
           f"with: {'; '.join(fixes)}")
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
    if plan.limit.bytes is not None and plan.limit.available is not None and plan.limit.bytes < plan.limit.available:
        out.append(f"a larger train.memory_limit (this machine has {plan.limit.available / GIB:.1f} GiB available)")
    return out
