"""`grpo bench`: seconds per GRPO step, split by stage, against two references measured in the same run.

    grpo bench [--json] [--quick] [--output PATH]        (default output: bench/results/latest.json)

For each model (the built-in architecture, then one about 4x larger), shape (the default task's, then a long
prompt) and group size G, on the same prompts and the same token counts, interleaved, medians over repeats:

  step   our code path: Sampler.generate -> RewardRunner + group advantages -> policy_update (the forward that
         computes the log-probs, the backward, the optimizer step) with the default config (mu = 1, beta = 0:
         no old-logprob or reference pass). Stages: generate / reward / logprob / backward+optimizer.
  floor  the same work done the usual way in plain torch/transformers: one KV-cached sampling loop over the N
         prompt copies (multinomial sampling, DynamicCache), one forward and backward over the N full
         sequences, one AdamW step (with gradient clipping).
  hf     `model.generate(num_return_sequences=G)`, same sampling settings (temperature, top_p, no top_k).

Token counts are equal by construction: the models have random weights and every method is held to exactly
T new tokens (EOS cannot be sampled before T: `min_new_tokens`), so every completion is T tokens long.
Clock: on CPU, torch runs one intra-op thread (GRPO_BENCH_THREADS) and seconds are the process's CPU time
(GRPO_BENCH_CLOCK=wall for wall-clock): on a shared machine other tenants' load stretches the wall clock (and
OpenMP threads waiting on each other inflate it tenfold) but not the work done. On CUDA: wall-clock after a
synchronize. Ratios are medians of per-repeat ratios. Peak RSS: the process's high-water mark during an untimed first pass of
each method (freed heap returned with malloc_trim, then the mark reset through /proc/self/clear_refs), which also
warms the shape up. See bench/README.md for the figures.

Then the real-vocabulary part (bench_vocab.py): a Qwen2-shaped model with 151,936 tokens, the update's peak memory
and seconds against the naive full-logits floor (entries with "kind": "vocab" in `runs`), and generation there.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.tracking.clock import Clock
from grpo.tracking.memory import peak_rss_mb, reset_peak_rss  # noqa: F401 (bench's figures use them)
from grpo.tokens import prompt_token_ids

DEFAULT_OUTPUT = Path("bench/results/latest.json")
MAX_POSITIONS = 512  # positions the bench models support (the long shape needs 320); no parameter depends on it


@dataclass(frozen=True)
class ModelSpec:
    name: str
    size: dict
    prompt_scale: float = 1.0  # fraction of each shape's prompts (keeps the larger model's runs short)


@dataclass(frozen=True)
class Shape:
    name: str
    prompts: int  # P
    completion_tokens: int  # T
    prompt_tokens: int | None = None  # L; None: the arithmetic task's own prompts (left-padded)


@dataclass(frozen=True)
class Plan:
    models: tuple[ModelSpec, ...]
    shapes: tuple[Shape, ...]
    group_sizes: tuple[int, ...]
    repeats: int
    length_sweep: tuple[int, ...]  # completion lengths for the length exponent (first model, first shape)
    length_sweep_group: int
    quick: bool = False


def full_plan() -> Plan:
    from grpo.models.builtin import TINY

    tiny = dict(TINY, max_position_embeddings=MAX_POSITIONS)
    big = dict(tiny, hidden_size=256, intermediate_size=768)  # 4 layers of width 256: ~3.9x the parameters
    return Plan(
        models=(ModelSpec("builtin", tiny), ModelSpec("builtin-4x", big, prompt_scale=0.25)),
        shapes=(Shape("default", prompts=16, completion_tokens=32),
                Shape("long_prompt", prompts=2, completion_tokens=64, prompt_tokens=256)),
        group_sizes=(4, 8, 16, 32), repeats=3, length_sweep=(16, 32, 64), length_sweep_group=8)


def quick_plan() -> Plan:
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS)
    return Plan(
        models=(ModelSpec("builtin", small), ModelSpec("builtin-4x", dict(small, hidden_size=64,
                                                                          intermediate_size=128))),
        shapes=(Shape("default", prompts=2, completion_tokens=8),
                Shape("long_prompt", prompts=1, completion_tokens=8, prompt_tokens=48)),
        group_sizes=(2, 4), repeats=1, length_sweep=(4, 8), length_sweep_group=2, quick=True)


# ---------------------------------------------------------------------------------------------- measuring
@contextmanager
def timed_forward(clock: Clock, acc: list):
    """Accumulate the seconds spent in `completion_logits` inside policy_update (the log-prob forward)."""
    from grpo.train import update

    inner = update.completion_logits

    def wrapper(*args, **kwargs):
        t = clock()
        out = inner(*args, **kwargs)
        acc.append(clock() - t)
        return out

    update.completion_logits = wrapper
    try:
        yield
    finally:
        update.completion_logits = inner


# ---------------------------------------------------------------------------------------------- the work
def long_prompts(task_prompts, length: int):
    """Arithmetic prompts lengthened to exactly `length` characters (= tokens) by a preamble of worked sums."""
    from grpo.types import Prompt

    examples = " ".join(f"{a} + {b} = {a + b}." for a, b in zip(range(11, 99, 7), range(3, 90, 5)))
    out = []
    for p in task_prompts:
        room = length - len(p.text)
        preamble = ("Worked examples: " + examples * (1 + length // len(examples)))[:room - 1] + "\n"
        out.append(Prompt(uid=p.uid, text=preamble + p.text, answer=p.answer, meta=p.meta, templated=p.templated))
    return out


class Workload:
    """Everything one (model, shape, G) measurement needs; the three methods run on the same prompts."""

    def __init__(self, models: dict, tokenizer, prompts, G: int, T: int, device, cfg, clock: Clock, runner):
        self.m, self.tok, self.prompts, self.G, self.T = models, tokenizer, prompts, G, T
        self.device, self.cfg, self.clock, self.runner = device, cfg, clock, runner

    # ------------------------------------------------------------------ ours
    def step(self) -> dict:
        from grpo.algo import group_advantages
        from grpo.rollout import Sampler
        from grpo.train.update import PolicyBatch, policy_update

        cfg, G, clock = self.cfg, self.G, self.clock
        policy, opt, sched = self.m["ours"], self.m["ours_opt"], self.m["ours_sched"]
        sampler = Sampler(policy, self.tok, max_new_tokens=self.T, temperature=cfg.rollout.temperature,
                          top_p=cfg.rollout.top_p, min_new_tokens=self.T)
        t0 = clock()
        rollouts = sampler.generate(self.prompts, G)
        t1 = clock()
        columns = {"answer": [p.answer for p in self.prompts for _ in range(G)]}
        scores = self.runner([p.text for p in self.prompts for _ in range(G)], rollouts.texts, columns)
        adv = group_advantages(scores.total.to(self.device), G, std=cfg.algo.std, scale=cfg.algo.scale,
                               eps=cfg.algo.eps)
        t2 = clock()
        batch = PolicyBatch(prompt_ids=rollouts.prompt_ids, prompt_mask=rollouts.prompt_mask,
                            completion_ids=rollouts.completion_ids, mask=rollouts.completion_mask.float(), adv=adv,
                            group_size=G)
        t3 = clock()  # the default config (mu = 1, beta = 0): no old-logprob and no reference pass, as the trainer
        forward: list[float] = []
        with timed_forward(clock, forward):
            policy_update(policy, opt, sched, batch, cfg)
        t4 = clock()
        tokens = int(rollouts.completion_mask.sum())
        assert tokens == len(self.prompts) * G * self.T, "the bench needs fixed-length completions"
        return {"generate_s": t1 - t0, "reward_s": t2 - t1, "logprob_s": (t3 - t2) + sum(forward),
                "backward_optimizer_s": (t4 - t3) - sum(forward), "step_s": t4 - t0, "gen_tokens": tokens}

    # ------------------------------------------------------------------ the naive floor
    @torch.no_grad()
    def floor_generate(self):
        """The usual KV-cached sampling loop over the N prompt copies (plain transformers + torch)."""
        from transformers import DynamicCache

        model, tok, G, T = self.m["floor"], self.tok, self.G, self.T
        enc = tok.pad({"input_ids": prompt_token_ids(tok, self.prompts)}, return_tensors="pt")  # grpo.tokens
        ids = enc["input_ids"].to(self.device).repeat_interleave(G, 0)
        mask = enc["attention_mask"].to(self.device).repeat_interleave(G, 0)
        model.eval()
        cache = DynamicCache(config=model.config)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        logits, pos = out.logits[:, -1], pos[:, -1:]
        new, logps = [], []
        for t in range(T):
            logits[:, tok.eos_token_id] = float("-inf")  # fixed length: no EOS before T tokens
            logp = torch.log_softmax(logits.float() / self.cfg.rollout.temperature, -1)
            nxt = torch.multinomial(logp.exp(), 1)
            new.append(nxt)
            logps.append(logp.gather(-1, nxt))
            if t == T - 1:
                break
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], 1)
            pos = pos + 1
            logits = model(input_ids=nxt, attention_mask=mask, position_ids=pos, cache=cache,
                           use_cache=True).logits[:, -1]
        completions = torch.cat(new, 1)
        texts = tok.batch_decode(completions.cpu(), skip_special_tokens=True)
        model.train()
        return ids, enc["attention_mask"].to(self.device).repeat_interleave(G, 0), completions, texts

    def floor(self) -> dict:
        clock, model, opt = self.clock, self.m["floor"], self.m["floor_opt"]
        t0 = clock()
        ids, mask, completions, _ = self.floor_generate()
        t1 = clock()
        full = torch.cat([ids, completions], 1)
        full_mask = torch.cat([mask, torch.ones_like(completions)], 1)
        pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
        adv = torch.randn(full.shape[0], device=self.device)
        L = ids.shape[1]
        logits = model(input_ids=full, attention_mask=full_mask, position_ids=pos).logits[:, L - 1:-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, completions[..., None])[..., 0]
        loss = -(adv[:, None] * logp).mean()
        loss.backward()
        t2 = clock()
        torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.optim.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = clock()
        return {"generate_s": t1 - t0, "forward_backward_s": t2 - t1, "optimizer_s": t3 - t2, "step_s": t3 - t0}

    # ------------------------------------------------------------------ transformers' generate
    @torch.no_grad()
    def hf_generate(self) -> dict:
        model, tok, clock, cfg = self.m["floor"], self.tok, self.clock, self.cfg
        model.eval()
        t0 = clock()
        enc = tok.pad({"input_ids": prompt_token_ids(tok, self.prompts)}, return_tensors="pt")  # grpo.tokens
        out = model.generate(input_ids=enc["input_ids"].to(self.device),
                             attention_mask=enc["attention_mask"].to(self.device), do_sample=True,
                             temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=0,
                             num_return_sequences=self.G, max_new_tokens=self.T, min_new_tokens=self.T,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        new = out[:, enc["input_ids"].shape[1]:]
        tok.batch_decode(new.cpu(), skip_special_tokens=True)
        t1 = clock()
        model.train()
        assert new.shape == (len(self.prompts) * self.G, self.T)
        return {"generate_s": t1 - t0}


def _median_dict(samples: list[dict]) -> dict:
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def measure(work: Workload, repeats: int, methods=("step", "floor", "hf")) -> dict:
    """One untimed pass per method (warms this shape up; measures its peak RSS), then `repeats` timed passes,
    interleaved (the starting method rotates per repeat); medians per figure, and the ratios as medians of the
    per-repeat ratios (the methods of one repeat run back to back, so a change in the load of a shared machine
    between repeats cancels out)."""
    raw: dict[str, list[dict]] = {m: [] for m in methods}
    calls = {"step": work.step, "floor": work.floor, "hf": work.hf_generate}
    peaks = {}
    for m in methods:
        reset_peak_rss()
        calls[m]()
        peaks[m] = peak_rss_mb()
    for r in range(repeats):
        for i in range(len(methods)):
            m = methods[(r + i) % len(methods)]
            raw[m].append(calls[m]())
    out = {m: _median_dict(v) | {"peak_rss_mb": peaks[m]} for m, v in raw.items()} | {"samples": raw}
    if "floor" in raw:
        out["step_over_floor"] = statistics.median(a["step_s"] / b["step_s"] for a, b in zip(raw["step"], raw["floor"]))
    if "hf" in raw:
        out["speedup_vs_hf_generate"] = statistics.median(
            b["generate_s"] / a["generate_s"] for a, b in zip(raw["step"], raw["hf"]))
    return out


# ---------------------------------------------------------------------------------------------- running
def fit_exponent(xs, ys) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den if den else float("nan")


def _setup(spec: ModelSpec, device, dtype, cfg):
    from grpo.models.builtin import build_model, build_tokenizer
    from grpo.train.optim import build_optimizer

    tok = build_tokenizer()
    tok.model_max_length = MAX_POSITIONS
    base = build_model(tok, seed=0, size=spec.size).to(device=device, dtype=dtype)
    base.config.use_cache = True
    ours, floor = base, copy.deepcopy(base)
    ours_opt, ours_sched = build_optimizer(ours.parameters(), cfg.optim, total_steps=10_000)
    floor_opt = torch.optim.AdamW(floor.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                  weight_decay=cfg.optim.weight_decay)
    params = sum(p.numel() for p in base.parameters())
    return tok, {"ours": ours, "ours_opt": ours_opt, "ours_sched": ours_sched, "floor": floor,
                 "floor_opt": floor_opt}, params


def _prompts(shape: Shape, task, n: int):
    prompts = task.split("train", n)
    return long_prompts(prompts, shape.prompt_tokens) if shape.prompt_tokens else prompts


def run_bench(plan: Plan, log=print) -> dict:
    from grpo.config import Config
    from grpo.data.arithmetic import ArithmeticTask
    from grpo.models.loading import resolve_dtype
    from grpo.rewards import RewardRunner

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = resolve_dtype("auto", device)
    if device.type == "cpu":
        torch.set_num_threads(int(os.environ.get("GRPO_BENCH_THREADS", "1")))
    clock = Clock(device)
    cfg = Config()
    task = ArithmeticTask()
    runner = RewardRunner(functions=list(task.reward_functions()))
    t_start = time.time()
    runs, models, length_sweep = [], {}, []
    try:
        for spec in plan.models:
            tok, m, params = _setup(spec, device, dtype, cfg)
            models[spec.name] = {"params": params, "size": spec.size, "prompt_scale": spec.prompt_scale,
                                 "vocab_size": len(tok)}
            for shape in plan.shapes:
                P = max(1, round(shape.prompts * spec.prompt_scale))
                prompts = _prompts(shape, task, P)
                for G in plan.group_sizes:
                    cfg.rollout.max_new_tokens = shape.completion_tokens
                    work = Workload(m, tok, prompts, G, shape.completion_tokens, device, cfg, clock, runner)
                    res = measure(work, plan.repeats)
                    run = _run_entry(spec, shape, G, prompts, tok, res)
                    runs.append(run)
                    log(_row(run))
            if spec is plan.models[0]:
                shape = plan.shapes[0]
                prompts = _prompts(shape, task, max(1, round(shape.prompts * spec.prompt_scale)))
                for T in plan.length_sweep:
                    cfg.rollout.max_new_tokens = T
                    work = Workload(m, tok, prompts, plan.length_sweep_group, T, device, cfg, clock, runner)
                    res = measure(work, plan.repeats, methods=("step",))
                    length_sweep.append({"completion_tokens": T, "step_s": res["step"]["step_s"],
                                         "group_size": plan.length_sweep_group, "model": spec.name,
                                         "shape": shape.name})
                    log(f"  length sweep  T={T:<4d} step {res['step']['step_s']:.3f}s")
            del m
    finally:
        runner.close()
    result = {
        "device": str(device), "dtype": str(dtype).replace("torch.", ""), "clock": clock.kind,
        "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "transformers": _version("transformers"), "python": platform.python_version(),
        "repeats": plan.repeats, "quick": plan.quick,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)),
        "wall_s": time.time() - t_start,
        "config": {"temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p, "mu": cfg.algo.epochs,
                   "beta": cfg.kl.coef, "micro_batch_tokens": cfg.optim.micro_batch_tokens},
        "models": models,
        "shapes": {s.name: {"prompts": s.prompts, "completion_tokens": s.completion_tokens,
                            "prompt_tokens": s.prompt_tokens or "arithmetic task"} for s in plan.shapes},
        "runs": runs,
    }
    result["exponents"] = exponents(runs, length_sweep)
    result["length_sweep"] = length_sweep
    result["acceptance"] = acceptance(result, plan)
    return result


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def _run_entry(spec, shape, G, prompts, tok, res) -> dict:
    step, floor, hf = res["step"], res["floor"], res["hf"]
    P = len(prompts)
    L = max(len(ids) for ids in prompt_token_ids(tok, prompts))
    gen_tokens = P * G * shape.completion_tokens
    return {
        "model": spec.name, "shape": shape.name, "group_size": G, "prompts": P, "prompt_tokens": L,
        "completion_tokens": shape.completion_tokens, "gen_tokens": gen_tokens,
        "step_s": step["step_s"], "floor_s": floor["step_s"], "step_over_floor": res["step_over_floor"],
        "gen_tokens_per_s": gen_tokens / step["generate_s"],
        "floor_gen_tokens_per_s": gen_tokens / floor["generate_s"],
        "hf_generate_tokens_per_s": gen_tokens / hf["generate_s"],
        "speedup_vs_hf_generate": res["speedup_vs_hf_generate"],
        "peak_rss_mb": step["peak_rss_mb"], "floor_peak_rss_mb": floor["peak_rss_mb"],
        "hf_peak_rss_mb": hf["peak_rss_mb"],
        "stages": {k: step[k] for k in ("generate_s", "reward_s", "logprob_s", "backward_optimizer_s")},
        "floor_stages": {k: floor[k] for k in ("generate_s", "forward_backward_s", "optimizer_s")},
        "hf_generate_s": hf["generate_s"],
        "samples": {k: [round(s["step_s" if "step_s" in s else "generate_s"], 4) for s in v]
                    for k, v in res["samples"].items()},
    }


def exponents(runs: list[dict], length_sweep: list[dict]) -> dict:
    out = {"group_size": [], "completion_length": None}
    for model, shape in dict.fromkeys((r["model"], r["shape"]) for r in runs):
        rs = [r for r in runs if r["model"] == model and r["shape"] == shape]
        if len(rs) >= 2:
            Gs = [r["group_size"] for r in rs]
            out["group_size"].append({"model": model, "shape": shape, "group_sizes": Gs,
                                      "step": fit_exponent(Gs, [r["step_s"] for r in rs]),
                                      "floor": fit_exponent(Gs, [r["floor_s"] for r in rs])})
    if len(length_sweep) >= 2:
        Ts = [x["completion_tokens"] for x in length_sweep]
        out["completion_length"] = {"model": length_sweep[0]["model"], "shape": length_sweep[0]["shape"],
                                    "group_size": length_sweep[0]["group_size"], "completion_tokens": Ts,
                                    "step": fit_exponent(Ts, [x["step_s"] for x in length_sweep])}
    return out


def acceptance(result: dict, plan: Plan) -> list[dict]:
    """The issue's thresholds, on the first model (the built-in one)."""
    runs = result["runs"]
    model = plan.models[0].name
    default, long_ = plan.shapes[0].name, plan.shapes[1].name if len(plan.shapes) > 1 else None

    def get(shape, G, key):
        for r in runs:
            if r["model"] == model and r["shape"] == shape and r["group_size"] == G:
                return r[key]
        return None

    checks = [("step/floor, default shapes, G=16", get(default, 16, "step_over_floor"), "<=", 0.75),
              ("step/floor, default shapes, G=8", get(default, 8, "step_over_floor"), "<=", 0.9),
              ("step/floor, long prompt, G=16", get(long_, 16, "step_over_floor"), "<=", 0.4),
              ("rollout tokens/s vs transformers generate, default shapes, G=16",
               get(default, 16, "speedup_vs_hf_generate"), ">=", 2.0)]
    ex = result["exponents"]
    g = next((e for e in ex["group_size"] if e["model"] == model and e["shape"] == default), None)
    checks.append(("exponent of step time in G (default shapes)", g["step"] if g else None, "<=", 1.1))
    ln = ex["completion_length"]
    checks.append(("exponent of step time in completion length", ln["step"] if ln else None, "<=", 1.1))
    out = []
    for name, value, op, thr in checks:
        met = None if value is None else (value <= thr if op == "<=" else value >= thr)
        out.append({"check": name, "value": value, "threshold": f"{op} {thr}", "met": met})
    return out


