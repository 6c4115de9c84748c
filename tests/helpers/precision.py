"""The precision a test means, pinned in its config, so that no test depends on the CPU it runs on.

`model.compute_dtype=auto` and `model.frozen_dtype=auto` decide from the CPU's flags (grpo.models.precision
cpu_native_bf16: /proc/cpuinfo, or GRPO_CPU_BF16=native|none): bf16 on a CPU with AVX512-BF16 or AMX, float32
elsewhere. A test that compares the trainer with a float32 reference pins FLOAT32; a test of an `auto` choice
replaces the probe itself and checks both answers; the bf16 variants of the wiring tests pin bf16_compute().

bf16 keeps 8 significant bits (7 stored): a value rounds to within BF16_UNIT / 2 of itself, relatively. The
tolerances of the bf16 variants are stated as multiples of BF16_UNIT (wiring_helpers.py, test_torchrun.py).
"""

from __future__ import annotations

FLOAT32 = ("model.compute_dtype=float32", "model.frozen_dtype=float32")
BF16_UNIT = 2.0 ** -7  # the spacing of bf16 values in [1, 2): 8 significant bits, 7 of them stored


def bf16_compute() -> str:
    """model.compute_dtype of a bf16 variant: bfloat16 where the CPU multiplies bf16 natively (or GRPO_CPU_BF16=native
    says so), bfloat16_emulated (the same roundings, float32 products) elsewhere."""
    from grpo.models.precision import cpu_native_bf16

    return "bfloat16" if cpu_native_bf16() else "bfloat16_emulated"
