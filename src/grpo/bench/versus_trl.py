"""`grpo bench --versus-trl`: seconds per GRPO step, ours against TRL's GRPOTrainer (and, with --before, against
this project's code at an earlier commit), on the same model and batch.

    grpo bench --versus-trl [--model DIR] [--prompts P --group G --max-new-tokens T] [--before REV] [--quick]
                            [--output PATH]                              (default model: the built-in one)
    python -m grpo.bench.versus_trl --model DIR --steps 3 --repeats 2

Results: --output, else <GRPO_CACHE>/bench-results/versus_trl.json. The committed files the docs quote are rewritten
only with --output naming them: bench/results/versus_trl_builtin.json (the built-in model) and
bench/results/versus_trl_smollm2.json (--model DIR of SmolLM2-135M-Instruct).

The same work on both sides: the model directory, P prompts (the arithmetic task's training problems, as one user
message each through the model's chat template when it has one), G completions per prompt, at most T new tokens,
temperature 1, top_p 1, learning rate, the `exact_answer` reward, beta = 0, one optimizer step per generation
(mu = 1), the seed's loss (TRL's loss_type="grpo": per-completion mean, then mean; std-normalised group
advantages), AdamW with betas (0.9, 0.99), a constant schedule, gradient clipping at 1. Neither side evaluates.
Ours runs its defaults otherwise (the memory plan, model.compute_dtype=auto); TRL at its best on this machine:
bf16=True where the CPU multiplies bf16 natively (or on CUDA), gradient checkpointing off.

Each method runs in its own process (its own peak RSS), `--repeats` times, interleaved (before, ours, TRL, ...) so
that all see the same machine load; each process takes one untimed step (warm-up), then `--steps` timed ones.
--before REV: the code of the git revision REV (its src/, from `git archive`) runs the same worker, as "before".
Seconds are wall-clock on one process with torch's default threads. Reported: the medians over every timed step of
each method, split into generate / reward / log-probs and update (ours: Trainer.step's own perf/* metrics; TRL: its
profiling contexts, collected in-process) with tokens generated per second, and the ratios. For ours, the update's
GFLOP/s (6 x parameters x the tokens its forward computes, padding included: perf/update_tokens) against the matrix
products this machine reaches in the same run, in the update's precision, at the model's MLP shape with as many rows:
the fraction of that peak says how much of the update is not arithmetic.
Completions end at EOS on both sides, so the token counts differ run to run: tokens per second is the fair speed,
seconds per step the user's.
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

from grpo.tracking.memory import peak_rss_mb

METHODS = ("before", "ours", "trl")  # "before": --before REV only
COMMITTED = "bench/results/versus_trl_builtin.json"  # the built-in model's, which the docs quote (grpo.bench.results)
MODEL_COMMITTED = "bench/results/versus_trl_smollm2.json"  # SmolLM2-135M-Instruct's


def default_spec(model: str | None, quick: bool) -> dict:
    """The shared settings. quick: a smoke run (tiny batch, 1 timed step, 1 repeat)."""
    return {"model": model, "prompts": 2 if quick else 4, "group": 2 if quick else 8,
            "max_new_tokens": 8 if quick else 32, "lr": 1e-6, "seed": 0, "steps": 1 if quick else 3,
            "repeats": 1 if quick else 3}


def write_problems(path: Path, n: int, chat: bool) -> Path:
    """n training problems of the built-in arithmetic task as a JSONL of {"prompt", "answer"}: the prompt a user
    message ([{"role": "user", "content": ...}]) when `chat`, else the plain text."""
    from grpo.data import get_task

    rows = [{"prompt": [{"role": "user", "content": p.text.strip()}] if chat else p.text, "answer": p.answer}
            for p in get_task("arithmetic").split("train", n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------------ the workers
def run_ours(spec: dict, data: Path, work: Path) -> dict:
    """Trainer.step() (1 + steps times) on the spec's batch -> per timed step: seconds by stage, tokens."""
    from grpo.config import load_config
    from grpo.train.trainer import Trainer

    overrides = [f"data.path={data}", "reward.functions=[exact_answer]", f"rollout.prompts_per_step={spec['prompts']}",
                 f"rollout.group_size={spec['group']}", f"rollout.max_new_tokens={spec['max_new_tokens']}",
                 "rollout.temperature=1.0", "rollout.top_p=1.0", f"optim.lr={spec['lr']}", f"train.seed={spec['seed']}",
                 f"train.steps={spec['steps'] + 1}", "train.preflight=off", "log.plots=false", "eval.n=1",
                 "eval.val_n=0", "data.test_fraction=0.05"]
    if spec["model"]:
        overrides.append(f"model.name={spec['model']}")
    trainer = Trainer(load_config(None, overrides), run_dir=work / "ours")
    try:
        trainer.step()  # warm-up: first-call allocations, kernels picked
        steps = []
        for _ in range(spec["steps"]):
            m = trainer.step().metrics
            tokens = m["perf/gen_tokens_per_s"] * m["perf/generate_s"]
            steps.append({"step_s": m["perf/step_s"], "generate_s": m["perf/generate_s"],
                          "reward_s": m["perf/reward_s"], "update_s": m["perf/update_s"], "tokens": tokens,
                          "update_tokens": m.get("perf/update_tokens")})  # None in code that did not log it
        steps[0]["compute"] = getattr(trainer, "compute", "weights")
        steps[0]["params"] = sum(p.numel() for p in trainer.policy.parameters())
    finally:
        trainer.close()
    return {"steps": steps}


