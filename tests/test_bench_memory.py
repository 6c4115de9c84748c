"""`grpo bench --memory`'s measuring and reporting: the peak is the whole process tree's (a child and its own
child, each holding a known amount), the table rows come from the results file, and bad arguments are refused
before any run."""

from __future__ import annotations

import sys

import pytest

from grpo.bench import memory
from grpo.errors import ConfigError

HOLD = """
import os, subprocess, sys, time
mb = int(sys.argv[1])
block = bytearray(mb * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1  # touched: resident
if len(sys.argv) > 2:
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[3]])
    child.wait()
else:
    time.sleep(1.5)
"""


def test_the_peak_is_the_whole_process_trees(tmp_path):
    """A process holding 300 MiB whose child holds 200 MiB at the same time: the polled peak is at least their sum
    (a measure of the parent alone would see about 300)."""
    cmd = [sys.executable, "-c", HOLD, "300", HOLD, "200"]
    res = memory.run_polled(cmd, {}, tmp_path / "log", timeout_s=60)
    assert res["rc"] == 0
    assert 500 <= res["peak_tree_mb"] < 500 + 200  # plus two interpreters' own few tens of MiB


def test_table_rows_render_the_results_file():
    result = {
        "entries": {"qwen2.5-0.5b-full-defaults": {"overrides": [], "peak_mb": 10_000.0, "floor_mb": 7_536.0,
                                                   "peak_over_floor": 1.327, "planned_mb": 9_500.0,
                                                   "step_s": [100.0, 120.0]}},
        "trl": {"qwen2.5-0.5b-full-defaults": {"peak_mb": 5_000.0}},
        "computed": {"qwen2.5-7b-lora16-P4": {"overrides": ["model.lora_rank=16", "rollout.prompts_per_step=4"],
                                              "planned_mb": 34_000.0, "step_s_scaled": 555.4}},
    }
    rows = memory.table_rows(result, "bench/results/memory.json").splitlines()
    # by hand: 10,000 MiB = 10.49 GB; 7,536 MiB = 7.90 GB; 9,500 MiB = 9.96 GB; TRL 5,000 MiB = 5.24 GB; mean 110 s
    assert rows[0] == ("| Qwen2.5-0.5B shape | full | P=16 G=8 T=32 | 10.49 | 7.90 (1.33x) | 9.96 | 5.24 | 110 | "
                       "`bench/results/memory.json` |")
    assert rows[1] == ("| Qwen2.5-7B shape | LoRA r=16 | P=4 G=8 T=32 | computed | - | 35.7 (computed) | - | "
                       "~555 (computed) | `bench/results/memory.json` |")
    assert memory.table_rows(result, "bench/results/memory.json", computed=False).splitlines() == rows[:1]
    result["entries"]["qwen2.5-0.5b-full-P4-limit1.5x"] = {**result["entries"].pop("qwen2.5-0.5b-full-defaults"),
                                                          "overrides": ["train.memory_limit=11.04"]}
    assert "| full, limit 11.04 GiB |" in memory.table_rows(result, "x", computed=False)


@pytest.mark.parametrize("argv, words", [
    (["--memory-model", "smollm2"], "give NAME=DIR"),
    (["--memory-model", "smollm2=/nope"], "give NAME=DIR"),
    (["--entries", "nope"], "--entries: unknown ['nope']"),
    (["--entries", "qwen2.5-0.5b-full-defaults"], "no --memory-model NAME=DIR for ['qwen2.5-0.5b']"),
])
def test_bad_arguments_are_refused_before_any_run(argv, words, tmp_path, capsys):
    from grpo.cli import main

    code = main(["bench", "--memory", *argv, "--output", str(tmp_path / "m.json")])
    assert code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
