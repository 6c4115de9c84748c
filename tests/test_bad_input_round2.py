"""Issue 29, bad input round two, row by row through the real entry point (`grpo.cli.main`): each wrong input ends
in exit code 2 (or 130 for Ctrl-C) with one message naming the field, file or function and no traceback, before the
model loads where it can, and nothing already on disk is written over (`tree_digest` of the directory before and
after). The run-directory rows (--resume, --overwrite, --output) are tests/test_run_dir_owner.py; the model
directory and helpers are those of test_bad_input.py (issue 22)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers.tree import tree_digest
from test_bad_input import model_dir, run, small  # noqa: F401 (model_dir: the module's fixture)

from grpo.cli import main
from grpo.errors import EXIT_OK, EXIT_USER


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("GRPO_DEBUG", raising=False)


# ----------------------------------------------------------------------------- one message, no traceback


@pytest.mark.parametrize(("override", "words"), [
    ("data.task=nope", "data.task must be one of ['arithmetic', 'code', 'tools']"),
    ("data.difficulty=nope", "data.difficulty for arithmetic must be one of"),
    ("model.device=gpu", "model.device='gpu' is not a device"),
    ("data.task_options={digits: 3}", "data.task_options ['digits']: data.task=arithmetic reads no task options"),
    ("model.dtype=float16", "model.dtype=float16 on the CPU"),
    ("reward.functions=[my_rewards.py]", "names a file or module but no function in it; add the function's name "
                                         "after a colon: my_rewards.py:<function name>"),
])
def test_config_values_that_used_to_crash_or_pass_are_one_message(override, words, model_dir, tmp_path,  # noqa: F811
                                                                  capsys):
    code, err = run(small(model_dir, tmp_path / "run", override), capsys)
    assert code == EXIT_USER and words in err
    assert not (tmp_path / "run").exists()


def test_cuda_without_a_gpu_is_one_message(model_dir, tmp_path, capsys):  # noqa: F811
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    code, err = run(small(model_dir, tmp_path / "run", "model.device=cuda"), capsys)
    assert code == EXIT_USER and "model.device='cuda', but" in err and "use model.device=auto" in err


def test_an_unknown_model_type_is_one_message(model_dir, tmp_path, capsys):  # noqa: F811
    bad = Path(shutil.copytree(model_dir, tmp_path / "m"))
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "llamma"}))
    code, err = run(small(bad, tmp_path / "run"), capsys)
    assert code == EXIT_USER
    assert "names model_type 'llamma', which transformers" in err and "(did you mean 'llama'?)" in err
    code, err = run(["eval", str(bad)], capsys)
    assert code == EXIT_USER and "names model_type 'llamma'" in err


def test_an_extends_cycle_is_one_message(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\ntrain: {steps: 1}\n")
    code, err = run(["train", str(tmp_path / "a.yaml")], capsys)
    assert code == EXIT_USER and "`extends:` goes round in a circle: " in err
    assert f"{(tmp_path / 'a.yaml').resolve()} -> {(tmp_path / 'b.yaml').resolve()} -> " \
           f"{(tmp_path / 'a.yaml').resolve()}" in err


def test_a_dotted_key_at_the_top_of_a_yaml_says_how_to_nest_it(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("train.steps: 5\n")
    code, err = run(["train", str(tmp_path / "run.yaml")], capsys)
    assert code == EXIT_USER and "the key 'train.steps' is dotted; in YAML nest it under its section" in err
    assert "did you mean" not in err


def test_a_key_without_its_value_says_to_write_key_equals_value(capsys):
    code, err = run(["train", "train.steps", "2"], capsys)
    assert code == EXIT_USER
    assert "'train.steps' is a config key, not a preset or file: write train.steps=VALUE" in err
    assert "unknown preset" not in err


def test_an_unreadable_data_file_is_one_message(model_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    import grpo.data.file_checks as file_checks

    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1 + 1?", "answer": "2"}\n')

    def no_permission(p):  # what open() raises for a file this user may not read (the tests run as root)
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(file_checks, "_read_head", no_permission)
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER and f"{path}: cannot be read (PermissionError: Permission denied)" in err


def test_a_hub_looking_data_path_offline_is_one_message_in_seconds(model_dir, tmp_path, capsys,  # noqa: F811
                                                                   monkeypatch):
    import time

    import grpo.data.files as files

    monkeypatch.setattr(files, "_hub_answers", lambda: False)  # this machine has no network to the Hub
    t0 = time.monotonic()
    code, err = run(small(model_dir, tmp_path / "run", "data.path=someorg/some-data",
                          "reward.functions=[exact_answer]"), capsys)
    assert code == EXIT_USER and "is not in the local cache, and the Hub does not answer" in err
    assert time.monotonic() - t0 < 10  # was 29 s of retries


def test_wandb_online_without_a_key_stops_before_the_model_loads(model_dir, tmp_path, capsys,  # noqa: F811
                                                                 monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("HOME", str(tmp_path))
    code, err = run(small(model_dir, tmp_path / "run", "log.trackers=[wandb]"), capsys)
    assert code == EXIT_USER and "WANDB_MODE=online, but there is no W&B API key" in err


def test_an_mlflow_server_that_does_not_answer_stops_in_seconds(model_dir, tmp_path, capsys,  # noqa: F811
                                                                 monkeypatch):
    import socket
    import time

    pytest.importorskip("mlflow")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    code, err = run(small(model_dir, tmp_path / "run", "log.trackers=[mlflow]"), capsys)
    assert code == EXIT_USER and f"MLFLOW_TRACKING_URI=http://127.0.0.1:{port} does not answer" in err
    assert time.monotonic() - t0 < 10  # was 257 s of retries, then a traceback
    assert not (tmp_path / "run").exists()


def test_list_keys_prints_real_defaults(capsys):
    assert main(["train", "--list-keys"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "PydanticUndefined" not in out
    assert re.search(r"^data\.task_options\s+\{\}", out, flags=re.M)


def test_preflight_help_says_exit_3(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "exit 3 if not" in " ".join(capsys.readouterr().out.split())


# ----------------------------------------------------------------------------- values with a range or a refusal


@pytest.mark.parametrize(("override", "words"), [
    ("train.steps=0", "train.steps: must be at least 1, got 0: a run of no steps would only evaluate"),
    ("eval.max_new_tokens=0", "eval.max_new_tokens: must be at least 1 (or null for rollout.max_new_tokens)"),
    ("train.output_dir=' '", "train.output_dir (--output-dir) is empty"),
    ("rollout.max_new_tokens=128", "rollout.max_new_tokens=128, but the model has 128 positions"),
    ("eval.max_new_tokens=500", "eval.max_new_tokens=500, but the model has 128 positions"),
])
def test_values_out_of_range_are_refused_with_the_reason(override, words, model_dir, tmp_path, capsys):  # noqa: F811
    argv = small(model_dir, tmp_path / "run", override)
    if override.startswith("train.output_dir"):
        argv = argv[:-2]  # the YAML-style key itself, without --output-dir
    code, err = run(argv, capsys)
    assert code == EXIT_USER and words in err
    assert not (tmp_path / "run").exists()


def test_a_group_size_that_cannot_fit_in_memory_is_refused_with_the_estimate(model_dir, tmp_path, capsys):  # noqa: F811
    """G = 100000 (13 GB and no output after 5 minutes before): the sampler's KV cache alone, computed by hand for
    the test model (2 layers, 2 key/value heads of 16, float32), is named with the machine's memory."""
    from grpo.train.budget import machine_memory

    total = machine_memory(__import__("torch").device("cpu"))[0]
    P, T = 2, 6
    G = total // (P * T * 2 * 2 * 2 * 16 * 4) + 1  # the smallest G whose KV cache alone exceeds the memory
    kv = P * G * T * 2 * 2 * 2 * 16 * 4
    code, err = run(small(model_dir, tmp_path / "run", f"rollout.group_size={G}"), capsys)
    assert code == EXIT_USER
    assert f"rollout.group_size={G} = {P * G} completions of up to rollout.max_new_tokens={T} tokens" in err
    assert f"KV cache {kv / 2**30:.1f} GiB" in err and "more than this machine's" in err
    assert not (tmp_path / "run").exists()


