"""A base model (no chat template) as a user brings it: raw "Question: ...\\nAnswer:" prompts, a stop string, the
library's defaults otherwise, seed by seed; and the same model without the stop string, to show the preflight's
advice.

    python -m grpo.bench.base_model --model DIR [--seeds 0 1] [--steps 40] [--output PATH]
        (results: bench/results/base_model_gemma3.json for Gemma 3 270M base; without --output, the cache)

The task: sums and differences of two numbers below 100 (non-negative differences), every distinct problem once,
shuffled with --data-seed; the first 500 are the held-out file (`data.test_path`: eval.n=300 test problems and
eval.val_n=200 validation ones, the defaults), the next --train-size the training file, so no test or validation
problem is trained on. Each run is `grpo train model.name=DIR data.path=train.jsonl data.test_path=test.jsonl
reward.functions=[exact_answer] rollout.stop=["\\n"] train.steps=S train.seed=K` in a subprocess (all threads), its
summary.json read back: test accuracy before and after (greedy, the same 300 problems), the model chosen on
validation, seconds, preflight seconds, the planned and the measured peak (the process tree's), and whether the
run printed the full-logits warning (the lean head not taken). The advice run is `grpo train --preflight` with the
same files and no rollout.stop: its exit code and the lines that name rollout.stop. The results file is rewritten
after every run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMITTED = "bench/results/base_model_gemma3.json"
HELD_OUT = 500  # eval.n (300) + eval.val_n (200), the defaults
STOP = '["\\n"]'  # the YAML list rollout.stop='["\n"]': one newline


def problems(seed: int) -> list[dict]:
    """Every distinct problem a + b and a - b (a >= b) with a, b in 0..99, shuffled by `seed`, as data rows."""
    rows = [(a, "+", b, a + b) for a in range(100) for b in range(100)]
    rows += [(a, "-", b, a - b) for a in range(100) for b in range(a + 1)]
    random.Random(seed).shuffle(rows)
    return [{"prompt": f"Question: What is {a} {op} {b}?\nAnswer:", "answer": str(c)} for a, op, b, c in rows]


def write_task(folder: Path, seed: int, train_size: int) -> tuple[Path, Path]:
    """train.jsonl and test.jsonl in `folder`: HELD_OUT held-out problems, then train_size others."""
    rows = problems(seed)
    train, test = folder / "train.jsonl", folder / "test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in rows[:HELD_OUT]))
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[HELD_OUT:HELD_OUT + train_size]))
    return train, test


def grpo_train(argv: list[str], log: Path) -> tuple[int, str, float]:
    """Run `python -m grpo.cli train ARGV`; its exit code, its output (also kept in `log`) and its wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grpo.cli", "train", *argv], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    log.write_text(proc.stdout)
    return proc.returncode, proc.stdout, time.perf_counter() - t0


def advice_run(model: str, train: Path, test: Path, work: Path) -> dict:
    """`grpo train --preflight` without rollout.stop: its exit code and the lines naming rollout.stop."""
    argv = ["--preflight", f"model.name={model}", f"data.path={train}", f"data.test_path={test}",
            "reward.functions=[exact_answer]", f"train.output_dir={work / 'advice'}"]
    code, out, wall = grpo_train(argv, work / "advice.log")
    return {"argv": argv, "exit_code": code, "wall_s": round(wall, 1),
            "advice": [line.strip() for line in out.splitlines() if "rollout.stop" in line]}


def training_run(model: str, train: Path, test: Path, work: Path, seed: int, steps: int) -> dict:
    """One `grpo train` with rollout.stop and the defaults otherwise; what its summary.json and output say."""
    out_dir = work / f"seed{seed}"
    argv = [f"model.name={model}", f"data.path={train}", f"data.test_path={test}", "reward.functions=[exact_answer]",
            f"rollout.stop={STOP}", f"train.steps={steps}", f"train.seed={seed}", f"train.output_dir={out_dir}",
            "log.progress=false"]
    code, out, wall = grpo_train(argv, work / f"seed{seed}.log")
    if code != 0:
        raise SystemExit(f"seed {seed}: grpo train exited {code} (its output: {work / f'seed{seed}.log'})\n"
                         f"{out[-2000:]}")
    s = json.loads((out_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_rows = [r for r in rows if "reward/mean" in r]
    return {"seed": seed, "argv": argv, "wall_s": round(wall, 1),
            "test_before": s["eval/accuracy_before"], "test_after": s["eval/accuracy_after"],
            "gain": round(s["eval/accuracy_after"] - s["eval/accuracy_before"], 4),
            "test_best": s["eval/accuracy_best"], "best_step": s["eval/best_step"],
            "val_best": s["eval/val_accuracy_best"], "test_n": s["eval/n"], "val_n": s["eval/val_n"],
            "preflight_s": s["time/preflight_s"], "rl_steps_s": s["time/rl_steps_s"],
            "step_s_median": statistics.median(r["perf/step_s"] for r in steps_rows if "perf/step_s" in r)
            if any("perf/step_s" in r for r in steps_rows) else None,
            "planned_peak_mb": s["memory/planned_peak_mb"], "peak_rss_mb": s["memory/peak_rss_mb"],
            "peak_over_plan": round(s["memory/peak_rss_mb"] / s["memory/planned_peak_mb"], 3),
            "full_logits_warning": "full (N, T, V) logits" in out,
            "lean_lines": [line.strip() for line in out.splitlines() if "lean" in line.lower()][:6],
            "truncated_frac_last": steps_rows[-1].get("rollout/truncated_frac") if steps_rows else None,
            "reward_per_step": [r["reward/mean"] for r in steps_rows]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a base model's directory (e.g. grpo import-gguf's output)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--train-size", type=int, default=4000)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--skip-advice", action="store_true", help="no run without rollout.stop")
    p.add_argument("--output", default=None, help=f"the results file (the committed one: {COMMITTED})")
    a = p.parse_args(argv)
    from grpo.bench.results import results_path, wrote

    output = results_path(Path(COMMITTED).name, a.output)
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-base-"))
    train, test = write_task(work, a.data_seed, a.train_size)
    result = {"spec": {"model": a.model, "seeds": a.seeds, "steps": a.steps, "train_size": a.train_size,
                       "data_seed": a.data_seed, "held_out": HELD_OUT, "stop": ["\n"]}, "runs": []}

    def save():
        gains = [r["gain"] for r in result["runs"]]
        if gains:
            result["summary"] = {"gain_mean": round(statistics.mean(gains), 4), "gains": gains,
                                 "gain_sd": round(statistics.stdev(gains), 4) if len(gains) > 1 else None}
        output.write_text(json.dumps(result, indent=1) + "\n")

    if not a.skip_advice:
        result["without_stop"] = advice_run(a.model, train, test, work)
        print(f"[base_model] without rollout.stop: exit {result['without_stop']['exit_code']}; "
              f"{result['without_stop']['advice'][:1]}", flush=True)
        save()
    for seed in a.seeds:
        run = training_run(a.model, train, test, work, seed, a.steps)
        result["runs"].append(run)
        print(f"[base_model] seed {seed}: test {run['test_before']:.3f} -> {run['test_after']:.3f} "
              f"(best on validation: step {run['best_step']}, test {run['test_best']:.3f}), "
              f"{run['wall_s']:.0f} s", flush=True)
        save()
    print(wrote(output, COMMITTED, "python -m grpo.bench.base_model --model DIR"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
