"""Issue 42 item 5, progress everywhere a user waits, in a log too (no terminal): a phase whose updates are minutes
apart (one evaluation batch of a large model) still prints a line every LOG_EVERY_S seconds; a long step prints
one; the preflight shows its progress and is its own part of the wall time."""

from __future__ import annotations

import io
import json
import re
import time

import pytest
from rich.console import Console

from grpo.tracking import progress
from grpo.tracking.console import RunConsole
from grpo.tracking.progress import Phase


def _log() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, highlight=False, markup=False), out


def test_a_phase_without_updates_still_prints_a_line_every_interval():
    console, out = _log()
    assert not console.is_terminal
    with Phase("evaluating", 300, "problems", console=console, every_s=0.2):
        time.sleep(0.9)  # one slow batch: no update() at all
    lines = [line for line in out.getvalue().splitlines() if line.startswith("[grpo] evaluating: 0/300 problems")]
    assert 3 <= len(lines) <= 5, out.getvalue()  # ~0.9 / 0.2, never silent for longer than the interval
    times = [float(m) for m in re.findall(r"problems \(0%\), (\d\.\d) s elapsed", out.getvalue())]
    assert times == sorted(times) and all(b - a >= 0.15 for a, b in zip(times, times[1:]))  # not more often


def test_a_phase_without_a_count_says_its_time():
    console, out = _log()
    with Phase("loading the model", console=console, every_s=0.2):
        time.sleep(0.5)
    assert re.search(r"^\[grpo\] loading the model: 0\.\d s elapsed$", out.getvalue(), flags=re.M), out.getvalue()


def test_the_default_interval_is_ten_seconds():
    assert progress.LOG_EVERY_S == 10.0 and Phase("x").every_s == 10.0


def test_a_long_step_in_a_log_says_it_is_running_unless_a_phase_speaks(monkeypatch, capsys):
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.2)
    console, out = _log()
    con = RunConsole(3, console=console)
    con.start(0)
    try:
        time.sleep(0.7)  # step 1 runs
        beats = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[grpo] step 1/3 running")]
        assert len(beats) >= 2
        with con.phase("evaluating (validation)", 10, "problems"):
            time.sleep(0.7)
        assert "step 1/3 running" not in capsys.readouterr().out  # the phase printed its own lines instead
        assert "[grpo] evaluating (validation): 0/10 problems" in out.getvalue()
    finally:
        con.stop()
    time.sleep(0.3)
    assert capsys.readouterr().out == ""  # stopped: silent


@pytest.mark.slow
def test_the_preflight_shows_progress_in_a_log_and_is_a_part_of_the_wall_time(tmp_path, monkeypatch, capsys):
    from grpo.cli import main

    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.3)
    slow = tmp_path / "slow_reward.py"
    slow.write_text("import time\n\ndef slow(prompts, completions, **kw):\n    time.sleep(0.4)\n"
                    "    return [float(len(c) % 2) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    code = main(["train", "reward.functions=[slow_reward.py:slow]", "train.steps=1", "eval.n=4", "eval.val_n=0",
                 "rollout.prompts_per_step=2", "rollout.group_size=2", "train.preflight_groups=2",
                 "log.plots=false", "--output-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert re.search(r"^\[grpo\] preflight: \d+/\d+ batches \(at most\)", out, flags=re.M), out[:3000]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["time/preflight_s"] >= 0.4  # at least one reward call of 0.4 s
    assert "preflight " in out.split("grpo train: done", 1)[1]  # the summary's wall time names the part


def test_grpo_eval_shows_progress_on_stderr_and_keeps_its_json_clean(tmp_path, monkeypatch, capsys):
    from helpers.tiny_hf import save_tiny_model

    import grpo.train.evaluate as evaluate
    from grpo.cli import main

    def slow(model, tokenizer, task, prompts, progress=None, **kw):
        time.sleep(0.7)  # one slow batch
        progress(len(prompts), len(prompts))
        return {"accuracy": 0.5, "n": len(prompts)}, []

    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.2)
    monkeypatch.setattr(evaluate, "evaluate_problems", slow)
    assert main(["eval", str(save_tiny_model(tmp_path / "model")), "--n", "8", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["accuracy"] == 0.5  # stdout: the JSON alone
    assert "[grpo] evaluating: 0/8 problems (0%)" in captured.err
