"""Fixtures of the trainer-level tests: a tiny model directory built once per session, one straight reference run,
trainers and override lists on it (helpers: train_helpers.py; the private GRPO_CACHE is the root conftest's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import E2E_STEPS, SMALL, base_overrides, deterministic, new_trainer, snapshot


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A small Llama with the built-in character tokenizer, saved once for the whole session."""
    import torch

    from grpo.models.builtin import build_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny-model")
    tok = build_tokenizer()
    with torch.random.fork_rng():
        model = build_model(tok, seed=0, size=SMALL)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def straight_run(tiny_model_dir, tmp_path_factory) -> dict:
    """The reference: E2E_STEPS steps straight through, in this process, deterministic settings.
    Returns {"state": snapshot(), "metrics": metrics.jsonl rows, "run_dir": Path}."""
    from grpo.tracking.metrics import read_jsonl

    run_dir = tmp_path_factory.mktemp("straight") / "run"
    with deterministic():
        trainer = new_trainer(tiny_model_dir, run_dir, f"train.steps={E2E_STEPS}")
        try:
            trainer.train()
            state = snapshot(trainer)
        finally:
            trainer.close()
    return {"state": state, "metrics": read_jsonl(run_dir / "metrics.jsonl"), "run_dir": run_dir}


@pytest.fixture
def overrides(tiny_model_dir, tmp_path):
    """A function: extra overrides -> the full override list of a small run in tmp_path/run."""

    def make(*extra: str, run_dir: Path | None = None) -> list[str]:
        return base_overrides(tiny_model_dir, run_dir or tmp_path / "run") + list(extra)

    return make


@pytest.fixture
def make_trainer(tiny_model_dir, tmp_path):
    """A function: extra overrides (and Trainer keyword arguments) -> a Trainer on the tiny model in tmp_path/run,
    with `varied_reward` unless reward_functions is given. Every trainer made here is closed at teardown."""
    made = []

    def make(*extra: str, run_dir: Path | None = None, **kwargs):
        trainer = new_trainer(tiny_model_dir, run_dir or tmp_path / "run", *extra, **kwargs)
        made.append(trainer)
        return trainer

    yield make
    for t in made:
        t.close()


@pytest.fixture(params=["float32", "bf16"])
def precision(request):
    """Both precisions (wiring_helpers.Precision), for the wiring tests that matter: loss, advantages, micro-batches,
    presets. bf16 is bfloat16 where the CPU multiplies bf16 natively, bfloat16_emulated elsewhere."""
    from wiring_helpers import wiring_precision

    return wiring_precision(request.param)
