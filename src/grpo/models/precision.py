"""Which dtype weights are held in, decided from this machine at run time: bfloat16 only where its matrix products
are native (CUDA, or a CPU whose /proc/cpuinfo flags include AVX512-BF16 or AMX-BF16), never by assumption.

    cpu_native_bf16()                 True on a CPU with native bf16 matrix products
    frozen_dtype(cfg, device, dtype)  the dtype of weights that never train (LoRA's base, the reference copy)
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["cpu_native_bf16", "frozen_dtype"]


def cpu_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when this CPU multiplies bfloat16 natively: AVX512-BF16 or AMX-BF16 among /proc/cpuinfo's flags (read
    at run time, never assumed; elsewhere torch emulates bf16 matrix products, far slower than float32).
    `cpuinfo`: that file's text (tests)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def frozen_dtype(cfg, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype of weights that never train (LoRA's base, the reference copy): model.frozen_dtype; auto is
    bfloat16 where its matrix products are native (CUDA, a CPU with cpu_native_bf16), else the policy's `dtype`."""
    name = cfg.model.frozen_dtype
    if name == "auto":
        native = device.type == "cuda" or (device.type == "cpu" and cpu_native_bf16())
        return torch.bfloat16 if native and dtype != torch.float16 else dtype
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]
