"""Checkpoint save/load: exact resume, atomic commit under kill -9, disk full, retention, corruption.

RELIABILITY.md section 10, tests 1 and 2, and section 9, cases 21 and 23.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.tiny_models import tiny_model
from transformers import LlamaForCausalLM

import grpo
from grpo.train.checkpoint import save as ckpt
from grpo.train.checkpoint import (CheckpointError, capture_rng_state, latest_checkpoint, load_checkpoint,
                                   restore_rng_state, save_checkpoint)

SRC = str(Path(grpo.__file__).resolve().parents[1])
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
            intermediate_size=64, vocab_size=50)


def tiny_llama(seed: int, **overrides) -> LlamaForCausalLM:
    return tiny_model("llama", seed=seed, **{**TINY, **overrides})


def make_training(seed: int):
    """A tiny Llama with attention dropout (so the forward pass draws from the torch RNG), AdamW and LambdaLR."""
    model = tiny_llama(seed, attention_dropout=0.1)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1.0 + i))
    return model, opt, sched


def train(model, opt, sched, steps: int) -> None:
    """Each step draws from python `random`, numpy and torch, so a lost RNG state changes the result."""
    for _ in range(steps):
        length = random.randint(4, 7)
        ids = torch.randint(0, TINY["vocab_size"], (2, length))
        loss = model(input_ids=ids, labels=ids).loss * (1.0 + float(np.random.rand()))
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def next_draws():
    return random.random(), float(np.random.rand()), torch.rand(3)


def save(run_dir, step, model, opt=None, **kw):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    kw.setdefault("trainer_state", {"step": step})
    kw.setdefault("schedulers", {})
    return save_checkpoint(run_dir, step, model=model, optimizers={"policy": opt}, **kw)


def params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def stale_dirs(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------------------------------- exact resume
def test_resume_is_bitwise_identical_to_straight_training(tmp_path):
    k = 3
    seed_all(0)
    ref_model, ref_opt, ref_sched = make_training(seed=1)
    train(ref_model, ref_opt, ref_sched, 2 * k)
    ref_draws = next_draws()

    seed_all(0)
    model, opt, sched = make_training(seed=1)
    train(model, opt, sched, k)
    path = save_checkpoint(tmp_path, k, model=model, optimizers={"policy": opt}, schedulers={"policy": sched},
                           trainer_state={"step": k, "cursor": [1, 2]})
    assert path == tmp_path / "checkpoints" / "step-000003"
    del model, opt, sched

    seed_all(12345)  # a new process would start from some other RNG state
    model, opt, sched = make_training(seed=99)  # fresh objects with different weights
    loaded = load_checkpoint(latest_checkpoint(tmp_path))
    assert (loaded.step, loaded.trainer_state) == (k, {"step": k, "cursor": [1, 2]})
    loaded.load_model_into(model)
    loaded.load_optimizers({"policy": opt})
    loaded.load_schedulers({"policy": sched})
    restore_rng_state(loaded.rng_state)
    train(model, opt, sched, k)

    assert params_equal(model, ref_model)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        s, r = opt.state[p], ref_opt.state[q]
        assert torch.equal(s["exp_avg"], r["exp_avg"]) and torch.equal(s["exp_avg_sq"], r["exp_avg_sq"])
        assert torch.equal(s["step"], r["step"])
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    assert sched.get_last_lr() == ref_sched.get_last_lr()
    draws = next_draws()
    assert draws[:2] == ref_draws[:2] and torch.equal(draws[2], ref_draws[2])


def test_rng_state_round_trip():
    state = capture_rng_state()
    want = next_draws()
    seed_all(7)
    restore_rng_state(state)
    got = next_draws()
    assert got[:2] == want[:2] and torch.equal(got[2], want[2])


def test_checkpoint_dir_loads_with_from_pretrained_and_keeps_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate("<>abcdefghij ")}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<", eos_token=">")
    model = tiny_llama(0, tie_word_embeddings=True)
    path = save(tmp_path, 5, model, tokenizer=tokenizer)
    assert params_equal(AutoModelForCausalLM.from_pretrained(path), model)
    assert AutoTokenizer.from_pretrained(path)("abc")["input_ids"] == tokenizer("abc")["input_ids"]
    fresh = tiny_llama(3, tie_word_embeddings=True)
    load_checkpoint(path).load_model_into(fresh)  # lm_head is tied, absent from the file: still strict-ok
    assert params_equal(fresh, model)


def test_plain_module_with_tied_weights_and_extra_models(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(5, 4)
            self.out = torch.nn.Linear(4, 5, bias=False)
            self.out.weight = self.emb.weight

    model, critic = Tied(), torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    opts = {"policy": torch.optim.Adam(model.parameters()), "value": torch.optim.Adam(critic.parameters())}
    path = save_checkpoint(tmp_path, 1, model=model, optimizers=opts, schedulers={},
                           extra_models={"value": critic}, trainer_state={})
    loaded = load_checkpoint(path)
    model2, critic2 = Tied(), torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    loaded.load_model_into(model2)
    loaded.load_extra_models({"value": critic2})
    assert params_equal(model2, model) and params_equal(critic2, critic)
    assert model2.out.weight is model2.emb.weight
    with pytest.raises(CheckpointError, match=r"optimizers \['policy', 'value'\]"):
        loaded.load_optimizers({"policy": opts["policy"]})  # a forgotten optimizer is an error, not silence


def test_load_model_into_is_strict(tmp_path):
    path = save(tmp_path, 1, tiny_llama(0))
    with pytest.raises(CheckpointError, match=r"missing keys \['model.layers.2"):
        load_checkpoint(path).load_model_into(tiny_llama(0, num_hidden_layers=3))
    with pytest.raises(CheckpointError, match="unexpected keys"):
        load_checkpoint(path).load_model_into(tiny_llama(0, num_hidden_layers=1))
    with pytest.raises(CheckpointError, match="size mismatch"):
        load_checkpoint(path).load_model_into(tiny_llama(0, vocab_size=60))


# ------------------------------------------------------------------------------------------- kill -9
KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch
    from grpo.train.checkpoint import save as ckpt

    run_dir, stage, kind = sys.argv[1:4]
    def die_at(s):
        if s == stage:
            os.kill(os.getpid(), signal.SIGKILL)
    ckpt._fault_hook = die_at
    torch.manual_seed(2)
    if kind == "llama":  # save_pretrained path; importing transformers costs seconds, so not for every stage
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(**{tiny!r}))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters())
    ckpt.save_checkpoint(run_dir, 2, model=model, optimizers={{"policy": opt}}, schedulers={{}},
                         trainer_state={{"step": 2}})
    print("survived")
""").format(tiny=TINY)


