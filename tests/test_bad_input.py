"""Issue 22, row by row, through the real `grpo` entry point (`grpo.cli.main` in this process, or a subprocess for
the signal cases): every bad input ends in one message naming the file, line, field or function, exit code 2 and
no traceback; a run that cannot learn stops with exit code 3; SIGINT / SIGTERM exit 130 / 143 after committing a
checkpoint; 0 only when the run finished all its steps. The exit codes are those docs/cli.md documents."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.precision import FLOAT32
from helpers.tiny_models import save_small_builtin

import grpo
from grpo.cli import main
from grpo.errors import EXIT_FAILURE, EXIT_HEALTH, EXIT_OK, EXIT_USER
from grpo.rewards import register_reward

SRC = str(Path(grpo.__file__).resolve().parents[1])
ROOT = Path(__file__).resolve().parents[1]
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 2, "max_position_embeddings": 128}


def none_reward(prompts, completions, **columns):
    """No signal for any sample."""
    return [None] * len(completions)


def sleepy_reward(prompts, completions, **columns):
    """Never answers in time (run in a forked child, killed at reward.timeout_s)."""
    time.sleep(30)
    return [1.0] * len(completions)


def nan_reward(prompts, completions, **columns):
    return [float("nan")] + [0.5] * (len(completions) - 1)


def varied_reward(prompts, completions, **columns):
    return [(sum(map(ord, c)) % 11) / 10 for c in completions]


none_reward.in_process = nan_reward.in_process = varied_reward.in_process = True
for _name, _fn in [("test_none", none_reward), ("test_sleepy", sleepy_reward), ("test_nan", nan_reward),
                   ("test_varied", varied_reward)]:
    register_reward(_name, _fn)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_small_builtin(tmp_path_factory.mktemp("tiny-model"), size=SMALL)


@pytest.fixture(autouse=True)
def _private_caches(tmp_path, monkeypatch):
    import datasets

    monkeypatch.delenv("GRPO_DEBUG", raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def small(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["train", f"model.name={model_dir}", "train.steps=2", "train.eval_every=0", "eval.n=4",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "data.train_size=50",
            "log.plots=false", "log.sample_groups=1", "reward.timeout_s=2",
            "train.preflight=off",  # reward call k is step k (the preflight would make one more call first)
            *FLOAT32, *extra, "--quiet", "--output-dir",
            str(run_dir)]


def run(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of `grpo argv`; asserts the one-message contract: no traceback."""
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


def data_file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


GOOD = "".join(json.dumps({"prompt": f"What is {i} + 1?\n", "answer": str(i + 1)}) + "\n" for i in range(20)).encode()


# ------------------------------------------------------------------------------- the table, row by row


def test_row_jsonl_not_utf8_names_file_and_line(model_dir, tmp_path, capsys):
    path = data_file(tmp_path, "latin.jsonl", GOOD.replace(b"What is 6 + 1?", b"What is 6 \xe9 1?"))
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER
    assert f"grpo: {path} line 7: not UTF-8 text (byte 0xe9" in err


def test_row_eval_of_a_missing_directory(tmp_path, capsys):
    code, err = run(["eval", str(tmp_path / "no-such-run" / "final")], capsys)
    assert code == EXIT_USER
    assert f"model_dir={str(tmp_path / 'no-such-run' / 'final')!r}: no such directory" in err
    assert "Repo id" not in err


def test_row_eval_of_weights_cut_short(model_dir, tmp_path, capsys):
    import shutil

    bad = Path(shutil.copytree(model_dir, tmp_path / "final"))
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    code, err = run(["eval", str(bad)], capsys)
    assert code == EXIT_USER
    assert f"{weights} is cut short" in err and "copy or save the model again" in err


def test_row_empty_data_file(model_dir, tmp_path, capsys):
    path = data_file(tmp_path, "empty.jsonl", b"")
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER and f"{path}: the file is empty (0 bytes)" in err and "StopIteration" not in err


def test_row_jsonl_with_a_cut_off_line(model_dir, tmp_path, capsys):
    path = data_file(tmp_path, "cut.jsonl", GOOD[:-9])
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER and f"{path} line 20: the last line is not complete JSON" in err and "cut off" in err


