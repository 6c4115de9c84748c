"""Benchmarks write the committed results files the docs quote only when asked (issue #54 item 5): run with its
defaults from the repository root, every writer (`grpo bench` and its parts, the python -m grpo.bench.* modules,
scripts/*.py, bench/*.py) leaves bench/results/ and bench/learning/results/ byte for byte as they were, writes under
$GRPO_CACHE/bench-results/ (conftest gives each test its own GRPO_CACHE) and prints a line naming that file and the
--output that regenerates the committed one. The measuring itself is replaced by stand-ins (only where the file goes
is under test); scripts/bf16_matmul.py runs for real, --quick, in a child process. A writer whose default went back
to a committed path fails here, and the file it changed is put back."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo.bench.results import is_committed, results_path, wrote
from grpo.cli import main as grpo_main

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_DIRS = ("bench/results", "bench/learning/results")


def snapshot() -> dict[Path, tuple[bytes, int]]:
    """Every file of the committed results folders: its bytes and modification time."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for d in COMMITTED_DIRS for p in sorted((ROOT / d).iterdir())
            if p.is_file()}


@pytest.fixture
def committed_untouched(monkeypatch):
    """Run from the repository root (where a relative default would land); afterwards assert the committed results
    folders are as they were, after putting back whatever a regressed writer changed, added or removed."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the writers set it for their measuring
    monkeypatch.setattr(sys, "path", list(sys.path))  # bench/learning/run.py prepends src/ when loaded
    before = snapshot()
    yield
    after = snapshot()
    for path in set(after) - set(before):
        path.unlink()
    for path, (data, _) in before.items():
        if after.get(path, (None,))[0] != data:
            path.write_bytes(data)
    changed = sorted(str(p.relative_to(ROOT)) for p in set(before) | set(after) if before.get(p) != after.get(p))
    assert not changed, f"a benchmark run with its defaults changed committed results files: {changed}"


def cache_dir() -> Path:
    return Path(os.environ["GRPO_CACHE"]) / "bench-results"


def load_script(path: str):
    """A script of the repository (scripts/, bench/) as a module, without running its __main__ block."""
    spec = importlib.util.spec_from_file_location(f"script_{Path(path).stem}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_write(output, result=None):
    """A stand-in benchmark's results file: written where the real one would be, so the test sees the path."""
    Path(output).write_text(json.dumps(result or {}))
    return result or {}


# ------------------------------------------------------------------------------- each writer, its measuring faked
def grpo_bench(mp):
    from grpo.bench import engines, run, vocab

    mp.setattr(run, "run_bench", lambda plan, log: {})
    mp.setattr(run, "summary", lambda result: "")
    mp.setattr(vocab, "run_vocab", lambda plan, log: {})
    mp.setattr(vocab, "merge_into", lambda result, part: result)
    mp.setattr(vocab, "summary", lambda part: "")
    mp.setattr(engines, "run_engines", lambda plan, log: {})
    mp.setattr(engines, "summary", lambda part: "")
    return lambda: grpo_main(["bench", "--quick"]), "latest.json", "bench/results/latest.json"


def engines_alone(mp):
    from grpo.bench import engines

    mp.setattr(engines, "run_engines", lambda plan, log: {})
    mp.setattr(engines, "summary", lambda result: "")
    return lambda: engines.main(["--quick"]), "engines.json", "bench/results/engines.json"


def engines_model(mp):
    from grpo.bench import engines

    mp.setattr(engines, "model_plan", lambda model, compute="weights": None)
    mp.setattr(engines, "run_engines", lambda plan, log: {})
    mp.setattr(engines, "summary", lambda result: "")
    return lambda: engines.main(["--model", "DIR"]), "engines_model.json", "bench/results/engines_model.json"


def vocab_alone(mp):
    from grpo.bench import vocab

    mp.setattr(vocab, "run_vocab", lambda plan, log: {})
    mp.setattr(vocab, "summary", lambda result: "")
    return lambda: vocab.main(["--quick"]), "vocab.json", "bench/results/vocab.json"


