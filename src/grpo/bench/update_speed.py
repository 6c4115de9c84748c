"""The policy update's seconds on one fixed batch of a real model, by micro-batch size: what the memory plan's
choice buys (train/memory_plan.py MAX_MICRO_BATCH_TOKENS).

    python -m grpo.bench.update_speed --model DIR [--prompts 8 --group 8 --max-new-tokens 48] [--compute auto]
                                      [--threads N] [--repeats 2] [--output PATH]

Results: --output, else <GRPO_CACHE>/bench-results/update_speed.json; the committed bench/results/update_speed.json,
which the docs quote, is rewritten only with --output naming it.

One Trainer (the model's defaults, model.compute_dtype as given: auto is bf16 where the CPU multiplies bf16
natively) samples one batch of P prompts x G completions of at most T tokens; then `policy_update` runs on that same
batch for each arm, `--repeats` times, the arms interleaved, and the best repeat counts: wall seconds on --threads
torch threads (default: torch's, one a core, as a run uses them) and the process's CPU seconds beside them (on one
thread the CPU seconds are robust to other tenants' load; on several, threads waiting on each other count too). The
learning rate is tiny (1e-9), so the batch's log-probs hardly move between arms. Arms: micro-batches of
OLD_PLAN_TOKENS (the plan's choice for SmolLM2 before train.memory_limit), 1,024, 2,048, 4,096 tokens (those below
the whole batch) and the whole batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

COMMITTED = "bench/results/update_speed.json"
OLD_PLAN_TOKENS = 293  # optim.micro_batch_tokens the plan chose for SmolLM2, P=8 G=8 T=48, before issue #49


def arms(whole: int) -> list[tuple[str, int]]:
    """(name, micro-batch tokens): the sizes below the whole batch, then the whole batch."""
    sizes = [OLD_PLAN_TOKENS, 1024, 2048, 4096]
    return [(f"micro_batch_{n}", n) for n in sizes if n < whole] + [("whole_batch", whole)]


def measure(model: str, prompts: int, group: int, max_new_tokens: int, compute: str, repeats: int,
            threads: int, log=print) -> dict:
    import torch

    from grpo.bench.versus_trl import write_problems
    from grpo.config import load_config
    from grpo.train.trainer import Trainer
    from grpo.train.update import policy_update

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="grpo-update-speed-") as d:
        data = write_problems(Path(d) / "train.jsonl", 200, chat=True)
        overrides = [f"model.name={model}", f"data.path={data}", "reward.functions=[exact_answer]",
                     f"rollout.prompts_per_step={prompts}", f"rollout.group_size={group}",
                     f"rollout.max_new_tokens={max_new_tokens}", "optim.lr=1e-9", "train.preflight=off",
                     "log.plots=false", "eval.n=1", "eval.val_n=0", "data.test_fraction=0.05",
                     f"model.compute_dtype={compute}"]
        trainer = Trainer(load_config(None, overrides), run_dir=Path(d) / "run")
        try:
            scored = trainer.rollouts.next(0)
            batch = trainer._policy_batch(scored.rollouts)
            batch.adv, _ = trainer._advantages(batch, scored.scores.total)
            whole = batch.forward_tokens(trainer.train_model)
            out = {"compute": trainer.compute, "forward_tokens": whole, "completion_tokens": int(batch.mask.sum()),
                   "prompt_tokens": int(batch.prompt_ids.shape[1]), "width": int(batch.completion_ids.shape[1]),
                   "arms": {}}
            for _ in range(repeats):
                for name, tokens in arms(whole):
                    trainer.cfg.optim.micro_batch_tokens = tokens
                    c0, w0 = time.process_time(), time.perf_counter()
                    policy_update(trainer.train_model, trainer.optimizer, trainer.scheduler, batch, trainer.cfg,
                                  trainer.dist, compute=trainer.compute)
                    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                    best = out["arms"].setdefault(name, {"tokens": tokens, "cpu_s": cpu, "wall_s": wall})
                    best["cpu_s"], best["wall_s"] = min(best["cpu_s"], cpu), min(best["wall_s"], wall)
                    log(f"[update-speed] {name}: {cpu:.1f} CPU s ({wall:.1f} wall)")
        finally:
            trainer.close()
    base = out["arms"]["whole_batch"]["wall_s"]
    for arm in out["arms"].values():
        arm["over_whole_batch"] = arm["wall_s"] / base
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo.bench.update_speed", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--compute", default="auto", help="model.compute_dtype (default auto)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own, one a core)")
    p.add_argument("--output", default=None, help=f"the results file (committed: {COMMITTED})")
    a = p.parse_args(argv)
    from grpo.bench.results import results_path, wrote
    from grpo.models.precision import cpu_bf16_flags
    from grpo.tracking.rundir import check_output_file, write_text_atomic

    if a.output is not None:
        check_output_file(a.output, "--output")
    out = results_path("update_speed.json", a.output)
    import torch

    load = os.getloadavg()[0]
    threads = a.threads or torch.get_num_threads()
    result = measure(a.model, a.prompts, a.group, a.max_new_tokens, a.compute, a.repeats, threads,
                     log=lambda m: print(m, file=sys.stderr, flush=True))
    result |= {"spec": vars(a) | {"output": None}, "cpu_bf16_flags": cpu_bf16_flags(), "load_avg_before": load,
               "load_avg_after": os.getloadavg()[0], "threads": threads}
    write_text_atomic(out, json.dumps(result, indent=1) + "\n")
    for name, arm in result["arms"].items():
        print(f"{name:<20} {arm['tokens']:>6} tokens  {arm['wall_s']:6.1f} s ({arm['cpu_s']:.1f} CPU s)  "
              f"{arm['over_whole_batch']:.2f}x")
    print(wrote(out, COMMITTED, "--model <SmolLM2-135M-Instruct dir>"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
