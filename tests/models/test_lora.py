"""LoRA through peft: only adapter weights train; with kl.coef > 0 the reference is the policy with its adapters
disabled (one copy of the base weights in the process); the final save is adapter-only or merged."""

from __future__ import annotations

import gc
import json

import pytest
import torch
from helpers.tiny_hf import REWARDS, small_run
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from grpo.config import load_config
from grpo.models.lora import AdapterDisabledReference, FrozenReference, apply_lora, save_final
from grpo.train.trainer import Trainer


def logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lora_with_kl_trains_only_adapters_and_keeps_one_base_copy(model_dirs, chat_data, tmp_path):
    run = tmp_path / "run"
    cfg = load_config(None, small_run(model_dirs["qwen2"], chat_data, run, "model.lora_rank=4", "kl.coef=0.1",
                                      "model.lora_target_modules=[q_proj,v_proj,up_proj]"))
    trainer = Trainer(cfg, reward_functions=REWARDS)
    try:
        assert isinstance(trainer.ref, AdapterDisabledReference) and list(trainer.ref.parameters()) == []
        gc.collect()
        assert sum(type(o) is Qwen2ForCausalLM for o in gc.get_objects()) == 1  # no frozen copy anywhere
        before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
        trainer.train()
    finally:
        trainer.close()
    after = trainer.policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_A." in k or ".lora_B." in k for k in changed)
    assert {k.split(".")[-4] for k in changed} <= {"q_proj", "v_proj", "up_proj"}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["policy/kl"] > 0  # the adapters moved the policy away from the base model

    ids = torch.tensor([[3, 40, 50, 60, 70]])
    base = AutoModelForCausalLM.from_pretrained(model_dirs["qwen2"])
    with trainer.ref.active() as ref:  # pi_ref is exactly the untouched base model
        torch.testing.assert_close(logits(ref, ids), logits(base, ids), rtol=0, atol=1e-6)
    trained = logits(trainer.policy, ids)
    assert not torch.allclose(trained, logits(base, ids))

    final = run / "final"  # adapter-only by default: small, loadable by AutoModelForCausalLM through peft
    assert (final / "adapter_config.json").exists() and not (final / "model.safetensors").exists()
    torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(final), ids), trained, rtol=0, atol=1e-5)
    save_final(trainer.policy, tmp_path / "merged", merged=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in k for k in merged.state_dict())
    torch.testing.assert_close(logits(merged, ids), trained, rtol=0, atol=1e-5)


def test_full_fine_tuning_with_kl_keeps_a_frozen_copy(model_dirs, chat_data, tmp_path):
    cfg = load_config(None, small_run(model_dirs["llama"], chat_data, tmp_path / "run", "kl.coef=0.1"))
    trainer = Trainer(cfg, reward_functions=REWARDS)
    try:
        assert isinstance(trainer.ref, FrozenReference)
        assert all(not p.requires_grad for p in trainer.ref.parameters())
        assert len(list(trainer.ref.parameters())) == len(list(trainer.policy.parameters()))
    finally:
        trainer.close()


def test_unknown_target_modules_name_the_setting_and_the_layers(model_dirs):
    cfg = load_config(None, ["model.lora_rank=2", "model.lora_target_modules=[nope]"])
    with pytest.raises(ValueError, match=r"model.lora_target_modules=\['nope'\].*q_proj"):
        apply_lora(AutoModelForCausalLM.from_pretrained(model_dirs["qwen2"]), cfg.model)
