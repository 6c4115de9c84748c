"""`grpo bench --versus-trl --learn`: does a real model learn, and learn faster per CPU-minute, with our trainer than
with TRL's GRPOTrainer, on the same task, settings and CPU budget?

    python -m grpo.bench.learning_vs_trl --model DIR [--quick] [--output PATH] [--keep-models DIR]
    grpo bench --versus-trl --learn --model DIR            (default model: the built-in one; results:
                                                             <GRPO_CACHE>/bench-results/learning_vs_trl.json, or
                                                             --output: the committed one the docs quote is
                                                             bench/results/learning_vs_trl_smollm2.json)

The task: the arithmetic task's two-digit additions and subtractions, each one user message (through the model's
chat template when it has one), in three disjoint sets: training problems (the task's train split), and from its
held-out split a validation set (the learning rate is chosen on it) and a test set after it (reported; never used
to choose anything). The same settings as `grpo bench --versus-trl` (versus_trl.py): P prompts, G completions, at
most T new tokens, temperature 1, top_p 1, `exact_answer`, beta = 0, mu = 1, TRL's loss_type="grpo", AdamW (0.9,
0.99), constant learning rate without warm-up, gradient clipping at 1; TRL's prompts shuffled by the seed as ours.

Each training run is a process with one torch thread and a budget of its own CPU time (time.process_time(), fair
when other jobs load the machine): ours checks it after each Trainer.step(), TRL in a TrainerCallback that sets
control.should_training_stop. Model loading is outside the budget. The run saves its final model to a directory,
and ONE evaluator (`score`: the library's greedy evaluation, grpo.train.evaluate.evaluate_model, on a FileTask of
the split's file, chat template on, T new tokens) reads it back from there for both methods, so the only
difference between the methods is the trainer. The model before training is scored once by the same function.

The plan: a learning-rate sweep on one seed with a shorter budget, the rate chosen per method by validation
accuracy; then every seed at each method's chosen rate. Our run and TRL's of one (rate, seed) run at the same time
(--jobs 2, one core each) or one after the other (--jobs 1), so both see the same machine load. The results JSON is
rewritten (atomically) after every run, so an interrupted benchmark keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METHODS = ("ours", "trl")
# what the docs quote (SmolLM2-135M-Instruct): written only with --output naming it (grpo.bench.results)
COMMITTED = "bench/results/learning_vs_trl_smollm2.json"


def default_spec(model: str | None, quick: bool) -> dict:
    """The shared settings; budgets in CPU seconds of the training process. quick: the built-in model, one tiny
    run per method and rate (a smoke run for the tests)."""
    if quick:
        return {"model": model, "prompts": 2, "group": 2, "max_new_tokens": 24, "temperature": 1.0, "train_n": 40,
                "val_n": 8, "test_n": 8, "sweep_lrs": [1e-4, 1e-3], "sweep_budget_s": 1.0, "sweep_seed": 0,
                "budget_s": 1.0, "seeds": [0], "threads": 1, "jobs": 1}
    return {"model": model, "prompts": 4, "group": 8, "max_new_tokens": 32, "temperature": 1.0, "train_n": 400,
            "val_n": 100, "test_n": 200, "sweep_lrs": [1e-6, 1e-5, 1e-4], "sweep_budget_s": 150.0, "sweep_seed": 0,
            "budget_s": 360.0, "seeds": [0, 1, 2], "threads": 1, "jobs": 2}


def model_dir(spec: dict) -> Path:
    from grpo.models.builtin import SHIPPED_DIR

    return Path(spec["model"] or SHIPPED_DIR / "arithmetic")


def write_splits(spec: dict, work: Path) -> dict[str, str]:
    """train / val / test JSONL files of {"prompt", "answer"} (the prompt a user message when the model has a chat
    template). val and test come from the task's held-out split, one after the other: the three share no problem."""
    from grpo.data import get_task
    from grpo.models.loading import load_tokenizer

    chat = bool(getattr(load_tokenizer(model_dir(spec)), "chat_template", None))
    task = get_task("arithmetic")
    held = task.split("test", spec["val_n"] + spec["test_n"])
    sets = {"train": task.split("train", spec["train_n"]), "val": held[:spec["val_n"]], "test": held[spec["val_n"]:]}
    texts = {k: {p.text for p in v} for k, v in sets.items()}
    assert not (texts["train"] & texts["val"] or texts["train"] & texts["test"] or texts["val"] & texts["test"])
    paths = {}
    for name, problems in sets.items():
        rows = [{"prompt": [{"role": "user", "content": p.text.strip()}] if chat else p.text, "answer": p.answer}
                for p in problems]
        paths[name] = str(work / f"{name}.jsonl")
        Path(paths[name]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


# ------------------------------------------------------------------------------------------------ the evaluator
def score(model_path: str | Path, data: dict[str, str], split: str, max_new_tokens: int) -> dict:
    """Greedy accuracy of the model saved in `model_path` on the problems of data[split], by the library's
    evaluation (the same for both methods): {'accuracy', 'n', 'correct' (how many)}."""
    from transformers import AutoModelForCausalLM

    from grpo.data.files import FileTask
    from grpo.models.loading import load_tokenizer
    from grpo.train.evaluate import evaluate_model

    tokenizer = load_tokenizer(Path(model_path))
    task = FileTask(data["train"], reward_functions=["exact_answer"], test_path=data[split], tokenizer=tokenizer)
    prompts = task.split("test", 10**9)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    res = evaluate_model(model, tokenizer, task, prompts, batch_size=len(prompts), max_new_tokens=max_new_tokens)
    return {"accuracy": res["accuracy"], "n": res["n"], "correct": sum(res["correct"])}


# ------------------------------------------------------------------------------------------------ the trainers
def ours_overrides(spec: dict, data: dict, lr: float, seed: int, steps: int = 100_000) -> list[str]:
    """Our trainer's settings for a run of the benchmark (also grpo.bench.optimizer_learning's): the spec's task and
    batch, a constant learning rate without warm-up, no preflight, no evaluation of its own (the evaluator scores the
    saved model)."""
    return [f"data.path={data['train']}", f"data.test_path={data['val']}", "reward.functions=[exact_answer]",
            f"rollout.prompts_per_step={spec['prompts']}", f"rollout.group_size={spec['group']}",
            f"rollout.max_new_tokens={spec['max_new_tokens']}", f"rollout.temperature={spec['temperature']}",
            "rollout.top_p=1.0", f"optim.lr={lr}", "optim.warmup_steps=0", "optim.schedule=constant",
            f"train.seed={seed}", f"train.steps={steps}", "train.preflight=off", "log.plots=false",
            "eval.n=1", "eval.val_n=0", f"model.name={model_dir(spec)}"]


def train_ours(spec: dict, job: dict, data: dict, out: Path) -> dict:
    """Trainer.step() until the job's CPU budget is spent; the final policy saved to `out`."""
    from grpo.config import load_config
    from grpo.train.trainer import Trainer

    overrides = ours_overrides(spec, data, job["lr"], job["seed"])
    trainer = Trainer(load_config(None, overrides), run_dir=out.parent / "ours-run")
    steps, rewards, cpu0, wall0 = 0, [], time.process_time(), time.perf_counter()
    try:
        while time.process_time() - cpu0 < job["budget_s"]:
            rewards.append(trainer.step().metrics["reward/mean"])
            steps += 1
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        trainer.policy.save_pretrained(out)
        trainer.tokenizer.save_pretrained(out)
    finally:
        trainer.close()
    return {"steps": steps, "train_cpu_s": cpu, "train_wall_s": wall, "reward_per_step": rewards}


def train_trl(spec: dict, job: dict, data: dict, out: Path) -> dict:
    """TRL's GRPOTrainer until the job's CPU budget is spent (a callback stops it); the final model saved to `out`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo.models.loading import load_tokenizer
    from grpo.rewards import exact_answer

    class CpuBudget(TrainerCallback):
        def __init__(self):
            self.cpu0 = self.wall0 = 0.0
            self.cpu = self.wall = 0.0

        def on_train_begin(self, args, state, control, **kw):
            self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.cpu, self.wall = time.process_time() - self.cpu0, time.perf_counter() - self.wall0
            if self.cpu >= job["budget_s"]:
                control.should_training_stop = True

    def reward(prompts, completions, answer, **kw):
        return exact_answer(prompts, completions, answer=answer)

    reward.__name__ = "exact_answer"
    P, G = spec["prompts"], spec["group"]
    args = GRPOConfig(output_dir=str(out.parent / "trl-run"), per_device_train_batch_size=P * G, num_generations=G,
                      gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, beta=0.0,
                      loss_type="grpo", scale_rewards="group", epsilon=0.2,
                      max_completion_length=spec["max_new_tokens"], temperature=spec["temperature"], top_p=1.0,
                      learning_rate=job["lr"], lr_scheduler_type="constant",
                      warmup_steps=0, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
                      max_steps=100000, seed=job["seed"], use_cpu=not torch.cuda.is_available(), bf16=False,
                      report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                      shuffle_dataset=True)
    rows = [json.loads(line) for line in Path(data["train"]).read_text().splitlines()]
    tokenizer = load_tokenizer(model_dir(spec))
    model = AutoModelForCausalLM.from_pretrained(model_dir(spec), dtype=torch.float32)
    budget = CpuBudget()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(rows), callbacks=[budget])
    trainer.train()
    trainer.save_model(str(out))
    tokenizer.save_pretrained(out)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"steps": trainer.state.global_step, "train_cpu_s": budget.cpu, "train_wall_s": budget.wall,
            "reward_per_step": rewards}


def worker(spec: dict, job: dict) -> dict:
    """One process: job["kind"] "score" (the untrained model) or "train" (one method, rate, seed, budget, then the
    final model scored on job["splits"])."""
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(spec["threads"])
    data = job["data"]
    if job["kind"] == "score":
        return {s: score(model_dir(spec), data, s, spec["max_new_tokens"]) for s in job["splits"]}
    from grpo.tracking.memory import peak_rss_mb

    out = Path(job["model_out"])
    wall0 = time.perf_counter()
    res = (train_ours if job["method"] == "ours" else train_trl)(spec, job, data, out)
    gc.collect()
    res |= {"completions": res["steps"] * spec["prompts"] * spec["group"], "train_peak_rss_mb": peak_rss_mb()}
    cpu0 = time.process_time()
    res["after"] = {s: score(out, data, s, spec["max_new_tokens"]) for s in job["splits"]}
    res |= {"eval_cpu_s": time.process_time() - cpu0, "process_cpu_s": time.process_time(),
            "process_wall_s": time.perf_counter() - wall0}
    return res


# ------------------------------------------------------------------------------------------------ the parent
class Bench:
    """The plan's processes, one after another (a pair at a time), and the results file rewritten after each."""

    def __init__(self, spec: dict, work: Path, output: Path, keep_models: Path | None, log=print):
        self.spec, self.work, self.output, self.keep, self.log = spec, work, output, keep_models, log
        src = str(Path(__file__).resolve().parents[2])  # src/grpo/bench/learning_vs_trl.py -> src: this code
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.result: dict = {"spec": spec, "complete": False, "before": None, "sweep": [], "chosen_lr": {},
                             "runs": [], "summary": {}}
        self.started = time.perf_counter()

    def save(self) -> None:
        import torch
        import transformers
        import trl

        self.result |= {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                     "trl": trl.__version__}, "cpu_count": os.cpu_count(),
                        "bench_wall_s": time.perf_counter() - self.started}
        self.output.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.output.with_name(self.output.name + ".tmp")
        tmp.write_text(json.dumps(self.result, indent=1) + "\n")
        os.replace(tmp, self.output)

    def _start(self, job: dict) -> tuple[subprocess.Popen, Path]:
        path = self.work / f"job-{len(list(self.work.glob('job-*.json')))}.json"
        path.write_text(json.dumps({"spec": self.spec, "job": job}))
        proc = subprocess.Popen([sys.executable, "-m", "grpo.bench.learning_vs_trl", "--worker", str(path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        return proc, path

    @staticmethod
    def _finish(proc: subprocess.Popen, what: str) -> dict:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"learning-vs-trl: {what} failed (exit {proc.returncode}):\n{err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])

    def before(self, data: dict) -> None:
        proc, _ = self._start({"kind": "score", "data": data, "splits": ["val", "test"]})
        self.result["before"] = self._finish(proc, "scoring the untrained model")
        self.save()
        b = self.result["before"]
        self.log(f"[learn] before training: val {b['val']['accuracy']:.3f}, test {b['test']['accuracy']:.3f}")

    def pair(self, phase: str, lrs: dict[str, float], seed: int, budget: float, splits: list[str], data: dict,
             first: str) -> list[dict]:
        """Our run and TRL's at (lrs[method], seed): at the same time (jobs 2) or one after the other, `first` first."""
        order = [first] + [m for m in METHODS if m != first]
        jobs = []
        for m in order:
            out = (self.keep or self.work) / f"{phase}-{m}-lr{lrs[m]:g}-s{seed}"
            jobs.append({"kind": "train", "method": m, "lr": lrs[m], "seed": seed, "budget_s": budget,
                         "splits": splits, "data": data, "model_out": str(out), "phase": phase})
        procs = []
        results = []
        for job in jobs:
            procs.append(self._start(job)[0])
            if self.spec["jobs"] < 2:
                results.append(self._finish(procs[-1], f"{job['method']} at lr {job['lr']:g}, seed {seed}"))
        if self.spec["jobs"] >= 2:
            results = [self._finish(p, f"{j['method']} at lr {j['lr']:g}, seed {seed}") for p, j in zip(procs, jobs)]
        rows = []
        for job, res in zip(jobs, results):
            row = {k: job[k] for k in ("phase", "method", "lr", "seed", "budget_s")} | res
            row["model_dir"] = job["model_out"] if self.keep else None
            if not self.keep:
                shutil.rmtree(job["model_out"], ignore_errors=True)
            for s in splits:
                row[f"gain_{s}"] = row["after"][s]["accuracy"] - self.result["before"][s]["accuracy"]
            row["gain_per_cpu_min"] = {s: row[f"gain_{s}"] / (row["train_cpu_s"] / 60) for s in splits}
            rows.append(row)
            self.log(f"[learn] {phase} {job['method']} lr {job['lr']:g} seed {seed}: {row['steps']} steps "
                     f"({row['train_cpu_s']:.0f} CPU s, {row['train_wall_s']:.0f} wall s), "
                     + ", ".join(f"{s} {row['after'][s]['accuracy']:.3f} ({row[f'gain_{s}']:+.3f})" for s in splits))
        return rows

    def run(self) -> dict:
        spec, data = self.spec, write_splits(self.spec, self.work)
        self.before(data)
        for i, lr in enumerate(spec["sweep_lrs"]):
            self.result["sweep"] += self.pair("sweep", {m: lr for m in METHODS}, spec["sweep_seed"],
                                              spec["sweep_budget_s"], ["val"], data, METHODS[i % 2])
            self.save()
        self.result["chosen_lr"] = chosen = choose_lrs(self.result["sweep"])
        self.log(f"[learn] chosen on validation: {chosen}")
        for i, seed in enumerate(spec["seeds"]):
            self.result["runs"] += self.pair("main", chosen, seed, spec["budget_s"], ["val", "test"], data,
                                             METHODS[i % 2])
            self.result["summary"] = summarize(self.result["runs"], spec)
            self.save()
        self.result["complete"] = True
        self.save()
        return self.result


def choose_lrs(sweep: list[dict]) -> dict[str, float]:
    """Per method, the swept rate with the highest validation accuracy after training (a tie: the smaller rate)."""
    return {m: min((r for r in sweep if r["method"] == m),
                   key=lambda r: (-r["after"]["val"]["accuracy"], r["lr"]))["lr"] for m in METHODS}


def mean_std(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def summarize(runs: list[dict], spec: dict) -> dict:
    """Per method over its seeds: mean and std of accuracy after, gain, gain per CPU-minute (test and val),
    steps, completions, CPU and wall seconds."""
    out = {}
    for m in METHODS:
        rs = [r for r in runs if r["method"] == m]
        if not rs:
            continue
        s = {"seeds": [r["seed"] for r in rs], "lr": rs[0]["lr"]}
        for split in ("val", "test"):
            s[f"after_{split}"] = mean_std([r["after"][split]["accuracy"] for r in rs])
            s[f"gain_{split}"] = mean_std([r[f"gain_{split}"] for r in rs])
            s[f"gain_per_cpu_min_{split}"] = mean_std([r["gain_per_cpu_min"][split] for r in rs])
        for k in ("steps", "completions", "train_cpu_s", "train_wall_s"):
            s[k] = mean_std([float(r[k]) for r in rs])
        out[m] = s
    return out


def table(result: dict) -> str:
    b = result["before"]
    lines = [f"before training: val {b['val']['accuracy']:.3f} (n={b['val']['n']}), test {b['test']['accuracy']:.3f} "
             f"(n={b['test']['n']})", "sweep (seed %d, %.0f CPU s each): method lr steps val-after" %
             (result["spec"]["sweep_seed"], result["spec"]["sweep_budget_s"])]
    for r in result["sweep"]:
        lines.append(f"  {r['method']:<4} {r['lr']:<6g} {r['steps']:4d} {r['after']['val']['accuracy']:.3f}")
    lines.append("main (mean ± std over seeds): method lr steps completions CPU-s wall-s test-after test-gain "
                 "gain/CPU-min val-after")
    for m, s in result["summary"].items():
        f = lambda k, fmt=".3f": f"{s[k]['mean']:{fmt}} ± {s[k]['std']:{fmt}}"  # noqa: E731
        lines.append(f"  {m:<4} {s['lr']:<6g} {f('steps', '.1f')} {f('completions', '.0f')} {f('train_cpu_s', '.0f')} "
                     f"{f('train_wall_s', '.0f')} {f('after_test')} {f('gain_test', '+.3f')} "
                     f"{f('gain_per_cpu_min_test', '+.4f')} {f('after_val')}")
    return "\n".join(lines)


def main(args) -> int:
    """`grpo bench --versus-trl --learn` / `python -m grpo.bench.learning_vs_trl`."""
    try:
        import trl  # noqa: F401
    except ImportError:
        print("grpo bench --versus-trl --learn needs TRL: pip install trl", file=sys.stderr)
        return 2
    from grpo.bench.results import results_path, wrote

    spec = default_spec(getattr(args, "model", None), getattr(args, "quick", False))
    for key in ("jobs", "threads"):
        if getattr(args, key, None):
            spec[key] = getattr(args, key)
    out = results_path("learning_vs_trl.json", getattr(args, "output", None))
    keep = getattr(args, "keep_models", None)
    with tempfile.TemporaryDirectory(prefix="grpo-learn-vs-trl-") as d:
        bench = Bench(spec, Path(d), out, Path(keep) if keep else None,
                      log=lambda msg: print(msg, file=sys.stderr, flush=True))
        result = bench.run()
    print(table(result))
    print(wrote(out, COMMITTED, "--model <SmolLM2-135M-Instruct dir>"))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m grpo.bench.learning_vs_trl")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--model")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--output")
    p.add_argument("--keep-models", help="keep every trained model under this directory (default: deleted)")
    p.add_argument("--jobs", type=int, help="1: our run and TRL's one after the other; 2 (default): at once")
    p.add_argument("--threads", type=int, help="torch threads per process (default 1)")
    a = p.parse_args()
    if a.worker:
        w = json.loads(a.worker.read_text())
        print(json.dumps(worker(w["spec"], w["job"])))
        raise SystemExit(0)
    raise SystemExit(main(a))
