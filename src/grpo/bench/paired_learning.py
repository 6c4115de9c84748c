"""Two settings of one trainer, side by side on a real model, seed by seed: does the lean one learn as the plain one?

    python -m grpo.bench.optimizer_learning --model DIR [--steps 16] [--lr 1e-5] [--seeds 0 1 2] [--output PATH]
        optim.name=adamw against optim.name=adamw_8bit         (results: bench/results/optimizer_learning.json)
    python -m grpo.bench.precision_learning --model DIR [...]
        model.compute_dtype=float32 against bfloat16            (results: bench/results/precision_learning.json)
        (bfloat16 where this CPU multiplies bf16 natively; elsewhere bfloat16_emulated, bf16's roundings computed
        with float32 products: the learning is bf16's, the seconds are not, and the file says which ran; bf16
        compute samples in bf16 too, and algo.tis_cap=auto corrects for the sampler's other rounding)
    python -m grpo.bench.correction_learning --model DIR [...]
        bf16 compute with algo.tis_cap=null against 2          (results: bench/results/correction_learning.json)

Without --output the results go to <GRPO_CACHE>/bench-results/ under the same name: the committed files above, which
the docs quote, are rewritten only with --output naming them.

The task, splits and evaluator are `grpo bench --versus-trl --learn`'s (learning_vs_trl.py): the arithmetic task as
user messages through the model's chat template, disjoint train / validation / test problems, the final model saved
and scored greedily by one evaluator. The same settings too (P=4, G=8, T=32, temperature 1, beta 0, mu 1, constant
learning rate without warm-up); the learning rate is the one that benchmark chose for our trainer on the validation
set (bench/results/learning_vs_trl_smollm2.json: 1e-5), so nothing is chosen here, on test or otherwise.

Both arms run the same number of steps (a fixed step count, not a CPU budget: the question is what the lean
setting's rounding does to learning; their time is reported beside it). Each run is a process with one torch
thread; the two arms of a seed run at the same time (one core each), so they see the same machine load. Per run:
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
from dataclasses import dataclass
from pathlib import Path



@dataclass(frozen=True)
class Comparison:
    name: str  # the results' key for a run's arm ("optimizer", "compute")
    arms: dict  # arm name -> overrides; the first is the baseline
    difference: str  # the summary's key for the per-seed difference, candidate minus baseline
    committed: str  # the results file the docs quote (bench/results/...): written only with --output naming it


def comparison(name: str) -> Comparison:
    """The comparison of `python -m grpo.bench.<name>_learning` ("optimizer" or "precision")."""
    if name == "optimizer":
        return Comparison("optimizer", {"adamw": ["optim.name=adamw"], "adamw_8bit": ["optim.name=adamw_8bit"]},
                          "difference_8bit_minus_float32", "bench/results/optimizer_learning.json")
    if name == "precision":
        from grpo.models.precision import cpu_native_bf16

        bf16 = "bfloat16" if cpu_native_bf16() else "bfloat16_emulated"
        return Comparison("compute", {"float32": ["model.compute_dtype=float32"],
                                      "bfloat16": [f"model.compute_dtype={bf16}"]},
                          "difference_bf16_minus_float32", "bench/results/precision_learning.json")
    if name == "correction":  # bf16 compute's sampler rounds otherwise than its trainer: TIS on it or not
        from grpo.models.precision import cpu_native_bf16

        bf16 = "bfloat16" if cpu_native_bf16() else "bfloat16_emulated"
        return Comparison("correction", {"tis_off": [f"model.compute_dtype={bf16}", "algo.tis_cap=null"],
                                         "tis_2": [f"model.compute_dtype={bf16}", "algo.tis_cap=2"]},
                          "difference_tis_minus_none", "bench/results/correction_learning.json")
    raise ValueError(f"unknown comparison {name!r}")


def default_spec(model: str, steps: int, lr: float, seeds: list[int], compare: Comparison) -> dict:
    from grpo.bench.learning_vs_trl import default_spec as versus_trl_spec

    spec = versus_trl_spec(model, quick=False)
    return {k: spec[k] for k in ("model", "prompts", "group", "max_new_tokens", "temperature", "train_n", "val_n",
                                 "test_n")} | {"steps": steps, "lr": lr, "seeds": seeds, "threads": 1,
                                               "compare": compare.name, "arms": compare.arms}


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
    """One run: job['steps'] Trainer.step()s with the arm's overrides (job['overrides']), the final policy saved and
    scored."""
    import torch

    from grpo.bench.learning_vs_trl import ours_overrides, score
    from grpo.config import load_config
    from grpo.tracking.memory import peak_rss_mb
    from grpo.train.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    data, out = job["data"], Path(job["model_out"])
    overrides = [*ours_overrides(spec, data, spec["lr"], job["seed"], spec["steps"]), *job["overrides"]]
    trainer = Trainer(load_config(None, overrides), run_dir=out.parent / f"run-{out.name}")
    rewards, step_cpu, phases, cpu0, wall0 = [], [], {"generate_s": [], "update_s": []}, time.process_time(), \
        time.perf_counter()
    try:
        for _ in range(spec["steps"]):
            t = time.process_time()
            metrics = trainer.step().metrics
            step_cpu.append(time.process_time() - t)
            rewards.append(metrics["reward/mean"])
            for key in phases:  # wall seconds of generation and of the policy update, apart
                phases[key].append(metrics[f"perf/{key}"])
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        optimizer_bytes = state_bytes(trainer.optimizer)
        resolved = {"compute": trainer.compute, "optim.name": trainer.cfg.optim.name,  # what the run took
                    "algo.tis_cap": trainer.cfg.algo.tis_cap}
        trainer.policy.save_pretrained(out)
        trainer.tokenizer.save_pretrained(out)
    finally:
        trainer.close()
    after = {s: score(out, data, s, spec["max_new_tokens"]) for s in ("val", "test")}
    return {"steps": spec["steps"], "train_cpu_s": cpu, "train_wall_s": wall, "step_cpu_s": step_cpu,
            "reward_per_step": rewards, "optimizer_state_bytes": optimizer_bytes, "peak_rss_mb": peak_rss_mb(),
            "resolved": resolved, "step_generate_s": phases["generate_s"], "step_update_s": phases["update_s"],
            "after": after}


def later_step_s(run: dict) -> float:
    """Median CPU seconds of a run's steps after the first (which compiles the 8-bit step); the first alone if that
    is all there is."""
    return statistics.median(run["step_cpu_s"][1:] or run["step_cpu_s"])


def summarize(runs: list[dict], compare: Comparison) -> dict:
    def ms(values):
        return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "values": values}

    out, key = {}, compare.name
    for name in compare.arms:
        rs = sorted((r for r in runs if r[key] == name), key=lambda r: r["seed"])
        if rs:
            out[name] = {"seeds": [r["seed"] for r in rs],
                         **{f"gain_{s}": ms([r[f"gain_{s}"] for r in rs]) for s in ("val", "test")},
                         **{f"after_{s}": ms([r["after"][s]["accuracy"] for r in rs]) for s in ("val", "test")},
                         "mean_reward": ms([statistics.fmean(r["reward_per_step"]) for r in rs]),
                         "step_cpu_s_median": ms([later_step_s(r) for r in rs]),
                         "first_step_cpu_s": ms([r["step_cpu_s"][0] for r in rs]),
                         # wall seconds of the two phases apart (bf16 compute changes the update, not generation)
                         **{f"{k}_median": ms([statistics.median(r[f"step_{k}"][1:] or r[f"step_{k}"]) for r in rs])
                            for k in ("generate_s", "update_s") if all(f"step_{k}" in r for r in rs)},
                         "optimizer_state_bytes": rs[0]["optimizer_state_bytes"],
                         "peak_rss_mb": ms([r["peak_rss_mb"] for r in rs])}
    if len(out) == 2:  # per seed, the candidate minus the baseline (the pairs ran side by side)
        base, cand = compare.arms
        pairs = {r["seed"]: {} for r in runs}
        for r in runs:
            pairs[r["seed"]][r[key]] = r
        both = [p for p in pairs.values() if len(p) == 2]
        out[compare.difference] = {f"gain_{s}": ms([p[cand][f"gain_{s}"] - p[base][f"gain_{s}"] for p in both])
                                   for s in ("val", "test")}
    return out


def run(spec: dict, output: Path, compare: Comparison, log=print) -> dict:
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

        from grpo.models.precision import cpu_native_bf16

        result.update(torch=torch.__version__, torchao=_version("torchao"), cpu_count=os.cpu_count(),
                      cpu_native_bf16=cpu_native_bf16(), bench_wall_s=time.perf_counter() - started)
        output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(output, json.dumps(result, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix=f"grpo-bench-{compare.name}-") as d:
        work = Path(d)
        data = write_splits(spec, work)
        result["before"] = {s: score(model_dir(spec), data, s, spec["max_new_tokens"]) for s in ("val", "test")}
        log(f"[{compare.name}] before: val {result['before']['val']['accuracy']:.3f}, "
            f"test {result['before']['test']['accuracy']:.3f}")
        save()
        for seed in spec["seeds"]:
            procs = []
            for name, overrides in compare.arms.items():
                job = {"arm": name, "overrides": overrides, "seed": seed, "data": data,
                       "model_out": str(work / f"{name}-s{seed}")}
                path = work / f"job-{name}-{seed}.json"
                path.write_text(json.dumps({"spec": spec, "job": job}))
                procs.append((job, subprocess.Popen([sys.executable, "-m", "grpo.bench.paired_learning",
                                                     "--worker", str(path)], stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE, text=True, env=env)))
            for job, proc in procs:
                out, err = proc.communicate()
                if proc.returncode != 0:
                    raise RuntimeError(f"{compare.name} bench: {job['arm']} seed {seed} failed:\n{err[-3000:]}")
                row = {compare.name: job["arm"], "seed": seed} | json.loads(out.strip().splitlines()[-1])
                for s in ("val", "test"):
                    row[f"gain_{s}"] = row["after"][s]["accuracy"] - result["before"][s]["accuracy"]
                result["runs"].append(row)
                log(f"[{compare.name}] {job['arm']} seed {seed}: test {row['after']['test']['accuracy']:.3f} "
                    f"({row['gain_test']:+.3f}), val {row['after']['val']['accuracy']:.3f}, "
                    f"{later_step_s(row):.1f} CPU s/step, state "
                    f"{row['optimizer_state_bytes'] / 2**20:.0f} MiB, peak {row['peak_rss_mb']:.0f} MB")
            result["summary"] = summarize(result["runs"], compare)
            save()
    result["complete"] = True
    save()
    return result


def main(argv=None, compare_name: str | None = None) -> int:
    """`python -m grpo.bench.optimizer_learning` / `precision_learning` / `correction_learning` (compare_name), and the
    workers' entry."""
    prog = f"python -m grpo.bench.{compare_name or 'paired'}_learning"
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--model")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5, help="default: the rate learning_vs_trl chose on validation")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--output", type=Path, help="default: <GRPO_CACHE>/bench-results/<the comparison's file>.json; "
                   "the committed one: bench/results/<the comparison's file>.json")
    a = p.parse_args(argv)
    if a.worker:
        w = json.loads(a.worker.read_text())
        print(json.dumps(train(w["spec"], w["job"])))
        return 0
    if compare_name is None:
        p.error("run python -m grpo.bench.optimizer_learning, precision_learning or correction_learning")
    if not a.model:
        p.error("--model DIR is required")
    from grpo.bench.results import results_path, wrote

    compare = comparison(compare_name)
    output = results_path(Path(compare.committed).name, a.output)
    result = run(default_spec(a.model, a.steps, a.lr, a.seeds, compare), output, compare,
                 log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(json.dumps(result["summary"], indent=1))
    print(wrote(output, compare.committed, "--model <SmolLM2-135M-Instruct dir>"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
