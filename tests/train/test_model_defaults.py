"""Defaults by model (grpo.train.defaults): a model directory gets its own learning rate and evaluation batch unless
the user set them; the built-in model keeps every value; the resolved values are what the run saves."""

from __future__ import annotations

import io

import pytest
import yaml

from helpers.tiny_hf import save_tiny_model, small_run, write_chat_jsonl

from grpo.config import Config, EvalConfig, ModelConfig, OptimConfig, load_config  # noqa: E402
from grpo.train.defaults import model_defaults  # noqa: E402

USER = ["model.name=./my-model"]


def resolved(source=None, overrides=()):
    cfg, notes = model_defaults(load_config(source, list(overrides)))
    return cfg, notes


def test_the_builtin_model_keeps_every_value():
    for preset in (None, "cispo", "ppo"):
        before = load_config(preset)
        cfg, notes = model_defaults(before)
        assert notes == [] and cfg.to_dict() == before.to_dict()
    assert resolved()[0].optim.lr == 1e-4 and resolved("cispo")[0].optim.lr == 5e-5


def test_a_model_directory_gets_safe_defaults_with_the_reason():
    cfg, notes = resolved(None, USER)
    assert (cfg.optim.lr, cfg.algo.value_lr, cfg.eval.batch_size) == (1e-6, 1e-5, 64)
    assert notes[0] == "optim.lr=1e-6 (default for full fine-tuning of a user model; set optim.lr to change)"
    assert not any("value_lr" in n for n in notes)  # resolved, but only PPO's critic uses it: no note
    lora, notes = resolved(None, [*USER, "model.lora_rank=8"])
    assert lora.optim.lr == 1e-5
    assert notes[0] == "optim.lr=1e-5 (default for LoRA fine-tuning of a user model; set optim.lr to change)"
    ppo, notes = resolved("ppo", USER)
    assert ppo.algo.value_lr == 1e-5 and any(n.startswith("algo.value_lr=1e-5 (") for n in notes)


def test_what_the_user_set_wins(tmp_path):
    cfg, notes = resolved(None, [*USER, "optim.lr=3e-5", "eval.batch_size=250",  # the command line
                                 "rollout.max_new_tokens=48"])
    assert (cfg.optim.lr, cfg.eval.batch_size, cfg.rollout.max_new_tokens) == (3e-5, 250, 48) and notes == []
    own = tmp_path / "mine.yaml"
    own.write_text("extends: cispo\nmodel:\n  name: ./my-model\noptim:\n  lr: 2.0e-5\n")  # the user's YAML
    assert resolved(own)[0].optim.lr == 2e-5
    code = Config(model=ModelConfig(name="./m"), optim=OptimConfig(lr=7e-6), eval=EvalConfig(batch_size=8))
    cfg, notes = model_defaults(code)  # fields given in code
    assert (cfg.optim.lr, cfg.eval.batch_size) == (7e-6, 8) and [n.split("=")[0] for n in notes] == [
        "rollout.max_new_tokens"]  # the one not given
    assert model_defaults(Config(model=ModelConfig(name="./m")))[0].optim.lr == 1e-6  # not given: the default


def test_a_presets_learning_rate_is_a_ratio_for_a_model_directory(tmp_path):
    """cispo halves the built-in lr (two updates per batch): a model directory gets half its own default."""
    cfg, notes = resolved("cispo", USER)
    assert cfg.optim.lr == pytest.approx(5e-7)
    assert notes[0] == ("optim.lr=5e-7 (default for full fine-tuning of a user model, 1e-6, times the cispo preset's "
                        "0.5 of the built-in 1e-4; set optim.lr to change)")
    own = tmp_path / "mine.yaml"
    own.write_text("extends: cispo\nmodel:\n  name: ./my-model\n  lora_rank: 4\n")  # extends without setting lr
    assert resolved(own)[0].optim.lr == pytest.approx(5e-6)
    assert resolved("dapo", USER)[0].optim.lr == 1e-6  # dapo sets no lr


def test_resolving_twice_and_the_saved_config_change_nothing(tmp_path):
    cfg, _ = resolved("cispo", USER)
    again, notes = model_defaults(cfg)
    assert notes == [] and again.to_dict() == cfg.to_dict()
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    reloaded, notes = model_defaults(load_config(saved))
    assert notes == [] and reloaded.to_dict() == cfg.to_dict()


def test_extends_marks_only_written_keys_as_set():
    """The `extends` chain merges the files' own keys: defaults are not 'set' by the preset that is extended."""
    cfg = load_config("dapo")
    assert "lr" not in cfg.optim.model_fields_set and "batch_size" not in cfg.eval.model_fields_set
    assert "algo.drop_zero_std_groups" in cfg.preset_keys and "optim.lr" not in cfg.preset_keys
    assert load_config("dapo", ["algo.clip_high=0.3"]).preset_keys == cfg.preset_keys - {"algo.clip_high"}


