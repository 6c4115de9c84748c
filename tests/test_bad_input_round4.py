"""Issue 51, bad input and faults round four (items 2-7), each through the real entry point (`grpo.cli.main`): a disk
that fills at every save path (inside torch's own writer, best/, a merged LoRA final/, metrics, plots, `grpo
report`), rows named by one number (the line an editor shows), non-finite settings and weights that training made
non-finite, chat templates that fail on a row, and counts no run can mean. Each ends in one message naming the
thing, without a traceback (exit 2 for input, 1 for a full disk, 3 for a run that diverged), nothing half-written.

A full disk is real: a tmpfs mounted for the test (root only; tests/test_bad_input_round3.py `small_disk`), filled
with a file at the moment the test names."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from test_bad_input import GOOD, SMALL, data_file, run, small

from grpo.errors import EXIT_USER


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny built-in architecture of tests/test_bad_input.py (its tokenizer has a chat template)."""
    from grpo.models.builtin import build_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny-model")
    tok = build_tokenizer()
    with torch.random.fork_rng():
        build_model(tok, seed=0, size=SMALL).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


# ---------------------------------------------------------------- item 4: non-finite settings and weights


@pytest.mark.parametrize(("override", "field", "value"), [
    ("optim.lr=inf", "optim.lr", "'inf'"), ("optim.lr=.nan", "optim.lr", "nan"),
    ("optim.lr=1e400", "optim.lr", "'1e400'"),
    ("optim.betas=[0.9, .inf]", "optim.betas.1", "inf"), ("reward.max_abs=-.inf", "reward.max_abs", "-inf"),
    ("algo.clip_high=nan", "algo.clip_high", "'nan'"), ("rollout.temperature=inf", "rollout.temperature", "'inf'"),
])
def test_non_finite_settings_are_refused_naming_the_field(override, field, value, model_dir, tmp_path, capsys):
    code, err = run(small(model_dir, tmp_path / "run", override), capsys)
    assert code == EXIT_USER
    assert f"{field}: must be a finite number, got {value}: no setting takes inf or NaN" in err, err
    assert len(err.strip().splitlines()) == 2 and not (tmp_path / "run").exists()


def test_every_float_setting_refuses_inf_and_nan():
    from grpo.config import ConfigError, load_config
    from grpo.config.load import describe_keys

    floats = {key: kind for key, kind, *_ in describe_keys() if re.search(r"\bfloat\b", kind)}
    assert "optim.lr" in floats and "rollout.vllm_probe_tolerance" in floats and len(floats) > 20
    for key, kind in floats.items():
        for bad in (".inf", "-.inf", ".nan"):
            value = f"[{bad}, {bad}]" if kind.startswith(("list", "tuple")) else bad
            with pytest.raises(ConfigError, match=re.escape(key) + r"(\.\d)?: must be a finite number"):
                load_config(None, [f"{key}={value}"])


# ---------------------------------------------------------------- item 7: counts no run can mean


@pytest.mark.parametrize(("override", "words"), [
    ("train.steps=10000000000000000000000", "train.steps: must be at most 100,000,000 (10^8 steps take 3 years at "
                                            "one step a second), got 10000000000000000000000"),
    ("optim.warmup_steps=1000000000", "optim.warmup_steps: must be at most 100,000,000"),
    ("algo.epochs=100000", "algo.epochs: must be at most 1,000 (updates of one batch: the step would not end)"),
    ("rollout.worker_threads=1000000", "rollout.worker_threads: must be at most 4,096"),
    ("train.seed=18446744073709551616", "train.seed: must be at most 4,294,967,295 (a seed is a 32-bit number)"),
    ("train.seed=-18446744073709551616", "train.seed: must be at least -4,294,967,295"),
    ("eval.n=10000000000", "eval.n: must be at most 1,000,000,000 (no run means a count past 10^9)"),
    ("rollout.group_size=10000000000", "rollout.group_size: must be at most 1,000,000,000"),
])
def test_counts_no_run_can_mean_are_refused_naming_the_bound(override, words, model_dir, tmp_path, capsys):
    code, err = run(small(model_dir, tmp_path / "run", override), capsys)
    assert code == EXIT_USER and words in err, err
    assert not (tmp_path / "run").exists()


def test_every_int_setting_has_a_bound_listed_by_list_keys(capsys):
    from grpo.cli import main
    from grpo.config import ConfigError, load_config
    from grpo.config.load import describe_keys
    from grpo.config.schema import count_limit

    ints = [(key, text) for key, kind, _, text in describe_keys() if kind.split(" ")[0] == "int"]
    assert len(ints) > 30
    for key, text in ints:
        limit = count_limit(key)
        assert f"at most {limit:,}" in text, (key, text)
        load_config(None, [f"{key}={limit}"])  # the bound itself is taken
        with pytest.raises(ConfigError, match=re.escape(key) + ": must be at most"):
            load_config(None, [f"{key}={limit + 1}"])
    assert main(["train", "--list-keys"]) == 0
    assert "at most 100,000,000" in capsys.readouterr().out


def test_more_steps_than_the_data_can_hold_is_warned_about(model_dir, tmp_path, capsys, caplog, monkeypatch):
    import grpo.train.trainer as trainer_module

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):  # the warning comes before the model loads; stop there
        raise Stop()

    monkeypatch.setattr(trainer_module, "load_policy", stop)
    path = data_file(tmp_path, "small.jsonl", GOOD)  # 20 rows, 18 for training
    with caplog.at_level(logging.WARNING, logger="grpo.data"), pytest.raises(Stop):
        from grpo.cli import main

        main(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]",
                   "train.steps=100000000"))
    assert re.search(r"train\.steps=100000000 x rollout\.prompts_per_step=2 draws each of the \d+ train prompts about "
                     r"[0-9.]+e\+07 times, more than 1000 passes over the data: lower train\.steps or give more data",
                     caplog.text), caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpo.data"), pytest.raises(Stop):
        main(small(model_dir, tmp_path / "run2", f"data.path={path}", "reward.functions=[exact_answer]",
                   "train.steps=5000"))  # 5000 x 2 / 17: about 590 passes
    assert "passes over the data" not in caplog.text
