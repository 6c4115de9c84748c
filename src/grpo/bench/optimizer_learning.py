"""Does the 8-bit AdamW learn as float32 AdamW does? optim.name=adamw against optim.name=adamw_8bit on a real model.

    python -m grpo.bench.optimizer_learning --model DIR [--steps 16] [--lr 1e-5] [--seeds 0 1 2] [--output PATH]
    (results: bench/results/optimizer_learning.json)

The task, splits and evaluator are `grpo bench --versus-trl --learn`'s (learning_vs_trl.py): the arithmetic task as
user messages through the model's chat template, disjoint train / validation / test problems, the final model saved
and scored greedily by one evaluator. The same settings too (P=4, G=8, T=32, temperature 1, beta 0, mu 1, constant
learning rate without warm-up); the learning rate is the one that benchmark chose for our trainer on the validation
set (bench/results/learning_vs_trl_smollm2.json: 1e-5), so nothing is chosen here, on test or otherwise.

Both optimizers run the same number of steps (a fixed step count, not a CPU budget: the question is what the
moments' rounding does to learning; their time is reported beside it). Each run is a process with one torch thread;
the two optimizers of a seed run at the same time (one core each), so they see the same machine load. Per run:
held-out accuracy after (validation and test) and its gain over the model before, reward per step, seconds per
step (CPU and wall), the optimizer state's bytes (counted from the optimizer) and the process's peak RSS. The
results file is rewritten after every pair.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPTIMIZERS = ("adamw", "adamw_8bit")
DEFAULT_OUTPUT = Path("bench/results/optimizer_learning.json")


def default_spec(model: str, steps: int, lr: float, seeds: list[int]) -> dict:
    from grpo.bench.learning_vs_trl import default_spec as versus_trl_spec

    spec = versus_trl_spec(model, quick=False)
    return {k: spec[k] for k in ("model", "prompts", "group", "max_new_tokens", "temperature", "train_n", "val_n",
                                 "test_n")} | {"steps": steps, "lr": lr, "seeds": seeds, "threads": 1}


def state_bytes(optimizer) -> int:
    """Bytes of the optimizer's state tensors; an 8-bit moment counts its codes and scales."""
    import torch

    total = 0
    for state in optimizer.state.values():
        for v in state.values():
            parts = [getattr(v, a) for a in ("codes", "scale") if hasattr(v, a)] if hasattr(v, "codes") else [v]
            total += sum(t.numel() * t.element_size() for t in parts if isinstance(t, torch.Tensor))
    return total


def train(spec: dict, job: dict) -> dict:
    """One run: job['steps'] Trainer.step()s with job['optimizer'], the final policy saved and scored."""
    import torch

    from grpo.bench.learning_vs_trl import ours_overrides, score
    from grpo.config import load_config
    from grpo.tracking.memory import peak_rss_mb
    from grpo.train.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    data, out = job["data"], Path(job["model_out"])
    overrides = [*ours_overrides(spec, data, spec["lr"], job["seed"], spec["steps"]), f"optim.name={job['optimizer']}"]
    trainer = Trainer(load_config(None, overrides), run_dir=out.parent / f"run-{out.name}")
    rewards, step_cpu, cpu0, wall0 = [], [], time.process_time(), time.perf_counter()
    try:
        for _ in range(spec["steps"]):
            t = time.process_time()
            rewards.append(trainer.step().metrics["reward/mean"])
            step_cpu.append(time.process_time() - t)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        optimizer_bytes = state_bytes(trainer.optimizer)
        trainer.policy.save_pretrained(out)
        trainer.tokenizer.save_pretrained(out)
    finally:
        trainer.close()
    after = {s: score(out, data, s, spec["max_new_tokens"]) for s in ("val", "test")}
    return {"steps": spec["steps"], "train_cpu_s": cpu, "train_wall_s": wall, "step_cpu_s": step_cpu,
            "reward_per_step": rewards, "optimizer_state_bytes": optimizer_bytes, "peak_rss_mb": peak_rss_mb(),
            "after": after}


def later_step_s(run: dict) -> float:
    """Median CPU seconds of a run's steps after the first (which compiles the 8-bit step); the first alone if that
    is all there is."""
    return statistics.median(run["step_cpu_s"][1:] or run["step_cpu_s"])


