"""`model.name` = a local directory: random Qwen2 and Llama checkpoints with a chat-template tokenizer train
2 steps on a JSONL file of conversations (the acceptance test), in fp32 on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_hf import REWARDS, small_run
from transformers import AutoModelForCausalLM

from grpo.config import load_config
from grpo.models.loading import resolve_dtype
from grpo.train.trainer import Trainer


@pytest.mark.parametrize("arch,extra", [("qwen2", ()), ("llama", ("model.gradient_checkpointing=true",))])
def test_two_steps_on_a_local_model_from_a_chat_jsonl(model_dirs, chat_data, tmp_path, arch, extra):
    run = tmp_path / "run"
    trainer = Trainer(load_config(None, small_run(model_dirs[arch], chat_data, run, *extra)), reward_functions=REWARDS)
    try:
        p = trainer.train_prompts[0]
        assert p.text.startswith("<|im_start|>system\n") and p.text.endswith("<|im_start|>assistant\n")
        assert next(trainer.policy.parameters()).dtype == torch.float32
        assert any(getattr(m, "gradient_checkpointing", False) is True for m in trainer.policy.modules()) == bool(extra)
        before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
        summary = trainer.train()
    finally:
        trainer.close()
    assert summary["steps"] == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["rollout/len_mean"] > 0 for r in rows[1:])
    after = trainer.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    loaded = AutoModelForCausalLM.from_pretrained(run / "final")
    assert all(torch.equal(v, after[k]) for k, v in loaded.state_dict().items() if k in after)


def test_dtype_is_fp32_on_cpu_and_bf16_on_gpu():
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16


def test_grpo_eval_of_a_data_file_run_uses_its_held_out_rows(model_dirs, chat_data, tmp_path, capsys):
    from grpo.cli import main

    run = tmp_path / "run"
    trainer = Trainer(load_config(None, small_run(model_dirs["qwen2"], chat_data, run, "eval.n=4")))
    try:
        summary = trainer.train()
        held_out = [p.text for p in trainer.eval_prompts]
    finally:
        trainer.close()
    capsys.readouterr()
    assert main(["eval", str(run / "final"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["task"] == "file" and result["n"] == summary["eval/n"] == len(held_out)  # the same problems
    assert summary["eval/n"] + summary["eval/val_n"] <= len(trainer.task.split("test", 10**6))
    assert result["accuracy"] == summary["eval/accuracy_after"]
