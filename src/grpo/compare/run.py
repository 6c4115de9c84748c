"""`grpo compare`: GRPO (beta = 0), GRPO (beta = 0.04) and PPO on the same work, measured, beside the seed's table.

    grpo compare [KEY=VALUE ...] [--steps N] [--seeds K] [--output-dir DIR] [--json]

Same work: every run uses the same built-in model (warmed up once, here, before any run starts), task, held-out
problems, train.seed, rollout.prompts_per_step P and rollout.group_size G (so the same P*G completions per step and
the same max_new_tokens), and the same prompt stream: `PromptStream` is seeded by train.seed, so step k of every run
trains on the same P prompts. Building the critic draws nothing from the global RNG, so the first step's samples
are the same draws in all three runs. The runs differ only in what their presets (`grpo`, `deepseekmath`, `ppo`)
change: the baseline (group mean vs. value model), the reference model and KL, and the loss aggregation.

Each run is its own process (`python -m grpo.compare.worker --worker SPEC`, grpo/compare/worker.py), run one after
another, so its peak RSS and timings are its own. Measured per run: the networks resident (policy, reference, value;
the reward here is a program, not a network), the bytes of parameters + gradients + optimizer state, peak RSS,
seconds per step (`perf/step_s`, training only, evaluation excluded), and held-out accuracy (greedy pass@1) against
steps, completions seen and training seconds. Output: `compare.json`, `plots/compare_accuracy.png` and the runs
under the output dir. Dotted config overrides (`rollout.group_size=16`) apply to every run; settings of SAME_WORK
that they make differ between the runs are refused. $GRPO_COMPARE_OVERRIDES (space-separated) is appended to them."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from grpo.compare.worker import accuracy_curve, resident_models, run_worker, state_bytes  # noqa: F401 (re-exported)

RUNS = {  # key -> (label, preset, extra overrides)
    "grpo": ("GRPO (β=0)", "grpo", []),
    "grpo_kl": ("GRPO (β=0.04)", "deepseekmath", ["kl.coef=0.04"]),
    "ppo": ("PPO", "ppo", []),
}
# Settings that define "the same work": the parent checks the three resolved configs agree on them.
SAME_WORK = ["model.name", "data.task", "data.difficulty", "data.train_size", "rollout.group_size",
             "rollout.prompts_per_step", "rollout.max_new_tokens", "rollout.temperature", "rollout.top_p",
             "train.seed", "train.steps", "train.eval_every", "eval.n", "warmup", "optim.lr"]
SEED_CLAIMS = {
    "models": "PPO 4 (policy, reward, value, reference); GRPO 2-3 (policy, reward, optional reference)",
    "baseline": "PPO: the value model's prediction; GRPO: the mean of the group's rewards",
    "memory": "PPO high (an extra value model); GRPO low (no value model)",
    "compute": "PPO: also trains the value model; GRPO: only multiple sampling; training cost cut by ~50%",
    "accuracy": "GRPO keeps the performance while cutting the cost",
}


# ---------------------------------------------------------------------------------------------- parent side
def run_overrides(args, seed: int) -> list[str]:
    extra = list(getattr(args, "overrides", None) or []) + shlex.split(os.environ.get("GRPO_COMPARE_OVERRIDES", ""))
    return [f"train.seed={seed}", f"train.steps={args.steps}", "log.progress=false", "log.plots=false", *extra]


def check_same_work(configs: dict) -> dict:
    """The SAME_WORK settings (identical in every run, or ConfigError naming the difference)."""
    from grpo.config import ConfigError

    def get(d, dotted):
        for part in dotted.split("."):
            d = d[part]
        return d

    dicts = {k: c.to_dict() for k, c in configs.items()}
    if any(c.rollout.mode != "sync" for c in configs.values()):  # its memory and CPU figures are one process's
        raise ConfigError("compare measures each method's models, memory and CPU time in its own process; "
                          "rollout.mode=async moves sampling, rewards and the reference into a worker process that "
                          "those figures would leave out: use rollout.mode=sync")
    first = next(iter(dicts.values()))
    for key in SAME_WORK:
        values = {k: get(d, key) for k, d in dicts.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            raise ConfigError(f"compare: {key} differs between the runs: {values}")
    return {key: get(first, key) for key in SAME_WORK if key != "warmup"}


def prepare_model(cfg, printer) -> None:
    """Build (or find) the built-in model once, here, so the workers never race to build it."""
    from grpo.data import get_task
    from grpo.warmup import policy_directory

    task = get_task(cfg.data.task, difficulty=cfg.data.difficulty)
    t = time.time()
    path, source = policy_directory(cfg, task)
    printer(f"[compare] model for seed {cfg.train.seed}: {path} ({source}, {time.time() - t:.0f} s)")


def launch(name: str, preset: str, overrides: list[str], work: Path, printer) -> dict:
    """One run in its own process. work/ holds the worker's spec, log and result, and work/run/ its run directory
    (a run directory holds only what the run writes: grpo.train.checkpoint.resume.claim_run_dir)."""
    work.mkdir(parents=True, exist_ok=True)
    spec = {"name": name, "preset": preset, "overrides": overrides, "run_dir": str(work / "run"),
            "result": str(work / "compare_result.json")}
    spec_path = work / "compare_spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    log_path = work / "worker.log"
    t = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, "-m", "grpo.compare.worker", "--worker", str(spec_path)],
                              stdout=log, stderr=subprocess.STDOUT, env=_worker_env(), check=False)
    if proc.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-30:])
        raise RuntimeError(f"compare: the {name} run failed (exit {proc.returncode}); {log_path}:\n{tail}")
    result = json.loads(Path(spec["result"]).read_text())
    printer(f"[compare] {name} seed {result['seed']}: {result['step_s']:.2f} s/step, peak RSS "
            f"{result['peak_rss_mb']:.0f} MB, accuracy {result['accuracy_before']:.3f} -> "
            f"{result['accuracy_final']:.3f} ({time.time() - t:.0f} s)")
    return result


def summarize(name: str, per_seed: list[dict]) -> dict:
    """One `runs` entry: means over seeds (std beside), the per-seed results, and the fixed facts."""
    first = per_seed[0]
    out = {k: first[k] for k in ("preset", "kl_coef", "advantage", "models_resident", "models", "model_state",
                                 "model_state_bytes", "reward", "completions_per_step", "completions_seen", "steps")}
    out["label"] = RUNS[name][0]
    out["baseline"] = "value model (GAE)" if first["advantage"] == "gae" else "group mean"
    for key in ("peak_rss_mb", "rss_after_imports_mb", "step_s", "step_s_median", "step_cpu_s", "generate_s",
                "update_s", "accuracy_before", "accuracy_final", "train_s"):
        vals = [r[key] for r in per_seed]
        out[key] = statistics.fmean(vals)
        out[f"{key}_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
    out["accuracy_final_per_seed"] = [r["accuracy_final"] for r in per_seed]
    out["seeds"] = [r["seed"] for r in per_seed]
    out["per_seed"] = per_seed
    return out


def ratios(runs: dict) -> dict:
    ppo = runs["ppo"]
    out = {}
    for name in ("grpo", "grpo_kl"):
        r = runs[name]
        out[name] = {"model_state_bytes": r["model_state_bytes"] / ppo["model_state_bytes"],
                     "peak_rss_mb": r["peak_rss_mb"] / ppo["peak_rss_mb"],
                     "step_s": r["step_s"] / ppo["step_s"], "step_cpu_s": r["step_cpu_s"] / ppo["step_cpu_s"],
                     "update_s": r["update_s"] / ppo["update_s"]}
    g = runs["grpo"]
    checks = {"grpo_model_state_le_0.55x_ppo": out["grpo"]["model_state_bytes"] <= 0.55,
              "grpo_peak_rss_lt_ppo": g["peak_rss_mb"] < ppo["peak_rss_mb"],
              "grpo_step_s_lt_ppo": g["step_s"] < ppo["step_s"]}
    return {"to_ppo": out, "checks": checks}


def check_args(args) -> None:
    """ConfigError for --seeds or --steps below 1, and for an --output-dir that is a file or holds anything (the
    runs, logs and compare.json of an earlier comparison are never written over)."""
    from grpo.config import ConfigError

    for flag, value in (("--seeds", args.seeds), ("--steps", args.steps)):
        if value < 1:
            raise ConfigError(f"grpo compare {flag} must be at least 1, got {value}")
    if args.output_dir is None:
        return
    out = Path(args.output_dir).expanduser()
    if not str(args.output_dir).strip() or out.exists() and not out.is_dir():
        raise ConfigError(f"grpo compare --output-dir={str(args.output_dir)!r} is not a directory; pass a new one")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held:
        raise ConfigError(f"grpo compare --output-dir={str(args.output_dir)!r} already holds "
                          f"{', '.join(held[:5])}{' ...' if len(held) > 5 else ''}: pass a new directory (nothing "
                          "there is written over)")


def main(args) -> int:
    from grpo.config import load_config

    def err(msg: str) -> None:  # progress goes to stderr; stdout holds the table (and the JSON last)
        print(msg, file=sys.stderr, flush=True)

    check_args(args)  # before any model is built: --seeds 0 ran one seed, a used --output-dir was written over
    seeds = list(range(args.seeds))
    out_dir = Path(args.output_dir or Path("runs") / f"compare-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    per_run: dict[str, list[dict]] = {k: [] for k in RUNS}
    settings = None
    for seed in seeds:
        overrides = run_overrides(args, seed)
        configs = {k: load_config(preset, overrides + extra) for k, (_, preset, extra) in RUNS.items()}
        same = check_same_work(configs)
        settings = settings or {k: v for k, v in same.items() if k != "train.seed"}
        prepare_model(configs["grpo"], err)
        for name, (_, preset, extra) in RUNS.items():
            per_run[name].append(launch(name, preset, overrides + extra, out_dir / f"{name}-seed{seed}", err))
    runs = {k: summarize(k, v) for k, v in per_run.items()}
    P, G = settings["rollout.prompts_per_step"], settings["rollout.group_size"]
    result = {
        "steps": args.steps, "seeds": seeds, "settings": settings, "completions_per_step": P * G,
        "prompt_matching": ("same train.seed => same built-in model and the same PromptStream order: step k of every "
                            "run trains on the same P prompts, G completions each"),
        "runs": runs, "ratios": ratios(runs), "seed_claims": SEED_CLAIMS, "output_dir": str(out_dir),
        "wall_s": time.time() - t0,
    }
    return _finish(result, out_dir, args)


def _finish(result: dict, out_dir: Path, args) -> int:
    from grpo.tracking.metrics import write_json_atomic

    result["plot"] = str(plot_accuracy(result, out_dir / "plots" / "compare_accuracy.png"))
    write_json_atomic(out_dir / "compare.json", result)
    print_table(result)
    print(f"compare.json and plots/compare_accuracy.png written to {out_dir}")
    if args.json:
        print(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------- table and plot
def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _pm(run: dict, key: str, fmt: str, seeds: int) -> str:
    text = format(run[key], fmt)
    return text + (f" ± {format(run[key + '_std'], fmt)}" if seeds > 1 else "")


def table_rows(result: dict) -> list[tuple[str, str, list[str]]]:
    """(metric, the seed's claim, [cell per run]) in RUNS order."""
    runs, n_seeds, to_ppo = result["runs"], len(result["seeds"]), result["ratios"]["to_ppo"]
    G = result["settings"]["rollout.group_size"]

    def ratio(name: str, key: str) -> str:
        return "" if name == "ppo" else f" ({to_ppo[name][key]:.2f}× PPO)"

    models, baseline, state, rss, step, cpu, update, acc = [], [], [], [], [], [], [], []
    for name, r in runs.items():
        nets = [m for m in r["models"] if not m.startswith("reward:")]
        reward_nets = len(r["models"]) - len(nets)
        seed_count = len(r["models"]) + (0 if reward_nets else 1)  # the seed counts the reward as a model
        models.append(f"{' + '.join(nets)} + {'reward model' if reward_nets else 'reward fn'} = {seed_count} "
                      f"({r['models_resident']} network{'s' if r['models_resident'] > 1 else ''})")
        baseline.append(f"group mean (G={G})" if r["advantage"] != "gae" else
                        "value model: GAE over V(s_t)")
        state.append(_mb(r["model_state_bytes"]) + ratio(name, "model_state_bytes"))
        rss.append(_pm(r, "peak_rss_mb", ".0f", n_seeds) + " MiB" + ratio(name, "peak_rss_mb"))
        step.append(_pm(r, "step_s", ".3f", n_seeds) + " s" + ratio(name, "step_s"))
        cpu.append(_pm(r, "step_cpu_s", ".3f", n_seeds) + " s" + ratio(name, "step_cpu_s"))
        update.append(f"{r['update_s']:.3f} s" + ratio(name, "update_s"))
        acc.append(f"{r['accuracy_before']:.3f} → " + _pm(r, "accuracy_final", ".3f", n_seeds)
                   + f" after {r['completions_seen']:,} completions")
    claims = result["seed_claims"]
    return [("models needed", claims["models"], models), ("baseline source", claims["baseline"], baseline),
            ("memory: params + grads + optimizer", claims["memory"], state),
            ("memory: peak RSS of the process", "(same claim)", rss),
            ("compute: seconds per step", claims["compute"], step),
            ("  CPU seconds per step (process)", "", cpu),
            ("  update seconds (critic included)", "", update),
            ("test accuracy (greedy pass@1)", claims["accuracy"], acc)]


def print_table(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    if not console.is_terminal:
        console.width = max(console.width, 170)
    n = len(result["seeds"])
    title = (f"PPO vs GRPO, measured: {result['steps']} steps x {result['completions_per_step']} completions, "
             f"{n} seed{'s' if n > 1 else ''}" + (" (mean ± std)" if n > 1 else ""))
    table = Table(title=title, show_lines=True)
    table.add_column("metric", style="bold")
    table.add_column("seed's claim", style="dim", max_width=34)
    for r in result["runs"].values():
        table.add_column(r["label"], max_width=36)
    for metric, claim, cells in table_rows(result):
        table.add_row(metric, claim, *cells)
    console.print(table)
    checks = result["ratios"]["checks"]
    console.print("checks: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in checks.items()))


def plot_accuracy(result: dict, path: Path) -> Path:
    """Held-out accuracy against training seconds and against completions seen (two panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    colors = {"grpo": "tab:blue", "grpo_kl": "tab:green", "ppo": "tab:red"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in result["runs"].items():
        curves = [r["accuracy_curve"] for r in run["per_seed"]]
        many = len(curves) > 1
        for i, c in enumerate(curves):
            kw = {"color": colors.get(name), "alpha": 0.3 if many else 1.0, "lw": 1 if many else 2, "marker": "o",
                  "ms": 3, "label": None if many or i else run["label"]}
            axes[0].plot([p["train_s"] for p in c], [p["accuracy"] for p in c], **kw)
            axes[1].plot([p["completions"] for p in c], [p["accuracy"] for p in c], **kw)
        if many and len({len(c) for c in curves}) == 1:
            acc = _mean_curve(curves, "accuracy")
            for ax, key in ((axes[0], "train_s"), (axes[1], "completions")):
                ax.plot(_mean_curve(curves, key), acc, color=colors.get(name), lw=2, label=f"{run['label']} (mean)")
    axes[0].set(title="validation accuracy vs training time", xlabel="training seconds (evaluation excluded)",
                ylabel="accuracy (greedy pass@1)")
    axes[1].set(title="validation accuracy vs completions seen", xlabel="completions sampled", ylabel="accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _mean_curve(curves: list[list[dict]], key: str) -> list[float]:
    return [statistics.fmean(c[j][key] for c in curves) for j in range(len(curves[0]))]


def _worker_env() -> dict[str, str]:
    """This process's environment, with the directory this `grpo` was imported from first on PYTHONPATH: the
    worker runs the same code as its parent, even when another copy of grpo is installed."""
    env = os.environ.copy()
    src = str(Path(__file__).resolve().parents[2])  # src/grpo/compare/run.py -> src
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    return env