def memory(mp):
    from grpo.bench import memory

    mp.setattr(memory, "computed_plans", lambda entries, work: {})
    return lambda: grpo_main(["bench", "--memory", "--entries", ""]), "memory.json", "bench/results/memory.json"


def async_rollouts(mp):
    from grpo.bench import async_rollouts

    mp.setattr(async_rollouts, "run", lambda spec, output, log: fake_write(output))
    mp.setattr(async_rollouts, "table", lambda result: "")
    return (lambda: grpo_main(["bench", "--async-rollouts", "--quick"]), "async_rollouts.json",
            "bench/results/async_rollouts.json")


def versus_trl(mp):
    pytest.importorskip("trl")
    from grpo.bench import versus_trl

    mp.setattr(versus_trl, "run", lambda spec, log, before=None: {})
    mp.setattr(versus_trl, "table", lambda result: "")
    return (lambda: grpo_main(["bench", "--versus-trl", "--quick"]), "versus_trl.json",
            "bench/results/versus_trl_builtin.json")


def learning_vs_trl(mp):
    pytest.importorskip("trl")
    from grpo.bench import learning_vs_trl

    class Bench:
        def __init__(self, spec, work, out, keep, log):
            self.out = out

        def run(self):
            return fake_write(self.out)

    mp.setattr(learning_vs_trl, "Bench", Bench)
    mp.setattr(learning_vs_trl, "table", lambda result: "")
    return (lambda: grpo_main(["bench", "--versus-trl", "--learn", "--quick"]), "learning_vs_trl.json",
            "bench/results/learning_vs_trl_smollm2.json")


def optimizer_learning(mp):
    from grpo.bench import paired_learning

    mp.setattr(paired_learning, "run", lambda spec, output, compare, log: fake_write(output, {"summary": {}}))
    return (lambda: paired_learning.main(["--model", "DIR"], "optimizer"), "optimizer_learning.json",
            "bench/results/optimizer_learning.json")


def profile_step(mp):
    from grpo.bench import profile_step

    mp.setattr(profile_step, "default_spec", lambda model, quick: {})
    mp.setattr(profile_step, "profile", lambda spec, work: {"ops": [], "stages": {
        k: 1.0 for k in ("perf/step_s", "perf/generate_s", "perf/reward_s", "perf/update_s")}})
    return lambda: profile_step.main([]), "profile_step.json", "bench/results/profile_step_smollm2.json"


def out_of_scope_parsers(mp):
    script = load_script("scripts/out_of_scope_parsers.py")
    mp.setattr(script, "xml_parser_seconds", lambda: {n: 1.0 for n in script.SIZES})
    mp.setattr(script, "math_verify_finishes", lambda limit_s: (True, 0.0))
    mp.setattr(sys, "argv", ["out_of_scope_parsers.py"])
    return script.main, "out_of_scope_parsers.json", "bench/results/out_of_scope_parsers.json"


def round_three(mp):
    script = load_script("scripts/round_three_figures.py")
    for part in ("ipc", "attacks", "budget", "overhead"):
        mp.setattr(script, part, lambda: {})
    mp.setattr(sys, "argv", ["round_three_figures.py"])
    return script.main, "round_three.json", "bench/results/round_three.json"


def lean_paths(mp):
    script = load_script("scripts/lean_paths.py")
    mp.setattr(script, "generation", lambda model, repeats: {})
    mp.setattr(script, "training_steps", lambda model, steps, work: {})
    return lambda: script.main(["--model", "DIR"]), "lean_paths.json", "bench/results/lean_paths_gemma3.json"


def readme_figures(mp):
    script = load_script("bench/readme_figures.py")
    mp.setattr(script, "run_train", lambda name, overrides, out_root, nice: {"name": name})
    mp.setattr(script, "table_rows", lambda runs: ["| row |"])
    mp.setattr(sys, "argv", ["readme_figures.py", "--seeds", "0", "--no-own-data"])
    return script.main, "readme_figures.json", "bench/results/readme_figures.json"


