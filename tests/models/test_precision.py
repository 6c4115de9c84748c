"""Weights that never train (LoRA's base, the reference copy) in bfloat16 where its matrix products are native:
the CPU's flags are read at run time (/proc/cpuinfo), the rule is model.frozen_dtype's, and a LoRA run with a
bf16 base trains float32 adapters only; a full run's bf16 reference gives the float32 reference's log-probs within
bf16's rounding."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_hf import REWARDS, small_run

from grpo.config import load_config
from grpo.models import precision
from grpo.models.precision import cpu_native_bf16, frozen_dtype
from grpo.train.trainer import Trainer

MILAN = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma avx512f vaes\n\nprocessor\t: 1\nflags\t\t: fpu avx2\n"
GENOA = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert not cpu_native_bf16(MILAN)
    assert cpu_native_bf16(GENOA) and cpu_native_bf16(SAPPHIRE)
    assert not cpu_native_bf16("model name\t: avx512_bf16 in a name, not a flag\n")
    this_machine = open("/proc/cpuinfo").read()
    assert cpu_native_bf16() == ("avx512_bf16" in this_machine.split() or "amx_bf16" in this_machine.split())


@pytest.mark.parametrize("setting, device, native, want", [
    ("auto", "cpu", False, torch.float32),
    ("auto", "cpu", True, torch.bfloat16),
    ("auto", "cuda", False, torch.bfloat16),
    ("float32", "cpu", True, torch.float32),
    ("bfloat16", "cpu", False, torch.bfloat16),
])
def test_frozen_dtype_rule(setting, device, native, want, monkeypatch):
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: native)
    cfg = load_config(None, [f"model.frozen_dtype={setting}"])
    assert frozen_dtype(cfg, torch.device(device), torch.float32) == want


def test_lora_with_a_bf16_base_trains_float32_adapters_only(model_dirs, chat_data, tmp_path):
    cfg = load_config(None, small_run(model_dirs["qwen2"], chat_data, tmp_path / "run", "model.lora_rank=4",
                                      "model.frozen_dtype=bfloat16", "kl.coef=0.1", "train.steps=1"))
    trainer = Trainer(cfg, reward_functions=REWARDS)
    try:
        params = dict(trainer.policy.named_parameters())
        base = {k: p for k, p in params.items() if "lora_" not in k}
        adapters = {k: p for k, p in params.items() if "lora_" in k}
        assert base and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in base.values())
        assert adapters and all(p.dtype == torch.float32 and p.requires_grad for p in adapters.values())
        before = {k: p.detach().clone() for k, p in params.items()}
        result = trainer.step()
        assert result.metrics["policy/grad_norm"] > 0
        changed = {k for k, p in trainer.policy.named_parameters() if not torch.equal(before[k], p.detach())}
        assert changed and all("lora_" in k for k in changed)
    finally:
        trainer.close()


def test_a_bf16_reference_gives_the_float32_references_log_probs(model_dirs, chat_data, tmp_path):
    """Full fine-tuning, kl.coef > 0: the reference copy in bf16 (half the bytes), its log-probs of a sampled batch
    within bf16's rounding of the float32 copy's, computed here by a direct forward of the initial model."""
    from grpo.train.update import batch_logprobs

    runs = {}
    for dtype in ("bfloat16", "float32"):
        cfg = load_config(None, small_run(model_dirs["llama"], chat_data, tmp_path / dtype, "kl.coef=0.1",
                                          f"model.frozen_dtype={dtype}"))
        trainer = Trainer(cfg, reward_functions=REWARDS)
        runs[dtype] = trainer
    try:
        ref_params = list(runs["bfloat16"].ref.parameters())
        assert ref_params and all(p.dtype == torch.bfloat16 for p in ref_params)
        assert all(p.dtype == torch.float32 for p in runs["bfloat16"].policy.parameters())  # the policy trains fp32
        scored = runs["float32"].rollouts.next(0)
        batch = runs["float32"]._policy_batch(scored.rollouts)
        out = {}
        for dtype, trainer in runs.items():
            with trainer.ref.active() as ref:
                out[dtype] = batch_logprobs(ref, batch, 10_000, 1.0)
        m = batch.mask.bool()
        gap = (out["bfloat16"][m] - out["float32"][m]).abs()
        assert gap.max() < 0.1 and gap.max() > 0  # bf16 rounds (about 3 significant digits); not the same tensor
    finally:
        for trainer in runs.values():
            trainer.close()


def test_a_bf16_file_loads_as_float32_with_the_same_values_and_tied_head(tmp_path):
    """load_policy converts a model loaded in its file's dtype (bfloat16 here) one parameter at a time: every value
    is the file's exactly (bf16 -> fp32 is exact), the head's tie is the config's, config.dtype is float32."""
    from helpers.tiny_hf import save_tiny_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo.models.loading import load_policy

    path = save_tiny_model(tmp_path / "fp32", "qwen2")
    bf16 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    bf16.save_pretrained(tmp_path / "bf16")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "bf16" / f).write_bytes((path / f).read_bytes())
    saved = load_file(tmp_path / "bf16" / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in saved.values())
    model, _ = load_policy(load_config(None, [f"model.name={tmp_path / 'bf16'}"]), tmp_path / "bf16")
    state = model.state_dict()
    assert all(state[k].dtype == torch.float32 and torch.equal(state[k], v.float()) for k, v in saved.items())
    assert model.config.dtype == torch.float32
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == bool(model.config.tie_word_embeddings)  # as the file says (the conversion keeps a tie)
