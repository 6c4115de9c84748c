"""Optimizer and learning-rate schedule (AdamW with linear warm-up, then constant, cosine or linear decay).

optim.name chooses the AdamW: torch's (float32 moments), or torchao's AdamW8bit (the moments in 8 bits, block-wise
scaled; the same update up to the moments' rounding), for full fine-tuning where the moments are the largest part.
"""

from __future__ import annotations

import math
import shutil

import torch

from grpo.errors import ConfigError, MissingExtraError

# torchao's AdamW8bit: moments of tensors of at least 4,096 values (a multiple of the block) are 8-bit codes with a
# float32 scale per block of 256; smaller ones (norms, biases) stay float32. Bytes of one moment per parameter
# (torch's AdamW: the parameter's own dtype):
MOMENT_BYTES = {"adamw_8bit": 1.0 + 4 / 256}


def build_optimizer(params, optim_cfg, total_steps: int, lr: float | None = None):
    """(AdamW, LambdaLR) for `params`; the schedule counts optimizer steps.

    AdamW is torch's fused kernel where it applies (plain CPU or CUDA tensors, not FSDP's DTensors): on the CPU the
    default per-parameter loop builds two temporaries the size of the parameter in each step (1 GiB at a 0.5B
    model's 151,936 x 896 embedding, while the gradients are alive); the update is the same AdamW
    (tests/train/test_wiring_optim.py). The fused kernel writes the parameters without bumping their in-place
    version counters, which the vLLM engine reads to know that the weights changed (rollout/vllm_engine.py
    `param_versions`): a hook bumps them after each step, as the per-parameter loop's own writes do."""
    params = [p for p in params if p.requires_grad]
    if optim_cfg.name == "adamw_8bit":
        opt = _adamw_8bit(params, optim_cfg, lr or optim_cfg.lr)
    else:
        fused = _fused_applies(params)
        opt = torch.optim.AdamW(params, lr=lr or optim_cfg.lr, betas=tuple(optim_cfg.betas),
                                weight_decay=optim_cfg.weight_decay, fused=fused or None)
        if fused:
            opt.register_step_post_hook(_mark_written)
    warm, kind = optim_cfg.warmup_steps, optim_cfg.schedule
    total = max(total_steps, 1)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(total - warm, 1))
        if kind == "cosine":
            return 0.5 * (1 + math.cos(math.pi * progress))
        if kind == "linear":
            return 1.0 - progress
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _adamw_8bit(params: list, optim_cfg, lr: float):
    """torchao's AdamW8bit with AdamW's settings (eps 1e-8 as torch's). Its step runs torch.compile, which on the CPU
    builds C++: checked here, not at the first step after the model and the first rollouts."""
    try:
        from torchao.optim import AdamW8bit
    except ImportError as e:
        raise MissingExtraError(f"optim.name=adamw_8bit needs torchao: pip install 'grpo[torchao]' ({e})") from e
    devices = {p.device.type for p in params}
    if "cpu" in devices and not _cxx_compiler():
        raise ConfigError("optim.name=adamw_8bit compiles its step with torch.compile, which on the CPU needs a C++ "
                          "compiler, and none was found (install g++, or set CXX); optim.name=adamw needs none")
    if any(type(p.data) is not torch.Tensor for p in params):
        raise ConfigError("optim.name=adamw_8bit is not supported with sharded parameters (parallel.strategy=fsdp); "
                          "use optim.name=adamw, or parallel.strategy=ddp")
    # its compiled step bumps the parameters' version counters itself, as the vLLM engine needs (tested)
    return AdamW8bit(params, lr=lr, betas=tuple(optim_cfg.betas), eps=1e-8, weight_decay=optim_cfg.weight_decay)


def _cxx_compiler() -> str | None:
    """The C++ compiler torch's inductor calls on Linux (torch._inductor.config.cpp.cxx): $CXX, else g++; None when it
    is not on PATH."""
    import os

    return shutil.which(os.environ.get("CXX") or "g++")


def _mark_written(optimizer, args, kwargs) -> None:
    """Bump the version counter of each parameter the step wrote (the fused kernel does not)."""
    for group in optimizer.param_groups:
        written = [p for p in group["params"] if p.grad is not None]
        if written:
            torch.autograd.graph.increment_version(written)


def _fused_applies(params: list) -> bool:
    """torch's fused AdamW takes plain floating-point tensors, all on one CPU or CUDA device."""
    devices = {p.device.type for p in params}
    return bool(params) and len(devices) == 1 and devices <= {"cpu", "cuda"} \
        and all(type(p.data) is torch.Tensor and p.is_floating_point() for p in params)


def guarded_step(params, optimizer, scheduler, max_grad_norm: float, finite: bool) -> torch.Tensor | None:
    """The optimizer step of the policy and of the critic, after the gradients of one update are in place: clip the
    gradient norm to `max_grad_norm`, then step the optimizer and the schedule; a non-finite loss (`finite` False,
    agreed by every rank) or gradient norm skips the step and clears the gradients (never apply a non-finite
    update). Returns the gradient norm before clipping (0-d; FSDP: the whole model's), or None when skipped."""
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm) if finite else None
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor
        grad_norm = grad_norm.full_tensor()
    if not finite or not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    scheduler.step()
    return grad_norm