def test_the_trainer_prints_uses_and_saves_the_resolved_values(tmp_path):
    from rich.console import Console

    from grpo.train.trainer import Trainer

    model = save_tiny_model(tmp_path / "model")
    data = write_chat_jsonl(tmp_path / "d.jsonl")
    overrides = [o for o in small_run(model, data, tmp_path / "run", "train.steps=1") if not o.startswith("optim.lr")]
    out = io.StringIO()
    trainer = Trainer(load_config(None, overrides), console=Console(file=out, width=200))
    try:
        assert trainer.cfg.optim.lr == 1e-5  # a tiny model: the table's 1e-6, then the small-model 1e-5
        assert trainer.optimizer.param_groups[0]["initial_lr"] == 1e-5
        n = sum(p.numel() for p in trainer.policy.parameters())
        lr_lines = [line for line in out.getvalue().splitlines() if "optim.lr=" in line]
        assert lr_lines == [f"[grpo] optim.lr=1e-5 (default for full fine-tuning of a user model under 200M "
                            f"parameters: this one has {n / 1e6:.1f}M, and on SmolLM2-135M 1e-5 learned where 1e-6 "
                            "did not in the measured budget, bench/results/learning_vs_trl_smollm2.json; set optim.lr "
                            "to change)"]  # one note, the final value: not the table's 1e-6 first (issue 42)
        trainer.train()
    finally:
        trainer.close()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["optim"]["lr"] == 1e-5 and saved["eval"]["batch_size"] == 64


def test_a_small_model_gets_1e_5_only_where_the_table_set_a_full_fine_tuning_lr():
    from grpo.train.defaults import small_model_lr

    lr_note = ["optim.lr=1e-6 (default for full fine-tuning of a user model; set optim.lr to change)"]

    def resolved(num_params, notes=lr_note, lora=0, lr=1e-6):
        cfg = load_config(None, [f"model.lora_rank={lora}", f"optim.lr={lr}"])
        note = small_model_lr(cfg, notes, num_params)
        return cfg.optim.lr, note

    lr, note = resolved(134_515_008)  # SmolLM2-135M
    assert lr == 1e-5 and note.startswith("optim.lr=1e-5 (default for full fine-tuning of a user model under 200M "
                                          "parameters: this one has 134.5M,")
    assert resolved(494_000_000) == (1e-6, None)  # Qwen2.5-0.5B: the published recipes' value
    assert resolved(3_436_544, lora=8, lr=1e-5) == (1e-5, None)  # LoRA has its own default
    assert resolved(3_436_544, notes=["eval.batch_size=64 (default ...)"], lr=3e-6) == (3e-6, None)  # the user's
    assert resolved(3_436_544, lr=5e-7)[0] == pytest.approx(5e-6)  # a preset's ratio (cispo: half) is kept


@pytest.mark.parametrize("own", [False, True])
def test_grpo_eval_of_a_bare_model_directory_gets_the_user_model_eval_batch(tmp_path, monkeypatch, own):
    """`grpo eval DIR` without a run's config.yaml: the directory is a user model, so eval.batch_size is 64 unless
    given (the built-in 250 can need more memory than a training step on a real model)."""
    import grpo.train.evaluate as evaluate
    from grpo.cli import main

    seen = {}

    def fake(model, tokenizer, task, prompts, **kw):
        seen.update(kw)
        return {"accuracy": 0.0, "n": len(prompts)}, []

    monkeypatch.setattr(evaluate, "evaluate_problems", fake)
    model = save_tiny_model(tmp_path / "model")
    assert main(["eval", str(model), *(["eval.batch_size=7"] if own else []), "--n", "2", "--json"]) == 0
    assert seen["batch_size"] == (7 if own else 64)


def test_a_model_directory_gets_room_for_an_instruct_models_answer(tmp_path):
    """rollout.max_new_tokens: the built-in 32 cut an instruct model's answers off (issue 42: 88% of SmolLM2's), so a
    model directory gets 256, at most half its positions, with the reason; a preset's or the user's value stays."""
    import json

    assert resolved()[0].rollout.max_new_tokens == 32  # the built-in model: its bare answers fit
    cfg, notes = resolved(None, USER)  # no config.json to read: no cap
    assert cfg.rollout.max_new_tokens == 256
    assert "rollout.max_new_tokens=256 (default for a user model: an instruct model's answer runs past the built-in " \
           "model's 32 tokens and a cut-off answer scores 0; 256 is TRL's default completion length; set " \
           "rollout.max_new_tokens to change)" in notes
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 128}))
    cfg, notes = resolved(None, [f"model.name={model}"])
    assert cfg.rollout.max_new_tokens == 64 and any("here half of the model's 128 positions" in n for n in notes)
    assert resolved("code", USER)[0].rollout.max_new_tokens == 64  # the code preset's own value
    assert resolved(None, [*USER, "rollout.max_new_tokens=40"])[0].rollout.max_new_tokens == 40


def test_one_learning_rate_note_with_the_warm_up_a_short_run_never_finishes():
    from grpo.train.defaults import lr_note

    cfg, notes = resolved(None, [*USER, "train.steps=3", "optim.warmup_steps=5"])
    note = lr_note(cfg, notes, 134_515_008)  # SmolLM2-135M: 1e-5, and 3 of the warm-up's 5 updates
    assert cfg.optim.lr == 1e-5 and note.startswith("optim.lr=1e-5 (default for full fine-tuning")
    assert note.endswith("; its linear ramp (optim.warmup_steps=5) is longer than this run's 3 updates, so the rate "
                         "peaks at 6e-6: lower optim.warmup_steps to reach it)")  # 1e-5 x 3/5, by hand
    import torch

    from grpo.train.optim import build_optimizer

    opt, sched = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg.optim, 3)
    used = []
    for _ in range(3):  # the rates the run's 3 updates use
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert max(used) == pytest.approx(6e-6)
    cfg, notes = resolved(None, [*USER, "train.steps=5", "optim.warmup_steps=5"])
    assert lr_note(cfg, notes, 134_515_008).endswith("; set optim.lr to change)")  # reached at the 5th update
    cfg, notes = resolved(None, [*USER, "train.steps=2", "optim.warmup_steps=5", "optim.lr=2e-6"])
    assert lr_note(cfg, notes, 134_515_008) is None  # the user's own rate: nothing was announced
