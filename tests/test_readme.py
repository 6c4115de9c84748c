"""The README as a tested contract: its quick-start and own-data commands, parsed from README.md, run as a new
user would run them (a fresh process, an empty model cache, from the repository root) with the step override
the README marks for long commands, exit 0, start from the shipped model, and print the fields the README shows;
its figures are those of bench/readme_figures.py's results and of the shipped model's recipe.

A command block is marked `<!-- readme-test: NAME; fast: KEY=V ... -->` (the override the test appends), its
printed output `<!-- readme-output: NAME -->`; the figures table follows `<!-- readme-figures -->`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MARK = re.compile(r"<!-- readme-(test|output): ([\w-]+)(?:; fast: ([^>]*?))? -->\n```\w*\n(.*?)```", re.DOTALL)


def blocks(kind: str) -> dict[str, tuple[str, list[str]]]:
    """{name: (block text, fast overrides)} of the README's marked blocks of one kind."""
    return {m[2]: (m[4], shlex.split(m[3] or "")) for m in MARK.finditer(README) if m[1] == kind}


def commands(name: str) -> tuple[list[list[str]], list[str]]:
    text, fast = blocks("test")[name]
    return [shlex.split(line) for line in text.splitlines() if line.startswith("grpo ")], fast


def table_fields(output: str) -> list[str]:
    """The first column of a printed rich table ('│ held-out accuracy │ ... │' -> 'held-out accuracy'; rich draws
    '|' instead of '│' where the terminal's encoding has no box characters)."""
    cells = [re.split(r"[│|]", row) for row in output.splitlines() if len(re.findall(r"[│|]", row)) >= 3]
    return [c[1].strip() for c in cells if c[1].strip()]


