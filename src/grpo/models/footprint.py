"""What a model costs in memory, from its config alone (no weights are read): the parameter counts, and the bytes
that autograd keeps for the backward pass per token of a training forward.

    counts = parameter_counts(config, lora)                  ParamCounts(total, trainable)
    per_token = saved_bytes_per_token(config, dtype, lora)   bytes saved for backward per token (all layers)

Parameters are counted on a model built on the `meta` device (exact for any architecture transformers knows, tied
embeddings counted once). The activations are measured, not modelled: a copy of the architecture with one and with
two decoder layers (and a 256-token vocabulary, so the head costs nothing) runs one forward with gradients under
`torch.autograd.graph.saved_tensors_hooks`, which sees every tensor autograd keeps; the distinct storages that are
not parameters are summed. Two layers minus one is one decoder layer's cost per token; the model's is that times
its layer count, plus what lies outside the layers. Those probe models are allocated with `to_empty` and never
written (their pages stay mostly unresident) and are freed at once.

With LoRA (peft) the probe carries the same adapters, so what the frozen layers do not keep is not counted.
Gradient checkpointing keeps each layer's input (hidden size x dtype bytes a token) and recomputes one layer at a
time in the backward pass: layers x hidden x bytes + one layer's cost.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch

log = logging.getLogger("grpo.models")

__all__ = ["ParamCounts", "parameter_counts", "saved_bytes_per_token"]

PROBE_VOCAB = 256
PROBE_TOKENS = 61  # long enough that per-token costs dominate (attention's saved state is linear in it); a prime, so
# no weight's shape has it and a saved (tokens, hidden) activation is never taken for a weight's cast copy


@dataclass(frozen=True)
class ParamCounts:
    total: int  # every parameter, tied ones once (LoRA: the base plus the adapters)
    trainable: int  # what gets gradients and optimizer state (LoRA: the adapters)
    linear: int = 0  # the weights of the base's linear layers but the head (models/precision.py storable_linears)


def _build(config, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if device != "meta":
        model = model.to_empty(device=device)  # never written: the probe reads only shapes and storages
        model.tie_weights()  # to_empty gives each parameter its own storage
    return model


def _with_lora(model, lora):
    if lora is None or lora.lora_rank <= 0:
        return model
    from grpo.models.lora import apply_lora

    return apply_lora(model, lora)


def parameter_counts(config, lora=None) -> ParamCounts:
    """ParamCounts of `config`'s causal LM (a transformers PretrainedConfig); `lora`: model.* settings with
    lora_rank > 0 adds the adapters (the base frozen), None or rank 0 is full fine-tuning."""
    from grpo.models.precision import storable_linears

    model = _build(config, torch.float32, "meta")
    linear = sum(layer.weight.numel() for _, _, layer in storable_linears(model))
    model = _with_lora(model, lora)
    seen, total, trainable = set(), 0, 0
    for p in model.parameters():  # parameters() yields a tied weight once; id() guards views of the same meta param
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return ParamCounts(total, trainable, linear)


def _probe_config(config, layers: int):
    """`config` with `layers` decoder layers and a PROBE_VOCAB vocabulary (per-layer lists such as layer_types cut
    to match)."""
    probe = copy.deepcopy(config)
    n = config.num_hidden_layers
    for key, value in list(vars(probe).items()):
        if isinstance(value, list) and len(value) == n and key != "architectures":
            setattr(probe, key, value[:layers])
    probe.num_hidden_layers = layers
    probe.vocab_size = PROBE_VOCAB
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(probe, key, None), int) and getattr(probe, key) >= PROBE_VOCAB:
            setattr(probe, key, 0)
    return probe


def _saved_bytes(model, tokens: int, compute: str = "weights") -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one training forward of 1 x tokens, computed
    as `compute` says (models/compute.py). A cast copy of a parameter (bf16 compute keeps one per linear layer for
    the backward) is not counted: it costs the same at any micro-batch (the memory plan adds it once)."""
    from grpo.models.compute import compute_context

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    # a weight's shape, either way round (a linear layer saves its cast weight transposed); PROBE_TOKENS is in none
    shapes = {s for p in model.parameters() if p.dim() == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in params and tuple(t.shape) not in shapes:
            seen[key] = max(seen.get(key, 0), storage.nbytes())
        return t

    model.train()
    ids = torch.randint(0, PROBE_VOCAB, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), compute_context(compute, torch.device("cpu")):
        body = model.get_base_model() if hasattr(model, "get_base_model") else model
        body.model(input_ids=ids, use_cache=False)  # the decoder stack; the head's cost is the caller's (chunked)
    return sum(seen.values())


def saved_bytes_per_token(config, dtype: torch.dtype, lora=None, checkpointing: bool = False,
                          compute: str = "weights") -> int:
    """Bytes autograd keeps per token of a training forward through the whole decoder stack of `config` in `dtype`
    (see the module docstring), computed as `compute` says (model.compute_dtype resolved, models/compute.py); with
    `checkpointing`, what gradient checkpointing keeps plus one layer's cost."""
    per_model = []
    for layers in (1, 2):
        model = _with_lora(_build(_probe_config(config, layers), dtype, "cpu"), lora)
        try:
            per_model.append(_saved_bytes(model, PROBE_TOKENS, compute) / PROBE_TOKENS)
        finally:
            del model
    layer = max(per_model[1] - per_model[0], 0.0)
    outside = max(per_model[0] - layer, 0.0)
    n = config.num_hidden_layers
    if checkpointing:
        hidden = getattr(config, "hidden_size", 0) * torch.finfo(dtype).bits // 8
        return int(n * hidden + layer + outside)
    return int(n * layer + outside)