def run_trl(spec: dict, data: Path, work: Path) -> dict:
    """TRL's GRPOTrainer (1 + steps optimizer steps) on the same batch -> per timed step: seconds by stage, tokens."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.extras import profiling

    from grpo.models.builtin import SHIPPED_DIR
    from grpo.models.loading import load_tokenizer
    from grpo.rewards import exact_answer

    model_dir = spec["model"] or str(SHIPPED_DIR / "arithmetic")
    tokenizer = load_tokenizer(Path(model_dir))
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    timings: dict[str, float] = {}
    log_metrics = profiling.ProfilingContext._log_metrics

    def collect(self, duration: float) -> None:  # TRL times its stages itself; keep the seconds per stage name
        timings[self.name] = timings.get(self.name, 0.0) + duration
        log_metrics(self, duration)

    profiling.ProfilingContext._log_metrics = collect

    class StepClock(TrainerCallback):
        def __init__(self):
            self.steps, self.t0, self.before = [], 0.0, {}

        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.before = time.perf_counter(), dict(timings)

        def on_step_end(self, args, state, control, **kw):
            spent = {k: v - self.before.get(k, 0.0) for k, v in timings.items()}
            gen = sum(v for k, v in spent.items() if "generate" in k)
            reward = sum(v for k, v in spent.items() if k.endswith("exact_answer"))
            self.steps.append({"step_s": time.perf_counter() - self.t0, "generate_s": gen, "reward_s": reward,
                               "parts": spent})

    def reward(prompts, completions, answer, **kw):
        return exact_answer(prompts, completions, answer=answer)

    reward.__name__ = "exact_answer"
    P, G = spec["prompts"], spec["group"]
    args = GRPOConfig(output_dir=str(work / "trl"), per_device_train_batch_size=P * G, num_generations=G,
                      gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, beta=0.0,
                      loss_type="grpo", scale_rewards="group", epsilon=0.2,
                      max_completion_length=spec["max_new_tokens"], temperature=1.0, top_p=1.0,
                      learning_rate=spec["lr"], lr_scheduler_type="constant",
                      warmup_steps=0, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
                      max_steps=spec["steps"] + 1, seed=spec["seed"], use_cpu=not torch.cuda.is_available(),
                      bf16=bool(spec.get("trl_bf16")), gradient_checkpointing=False,  # TRL at its best here
                      report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True,
                      dataloader_num_workers=0, shuffle_dataset=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    clock = StepClock()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(rows), callbacks=[clock])
    trainer.train()
    profiling.ProfilingContext._log_metrics = log_metrics
    steps = clock.steps[1:]  # the first step is the warm-up
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h][1:]
    for s, mean_len in zip(steps, lengths):
        s["tokens"] = mean_len * P * G
        s["update_s"] = s["step_s"] - s["generate_s"] - s["reward_s"]  # log-probs, loss, backward, optimizer
    return {"steps": steps}


def worker(method: str, spec: dict) -> dict:
    """One process's measurement: the method's timed steps, their means, its peak RSS."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix=f"grpo-vs-trl-{method}-") as d:
        work = Path(d)
        from grpo.models.loading import load_tokenizer
        from grpo.models.builtin import SHIPPED_DIR

        tok = load_tokenizer(Path(spec["model"] or SHIPPED_DIR / "arithmetic"))
        data = write_problems(work / "train.jsonl", 200, chat=bool(getattr(tok, "chat_template", None)))
        out = (run_trl if method == "trl" else run_ours)(spec, data, work)  # "before": run_ours of older code
    steps = out["steps"]
    mean = {k: statistics.fmean(s[k] for s in steps)
            for k in ("step_s", "generate_s", "reward_s", "update_s", "tokens")}
    mean["gen_tokens_per_s"] = mean["tokens"] / max(mean["generate_s"], 1e-9)
    return {"method": method, "steps": steps, "mean": mean, "peak_rss_mb": peak_rss_mb()}


