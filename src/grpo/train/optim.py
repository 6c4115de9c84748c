"""Optimizer and learning-rate schedule (AdamW with linear warm-up, then constant, cosine or linear decay)."""

from __future__ import annotations

import math

import torch


def build_optimizer(params, optim_cfg, total_steps: int, lr: float | None = None):
    """(AdamW, LambdaLR) for `params`; the schedule counts optimizer steps."""
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr or optim_cfg.lr, betas=tuple(optim_cfg.betas),
                            weight_decay=optim_cfg.weight_decay)
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