def test_a_step_larger_than_the_free_memory_gets_a_printed_estimate(model_dir, tmp_path, monkeypatch):  # noqa: F811
    import grpo.train.budget as budget
    from grpo.config import load_config

    monkeypatch.setattr(budget, "machine_memory", lambda device: (10 * 2**30, 1000))  # 1000 bytes free
    printed = []
    cfg = load_config(None, small(model_dir, tmp_path / "run")[1:-3])
    budget.check_step_fits(cfg, __import__("torch").device("cpu"), __import__("torch").float32, printed.append)
    assert len(printed) == 1 and "more than the 0.0 GiB of memory free now" in printed[0]


# ----------------------------------------------------------------------------- fail fast, at the right place


def test_a_broken_csv_quote_is_reported_where_it_opens(model_dir, tmp_path, capsys):  # noqa: F811
    lines = ["prompt,answer"] + [f"What is {i} + 1?,{i + 1}" for i in range(60)]
    lines[11] = '"What is 10 + 1?,11'  # line 12 of the file: a quote that never closes
    path = data_file_at(tmp_path / "broken.csv", "\n".join(lines) + "\n")
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER
    assert f"{path} line 12: 1 fields, the header has 2" in err
    assert "a quoted field opens on line 12 and runs to line 61" in err


