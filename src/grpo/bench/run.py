"""`grpo bench`: seconds per GRPO step, split by stage, against two references measured in the same run.

    grpo bench [--json] [--quick] [--output PATH]        (default output: <GRPO_CACHE>/bench-results/latest.json;
                                                          the committed one: --output bench/results/latest.json)

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
synchronize. Ratios are medians of per-repeat ratios. Peak RSS: the process's high-water mark during an untimed
first pass of each method (freed heap returned with malloc_trim, then the mark reset through /proc/self/clear_refs),
which also warms the shape up. See bench/README.md for the figures.

Then the real-vocabulary part (bench_vocab.py): a Qwen2-shaped model with 151,936 tokens, the update's peak memory
and seconds against the naive full-logits floor (entries with "kind": "vocab" in `runs`), and generation there.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import sys
import time
from dataclasses import dataclass

import torch

from grpo.bench.report import HEADER, acceptance, exponents, fit_exponent, row, summary  # noqa: F401 (re-exported)
from grpo.tracking.clock import Clock
from grpo.bench.workload import Workload, long_prompts, measure, timed_forward  # noqa: F401 (re-exported)
from grpo.tracking.memory import peak_rss_mb, reset_peak_rss  # noqa: F401 (re-exported: scripts/vocab_train_memory.py)
from grpo.tokens import prompt_token_ids

COMMITTED = "bench/results/latest.json"  # what the docs quote: written only with --output naming it (results.py)
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
# ---------------------------------------------------------------------------------------------- the work
# ---------------------------------------------------------------------------------------------- running
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
                    log(row(run))
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


# ---------------------------------------------------------------------------------------------- output
def main(args) -> int:
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    if getattr(args, "output", None) is not None:  # before minutes of measuring: a wrong path must not cost them
        from grpo.tracking.rundir import check_output_file

        check_output_file(args.output, "--output")
    if getattr(args, "memory", False):  # peak memory of whole runs against the floor, the plan and TRL (memory.py)
        from grpo.bench import memory

        return memory.main(args)
    if getattr(args, "async_rollouts", False):  # rollout.mode=async against sync, whole runs (async_rollouts.py)
        from grpo.bench import async_rollouts

        return async_rollouts.main(args)
    if getattr(args, "learn", False) and not getattr(args, "versus_trl", False):
        from grpo.errors import ConfigError

        raise ConfigError("--learn measures learning against TRL: give it with --versus-trl")
    if getattr(args, "overrides", None):
        from grpo.errors import ConfigError

        raise ConfigError(f"config overrides {args.overrides} apply to --async-rollouts runs only")
    if getattr(args, "versus_trl", False):  # a part of its own: ours against TRL on one model (versus_trl.py)
        from grpo.bench import learning_vs_trl, versus_trl

        return (learning_vs_trl if getattr(args, "learn", False) else versus_trl).main(args)
    plan = quick_plan() if getattr(args, "quick", False) else full_plan()
    def err(msg):
        print(msg, file=sys.stderr, flush=True)

    err(HEADER)
    result = run_bench(plan, log=err)
    from grpo.bench import vocab as bench_vocab  # the real-vocabulary part: update memory/time vs the floor, generation

    vocab = bench_vocab.run_vocab(bench_vocab.quick_plan() if plan.quick else bench_vocab.full_plan(), log=err)
    bench_vocab.merge_into(result, vocab)
    from grpo.bench import engines as bench_engines  # the engine axis: native, vllm (when installed), hf generate

    result["engines"] = bench_engines.run_engines(bench_engines.cpu_plan(plan.quick), log=err)
    from grpo.bench.results import results_path, wrote
    from grpo.tracking.rundir import write_text_atomic

    out = results_path("latest.json", getattr(args, "output", None))  # a given --output was checked at the start
    write_text_atomic(out, json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(bench_vocab.summary(vocab))
    print(bench_engines.summary(result["engines"]))
    print(wrote(out, COMMITTED))
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