def learning_run(mp):
    script = load_script("bench/learning/run.py")

    def write_data(out, train_size, test_size):
        rows = "".join(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" for _ in range(test_size))
        (out / "train.jsonl").write_text(rows)
        (out / "test.jsonl").write_text(rows)
        return out / "train.jsonl", out / "test.jsonl"

    run = {"curve": [], "wall_s": 1.0, "cpu_s": 1.0, "lr": 1e-6, "best_checkpoint": None, "command": "",
           **{k: 0.0 for k in ("before", "after", "best", "per_1k", "per_min", "per_cpu_min", "max_drop")}}
    mp.setattr(script, "write_data", write_data)
    mp.setattr(script, "build_checkpoint", lambda *a, **k: "model")
    mp.setattr(script, "train", lambda *a, **k: dict(run))
    mp.setattr(script, "figures", lambda curve: {})
    mp.setattr(script, "table", lambda results: "")
    mp.setattr(script, "curve_table", lambda results: "")
    work = Path(os.environ["GRPO_CACHE"]).parent / "learning-work"
    argv = ["--small", "--configs", "default:grpo:", "--seeds", "0", "--eval-n", "1", "--val-n", "1", "--work",
            str(work)]
    return lambda: script.main(argv), "learning/small.json", "bench/learning/results/"


WRITERS = [grpo_bench, engines_alone, engines_model, vocab_alone, memory, async_rollouts, versus_trl, learning_vs_trl,
           optimizer_learning, profile_step, out_of_scope_parsers, round_three, lean_paths, readme_figures,
           learning_run]


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.__name__)
def test_a_writer_with_its_defaults_writes_to_the_cache_and_says_so(writer, monkeypatch, capsys,
                                                                     committed_untouched):
    run, name, committed = writer(monkeypatch)
    assert run() in (0, None)
    out = cache_dir() / name
    assert out.is_file(), f"nothing written at {out}"
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed
    assert f"--output {committed}" in printed if committed.endswith(".json") else committed in printed


def test_bf16_matmul_quick_in_a_child_process_leaves_the_file_docs_memory_md_quotes(tmp_path, committed_untouched):
    """The issue's own case: `python scripts/bf16_matmul.py` from the repository root rewrote the file that
    docs/memory.md quotes. Now it writes the cache's copy and says how the committed one is regenerated."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "scripts/bf16_matmul.py", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = cache_dir() / "bf16_matmul.json"
    assert json.loads(out.read_text())["quick"] is True
    assert proc.stdout.splitlines()[-1] == (f"wrote {out} (the committed bench/results/bf16_matmul.json, which the "
                                            "docs quote, is regenerated with --output bench/results/bf16_matmul.json)")
    mine = tmp_path / "mine.json"
    proc = subprocess.run([sys.executable, "scripts/bf16_matmul.py", "--quick", "--output", str(mine)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(mine.read_text())["shapes"], proc.stderr[-2000:]
    proc = subprocess.run([sys.executable, "scripts/bf16_matmul.py", "--quick", "--output", str(tmp_path / "no" / "x")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "does not exist" in proc.stderr  # a user's --output is still checked first


def test_results_path_is_the_users_output_or_the_cache(tmp_path):
    assert results_path("memory.json", "bench/results/memory.json") == Path("bench/results/memory.json")
    assert results_path("memory.json", tmp_path / "m.json") == tmp_path / "m.json"
    default = results_path("learning/small.json", None)
    assert default == cache_dir() / "learning" / "small.json" and default.parent.is_dir()
    assert results_path("x.json", "") == cache_dir() / "x.json"


def test_the_line_names_the_committed_file_only_when_it_was_not_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench" / "results").mkdir(parents=True)
    assert is_committed("bench/results/memory.json", "bench/results/memory.json")
    assert is_committed(tmp_path / "bench/results/memory.json", "bench/results/memory.json")
    assert not is_committed(cache_dir() / "memory.json", "bench/results/memory.json")
    assert wrote("bench/results/memory.json", "bench/results/memory.json") == "wrote bench/results/memory.json"
    assert wrote("/tmp/m.json", "bench/results/x.json", "--model DIR") == (
        "wrote /tmp/m.json (the committed bench/results/x.json, which the docs quote, is regenerated with "
        "--model DIR --output bench/results/x.json)")
