"""Regenerate the README's figures: the default `grpo train` for several train.seed values and the own-data
command, each a fresh process with an empty model cache (a new user's first launch), then the JSON and the
README's table rows.

    python bench/readme_figures.py --output bench/results/readme_figures.json   # seeds 0 1 2 + the own-data run
                                                                                # (~3 min each here)
    python bench/readme_figures.py --seeds 0 --no-own-data
    python bench/readme_figures.py --steps 2 --eval-n 20 --output /tmp/x.json   # a smoke run
    python bench/readme_figures.py --preset tools --seeds 0 --no-own-data --output bench/results/tools_figures.json

Writes --output, else <GRPO_CACHE>/bench-results/readme_figures.json (<preset>_figures.json with --preset;
grpo.bench.results): the committed bench/results/readme_figures.json and tools_figures.json, which the README and
docs quote, are rewritten only with --output naming them. The file holds the machine (CPU model as lscpu names it,
cores, load average before and after: the machine may be shared), and per run the held-out accuracy before/after,
summary.json's wall time and its parts, the process's wall time (Python start-up, imports and plots included) and,
for a task with tools, the share of training episodes that called one at the first and the last step
(metrics.jsonl's `env/tool_use_frac`). `--preset` runs `grpo train PRESET` (code, tools, ...) instead of the
default. Runs are niced (--nice, default 5) so that a shared machine stays usable; the timings are of that machine
as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWN_DATA = ["data.path=examples/arithmetic_qa.jsonl", "reward.functions=[exact_answer]"]


def cpu_model() -> str:
    """lscpu's 'Model name' (falls back to /proc/cpuinfo, then platform)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def tool_use(run_dir: Path) -> dict:
    """metrics.jsonl's env/tool_use_frac at the first and the last step; {} for a task without tools."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    fracs = [r["env/tool_use_frac"] for r in rows if "env/tool_use_frac" in r]
    return {"env/tool_use_frac_first": fracs[0], "env/tool_use_frac_last": fracs[-1]} if fracs else {}


def run_train(name: str, overrides: list[str], out_root: Path, nice: int) -> dict:
    """One `grpo train` process with an empty GRPO_CACHE; its summary.json plus the process's wall time."""
    run_dir = out_root / name
    env = dict(os.environ, GRPO_CACHE=str(out_root / f"cache-{name}"), COLUMNS="116",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = ["nice", "-n", str(nice), sys.executable, "-m", "grpo.cli", "train", *overrides, "--output-dir", str(run_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    process_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = proc.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if "grpo train: done" in line), len(lines))
    printed = [line.replace(str(run_dir), f"runs/{name.replace(' ', '-')}") for line in lines[start:]]
    return {"name": name, "command": "grpo train " + " ".join(overrides), "process_s": round(process_s, 1),
            **{k: summary[k] for k in summary if k.startswith(("eval/", "time/")) or k in
               ("steps", "wall_s", "model_source")}, **tool_use(run_dir), "printed": printed}


def table_rows(runs: list[dict]) -> list[str]:
    """The README's table rows: | run | accuracy before | after | gain | wall time (parts) |."""
    sys.path.insert(0, str(ROOT / "src"))
    from grpo.tracking.clock import breakdown
    from grpo.tracking.progress import format_duration

    rows = []
    for r in runs:
        before, after = r["eval/accuracy_before"], r["eval/accuracy_after"]
        rows.append(f"| {r['name']} | {before:.3f} | {after:.3f} | {after - before:+.3f} | "
                    f"{format_duration(r['wall_s'])} ({breakdown(r)}) |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-own-data", action="store_true")
    parser.add_argument("--preset", help="run `grpo train PRESET` (e.g. code, tools) instead of the default")
    parser.add_argument("--steps", type=int, help="train.steps (default: the preset's, as in the README)")
    parser.add_argument("--eval-n", type=int, help="eval.n (default: the preset's)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=V", help="more overrides for every run")
    parser.add_argument("--nice", type=int, default=5)
    parser.add_argument("--output", default=None, help="the results file (default <GRPO_CACHE>/bench-results/"
                        "readme_figures.json or <preset>_figures.json; the committed one: "
                        "bench/results/readme_figures.json)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from grpo.bench.results import results_path, wrote

    file_name = f"{args.preset}_figures.json" if args.preset else "readme_figures.json"
    out = results_path(file_name, args.output)
    extra = ([f"train.steps={args.steps}"] if args.steps else []) + ([f"eval.n={args.eval_n}"] if args.eval_n else [])
    extra += args.set
    import torch
    import transformers

    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "load_before": list(os.getloadavg())}
    result = {"machine": machine, "torch": torch.__version__, "transformers": transformers.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "preset": args.preset, "overrides": extra,
              "runs": []}
    preset = [args.preset] if args.preset else []
    jobs = [(" ".join([*preset, f"train.seed={s}"]), [*preset, f"train.seed={s}", *extra]) for s in args.seeds]
    jobs += [] if args.no_own_data else [("own data", [*OWN_DATA, *extra])]
    with tempfile.TemporaryDirectory(prefix="grpo-readme-") as tmp:
        for name, overrides in jobs:
            result["runs"].append(run_train(name, overrides, Path(tmp), args.nice))
            print(table_rows(result["runs"][-1:])[0], flush=True)
            machine["load_after"] = list(os.getloadavg())
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")  # after each run: nothing is lost
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, load average {machine['load_before'][0]:.1f} before "
          f"and {machine['load_after'][0]:.1f} after")
    print(wrote(out, f"bench/results/{file_name}"))


if __name__ == "__main__":
    main()