def summarize(runs: list[dict]) -> dict:
    def ms(values):
        return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "values": values}

    out = {}
    for name in OPTIMIZERS:
        rs = sorted((r for r in runs if r["optimizer"] == name), key=lambda r: r["seed"])
        if rs:
            out[name] = {"seeds": [r["seed"] for r in rs],
                         **{f"gain_{s}": ms([r[f"gain_{s}"] for r in rs]) for s in ("val", "test")},
                         **{f"after_{s}": ms([r["after"][s]["accuracy"] for r in rs]) for s in ("val", "test")},
                         "mean_reward": ms([statistics.fmean(r["reward_per_step"]) for r in rs]),
                         "step_cpu_s_median": ms([later_step_s(r) for r in rs]),
                         "first_step_cpu_s": ms([r["step_cpu_s"][0] for r in rs]),
                         "optimizer_state_bytes": rs[0]["optimizer_state_bytes"],
                         "peak_rss_mb": ms([r["peak_rss_mb"] for r in rs])}
    if len(out) == 2:  # per seed, 8-bit minus float32 (the pairs ran side by side)
        pairs = {r["seed"]: {} for r in runs}
        for r in runs:
            pairs[r["seed"]][r["optimizer"]] = r
        both = [p for p in pairs.values() if len(p) == 2]
        out["difference_8bit_minus_float32"] = {
            f"gain_{s}": ms([p["adamw_8bit"][f"gain_{s}"] - p["adamw"][f"gain_{s}"] for p in both])
            for s in ("val", "test")}
    return out


def run(spec: dict, output: Path, log=print) -> dict:
    from grpo.bench.engines import _version
    from grpo.bench.learning_vs_trl import model_dir, score, write_splits
    from grpo.tracking.rundir import write_text_atomic

    src = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]),
               OMP_NUM_THREADS=str(spec["threads"]), TOKENIZERS_PARALLELISM="false")
    result = {"spec": spec, "complete": False, "before": None, "runs": [], "summary": {}}
    started = time.perf_counter()

    def save():
        import torch

        result.update(torch=torch.__version__, torchao=_version("torchao"), cpu_count=os.cpu_count(),
                      bench_wall_s=time.perf_counter() - started)
        output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(output, json.dumps(result, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="grpo-bench-optim-") as d:
        work = Path(d)
        data = write_splits(spec, work)
        result["before"] = {s: score(model_dir(spec), data, s, spec["max_new_tokens"]) for s in ("val", "test")}
        log(f"[optim] before: val {result['before']['val']['accuracy']:.3f}, "
            f"test {result['before']['test']['accuracy']:.3f}")
        save()
        for seed in spec["seeds"]:
            procs = []
            for name in OPTIMIZERS:
                job = {"optimizer": name, "seed": seed, "data": data, "model_out": str(work / f"{name}-s{seed}")}
                path = work / f"job-{name}-{seed}.json"
                path.write_text(json.dumps({"spec": spec, "job": job}))
                procs.append((job, subprocess.Popen([sys.executable, "-m", "grpo.bench.optimizer_learning",
                                                     "--worker", str(path)], stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE, text=True, env=env)))
            for job, proc in procs:
                out, err = proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(f"optimizer bench: {job['optimizer']} seed {seed} failed:\n{err[-3000:]}")
                row = {"optimizer": job["optimizer"], "seed": seed} | json.loads(out.strip().splitlines()[-1])
                for s in ("val", "test"):
                    row[f"gain_{s}"] = row["after"][s]["accuracy"] - result["before"][s]["accuracy"]
                result["runs"].append(row)
                log(f"[optim] {job['optimizer']} seed {seed}: test {row['after']['test']['accuracy']:.3f} "
                    f"({row['gain_test']:+.3f}), val {row['after']['val']['accuracy']:.3f}, "
                    f"{later_step_s(row):.1f} CPU s/step, state "
                    f"{row['optimizer_state_bytes'] / 2**20:.0f} MiB, peak {row['peak_rss_mb']:.0f} MB")
            result["summary"] = summarize(result["runs"])
            save()
    result["complete"] = True
    save()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo.bench.optimizer_learning")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--model")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5, help="default: the rate learning_vs_trl chose on validation")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    a = p.parse_args(argv)
    if a.worker:
        w = json.loads(a.worker.read_text())
        print(json.dumps(train(w["spec"], w["job"])))
        return 0
    if not a.model:
        p.error("--model DIR is required")
    result = run(default_spec(a.model, a.steps, a.lr, a.seeds), a.output,
                 log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
