"""Where the time of one GRPO step goes: torch's profiler around one `Trainer.step()` on a model directory.

    python -m grpo.bench.profile_step --model DIR [--output PATH]

Results: --output, else <GRPO_CACHE>/bench-results/profile_step.json; the committed file the docs quote is rewritten
only with `--model <SmolLM2-135M-Instruct dir> --output bench/results/profile_step_smollm2.json`.

The batch is versus_trl's (P prompts of the arithmetic task as chat user messages, G completions, T new tokens,
temperature 1, the exact_answer reward, one optimizer step). One untimed step first (allocations, kernel choice),
then one step timed by its own perf/* metrics (the stages), then one step under `torch.profiler.profile` (CPU
activities): the operators by self CPU time (the top 25, with their share) and that step's stages. The profiler's
per-operator cost falls mostly on the decode loop's many small operators, so the profiled step's generation is
slower than the unprofiled one's (both are written): read the shares as where the arithmetic is, and the stages of
the unprofiled step as where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from grpo.bench.versus_trl import default_spec, write_problems


def profile(spec: dict, work: Path, top: int = 25) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from grpo.config import load_config
    from grpo.train.trainer import Trainer

    data = write_problems(work / "problems.jsonl", 200, chat=bool(spec["model"]))
    overrides = [f"data.path={data}", "reward.functions=[exact_answer]", f"rollout.prompts_per_step={spec['prompts']}",
                 f"rollout.group_size={spec['group']}", f"rollout.max_new_tokens={spec['max_new_tokens']}",
                 f"optim.lr={spec['lr']}", "train.steps=3", "train.preflight=off", "eval.n=1", "eval.val_n=0",
                 "data.test_fraction=0.05", f"train.seed={spec['seed']}"]
    if spec["model"]:
        overrides.append(f"model.name={spec['model']}")
    trainer = Trainer(load_config(None, overrides), run_dir=work / "run")
    load_before = os.getloadavg()[0]
    try:
        trainer.step()  # warm-up
        metrics = trainer.step().metrics  # the stages, timed without the profiler
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            profiled = trainer.step().metrics
    finally:
        trainer.close()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_us = sum(e.self_cpu_time_total for e in events)
    ops = [{"op": e.key, "self_cpu_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total_us,
            "calls": e.count} for e in events[:top]]
    stages = {k: metrics[k] for k in ("perf/step_s", "perf/generate_s", "perf/reward_s", "perf/update_s",
                                      "perf/gen_tokens_per_s", "perf/peak_rss_mb") if k in metrics}
    params = sum(p.numel() for p in trainer.policy.parameters())
    profiled_stages = {k: profiled[k] for k in stages}
    return {"spec": spec, "stages": stages, "profiled_stages": profiled_stages, "ops": ops,
            "profiled_self_cpu_s": total_us / 1e6,
            "params": params,
            "vocab": trainer.tokenizer.vocab_size if hasattr(trainer.tokenizer, "vocab_size") else None,
            "gen_tokens": metrics["perf/gen_tokens_per_s"] * metrics["perf/generate_s"],
            "threads": torch.get_num_threads(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "load_before": load_before, "load_after": os.getloadavg()[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo.bench.profile_step")
    p.add_argument("--model", default=None, help="a model directory (default: the built-in model)")
    p.add_argument("--output", default=None, help="the results file (default <GRPO_CACHE>/bench-results/"
                   "profile_step.json; the committed one: bench/results/profile_step_smollm2.json)")
    a = p.parse_args(argv)
    from grpo.bench.results import results_path, wrote
    from grpo.tracking.rundir import check_output_file, write_text_atomic

    if a.output is not None:  # before the profiling: a wrong path must not cost it
        check_output_file(a.output, "--output")
    out = results_path("profile_step.json", a.output)
    spec = default_spec(a.model, quick=False)
    with tempfile.TemporaryDirectory(prefix="grpo-profile-") as tmp:
        result = profile(spec, Path(tmp))
    write_text_atomic(out, json.dumps(result, indent=1) + "\n")
    s = result["stages"]
    print(f"step (unprofiled) {s['perf/step_s']:.2f} s: generate {s['perf/generate_s']:.2f}, "
          f"reward {s['perf/reward_s']:.2f}, log-probs + update {s['perf/update_s']:.2f}")
    for op in result["ops"][:15]:
        print(f"{op['share']:6.1%}  {op['self_cpu_s']:7.2f} s  {op['calls']:6d}  {op['op']}")
    print(wrote(out, "bench/results/profile_step_smollm2.json", "--model <SmolLM2-135M-Instruct dir>"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