def run_readme_command(argv: list[str], fast: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    assert argv[0] == "grpo"
    out_dir = tmp_path / "run"
    env = dict(os.environ, GRPO_CACHE=str(tmp_path / "empty-cache"), COLUMNS="200",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "grpo.cli", *argv[1:], *fast, "--output-dir", str(out_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out_dir / "summary.json").read_text())


def test_the_readme_marks_its_commands_and_outputs():
    assert set(blocks("test")) == {"quick-start", "own-data", "vllm"}
    assert {"quick-start", "own-data-head"} <= set(blocks("output"))
    assert commands("quick-start")[0] == [["grpo", "train"]]
    assert table_fields(blocks("output")["quick-start"][0]) == ["test accuracy", "best (validation)", "steps",
                                                                "wall time", "run directory", "plot"]


def table_cells(output: str) -> dict[str, str]:
    """{first column: second column} of a printed rich table (see table_fields)."""
    rows = [re.split(r"[│|]", row) for row in output.splitlines() if len(re.findall(r"[│|]", row)) >= 3]
    return {c[1].strip(): c[2].strip() for c in rows if c[1].strip()}


@pytest.mark.slow
def test_quick_start_runs_from_the_shipped_model_and_prints_the_readme_fields(tmp_path):
    """The README's `grpo train` (2 steps, 20 test problems) starts from the shipped model, trains it, and prints
    the README's fields with the run's own values: the accuracy before is the shipped model's, measured here apart
    on the same 20 test problems; the rest are summary.json's, the run directory and its plot."""
    from grpo.config import load_config
    from grpo.models import builtin
    from grpo.train.evaluate import heldout_accuracy

    (argv,), fast = commands("quick-start")
    assert fast == ["train.steps=2", "eval.n=20"]
    proc, summary = run_readme_command(argv, fast, tmp_path)
    assert summary["model_source"] == "shipped" and summary["steps"] == 2
    assert "warm-up" not in proc.stdout  # nothing is built on a first launch
    cells = table_cells(proc.stdout.split("grpo train: done", 1)[1])
    assert list(cells) == table_fields(blocks("output")["quick-start"][0]), proc.stdout[-2000:]
    shipped = heldout_accuracy(load_config(None, ["eval.n=20"]), builtin.SHIPPED_DIR / "arithmetic")["accuracy"]
    before, after = summary["eval/accuracy_before"], summary["eval/accuracy_after"]
    assert before == shipped
    se = lambda p: f"{p:.3f} ± {(p * (1 - p) / 20) ** 0.5:.3f}"  # noqa: E731 (20 test problems: with its standard error)
    assert cells["test accuracy"] == f"{se(before)} -> {se(after)}  ({after - before:+.3f}) on 20 problems"
    assert cells["best (validation)"] == (f"step {summary['eval/best_step']}: test {se(summary['eval/accuracy_best'])},"
                                          f" validation {summary['eval/val_accuracy_best']:.3f}")
    assert cells["steps"] == "2"
    out_dir = tmp_path / "run"
    assert cells["run directory"] == str(out_dir) and cells["plot"] == str(out_dir / "plots" / "training.png")
    assert (out_dir / "plots" / "training.png").is_file()
    first = json.loads((out_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert f"accuracy before training: test {se(before)} on 20 problems, validation {first['eval/val_accuracy']:.3f} " \
           f"on 200 (± one standard error: fewer than 100 problems)" in proc.stdout
    trained = (out_dir / "final" / "model.safetensors").read_bytes()
    assert trained != (builtin.SHIPPED_DIR / "arithmetic" / "model.safetensors").read_bytes()  # RL changed it


@pytest.mark.slow
def test_own_data_command_trains_the_built_in_model_on_the_example_file(tmp_path):
    argvs, fast = commands("own-data")
    head = blocks("test")["own-data"][0].splitlines()[0]
    assert head == "head -2 examples/arithmetic_qa.jsonl"
    shown = blocks("output")["own-data-head"][0].splitlines()
    assert shown == (ROOT / "examples" / "arithmetic_qa.jsonl").read_text().splitlines()[:2]
    assert all(not json.loads(row)["prompt"].endswith("\n") for row in shown)  # as a user writes a question
    (argv,) = argvs
    proc, summary = run_readme_command(argv, fast, tmp_path)
    assert summary["model_source"] == "shipped" and summary["task"] == "examples/arithmetic_qa.jsonl"
    assert table_fields(proc.stdout)[:1] == ["test accuracy"]


def figures() -> list[list[str]]:
    table = README.split("<!-- readme-figures -->", 1)[1].strip().split("\n\n", 1)[0]
    assert table.startswith("| run | accuracy before | after | gain |")
    return [[c.strip() for c in row.strip("|").split("|")] for row in table.splitlines()[2:]]


def test_the_readme_figures_are_the_benchmark_script_results_and_the_shipped_model():
    path = ROOT / "bench" / "results" / "readme_figures.json"
    rows = figures()
    if not path.exists():  # not measured yet: then the README's table must be empty, not hand-written
        assert rows == []
        pytest.skip("bench/results/readme_figures.json not generated yet: python bench/readme_figures.py")
    result = json.loads(path.read_text())
    assert [r[0] for r in rows] == [r["name"] for r in result["runs"]]
    for row, run in zip(rows, result["runs"]):
        before, after = run["eval/accuracy_before"], run["eval/accuracy_after"]
        assert row[1:4] == [f"{before:.3f}", f"{after:.3f}", f"{after - before:+.3f}"]
        assert run["model_source"] == "shipped" and run["steps"] == 150
    assert result["machine"]["cpu"] in README  # the table names the CPU it was measured on
    recipe = json.loads((ROOT / "src" / "grpo" / "models" / "weights" / "arithmetic" / "recipe.json").read_text())
    for row, run in zip(rows, result["runs"]):
        if run["name"].startswith("train.seed="):  # the built-in task: the shipped model's recorded accuracy
            assert row[1] == f"{recipe['heldout']['accuracy']:.3f}"


def test_the_vllm_lines_are_the_ones_ci_runs():
    """The README's vLLM install lines are what scripts/test_vllm.sh (run by CI) builds its environment with, and its
    `grpo train rollout.engine=vllm` is the command that script ends with."""
    block, _ = blocks("test")["vllm"]
    lines = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    script = (ROOT / "scripts" / "test_vllm.sh").read_text()
    venv, install, train = lines
    assert venv == "python3 -m venv --system-site-packages .venv-vllm && . .venv-vllm/bin/activate"
    assert 'python3 -m venv --system-site-packages "$venv"' in script and 'venv="${GRPO_VLLM_VENV:-.venv-vllm}"' in script
    assert install == "bash scripts/install.sh vllm" and f'. "$venv/bin/activate" && {install}' in script
    assert train == "grpo train rollout.engine=vllm" and '"$venv/bin/grpo" train rollout.engine=vllm' in script
    installer = (ROOT / "scripts" / "install.sh").read_text()
    assert "pip uninstall -y -q torchvision torchaudio torchcodec" in installer
