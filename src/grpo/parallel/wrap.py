"""Wrapping the policy for data-parallel training, and what the wrappers change around it.

    wrap_policy(model, d, ref)   DDP (parallel.strategy=ddp) or FSDP2 `fully_shard` per decoder layer, then the
                                 root (parallel.strategy=fsdp; a frozen reference copy too); call it BEFORE
                                 building the optimizer (FSDP replaces the parameters)
    shard_frozen(model, d)       FSDP: shard a module that way (it also suits one that does not train)
    backward_sync(model, d, on)  gradient synchronisation on or off for one micro-batch's backward (no_sync)
    generation(model, d)         FSDP: gather every layer's weights once, decode without collectives (ranks stop
                                 at different lengths), then reshard; DDP: nothing (generation uses the module)
    align_batch(batch, d, pad)   pad prompts (left) and completions (right) to the job's longest, so every rank
                                 has the same shapes and the same number of micro-batches (FSDP's collectives
                                 happen per forward, so the counts must match)
    checkpoint_views(...)        objects that `save_checkpoint` / `load_checkpoint` use like a model and an
                                 optimizer: FSDP gathers full state dicts (collective) and loads them back into
                                 the shards; DDP and one process: the objects themselves
    SyncedGuard                  a preemption flag read the same on every rank (an all-reduce per read)
    NullWriter                   what ranks other than 0 write metrics to

FSDP2 works with gloo on the CPU too (tested there); mixed precision (bf16 parameters on CUDA) comes from the
model's dtype (model.dtype=auto: bf16 on CUDA), not from an FSDP policy.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from grpo.parallel.dist import Dist


def _fsdp():
    from torch.distributed.fsdp import FSDPModule, fully_shard

    return FSDPModule, fully_shard


def _layers(model) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (or of the model under a peft wrapper)."""
    layer_cls = set(getattr(model, "_no_split_modules", None) or [])
    inner = getattr(model, "get_base_model", lambda: model)()
    layer_cls |= set(getattr(inner, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in layer_cls]


def is_fsdp(model) -> bool:
    """True for a module sharded with FSDP2 `fully_shard`."""
    if not torch.distributed.is_available():
        return False
    FSDPModule, _ = _fsdp()
    return isinstance(model, FSDPModule)


def wrap_policy(model: torch.nn.Module, d: Dist, reference=None) -> torch.nn.Module:
    """The module to train through: the model itself (one process), a DDP wrapper, or the model sharded in place
    (FSDP; a frozen reference copy, `reference.model`, is sharded too)."""
    if not d.enabled:
        return model
    if d.strategy == "fsdp":
        shard_frozen(model, d)
        if isinstance(getattr(reference, "model", None), torch.nn.Module):
            shard_frozen(reference.model, d)
        return model
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    ids = [d.device.index] if d.device.type == "cuda" else None
    # buffers (rotary tables) are identical on every rank: no sync, so forwards issue no extra collectives
    newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    no_sync = {"forward_sync_buffers": False} if newer else {"broadcast_buffers": False}
    return DistributedDataParallel(model, device_ids=ids, **no_sync)


def shard_frozen(model: torch.nn.Module, d: Dist) -> torch.nn.Module:
    if d.enabled and d.strategy == "fsdp":
        _, fully_shard = _fsdp()
        for layer in _layers(model):
            fully_shard(layer)
        fully_shard(model)
    return model


def backward_sync(model: torch.nn.Module, d: Dist, sync: bool):
    """Context for one backward: `sync=False` accumulates locally (all but the last micro-batch)."""
    if not d.enabled or sync:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    FSDPModule, _ = _fsdp()
    if isinstance(model, FSDPModule):
        return _fsdp_no_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


@contextlib.contextmanager
def generation(model: torch.nn.Module, d: Dist):
    """FSDP: every rank gathers the full weights once (the same collectives in the same order), then decodes on
    its own for as many steps as its prompts need; the shards and each module's reshard-after-forward setting
    (the root's differs; FSDP sets it at its lazy init) are restored at the end."""
    FSDPModule, _ = _fsdp() if d.enabled and d.strategy == "fsdp" else (None, None)
    if FSDPModule is None or not isinstance(model, FSDPModule):
        yield
        return
    model._get_fsdp_state()._lazy_init()  # settle the root's settings before saving them (idempotent)
    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    saved = []
    for m in mods:
        state = m._get_fsdp_state()
        saved.append((state, state._auto_reshard_after_forward,
                      [g.post_forward_mesh_info for g in state._fsdp_param_groups]))
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
        for state, auto, infos in saved:
            state._auto_reshard_after_forward = auto
            for g, info in zip(state._fsdp_param_groups, infos):
                g.post_forward_mesh_info = info


def align_batch(batch, d: Dist, pad_id: int):
    """Pad a PolicyBatch (in place) to the job-wide longest prompt and completion; returns it."""
    if not d.enabled:
        return batch
    L, T = (int(x) for x in d.reduce([batch.prompt_ids.shape[1], batch.completion_ids.shape[1]], "max"))
    pl, pt = L - batch.prompt_ids.shape[1], T - batch.completion_ids.shape[1]
    pad = torch.nn.functional.pad
    if pl:
        batch.prompt_ids, batch.prompt_mask = pad(batch.prompt_ids, (pl, 0), value=pad_id), pad(batch.prompt_mask, (pl, 0))
    if pt:
        batch.completion_ids, batch.mask = pad(batch.completion_ids, (0, pt), value=pad_id), pad(batch.mask, (0, pt))
        for name in ("old_logp", "ref_logp", "sampler_logp", "attention_mask"):
            if getattr(batch, name) is not None:
                setattr(batch, name, pad(getattr(batch, name), (0, pt)))
    return batch


# ------------------------------------------------------------------ checkpoints under FSDP
class _FullModel:
    """The policy as `save_checkpoint` / `Checkpoint.load_model_into` see it under FSDP: full state dicts.

    For a save, the state is gathered when the view is made (every rank takes part) and rank 0 writes it; for a
    resume every rank reads the file and loads its shards from the full tensors.
    """

    def __init__(self, model, state: dict | None = None):
        self.model, self._state = model, state

    def state_dict(self):
        """For a save: the gathered state (rank 0 holds the tensors, the other ranks an empty dict). For a
        resume (only the key names and tied weights matter): this rank's local shards."""
        if self._state is not None:
            return self._state
        return {k: v.to_local() if hasattr(v, "to_local") else v for k, v in self.model.state_dict().items()}

    def gather(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_state_dict(self, state, strict: bool = True):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        return set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True,
                                                                                strict=strict))

    def save_pretrained(self, directory, safe_serialization: bool = True):
        from grpo.models.lora import is_peft

        state = self.state_dict()
        if not is_peft(self.model):
            self.model.save_pretrained(directory, state_dict=state, safe_serialization=True)
            return
        from safetensors.torch import save_file  # adapters and base weights, peft's key names (resume only)

        seen, flat = set(), {}
        for k, v in state.items():
            flat[k] = v.contiguous() if v.data_ptr() not in seen else v.clone()
            seen.add(v.data_ptr())
        save_file(flat, str(Path(directory) / "model.safetensors"))