@pytest.mark.parametrize("stage,kind", [("after_model", "llama"), ("after_optimizers", "plain"),
                                        ("before_marker", "plain"), ("after_marker", "llama")])
def test_kill_during_save_keeps_previous_checkpoint(tmp_path, caplog, stage, kind):
    model = tiny_llama(1)
    opt = torch.optim.AdamW(model.parameters())
    first = save(tmp_path, 1, model, opt, trainer_state={"step": 1, "cursor": 7})
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), stage, kind], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    leftovers = stale_dirs(tmp_path)
    assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-step-000002-"), leftovers

    assert latest_checkpoint(tmp_path) == first
    assert leftovers[0] in caplog.text and "partial checkpoint" in caplog.text
    loaded = load_checkpoint(first)
    assert loaded.trainer_state == {"step": 1, "cursor": 7}
    fresh = tiny_llama(5)
    loaded.load_model_into(fresh)
    assert params_equal(fresh, model)

    caplog.clear()
    third = save(tmp_path, 3, model, opt)
    assert "removing stale partial checkpoint" in caplog.text and leftovers[0] in caplog.text
    assert stale_dirs(tmp_path) == [] and latest_checkpoint(tmp_path) == third


# ------------------------------------------------------------------------------------------- save failures
def test_disk_full_fails_loudly_and_keeps_previous(tmp_path, monkeypatch):
    model = tiny_llama(0)
    first = save(tmp_path, 1, model)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match=r"saving checkpoint step 2 to .*step-000002 failed: .*No space") as e:
        save(tmp_path, 2, model)
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
    monkeypatch.undo()
    assert stale_dirs(tmp_path) == []
    assert not (tmp_path / "checkpoints" / "step-000002").exists()
    assert latest_checkpoint(tmp_path) == first
    load_checkpoint(first).load_model_into(tiny_llama(3))


@pytest.mark.parametrize("stage", ["after_model", "after_extra_models", "after_schedulers", "after_state",
                                   "before_marker", "after_marker"])
def test_failure_at_any_stage_leaves_no_trace(tmp_path, monkeypatch, stage):
    model = torch.nn.Linear(3, 3)
    first = save(tmp_path, 1, model)

    def fail(s):
        if s == stage:
            raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(ckpt, "_fault_hook", fail)
    with pytest.raises(CheckpointError, match="step 2"):
        save(tmp_path, 2, model, extra_models={"value": torch.nn.Linear(2, 2)})
    assert stale_dirs(tmp_path) == [] and latest_checkpoint(tmp_path) == first