# ------------------------------------------------------------------------------------------------ the parent
def run(spec: dict, log=print, before: str | None = None) -> dict:
    """Every repeat of each method, interleaved, each in a fresh process -> the result (JSON-able). before: a git
    revision whose src/ runs the "before" arm (the same worker and spec, that code's defaults)."""
    here = str(Path(__file__).resolve().parents[2])  # src/grpo/bench/versus_trl.py -> src: the worker runs this code
    methods = [m for m in METHODS if m != "before" or before]
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as d:
        spec_path = Path(d) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        srcs = {m: here for m in methods} | ({"before": _checkout(before, Path(d) / "before")} if before else {})
        for r in range(spec["repeats"]):
            for method in methods:
                path = os.pathsep.join([srcs[method], *filter(None, [os.environ.get("PYTHONPATH")])])
                proc = subprocess.run([sys.executable, "-m", "grpo.bench.versus_trl", "--worker",
                                       "ours" if method == "before" else method, "--spec", str(spec_path)],
                                      capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path))
                if proc.returncode != 0:
                    raise RuntimeError(f"versus-trl: the {method} worker failed (exit {proc.returncode}):\n"
                                       f"{proc.stderr[-3000:]}")
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                runs[method].append(res)
                m = res["mean"]
                log(f"[bench] repeat {r} {method}: {m['step_s']:.3f} s/step (generate {m['generate_s']:.3f}, reward "
                    f"{m['reward_s']:.3f}, log-probs + update {m['update_s']:.3f}), {m['gen_tokens_per_s']:.0f} tok/s,"
                    f" peak {res['peak_rss_mb']:.0f} MB")
    med = {m: _medians(runs[m]) for m in methods}
    ratios = {"step_s": med["ours"]["step_s"] / med["trl"]["step_s"],
              "gen_tokens_per_s": med["ours"]["gen_tokens_per_s"] / med["trl"]["gen_tokens_per_s"]}
    import torch
    import transformers
    import trl

    out = {"spec": spec, "median": med, "ours_over_trl": ratios, "runs": runs,
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
           "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "before": before}
    if before:
        out["ours_over_before"] = {k: med["ours"][k] / med["before"][k] for k in ("step_s", "update_s", "generate_s")}
    out["update_rate"] = update_rate(spec, runs["ours"])
    return out


def _medians(runs: list[dict]) -> dict:
    """A method's medians over every timed step of every process (seconds, tokens, tokens/s) and over its
    processes' peak RSS."""
    steps = [s for r in runs for s in r["steps"]]
    med = {k: statistics.median(s[k] for s in steps) for k in ("step_s", "generate_s", "reward_s", "update_s",
                                                                "tokens")}
    med["gen_tokens_per_s"] = statistics.median(s["tokens"] / max(s["generate_s"], 1e-9) for s in steps)
    med["peak_rss_mb"] = statistics.median(r["peak_rss_mb"] for r in runs)
    return med


def _checkout(rev: str, where: Path) -> str:
    """The src/ of git revision `rev` of this checkout, extracted under `where` (git archive); its path."""
    root = Path(__file__).resolve().parents[3]
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(root), "archive", rev, "src"], capture_output=True, check=False)
    if archive.returncode != 0:
        from grpo.errors import ConfigError

        raise ConfigError(f"--before {rev!r}: git archive failed in {root}: {archive.stderr.decode()[-300:]}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return str(where / "src")


def update_rate(spec: dict, runs: list[dict]) -> dict | None:
    """Our update's GFLOP/s (6 x parameters x perf/update_tokens / perf/update_s, median over the steps) and the
    matrix-product rate this machine reaches now in the update's precision, at the model's MLP shape with as many
    rows (engines.matmul_peak); None for code that does not log the tokens."""
    import torch
    from transformers import AutoConfig

    from grpo.bench.engines import matmul_peak
    from grpo.models.builtin import SHIPPED_DIR

    steps = [s for r in runs for s in r["steps"] if s.get("update_tokens")]
    if not steps:
        return None
    first = runs[0]["steps"][0]
    params, compute = first["params"], first.get("compute", "weights")
    achieved = statistics.median(6 * params * s["update_tokens"] / s["update_s"] / 1e9 for s in steps)
    config = AutoConfig.from_pretrained(spec["model"] or SHIPPED_DIR / "arithmetic")
    rows = int(statistics.median(s["update_tokens"] for s in steps))
    dtype = torch.bfloat16 if compute in ("bfloat16", "bfloat16_emulated") else torch.float32
    peak = matmul_peak(config.hidden_size, config.intermediate_size, torch.device("cpu"), dtype, rows=rows)
    return {"gflops": achieved, "peak_gflops": peak, "fraction_of_peak": achieved / peak, "rows": rows,
            "dtype": str(dtype).removeprefix("torch."), "params": params, "compute": compute}


def table(result: dict) -> str:
    lines = ["method  s/step   generate  reward  log-probs+update  gen tok/s  peak MB"]
    for m in result["median"]:
        x = result["median"][m]
        lines.append(f"{m:<6}  {x['step_s']:7.3f}  {x['generate_s']:8.3f}  {x['reward_s']:6.3f}  "
                     f"{x['update_s']:16.3f}  "
                     f"{x['gen_tokens_per_s']:9.0f}  {x['peak_rss_mb']:7.0f}")
    r = result["ours_over_trl"]
    lines.append(f"ours / TRL: {r['step_s']:.2f}x the seconds per step, {r['gen_tokens_per_s']:.2f}x the generation "
                 "speed")
    if result.get("ours_over_before"):
        b = result["ours_over_before"]
        lines.append(f"ours / {result['before']}: {b['step_s']:.2f}x the seconds per step (update {b['update_s']:.2f}x, "
                     f"generate {b['generate_s']:.2f}x)")
    u = result.get("update_rate")
    if u:
        lines.append(f"update: {u['gflops']:.0f} GFLOP/s, {u['fraction_of_peak']:.0%} of the {u['peak_gflops']:.0f} "
                     f"GFLOP/s this machine's {u['dtype']} products reach at {u['rows']} rows")
    return "\n".join(lines)


def main(args) -> int:
    """`grpo bench --versus-trl`."""
    try:
        import trl  # noqa: F401
    except ImportError:
        print("grpo bench --versus-trl needs TRL: pip install trl", file=sys.stderr)
        return 2
    import torch

    from grpo.models.precision import cpu_native_bf16

    spec = default_spec(getattr(args, "model", None), getattr(args, "quick", False))
    for key in ("steps", "repeats", "prompts", "group", "max_new_tokens"):
        if getattr(args, key, None):
            spec[key] = getattr(args, key)
    spec["trl_bf16"] = torch.cuda.is_available() or cpu_native_bf16()  # TRL at its best on this machine
    result = run(spec, log=lambda msg: print(msg, file=sys.stderr, flush=True), before=getattr(args, "before", None))
    from grpo.bench.results import results_path, wrote

    out = results_path("versus_trl.json", getattr(args, "output", None))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out)
    print(table(result))
    real = not str(getattr(args, "model", None) or "builtin:").startswith("builtin:")  # a model directory
    print(wrote(out, MODEL_COMMITTED, "--model <SmolLM2-135M-Instruct dir>") if real else wrote(out, COMMITTED))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m grpo.bench.versus_trl")
    p.add_argument("--worker", choices=METHODS)
    p.add_argument("--spec", type=Path)
    p.add_argument("--model")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--steps", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--prompts", type=int)
    p.add_argument("--group", type=int)
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--before")
    p.add_argument("--output")
    a = p.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, json.loads(a.spec.read_text()))))
        raise SystemExit(0)
    raise SystemExit(main(a))
