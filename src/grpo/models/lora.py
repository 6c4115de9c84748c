"""LoRA through peft, the reference policy pi_ref of the KL term, and the final save.

    apply_lora(model, model_cfg) -> PeftModel    LoraConfig(r, alpha, dropout, target_modules); only adapters train
    reference_policy(policy, cfg)                None when beta = 0 (no reference at all);
                                                 with LoRA: the policy itself with its adapters disabled, so the
                                                 base weights exist once (DESIGN.md, "no second copy");
                                                 otherwise a frozen copy of the initial policy
    save_final(model, directory, merged=False)   a PeftModel saves its adapter (adapter_config.json +
                                                 adapter_model.safetensors, loadable by AutoModelForCausalLM or
                                                 peft) or, merged, full weights W + (alpha/r) B A; other models
                                                 save_pretrained as usual

A reference is used as `with ref.active() as model: logp = ...` under no_grad; `ref.parameters()` are the
parameters it holds beyond the policy's (none for the adapter-disabled reference).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from pathlib import Path

import torch

log = logging.getLogger("grpo.models")

__all__ = ["AdapterDisabledReference", "FrozenReference", "apply_lora", "frozen_copy", "is_peft", "merged_state_dict",
           "reference_policy", "save_final", "saved_bytes", "unwrap", "check_target_modules"]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        inner = getattr(model, "module", None) if isinstance(model, torch.nn.parallel.DistributedDataParallel) \
            else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def is_peft(model) -> bool:
    return hasattr(unwrap(model), "peft_config")


def apply_lora(model, model_cfg):
    """Wrap `model` in a peft LoRA model; base weights are frozen, adapters (B = 0 at start) train."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # depends on the optional extra
        from grpo.errors import MissingExtraError

        raise MissingExtraError("model.lora_rank > 0 needs peft: pip install 'grpo[lora]'") from e
    r = model_cfg.lora_rank
    targets = model_cfg.lora_target_modules
    check_target_modules(model, targets)
    config = LoraConfig(r=r, lora_alpha=model_cfg.lora_alpha or 2 * r, lora_dropout=model_cfg.lora_dropout,
                        target_modules=targets, bias="none", task_type="CAUSAL_LM")
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as e:
        from grpo.errors import ConfigError

        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(f"model.lora_target_modules={targets!r} does not fit this model ({e}); its linear "
                         f"layers are {names}") from e
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    log.info("LoRA r=%d alpha=%s on %s: %d of %d parameters train", r, config.lora_alpha, targets, trainable, total)
    return peft_model


def check_target_modules(model, targets) -> None:
    """ConfigError naming each entry of model.lora_target_modules (a list of module names, matched as peft does: the
    last part(s) of a module's dotted name) that names no linear or embedding layer of `model`; peft itself would
    keep a wrong name silently when another one matches. A string (a regex or "all-linear") or null goes to peft."""
    if not isinstance(targets, (list, tuple)):
        return
    import difflib

    from grpo.errors import ConfigError

    layers = [n for n, m in model.named_modules()
              if isinstance(m, (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d)) or type(m).__name__ == "Conv1D"]
    bad = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in layers)]
    if bad:
        names = sorted({n.rsplit(".", 1)[-1] for n in layers})
        hints = "".join(f" ({b!r}: did you mean {c[0]!r}?)" for b in bad
                        if (c := difflib.get_close_matches(b.rsplit(".", 1)[-1], names, 1)))
        raise ConfigError(f"model.lora_target_modules={list(targets)!r}: {', '.join(map(repr, bad))} "
                          f"{'is' if len(bad) == 1 else 'are'} not a layer of this model{hints}; its linear and "
                          f"embedding layers are {names}")


class FrozenReference:
    """pi_ref as a frozen copy of the initial policy (full fine-tuning)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    @contextlib.contextmanager
    def active(self):
        yield self.model

    def parameters(self):
        return self.model.parameters()


class AdapterDisabledReference:
    """pi_ref as the policy's base model: the same PeftModel with its adapters disabled (no second copy)."""

    def __init__(self, peft_model):
        self.peft_model = peft_model

    @contextlib.contextmanager
    def active(self):
        with self.peft_model.disable_adapter():
            yield self.peft_model

    def parameters(self):
        return iter(())  # it holds nothing beyond the policy's own weights


def reference_policy(policy, cfg):
    """The reference for kl.coef > 0 (None otherwise), built before the policy is wrapped or sharded."""
    if cfg.kl.coef <= 0:
        return None  # beta = 0 loads no reference at all
    if is_peft(policy):
        return AdapterDisabledReference(unwrap(policy))
    from grpo.models.precision import frozen_dtype, store_linears_bf16, stores_linears_bf16

    param = next(unwrap(policy).parameters())
    if stores_linears_bf16(cfg, param.device, param.dtype):
        return FrozenReference(store_linears_bf16(frozen_copy(unwrap(policy))))
    return FrozenReference(frozen_copy(unwrap(policy)).to(frozen_dtype(cfg, param.device, param.dtype)))


# ------------------------------------------------------------------------------------------------ saving
def merged_state_dict(peft_model) -> dict[str, torch.Tensor]:
    """The base model's state dict (its own key names) with each LoRA delta (alpha/r) B A added, on the CPU.

    Computed from the adapters without touching the model (no merge/unmerge round trip), so training can go on.
    """
    from peft.tuners.lora import LoraLayer

    from grpo.models.precision import Bf16StoredLinear

    base = peft_model.get_base_model()
    adapter = peft_model.active_adapter
    out = {k.replace(".base_layer.", "."): v.detach() for k, v in base.state_dict().items() if ".lora_" not in k}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            key = f"{name}.weight"
            delta = module.get_delta_weight(adapter).detach()
            computed = torch.float32 if isinstance(module.get_base_layer(), Bf16StoredLinear) else out[key].dtype
            out[key] = (out[key].to(torch.float32) + delta.to(torch.float32)).to(computed)
    return {k: v.cpu() for k, v in out.items()}


def save_final(model, directory: str | Path, *, merged: bool = False, state_dict: dict | None = None) -> None:
    """Save a trained policy for `from_pretrained`: adapter-only or merged for a PeftModel, else full weights.

    state_dict: a full (gathered) state dict to write instead of the module's own (FSDP, see grpo.parallel).
    """
    model, directory = unwrap(model), Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if is_peft(model) and merged:
        base = model.get_base_model()
        base.save_pretrained(directory, state_dict=merged_state_dict(model), safe_serialization=True)
        return
    kwargs = {"state_dict": state_dict} if state_dict is not None else {}
    model.save_pretrained(directory, safe_serialization=True, **kwargs)


def saved_bytes(model, *, merged: bool = False) -> int:
    """About the bytes of the weights save_final (or a checkpoint) writes for `model`: a PeftModel's adapter (its
    base's weights when `merged`), else the state dict, each storage once (tied weights are stored once)."""
    model = unwrap(model)
    if is_peft(model):
        if merged:
            tensors = [v for k, v in model.get_base_model().state_dict().items() if ".lora_" not in k]
        else:
            from peft import get_peft_model_state_dict

            tensors = list(get_peft_model_state_dict(model).values())
    else:
        tensors = list(model.state_dict().values())
    seen = {(t.data_ptr(), t.numel(), t.dtype) if t.numel() else id(t): t.numel() * t.element_size() for t in tensors}
    return sum(seen.values())


def frozen_copy(model):
    """A frozen copy (eval mode, no gradients) for the reference model pi_ref."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref
