"""Issue 42 item 4, honest small numbers: a data file that cuts eval.n / eval.val_n is said at start with the numbers
the run uses, and every accuracy on fewer than 100 problems is printed with its standard error, sqrt(p (1 - p) / n);
the summary table in a log is as wide as its values (none wrapped)."""

from __future__ import annotations

import io
import json
import math

from helpers.tiny_hf import save_tiny_model, small_run, write_chat_jsonl
from rich.console import Console

from grpo.config import load_config
from grpo.tracking.console import RunConsole, accuracy_text


def test_accuracy_text_adds_the_standard_error_under_100_problems():
    assert accuracy_text(0.5, 18) == "0.500 ± 0.118"  # sqrt(0.25 / 18) = 0.11785
    assert accuracy_text(0.389, 18) == "0.389 ± 0.115"  # sqrt(0.389 * 0.611 / 18) = 0.11491
    assert accuracy_text(0.25, 99) == f"0.250 ± {math.sqrt(0.25 * 0.75 / 99):.3f}"
    assert accuracy_text(0.56, 100) == "0.560" and accuracy_text(0.56, 300) == "0.560"


def _summary(n: int, val_n: int) -> dict:
    return {"eval/accuracy_before": 0.5, "eval/accuracy_after": 0.389, "eval/n": n, "eval/val_n": val_n,
            "eval/best_step": 2, "eval/accuracy_best": 0.444, "eval/val_accuracy_best": 0.588, "steps": 3,
            "wall_s": 231.0, "time/model_s": 12.3, "time/eval_s": 100.0, "time/rl_steps_s": 110.0,
            "time/save_s": 5.0, "time/other_s": 3.7}


def test_the_summary_in_a_log_has_standard_errors_and_no_wrapped_value(tmp_path):
    out = io.StringIO()
    con = RunConsole(3, console=Console(file=out, width=80, highlight=False, markup=False))  # a log: no terminal
    run_dir = tmp_path / ("a-long-run-directory-name-" * 3)
    con.summary(_summary(18, 17), run_dir, run_dir / "plots" / "training.png")
    text = out.getvalue()
    assert "│ test accuracy     │ 0.500 ± 0.118 -> 0.389 ± 0.115  (-0.111) on 18 problems" in text
    assert "step 2: test 0.444 ± 0.117, validation 0.588 ± 0.119 on 17 problems" in text  # by hand, as above
    assert "± one standard error" in text
    assert f"│ {run_dir}" in text  # the path whole, on one line, though longer than 80 columns
    rows = [line for line in text.splitlines() if line.startswith(("│", "┌", "└"))]
    assert len({len(r) for r in rows}) == 1 and len(rows[0]) > 80  # one width, as wide as the values
    assert len(rows) == 2 + 6  # borders + one line per row: nothing wrapped onto a second line
    out.truncate(0)
    out.seek(0)
    con.summary(_summary(300, 200), run_dir, None)
    assert "│ test accuracy     │ 0.500 -> 0.389  (-0.111) on 300 problems" in out.getvalue()
    assert "±" not in out.getvalue()


def test_a_data_file_that_cuts_the_held_out_sets_is_said_at_start(tmp_path):
    from grpo.train.trainer import Trainer

    model = save_tiny_model(tmp_path / "model")
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(300)))
    cfg = load_config(None, small_run(model, data, tmp_path / "run", "eval.n=300", "eval.val_n=200",
                                      "data.test_fraction=0.1"))
    out = io.StringIO()
    trainer = Trainer(cfg, console=Console(file=out, width=300))
    try:
        n, val_n = len(trainer.eval_prompts), len(trainer.val_prompts)
    finally:
        trainer.close()
    pool = n + val_n
    assert 10 < pool < 60 and val_n == pool // 2  # ~10% of 300 rows held out; half of a short pool validates
    se = math.sqrt(0.25 / min(n, val_n))
    assert (f"[grpo] eval.n=300 and eval.val_n=200 ask for 500 held-out problems, and the data has {pool} (more: "
            f"raise data.test_fraction or give data.test_path): this run tests on {n} and validates on {val_n}; an "
            f"accuracy on fewer than 100 problems is printed with its standard error (± sqrt(p (1 - p) / n), "
            f"{se:.3f} at worst here)") in out.getvalue()


def test_no_note_when_the_data_has_enough_held_out_problems(tmp_path):
    from grpo.train.trainer import Trainer

    model = save_tiny_model(tmp_path / "model")
    data = write_chat_jsonl(tmp_path / "d.jsonl", n=40)
    out = io.StringIO()
    trainer = Trainer(load_config(None, small_run(model, data, tmp_path / "run", "eval.val_n=1")),
                      console=Console(file=out, width=300))
    trainer.close()
    assert (len(trainer.eval_prompts), len(trainer.val_prompts)) == (2, 1) and "held-out problems" not in out.getvalue()


def test_grpo_eval_prints_the_standard_error_on_few_problems(tmp_path, monkeypatch, capsys):
    import grpo.train.evaluate as evaluate
    from grpo.cli import main

    monkeypatch.setattr(evaluate, "evaluate_problems",
                        lambda model, tok, task, prompts, **kw: ({"accuracy": 0.25, "n": 8}, []))
    model = save_tiny_model(tmp_path / "model")
    assert main(["eval", str(model), "--n", "8"]) == 0
    assert "accuracy 0.2500 ± 0.1531 (one standard error) (greedy) on 8 held-out problems" in capsys.readouterr().out
