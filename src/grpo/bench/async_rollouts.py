"""`grpo bench --async-rollouts`: rollout.mode=async (max_staleness 1) against rollout.mode=sync, same runs otherwise.

    grpo bench --async-rollouts [--model DIR] [--steps 40] [--repeats 3] [--quick] [--output PATH] [KEY=VALUE ...]

Each (seed, mode) is one `grpo train` process on the default task (the built-in model unless --model), the modes
interleaved per seed (sync, sync_1thread, async, sync, ...) so that all see the same machine load. Three modes,
because async splits the CPU threads (the worker half, the trainer the rest): sync with torch's default threads
(what a user gets) and sync_1thread (OMP_NUM_THREADS=1: the threads of each async side) as the two baselines. With
--model DIR (a real model): P=4, G=8, T=32 without warm-up as in `grpo bench --versus-trl --learn`, 200 test
problems, 20 steps, sync and async only (MODEL_EXTRA). No evaluation during
training (train.eval_every=0, eval.val_n=0): the test accuracy before and after is the learning figure. Reported per
run and as mean +- std over seeds: steps per minute (steady: steps 2..N from perf/step_s; and whole: the RL wall time,
the worker's start-up included), test accuracy gain per minute of RL wall time and per 1,000 completions, the
staleness and the trainer's wait for its batch; and async/sync ratios of the means. Results: --output, else
<GRPO_CACHE>/bench-results/async_rollouts.json (written after every run, so an interrupted benchmark keeps what it
measured); the committed file the docs quote is rewritten only with `--output bench/results/async_rollouts.json`.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from grpo.bench import children
from grpo.errors import UserError

MODES = ("sync", "sync_1thread", "async")  # sync_1thread: OMP_NUM_THREADS=1, the thread count of each async side
COMMITTED = "bench/results/async_rollouts.json"  # what the docs quote: written only with --output naming it
MODEL_COMMITTED = "bench/results/async_rollouts_smollm2.json"  # --model DIR of SmolLM2-135M-Instruct
# --model DIR (a real model, e.g. SmolLM2-135M-Instruct): the shape of `grpo bench --versus-trl --learn` (P=4, G=8,
# T=32, no warm-up; 200 test problems), 20 steps, and the two modes the comparison needs (a step is ~50x the
# built-in model's, so sync_1thread is left out)
MODEL_EXTRA = ["rollout.prompts_per_step=4", "rollout.max_new_tokens=32",  # T=32 said, not the model default 256
               "optim.warmup_steps=0", "eval.n=200"]


def default_spec(model: str | None, quick: bool) -> dict:
    if model and not quick:
        return {"model": model, "steps": 20, "repeats": 3, "max_staleness": 1, "modes": ["sync", "async"],
                "extra": MODEL_EXTRA}
    return {"model": model, "steps": 4 if quick else 40, "repeats": 1 if quick else 3, "max_staleness": 1,
            "modes": list(MODES), "extra": ["rollout.prompts_per_step=4", "eval.n=20"] if quick else []}


def overrides(spec: dict, mode: str, seed: int) -> list[str]:
    out = [f"train.steps={spec['steps']}", f"train.seed={seed}", "train.eval_every=0", "eval.val_n=0",
           "log.progress=false", "log.plots=false", f"rollout.mode={'async' if mode == 'async' else 'sync'}",
           f"rollout.max_staleness={spec['max_staleness']}", *spec["extra"]]
    return out + ([f"model.name={spec['model']}"] if spec["model"] else [])


def run_one(spec: dict, mode: str, seed: int, work: Path) -> dict:
    """One `grpo train` process -> its figures (from summary.json and metrics.jsonl)."""
    out = work / f"{mode}-seed{seed}"
    cmd = [sys.executable, "-m", "grpo.cli", "train", *overrides(spec, mode, seed), "--output-dir", str(out)]
    t, load_before = time.perf_counter(), os.getloadavg()[0]
    env = os.environ | {"PYTHONUNBUFFERED": "1"} | ({"OMP_NUM_THREADS": "1"} if mode == "sync_1thread" else {})
    log_path = work / f"{mode}-seed{seed}.stderr"
    with children.owned(children.spawn(cmd, env, log_path, stderr_only=True)) as proc:
        proc.wait()
    if proc.returncode != 0:
        raise children.run_failure(f"grpo bench --async-rollouts: the {mode} run of seed {seed}", proc.returncode,
                                   log_path.read_text(errors="replace"))
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "perf/step_s" in r]
    P_G = steps[0]["rollout/groups"] * _group_size(out)  # completions per step
    rl_s = summary["time/rl_steps_s"]
    gain = summary["eval/accuracy_after"] - summary["eval/accuracy_before"]
    steady = sum(r["perf/step_s"] for r in steps[1:])
    return {"mode": mode, "seed": seed, "steps": len(steps), "process_s": time.perf_counter() - t, "rl_s": rl_s,
            "load_before": load_before, "load_after": os.getloadavg()[0],
            "steps_per_min": 60 * len(steps) / rl_s, "steady_steps_per_min": 60 * (len(steps) - 1) / steady,
            "accuracy_before": summary["eval/accuracy_before"], "accuracy_after": summary["eval/accuracy_after"],
            "gain_per_min": gain / (rl_s / 60), "completions": int(len(steps) * P_G),
            "gain_per_1k_completions": gain / (len(steps) * P_G / 1000),
            "staleness_mean": statistics.fmean(r.get("rollout/staleness", 0.0) for r in steps),
            "wait_s_mean": statistics.fmean(r.get("perf/wait_s", 0.0) for r in steps[1:]),
            "generate_s_mean": statistics.fmean(r["perf/generate_s"] for r in steps[1:]),
            "update_s_mean": statistics.fmean(r["perf/update_s"] for r in steps[1:]),
            "kl_mean": statistics.fmean(r.get("policy/kl", 0.0) for r in steps)}  # the KL term at work (kl.coef > 0)


def _group_size(run_dir: Path) -> int:
    import yaml

    return int(yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]["group_size"])


KEYS = ("steps_per_min", "steady_steps_per_min", "gain_per_min", "gain_per_1k_completions", "accuracy_after",
        "staleness_mean", "wait_s_mean")


def aggregate(runs: list[dict]) -> dict:
    """mean and std over seeds per mode, and async/sync ratios of the means."""
    out: dict = {}
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        if rs:
            out[mode] = {k: {"mean": statistics.fmean(r[k] for r in rs),
                             "std": statistics.stdev(r[k] for r in rs) if len(rs) > 1 else 0.0} for k in KEYS}
            out[mode]["n"] = len(rs)
    for base in ("sync", "sync_1thread"):
        if "async" in out and base in out:
            out[f"async_over_{base}"] = {k: out["async"][k]["mean"] / out[base][k]["mean"]
                                         for k in ("steps_per_min", "steady_steps_per_min", "gain_per_min")
                                         if out[base][k]["mean"]}
    return out


def run(spec: dict, output: Path, log=print) -> dict:
    import torch

    result = {"spec": spec, "runs": [], "threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
    with children.owning_signals("grpo bench --async-rollouts", kept=lambda: output if result["runs"] else None), \
            tempfile.TemporaryDirectory(prefix="grpo-bench-async-") as tmp:
        _runs(spec, output, log, result, Path(tmp))
    return result


def _runs(spec: dict, output: Path, log, result: dict, tmp: Path) -> None:
    for seed in range(spec["repeats"]):
        for mode in spec.get("modes", MODES):
            r = run_one(spec, mode, seed, tmp)
            result["runs"].append(r)
            result["aggregate"] = aggregate(result["runs"])
            _write(output, result)
            log(f"[bench] seed {seed} {mode}: {r['steady_steps_per_min']:.1f} steps/min steady "
                f"({r['steps_per_min']:.1f} whole), test accuracy {r['accuracy_before']:.3f} -> "
                f"{r['accuracy_after']:.3f}, staleness {r['staleness_mean']:.2f}, wait {r['wait_s_mean']:.3f} s")


def _write(path: Path, result: dict) -> None:
    from grpo.tracking.rundir import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(result, indent=1) + "\n")


def table(result: dict) -> str:
    agg = result["aggregate"]
    lines = ["mode          steps/min (steady)  steps/min (whole)  test acc after    gain/min        gain/1k compl."]
    for mode in MODES:
        if mode in agg:
            a = agg[mode]
            lines.append(f"{mode:<12}  {a['steady_steps_per_min']['mean']:7.1f} +- "
                         f"{a['steady_steps_per_min']['std']:4.1f}"
                         f"  {a['steps_per_min']['mean']:7.1f} +- {a['steps_per_min']['std']:4.1f}  "
                         f"{a['accuracy_after']['mean']:.3f} +- {a['accuracy_after']['std']:.3f}  "
                         f"{a['gain_per_min']['mean']:.3f} +- {a['gain_per_min']['std']:.3f}  "
                         f"{a['gain_per_1k_completions']['mean']:.4f} +- {a['gain_per_1k_completions']['std']:.4f}")
    for base in ("sync", "sync_1thread"):
        r = agg.get(f"async_over_{base}")
        if r:
            lines.append(f"async / {base}: {r['steady_steps_per_min']:.2f}x steps per minute (steady), "
                         f"{r['steps_per_min']:.2f}x (whole), {r.get('gain_per_min', float('nan')):.2f}x accuracy "
                         "gain per minute")
    return "\n".join(lines)


# what the benchmark sets per run itself (overrides() and --steps/--repeats/--model): not a KEY=VALUE override
OWN_KEYS = ("train.steps", "train.seed", "train.eval_every", "eval.val_n", "rollout.mode", "rollout.max_staleness",
            "model.name", "log.")


def spec_from_args(args) -> dict:
    """The benchmark's spec from `grpo bench --async-rollouts` arguments: the defaults, --steps, --repeats, and the
    KEY=VALUE overrides after the default ones (so they win), checked before any run: a key the benchmark sets per
    run, or an override the config refuses, is a ConfigError; overrides need their own --output (the default file
    holds the default runs)."""
    from grpo.config import ConfigError, load_config

    model = getattr(args, "model", None)
    if model:
        _check_model(model)
    spec = default_spec(model, getattr(args, "quick", False))
    for key in ("steps", "repeats"):
        value = getattr(args, key, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{key} must be at least 1 ({'training steps per run' if key == 'steps' else 'seeds'}"
                              f"), got {value}")
        if value is not None:
            spec[key] = value
    extra = list(getattr(args, "overrides", None) or [])
    own = [o for o in extra if o.split("=", 1)[0].startswith(OWN_KEYS)]
    if own:
        raise ConfigError(f"grpo bench --async-rollouts sets {own} itself per run (use --steps, --repeats, --model)")
    if extra and not getattr(args, "output", None):
        raise ConfigError(f"overrides {extra} change what is measured: name the results file with --output")
    spec["extra"] = [*spec["extra"], *extra]
    load_config(None, overrides(spec, "async", 0))  # a wrong key or value: one message now, not after a run
    return spec


def _check_model(model: str) -> None:
    """--model as `grpo train` will read it (a model directory, a .gguf file or builtin:tiny), checked before any
    run starts: one message naming it, not a failed child's."""
    from grpo.models.checks import check_model_dir

    if model.startswith("builtin:"):
        if model != "builtin:tiny":
            raise UserError(f"--model: unknown built-in model {model!r}; the built-in one is 'builtin:tiny'")
    elif model.lower().endswith(".gguf"):
        from grpo.models.gguf import check_gguf

        if not Path(model).is_file():
            raise UserError(f"--model={model!r}: no such GGUF file")
        check_gguf(model)
    else:
        check_model_dir(model, field="--model")


def main(args) -> int:
    spec = spec_from_args(args)
    from grpo.bench.results import results_path, wrote

    out = results_path("async_rollouts.json", getattr(args, "output", None))
    result = run(spec, out, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(table(result))
    real = not str(getattr(args, "model", None) or "builtin:").startswith("builtin:")  # a model directory
    print(wrote(out, MODEL_COMMITTED, "--model <SmolLM2-135M-Instruct dir>") if real else wrote(out, COMMITTED))
    return 0
