"""Issue 42 item 7, help that teaches: every preset in `grpo --help`, an own-data example in `grpo train --help`,
`--debug` after every command, hints that point where the README teaches (a reward of your own as FILE.py:FUNCTION,
the data set's own column names), and a refused value named with the value itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bad_input import model_dir, small  # noqa: F401 (model_dir: the module's fixture)

from grpo.cli import build_parser, main
from grpo.errors import EXIT_USER


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return " ".join(capsys.readouterr().out.split())


def test_top_level_help_names_every_packaged_preset(capsys):
    import grpo

    # the preset files themselves, not list_presets()
    presets = sorted(p.stem for p in (Path(grpo.__file__).parent / "presets").glob("*.yaml"))
    assert {"cispo", "code", "tools", "dapo", "ppo"} <= set(presets)
    text = _help(["--help"], capsys)
    missing = [p for p in presets if f" {p}," not in text and f" {p} " not in text and not text.endswith(f" {p}")]
    assert missing == []


def test_train_help_shows_an_own_data_example(capsys):
    text = _help(["train", "--help"], capsys)
    assert "data.path=qa.jsonl data.prompt_column=question data.answer_column=solution" in text
    assert "reward.functions=[my_rewards.py:accuracy]" in text and "grpo import-gguf model.gguf" in text


def test_every_command_accepts_debug_after_its_name():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps the subcommands here
    assert {"train", "eval", "warmup", "import-gguf", "compare", "bench", "report"} <= set(commands)
    for name, sub in commands.items():
        assert any("--debug" in a.option_strings for a in sub._actions), name


def test_import_gguf_with_debug_prints_the_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GRPO_DEBUG", raising=False)
    assert main(["import-gguf", str(tmp_path / "none.gguf"), str(tmp_path / "out"), "--debug"]) == EXIT_USER
    err = capsys.readouterr().err
    assert "Traceback" in err and "no such GGUF file" in err


def test_an_unknown_reward_points_to_a_function_of_your_own(capsys):
    assert main(["train", "reward.functions=[exact_answr]", "--preflight"]) == EXIT_USER
    err = capsys.readouterr().err
    assert "did you mean 'exact_answer'" in err and "FILE.py:FUNCTION" in err
    assert "reward.functions=[my_rewards.py:accuracy]" in err and "register_reward" not in err


@pytest.mark.parametrize(("override", "words"), [
    ("train.steps=three", "train.steps: Input should be a valid integer, unable to parse string as an integer, "
                          "got 'three'"),
    ("optim.lr=fast", "optim.lr: Input should be a valid number, unable to parse string as a number, got 'fast'"),
])
def test_a_value_of_the_wrong_type_is_named_in_the_message(override, words, capsys):
    assert main(["train", override, "--preflight"]) == EXIT_USER
    err = " ".join(capsys.readouterr().err.split())
    assert words in err and "Traceback" not in err


def test_a_missing_column_suggests_the_files_own_column(model_dir, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "solution": str(i + 1)}) + "\n"
                            for i in range(20)))
    argv = small(model_dir, tmp_path / "run", f"data.path={path}", "reward.functions=[exact_answer]")
    assert main(argv) == EXIT_USER
    assert "no column 'prompt' (data.prompt_column); its columns are ['question', 'solution']: name yours, e.g. " \
           "data.prompt_column=question" in capsys.readouterr().err
    argv = small(model_dir, tmp_path / "run2", f"data.path={path}", "reward.functions=[exact_answer]",
                 "data.prompt_column=question")
    assert main(argv) == EXIT_USER
    assert "e.g. data.answer_column=solution" in capsys.readouterr().err