class _FullOptimizer:
    def __init__(self, model, optimizer, state: dict | None = None):
        self.model, self.optimizer, self._state = model, optimizer, state

    def state_dict(self):
        return self._state

    def load_state_dict(self, state):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))


def checkpoint_views(model, optimizer, d: Dist, *, for_save: bool):
    """(model, optimizer) to hand to the checkpoint functions: the objects themselves, or full-state views under
    FSDP. for_save=True gathers the full states now: call it on EVERY rank, then save on rank 0 only."""
    if not (d.enabled and d.strategy == "fsdp"):
        return model, optimizer
    if not for_save:
        return _FullModel(model), _FullOptimizer(model, optimizer)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = _FullModel(model).gather()
    optim_state = get_optimizer_state_dict(model, optimizer, options=full)
    return _FullModel(model, model_state), _FullOptimizer(model, optimizer, optim_state)


def full_state_dict(model, d: Dist) -> dict | None:
    """FSDP: the gathered state dict (collective: every rank calls it; rank 0 gets the tensors); otherwise None
    (the module saves itself)."""
    if d.enabled and d.strategy == "fsdp":
        return _FullModel(model).gather()
    return None


# ------------------------------------------------------------------ the run loop's helpers
class SyncedGuard:
    """A PreemptionGuard whose `requested` is the OR over the ranks, so every rank stops at the same step.
    Every rank must read it at the same points (the loop's control flow is the same on every rank)."""

    def __init__(self, guard, d: Dist):
        self._guard, self._d = guard, d

    @property
    def requested(self) -> bool:
        return self._d.any(self._guard.requested) if self._d.enabled else self._guard.requested

    def __getattr__(self, name):
        return getattr(self._guard, name)


class NullWriter:
    """Accepts records and writes nothing (ranks other than 0)."""

    def write(self, record) -> None:
        pass

    def close(self) -> None:
        pass


__all__ = ["NullWriter", "SyncedGuard", "align_batch", "backward_sync", "checkpoint_views", "full_state_dict",
           "generation", "is_fsdp", "shard_frozen", "wrap_policy"]