# ---------------------------------------------------------------------------------------------- output
HEADER = (f"{'model':<11} {'shape':<12} {'G':>3} {'step s':>8} {'floor s':>8} {'step/floor':>10} {'gen tok/s':>10} "
          f"{'hf tok/s':>9} {'vs hf':>6} {'peak MB':>8}   generate/reward/logprob/backward+opt s")


def _row(r: dict) -> str:
    s = r["stages"]
    return (f"{r['model']:<11} {r['shape']:<12} {r['group_size']:>3} {r['step_s']:>8.3f} {r['floor_s']:>8.3f} "
            f"{r['step_over_floor']:>10.3f} {r['gen_tokens_per_s']:>10.0f} {r['hf_generate_tokens_per_s']:>9.0f} "
            f"{r['speedup_vs_hf_generate']:>6.2f} {r['peak_rss_mb']:>8.0f}   {s['generate_s']:.3f}/{s['reward_s']:.3f}/"
            f"{s['logprob_s']:.3f}/{s['backward_optimizer_s']:.3f}")


def summary(result: dict) -> str:
    title = (f"grpo bench  {result['device']} {result['dtype']}, {result['threads']} thread(s), {result['clock']} "
             f"seconds, medians of {result['repeats']}, run took {result['wall_s']:.0f} s")
    lines = [title, HEADER]
    lines += [_row(r) for r in result["runs"] if r.get("kind") != "vocab"]
    lines.append("fitted exponents (slope of log step_s):")
    for e in result["exponents"]["group_size"]:
        lines.append(f"  vs G {e['group_sizes']}  {e['model']}/{e['shape']}: step {e['step']:.2f}   "
                     f"floor {e['floor']:.2f}")
    ln = result["exponents"]["completion_length"]
    if ln:
        lines.append(f"  vs completion length {ln['completion_tokens']}  {ln['model']}/{ln['shape']} "
                     f"G={ln['group_size']}: step {ln['step']:.2f}")
    lines.append("acceptance (built-in model):")
    for a in result["acceptance"]:
        v = "n/a" if a["value"] is None else f"{a['value']:.3f}"
        mark = {True: "met", False: "NOT met", None: "not measured"}[a["met"]]
        lines.append(f"  {a['check']}: {v} (want {a['threshold']}) {mark}")
    return "\n".join(lines)


def main(args) -> int:
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    plan = quick_plan() if getattr(args, "quick", False) else full_plan()
    err = (lambda msg: print(msg, file=sys.stderr, flush=True))
    err(HEADER)
    result = run_bench(plan, log=err)
    from grpo import bench_vocab  # the real-vocabulary part: update memory/time vs the floor, generation

    vocab = bench_vocab.run_vocab(bench_vocab.quick_plan() if plan.quick else bench_vocab.full_plan(), log=err)
    bench_vocab.merge_into(result, vocab)
    from grpo import bench_engines  # the engine axis: native, vllm (when installed), transformers generate

    result["engines"] = bench_engines.run_engines(bench_engines.cpu_plan(plan.quick), log=err)
    out = Path(getattr(args, "output", None) or DEFAULT_OUTPUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(bench_vocab.summary(vocab))
    print(bench_engines.summary(result["engines"]))
    print(f"wrote {out}")
    if getattr(args, "json", False):
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="grpo bench")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--output", default=None)
    raise SystemExit(main(p.parse_args()))