def test_a_20_mb_prompt_is_refused_by_its_characters_in_seconds(model_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    import time

    import grpo.train.trainer as trainer_module

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model loaded before the 20 MB prompt was refused")

    monkeypatch.setattr(trainer_module, "load_policy", must_not_load)
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    rows[5]["prompt"] = "x" * 20_000_000
    path = data_file_at(tmp_path / "huge.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    t0 = time.monotonic()
    code, err = run(small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]"),
                    capsys)
    assert code == EXIT_USER
    assert "huge.jsonl line 6: column 'prompt' has 20000001 characters, more than data.max_prompt_tokens=256 " \
           "tokens can hold" in err  # the prompt as the model sees it: the text and a newline
    assert time.monotonic() - t0 < 10  # was 62 s: the model loaded and the tokenizer ran over 20 MB first
    assert not (tmp_path / "run").exists()


def _tokenizers():
    from helpers.tiny_hf import chat_tokenizer, zephyr_tokenizer

    from grpo.models.builtin import build_tokenizer

    return {"builtin": build_tokenizer(), "byte-level chat": chat_tokenizer(), "trained BPE": zephyr_tokenizer()}


@pytest.mark.parametrize("name", ["builtin", "byte-level chat", "trained BPE"])
def test_no_token_stands_for_more_characters_than_max_token_chars(name):
    """The bound the character check rests on, token by token: no id decodes to more characters (so a text of
    more than limit x max_token_chars characters needs more than limit tokens)."""
    from grpo.data.validate import max_token_chars

    tok = _tokenizers()[name]
    bound = max_token_chars(tok)
    longest = max(len(tok.decode([i])) for i in range(len(tok)))
    assert 1 <= longest <= bound


def test_the_character_check_drops_with_the_filter_and_loads_no_tokenizer_for_short_prompts():
    from grpo.config import load_config
    from grpo.data.validate import check_prompt_chars
    from grpo.types import Prompt

    from grpo.models.builtin import build_tokenizer

    loads = []

    def loader():
        loads.append(1)
        return build_tokenizer()

    short = [Prompt(uid=f"p{i}", text="What is 1 + 1?") for i in range(4)]
    cfg = load_config(None, ["data.max_prompt_tokens=16", "rollout.prompts_per_step=2"])
    assert check_prompt_chars(short, short[:1], loader, cfg) == (short, short[:1]) and loads == []
    per_token = max(map(len, build_tokenizer().get_vocab()))  # the reference: the longest vocabulary entry
    at_bound = Prompt(uid="edge", text="x" * (16 * per_token))  # may fit: kept for the token check
    over = Prompt(uid="huge", text="x" * (16 * per_token + 1))
    cfg.data.filter_long_prompts = True
    assert check_prompt_chars([*short, at_bound, over], short, loader, cfg) == ([*short, at_bound], short)
    assert loads == [1]


@pytest.mark.parametrize(("body", "words"), [
    ("return [1.0]", "reward function 'bad' returned 1 values for"),
    ("return ['yes'] * len(completions)", "reward function 'bad' returned a non-numeric value 'yes' at index 0"),
], ids=["wrong-count", "wrong-type"])
def test_a_reward_of_the_wrong_count_or_type_stops_before_the_first_evaluation(body, words, model_dir, tmp_path,  # noqa: F811
                                                                                capsys, monkeypatch):
    """The preflight (on by default: train.preflight=stop) scores its samples before the first evaluation: a reward
    function returning the wrong number or type of values stops there, in seconds, not at step 1."""
    import time

    import grpo.train.loop as loop

    def must_not_run(*args, **kwargs):
        raise AssertionError("the held-out evaluation ran before the reward's error was reported")

    monkeypatch.setattr(loop, "_evaluate", must_not_run)
    (tmp_path / "my_rewards.py").write_text(f"def bad(prompts, completions, **kw):\n    {body}\n")
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    code, err = run(small(model_dir, tmp_path / "run", "reward.functions=[my_rewards.py:bad]",
                          "train.preflight=stop"), capsys)
    assert code == EXIT_USER and words in err
    assert time.monotonic() - t0 < 10


def data_file_at(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- grpo compare


@pytest.mark.parametrize("flag", ["--seeds", "--steps"])
def test_compare_seeds_or_steps_below_1_is_an_error(flag, tmp_path, capsys):
    code, err = run(["compare", flag, "0", "--output-dir", str(tmp_path / "cmp")], capsys)
    assert code == EXIT_USER and f"grpo compare {flag} must be at least 1, got 0" in err
    assert not (tmp_path / "cmp").exists()  # was: --seeds 0 ran one seed


def test_compare_into_a_used_output_dir_is_refused_and_changes_nothing(tmp_path, capsys):
    used = tmp_path / "cmp"
    (used / "grpo-seed0").mkdir(parents=True)
    (used / "grpo-seed0" / "worker.log").write_text("the earlier comparison's log\n")
    (used / "compare.json").write_text("{}")
    before = tree_digest(used)
    code, err = run(["compare", "--steps", "1", "--output-dir", str(used)], capsys)
    assert code == EXIT_USER and "already holds compare.json, grpo-seed0: pass a new directory" in err
    assert tree_digest(used) == before


def test_compare_in_async_mode_is_refused(tmp_path, capsys):
    """compare's memory and CPU figures are each run's own process: a rollout worker would be left out."""
    code, err = run(["compare", "--steps", "1", "rollout.mode=async", "--output-dir", str(tmp_path / "cmp")], capsys)
    assert code == EXIT_USER and "rollout.mode=async moves sampling" in err and "use rollout.mode=sync" in err


# ----------------------------------------------------------------------------- a run stopped by the user


def test_ctrl_c_before_the_first_step_says_nothing_was_saved(model_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    import grpo.train.trainer as trainer_module

    def interrupted(*args, **kwargs):  # Ctrl-C while the data or the model loads
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module.Trainer, "__init__", interrupted)
    code, err = run(small(model_dir, tmp_path / "run"), capsys)
    assert code == 130
    assert err.strip() == "grpo: interrupted before training started; nothing was saved"  # one line, no more


def test_a_second_ctrl_c_says_the_step_in_progress_is_not_saved(model_dir, tmp_path, capsys,  # noqa: F811
                                                                monkeypatch):
    import grpo.train.trainer as trainer_module

    def second_interrupt(self, **kwargs):  # what PreemptionGuard raises for a Ctrl-C while already stopping
        raise KeyboardInterrupt("second interrupt (SIGINT) after SIGINT")

    monkeypatch.setattr(trainer_module.Trainer, "train", second_interrupt)
    code, err = run(small(model_dir, tmp_path / "run"), capsys)
    assert code == 130 and err.strip() == ("grpo: aborted by a second interrupt; the step in progress is not saved, "
                                           "checkpoints committed before it are intact")


def test_a_stop_before_step_1_does_not_suggest_resume(model_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    """Ctrl-C during the preflight (the signal guard is up): the run stops at step 0 with nothing saved, so the
    message says to start again, not to --resume (which would be refused: there is no checkpoint)."""
    import os
    import signal

    import grpo.train.loop as loop

    monkeypatch.setattr(loop, "_preflight", lambda trainer, out: os.kill(os.getpid(), signal.SIGINT))
    argv = [a for a in small(model_dir, tmp_path / "run") if a != "--quiet"]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 130 and "Traceback" not in captured.err
    assert "stopped by SIGINT at step 0; nothing trained yet, nothing saved (no checkpoint to --resume from): " \
           "start again with --overwrite or a new --output-dir" in captured.out
    assert "Resume with" not in captured.out + captured.err
    assert not (tmp_path / "run" / "checkpoints").exists()


# ----------------------------------------------------------------------------- where a run may write


def test_output_dir_under_proc_is_one_message(model_dir, capsys):  # noqa: F811
    code, err = run(small(model_dir, Path("/proc/grpo-run")), capsys)
    assert code == EXIT_USER and "'/proc/grpo-run': cannot write there" in err


def test_the_users_literal_group_size_of_100000_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """`grpo train rollout.group_size=100000` (13 GB and no output after 5 minutes before). On a machine of 64 GiB
    (the figure is set here, so the test does not depend on this machine) the estimate, by hand for the built-in
    model (4 layers, 4 key/value heads of 32, float32 on the CPU; P = 16, T = 32), is 195.3 GiB of KV cache."""
    import grpo.train.budget as budget
    import grpo.train.trainer as trainer_module

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model loaded before the step was refused")

    monkeypatch.setattr(budget, "machine_memory", lambda device: (64 * 2**30, 60 * 2**30))
    monkeypatch.setattr(trainer_module, "load_policy", must_not_load)
    kv = 16 * 100_000 * 32 * 4 * 2 * 4 * 32 * 4
    code, err = run(["train", "rollout.group_size=100000", "--quiet", "--output-dir", str(tmp_path / "run")], capsys)
    assert code == EXIT_USER
    assert "rollout.prompts_per_step=16 x rollout.group_size=100000 = 1600000 completions" in err
    assert f"KV cache {kv / 2**30:.1f} GiB" in err and "more than this machine's 64.0 GiB of memory" in err
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def finished_run(model_dir, tmp_path_factory) -> Path:  # noqa: F811
    """A finished 1-step run (checkpoints/step-000001, final/, summary.json), made once; tests copy it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert main(small(model_dir, run_dir, "train.steps=1")) == EXIT_OK
    return run_dir


@pytest.mark.parametrize("override", ["train.steps=0", "rollout.max_new_tokens=128", "model.dtype=float16",
                                      "data.task=nope"])
def test_a_refused_value_on_resume_changes_nothing_in_the_run(override, finished_run, model_dir, tmp_path,  # noqa: F811
                                                              capsys):
    run_dir = Path(shutil.copytree(finished_run, tmp_path / "run"))
    before = tree_digest(run_dir)
    code, _ = run([*small(model_dir, run_dir, "train.steps=2", override), "--resume"], capsys)
    assert code == EXIT_USER
    assert tree_digest(run_dir) == before  # final/, summary.json, metrics.jsonl and the checkpoint as they were


# ----------------------------------------------------------------------------- each message printed once


def test_a_failed_checkpoint_save_is_printed_once(model_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    import errno
    import os

    import grpo.train.checkpoint.save as save

    def disk_full(stage):
        if stage == "after_optimizers":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(save, "_fault_hook", disk_full)
    argv = [a for a in small(model_dir, tmp_path / "run", "train.steps=1") if a != "--quiet"]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 1 and "Traceback" not in captured.err
    both = captured.out + captured.err
    assert both.count("checkpoint save at step 1 failed") == 1, both  # was twice: '[grpo] error: ...', then grpo:


def test_a_raising_reward_prints_its_traceback_once(model_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    """The reward function's traceback is logged once (grpo.rewards, a warning); the final message names the
    function and the last error, not the whole traceback again."""
    import logging

    (tmp_path / "my_rewards.py").write_text("def broken(prompts, completions, **kw):\n"
                                            "    raise ValueError('my verifier exploded')\n")
    monkeypatch.chdir(tmp_path)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("grpo.rewards").addHandler(handler)
    try:
        code = main(small(model_dir, tmp_path / "run", "reward.functions=[my_rewards.py:broken]"))
    finally:
        logging.getLogger("grpo.rewards").removeHandler(handler)
    err = capsys.readouterr().err
    logged = "".join(logging.Formatter().format(r) for r in records)
    assert logged.count("Traceback (most recent call last)") == 1 and "my verifier exploded" in logged
    assert "Traceback" not in err
    assert "reward function 'broken' raised on 4/4 samples" in err
    assert "last error: ValueError: my verifier exploded (traceback in the log above)" in err
    assert code != EXIT_OK


def test_warmup_output_naming_a_file_is_one_message_and_leaves_it(tmp_path, capsys):
    (tmp_path / "warm").write_text("mine")
    code, err = run(["warmup", "--no-eval", "--output", str(tmp_path / "warm")], capsys)
    assert code == EXIT_USER and f"--output={str(tmp_path / 'warm')!r} is a file" in err
    assert (tmp_path / "warm").read_text() == "mine"
