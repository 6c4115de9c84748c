"""bench/learning/run.py's figures from a curve (the benchmark itself trains, so it is not run here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "bench" / "learning" / "run.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_learning_run", RUN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_figures_of_a_hand_curve():
    """(step, completions, train wall s, train CPU s, accuracy): 0.20 -> 0.25 -> 0.22 -> 0.30 over 3 x 640
    completions, 120 s wall, 60 s CPU. Gain 0.10; the largest drop is 0.25 -> 0.22."""
    run = _load()
    curve = [(0, 0, 0.0, 0.0, 0.20), (10, 640, 40.0, 20.0, 0.25), (20, 1280, 80.0, 40.0, 0.22),
             (30, 1920, 120.0, 60.0, 0.30)]
    f = run.figures(curve)
    assert f["gain"] == pytest.approx(0.10)
    assert f["per_1k"] == pytest.approx(1000 * 0.10 / 1920)
    assert f["per_min"] == pytest.approx(60 * 0.10 / 120)
    assert f["per_cpu_min"] == pytest.approx(60 * 0.10 / 60)
    assert f["max_drop"] == pytest.approx(0.03)
    assert f["best"] == 0.30 and f["before"] == 0.20 and f["after"] == 0.30


def test_a_rising_curve_has_no_drop():
    run = _load()
    assert run.figures([(0, 0, 0.0, 0.0, 0.1), (5, 320, 1.0, 1.0, 0.1), (10, 640, 2.0, 2.0, 0.2)])["max_drop"] == 0.0


def test_table_gives_mean_and_spread_over_seeds():
    run = _load()
    rows = [{"config": "default", "lr": 5e-5, "before": 0.2, "after": a, "gain": a - 0.2, "per_1k": 0.0,
             "per_min": 0.0, "per_cpu_min": 0.0, "max_drop": d} for a, d in ((0.3, 0.01), (0.4, 0.05))]
    line = run.table(rows).splitlines()[-1]
    assert line.startswith("| default | 5e-05 | 2 | 0.200 ± 0.000 | 0.350 ± 0.071 | +0.150 ± 0.071 |")
    assert line.endswith("| 0.050 |")


def test_library_curve_counts_resampled_completions(tmp_path):
    """metrics.jsonl rows as `grpo train` + timed_cli.py write them: step 0's evaluation, then steps with their
    times; dapo's second generation round in step 2 makes it 128 completions, not 64."""
    import argparse
    import json

    run = _load()
    rows = [{"step": 0, "eval/accuracy": 0.3},
            {"step": 1, "perf/step_s": 2.0, "perf/step_cpu_s": 1.0, "bench/sampled_completions": 64.0},
            {"step": 2, "perf/step_s": 3.0, "perf/step_cpu_s": 1.5, "bench/sampled_completions": 128.0,
             "eval/accuracy": 0.35},
            {"step": 3, "perf/step_s": 2.0, "perf/step_cpu_s": 1.0},  # no count (older rows): P x G
            {"step": 3, "eval/accuracy": 0.4}]  # an evaluation in a row of its own counts no step
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    curve = run.library_curve(tmp_path, 0.3, argparse.Namespace(prompts=8, group=8))
    assert curve == [(0, 0, 0.0, 0.0, 0.3), (2, 192, 5.0, 2.5, 0.35), (3, 256, 7.0, 3.5, 0.4)]


def test_report_merges_results_files_run_in_parallel(tmp_path, capsys):
    """Seeds run in two processes write two results files; --report A B prints their runs together and --merge
    writes them to one file."""
    import json

    run = _load()
    row = {"config": "default", "lr": 1e-6, "before": 0.2, "per_1k": 0.001, "per_min": 0.0, "per_cpu_min": 0.0,
           "max_drop": 0.0, "curve": [[0, 0, 0.0, 0.0, 0.2], [10, 640, 1.0, 1.0, 0.3]]}
    files = []
    for seed, after in ((0, 0.3), (1, 0.4)):
        f = tmp_path / f"s{seed}.json"
        f.write_text(json.dumps({"size": "medium", "results": [row | {"seed": seed, "after": after,
                                                                      "gain": after - 0.2}]}))
        files.append(f)
    merged = tmp_path / "all.json"
    assert run.main(["--report", *map(str, files), "--merge", str(merged)]) == 0
    assert "| default | 1e-06 | 2 | 0.200 ± 0.000 | 0.350 ± 0.071 |" in capsys.readouterr().out
    assert [r["seed"] for r in json.loads(merged.read_text())["results"]] == [0, 1]