def test_bad_trainer_state_and_arguments(tmp_path):
    model = torch.nn.Linear(3, 3)
    with pytest.raises(CheckpointError, match="not JSON serializable"):
        save(tmp_path, 1, model, trainer_state={"x": object()})
    assert not (tmp_path / "checkpoints").exists() or stale_dirs(tmp_path) == []
    with pytest.raises(ValueError, match="names"):
        save(tmp_path, 1, model, schedulers={"a/b": None})
    with pytest.raises(ValueError, match="step"):
        save(tmp_path, -1, model)


# ------------------------------------------------------------------------------------------- retention
def test_retention_keeps_newest_and_deletes_only_after_commit(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 3)
    for step in (1, 2, 3):
        save(tmp_path, step, model, keep_last=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-000002", "step-000003"]

    seen = {}
    monkeypatch.setattr(ckpt, "_fault_hook", lambda s: seen.setdefault(s, sorted(p.name for p in root.iterdir())))
    save(tmp_path, 4, model, keep_last=1)
    assert seen["after_marker"][1:] == ["step-000002", "step-000003"]  # old ones still there at commit time
    assert seen["after_marker"][0].startswith(".tmp-step-000004-")
    assert seen["after_rename"] == ["step-000002", "step-000003", "step-000004"]
    assert sorted(p.name for p in root.iterdir()) == ["step-000004"]

    monkeypatch.setattr(ckpt, "_fault_hook", lambda s: None)
    for step in (5, 6, 7):
        save(tmp_path, step, model, keep_last=0)
    assert len(list(root.iterdir())) == 4


def test_resave_same_step_replaces_it(tmp_path):
    model = torch.nn.Linear(3, 3)
    save(tmp_path, 1, model, trainer_state={"v": 1})
    path = save(tmp_path, 1, model, trainer_state={"v": 2})
    assert load_checkpoint(path).trainer_state == {"v": 2} and stale_dirs(tmp_path) == []


def test_interrupted_resave_is_restored_by_next_save(tmp_path, caplog):
    model = torch.nn.Linear(3, 3)
    path = save(tmp_path, 1, model)
    aside = path.with_name(".old-step-000001-4242")  # killed between "rename old aside" and "rename new in"
    os.rename(path, aside)
    assert latest_checkpoint(tmp_path) is None
    save(tmp_path, 2, model, keep_last=0)
    assert "restored" in caplog.text and path.is_dir() and stale_dirs(tmp_path) == []


# ------------------------------------------------------------------------------------------- corruption
def test_truncated_file_is_rejected_and_skipped(tmp_path, caplog):
    model = tiny_llama(0)
    first = save(tmp_path, 1, model)
    second = save(tmp_path, 2, model)
    weights = second / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"step-000002.*model\.safetensors.*truncated"):
        load_checkpoint(second)
    assert latest_checkpoint(tmp_path) == first
    assert "step-000002" in caplog.text and "model.safetensors" in caplog.text


@pytest.mark.parametrize("damage,match", [
    (lambda p: (p / "optimizer.policy.pt").unlink(), r"optimizer\.policy\.pt is missing"),
    (lambda p: (p / "COMMITTED").write_text("{not json"), "bad manifest in COMMITTED"),
    (lambda p: (p / "COMMITTED").unlink(), "not committed"),
    (lambda p: (p / "trainer_state.json").write_text('{"step": 9}'), r"trainer_state\.json"),
])
def test_damaged_checkpoint_names_the_file(tmp_path, damage, match):
    path = save(tmp_path, 1, torch.nn.Linear(3, 3))
    damage(path)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(path)
    assert latest_checkpoint(tmp_path) is None


def test_unreadable_safetensors_is_rejected(tmp_path):
    path = save(tmp_path, 1, torch.nn.Linear(3, 3))
    weights = path / "model.safetensors"
    junk = b"\xff" * weights.stat().st_size
    weights.write_bytes(junk)
    manifest = json.loads((path / "COMMITTED").read_text())  # even with a manifest that matches the junk
    manifest["files"]["model.safetensors"]["sha256"] = None
    (path / "COMMITTED").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"model\.safetensors is not readable safetensors"):
        load_checkpoint(path)


def test_peft_model_saves_and_restores_its_adapters(tmp_path):
    peft = pytest.importorskip("peft")

    def lora_model(adapter_seed):
        base = tiny_llama(0)  # the same base weights every time, as a resumed run would load them
        torch.manual_seed(adapter_seed)
        cfg = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        return peft.get_peft_model(base, cfg)

    model = lora_model(1)
    path = save(tmp_path, 1, model)
    assert (path / "adapter_model.safetensors").is_file()
    fresh = lora_model(2)
    assert not params_equal(fresh, model)
    load_checkpoint(path).load_model_into(fresh)
    assert params_equal(fresh, model)
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(path).load_model_into(tiny_llama(0))