def test_row_report_on_a_directory_that_is_not_a_run(tmp_path, capsys):
    code, err = run(["report", str(tmp_path)], capsys)
    assert code == EXIT_USER and f"run directory {str(tmp_path)!r} has no metrics.jsonl: not a grpo run" in err
    code, err = run(["report", str(tmp_path / "missing")], capsys)
    assert code == EXIT_USER and "no such directory" in err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew')
    code, err = run(["report", str(tmp_path)], capsys)
    assert code == EXIT_USER and f"{tmp_path / 'metrics.jsonl'} line 2 is not valid JSON" in err


def test_row_output_dir_naming_a_file(model_dir, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    code, err = run(small(model_dir, tmp_path / "notes.txt"), capsys)
    assert code == EXIT_USER and f"train.output_dir (--output-dir)={str(tmp_path / 'notes.txt')!r} is a file" in err
    code, err = run(small(model_dir, tmp_path / "notes.txt" / "run"), capsys)
    assert code == EXIT_USER and "is a file, so the directory cannot be created there" in err


def test_row_misspelled_reward_function_says_did_you_mean(model_dir, tmp_path, capsys):
    code, err = run(small(model_dir, tmp_path / "run", "reward.functions=[exact_anser]"), capsys)
    assert code == EXIT_USER
    assert "unknown reward function 'exact_anser' (did you mean 'exact_answer'?)" in err and "reward.functions" in err


def test_a_reward_function_named_twice_is_one_message(model_dir, tmp_path, capsys):
    code, err = run(small(model_dir, tmp_path / "run", "reward.functions=[exact_answer, exact_answer]"), capsys)
    assert code == 2
    assert "reward.functions: names must be unique" in err and "exact_answer" in err


def test_a_missing_optional_package_names_its_extra(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError, as when it is not installed
    code, err = run(small(model_dir, tmp_path / "run", "model.lora_rank=4"), capsys)
    assert code == 2
    assert "model.lora_rank > 0 needs peft: pip install 'grpo[lora]'" in err


def test_row_reward_returning_none_for_every_sample_stops_with_exit_3(model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, err = run(small(model_dir, run_dir, "train.steps=6", "reward.functions=[test_none]"), capsys)
    assert code == EXIT_HEALTH
    assert ("reward function 'test_none' gave no value for any sample in 3 steps in a row (steps 1-3): it returned "
            "None for every sample (reward.max_missing_steps=3)") in err
    assert f"--output-dir {run_dir} --resume" in err
    assert not (run_dir / "final").exists() and not (run_dir / "summary.json").exists()
    assert (run_dir / "checkpoints" / "step-000003" / "COMMITTED").is_file()
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]  # step 0: accuracy before


def test_row_reward_that_always_times_out_stops_with_exit_3(model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, err = run(small(model_dir, run_dir, "reward.functions=[test_sleepy]", "reward.timeout_s=0.3",
                          "reward.max_missing_steps=1"), capsys)
    assert code == EXIT_HEALTH
    assert ("reward function 'test_sleepy' gave no value for any sample in step 1: it timed out (reward.timeout_s) "
            "for every sample") in err
    assert not (run_dir / "final").exists()


def _signal_script(model_dir: Path, run_dir: Path, sig: signal.Signals) -> str:
    """`grpo train` in a new process whose reward sends `sig` to the process during step 2."""
    argv = small(model_dir, run_dir, "train.steps=4", "reward.functions=[test_signal]")
    return f"""
import os, signal, sys
sys.path.insert(0, {SRC!r})
from grpo.rewards import register_reward
from grpo.cli import main
calls = []
def signalling(prompts, completions, **columns):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.{sig.name})
    return [(sum(map(ord, c)) % 11) / 10 for c in completions]
signalling.in_process = True
register_reward("test_signal", signalling)
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_row_signal_exits_130_or_143_after_the_checkpoint(model_dir, tmp_path, sig):
    run_dir = tmp_path / "run"
    env = {**os.environ, "GRPO_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    script = _signal_script(model_dir, run_dir, sig)
    chained = subprocess.run(["bash", "-c", f'"{sys.executable}" -c "$SCRIPT" && echo CHAIN-WENT-ON'],
                             env={**env, "SCRIPT": script}, capture_output=True, text=True, timeout=300)
    assert chained.returncode == 128 + sig, chained.stdout[-2000:] + chained.stderr[-2000:]
    assert chained.returncode == {"SIGINT": 130, "SIGTERM": 143}[sig.name]
    assert "CHAIN-WENT-ON" not in chained.stdout  # `grpo train ... && grpo eval ...` stops here
    assert "Traceback" not in chained.stderr
    assert f"stopped by {sig.name} at step 2" in chained.stdout + chained.stderr
    assert f"exit code {128 + sig}: the run is not finished" in chained.stderr
    assert (run_dir / "checkpoints" / "step-000002" / "COMMITTED").is_file() and not (run_dir / "final").exists()


# ---------------------------------------------------------------------------------- the checks of part 1


def test_a_finished_run_exits_0(model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, _ = run(small(model_dir, run_dir, "train.steps=1", "reward.functions=[test_varied]"), capsys)
    assert code == EXIT_OK and (run_dir / "final").is_dir() and (run_dir / "summary.json").is_file()


def test_train_on_a_model_directory_that_is_not_one(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    code, err = run(small(tmp_path / "m", tmp_path / "run"), capsys)
    assert code == EXIT_USER and f"model.name={str(tmp_path / 'm')!r}: no config.json in {tmp_path / 'm'}" in err
    code, err = run(small(tmp_path / "nope", tmp_path / "run"), capsys)
    assert code == EXIT_USER and "no such directory" in err


def test_train_on_a_model_without_tokenizer(model_dir, tmp_path, capsys):
    import shutil

    bad = Path(shutil.copytree(model_dir, tmp_path / "m"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bad / name).unlink()
    code, err = run(small(bad, tmp_path / "run"), capsys)
    assert code == EXIT_USER and f"model.name={str(bad)!r}: no tokenizer" in err


def test_data_rows_of_the_wrong_shape_and_mixed_types(model_dir, tmp_path, capsys):
    for data, words in [(GOOD + b"[1, 2]\n", "line 21: a JSON array, expected an object"),
                        (GOOD + b'{"prompt": "q", "answer": 7}\n', "line 21: column 'answer' is a number here")]:
        path = data_file(tmp_path, "d.jsonl", data)
        code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                        capsys)
        assert code == EXIT_USER and f"{path} {words}" in err


def test_a_compressed_data_file_trains(model_dir, tmp_path, capsys):
    path = data_file(tmp_path, "d.jsonl.gz", gzip.compress(GOOD))
    code, _ = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]",
                        "train.steps=1"), capsys)
    assert code == EXIT_OK


def test_a_reward_returning_nan_trains_on_and_names_the_function_and_index(model_dir, tmp_path, capsys, caplog):
    """NaN for sample 0 of each call: that sample has no value from the function (issue #28: it is that sample's
    invalid value, counted in reward/<fn>/invalid_frac), the run goes on, and the log names the function and index."""
    import json
    import logging

    with caplog.at_level(logging.WARNING, logger="grpo.rewards"):
        code, _ = run(small(model_dir, tmp_path / "run", "reward.functions=[test_nan]", "train.preflight=off"),
                      capsys)
    assert code == EXIT_OK
    assert "reward function 'test_nan' returned nan at index 0" in caplog.text and "invalid_frac" in caplog.text
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["reward/test_nan/invalid_frac"] > 0 for r in rows if r["step"] > 0)


def test_debug_flag_and_env_print_the_traceback(model_dir, tmp_path, capsys, monkeypatch):
    path = data_file(tmp_path, "empty.jsonl", b"")
    argv = small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]")
    assert main([*argv, "--debug"]) == EXIT_USER
    err = capsys.readouterr().err
    assert "Traceback" in err and "DataFileError" in err and "the file is empty" in err
    monkeypatch.setenv("GRPO_DEBUG", "1")
    assert main(argv) == EXIT_USER
    assert "Traceback" in capsys.readouterr().err


def test_the_docs_document_the_exit_codes():
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text[text.index("## Exit codes"):]
    section = section[:section.index("\n## ", 4)]
    table = dict(re.findall(r"^\| `?(\d+)`? \| (.+?) \|$", section, flags=re.M))
    assert set(table) == {str(EXIT_OK), str(EXIT_FAILURE), str(EXIT_USER), str(EXIT_HEALTH), "130", "143"}
    assert "finished all its steps" in table["0"] and "SIGINT" in table["130"] and "SIGTERM" in table["143"]
