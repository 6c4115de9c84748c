"""The lean paths against the generic ones on a real model, in one run: generation's tokens per second through
LeanDecoder against the model's own forward, and a training step's seconds with both lean paths (the lean decoder,
log-probs from the hidden states in chunks) against both generic ones (the model's forward every decode step, the full
(N, T, V) logits). The generic arm is what the code did for Gemma 3 before the lean paths were chosen by evidence (the
allowlists refused it both), forced here in the same process (LeanDecoder.for_model and plain_output_head made to
decline), so the two arms share the machine's load; they alternate, and each figure is a median.

    PYTHONPATH=src python scripts/lean_paths.py --model DIR [--output bench/results/lean_paths_gemma3.json]
        [--repeats 3] [--steps 2]

generation: P = 8 problems of the built-in arithmetic task as raw prompts, G = 8, exactly T = 32 new tokens (EOS
masked until then), temperature 1, the compute the trainer picks (model.compute_dtype=auto), wall seconds of
`Sampler.generate`, --repeats times each arm. step: `Trainer.step()` at P = 4, G = 8, T = 32 (the versus-TRL batch,
raw prompts, exact_answer), one untimed step then --steps timed ones by their own perf/* metrics, each arm its own
Trainer in turn. The JSON goes to --output (default $GRPO_CACHE/bench-results/lean_paths.json) and is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = "bench/results/lean_paths_gemma3.json"
P_GEN, P_STEP, G, T = 8, 4, 8, 32


@contextlib.contextmanager
def generic_paths(generic: bool):
    """Within the block, when `generic`: both lean paths decline (the model's forward every decode step, the full
    logits), as before they were chosen by evidence for this model; else nothing changes."""
    from grpo.models import forward
    from grpo.rollout.decode import LeanDecoder

    if not generic:
        yield
        return
    saved = forward.plain_output_head, LeanDecoder.__dict__["for_model"]
    forward.plain_output_head = lambda model: None
    LeanDecoder.for_model = classmethod(lambda cls, model: None)
    try:
        yield
    finally:
        forward.plain_output_head = saved[0]
        LeanDecoder.for_model = saved[1]


def generation(model_dir: str, repeats: int, log=print) -> dict:
    """tokens/s of Sampler.generate, lean and generic arms alternating; their medians and ratio."""
    import torch

    from grpo.config import load_config
    from grpo.data import get_task
    from grpo.models.compute import resolve_compute
    from grpo.models.loading import load_policy
    from grpo.rollout import Sampler
    from grpo.rollout.decode import check_lean_paths

    cfg = load_config(None, [f"model.name={model_dir}"])
    model, tok = load_policy(cfg, Path(model_dir))
    compute = resolve_compute(cfg, torch.device("cpu"), next(model.parameters()).dtype)
    notes = check_lean_paths(model)
    prompts = get_task("arithmetic").split("train", P_GEN)
    sampler = Sampler(model, tok, max_new_tokens=T, min_new_tokens=T, compute=compute)
    times: dict[str, list[float]] = {"lean": [], "generic": []}
    for r in range(repeats + 1):  # the first round warms both up, untimed
        for arm in ("lean", "generic"):
            with generic_paths(arm == "generic"):
                t0 = time.perf_counter()
                sampler.generate(prompts, G, generator=torch.Generator().manual_seed(r))
                seconds = time.perf_counter() - t0
            if r:
                times[arm].append(seconds)
                log(f"[lean_paths] generation {arm}: {P_GEN * G * T / seconds:.1f} tokens/s ({seconds:.1f} s)")
    tokens = P_GEN * G * T
    med = {arm: statistics.median(v) for arm, v in times.items()}
    return {"prompts": P_GEN, "group": G, "max_new_tokens": T, "tokens": tokens, "compute": compute,
            "lean_notes": notes, "seconds": times, "median_s": med,
            "tokens_per_s": {arm: round(tokens / s, 1) for arm, s in med.items()},
            "lean_speedup": round(med["generic"] / med["lean"], 2)}


def training_steps(model_dir: str, steps: int, work: Path, log=print) -> dict:
    """perf/* of `steps` timed Trainer.step()s per arm (after one untimed), the arms one after the other."""
    from grpo.bench.versus_trl import write_problems
    from grpo.config import load_config
    from grpo.train.trainer import Trainer

    data = write_problems(work / "problems.jsonl", 200, chat=False)
    overrides = [f"model.name={model_dir}", f"data.path={data}", "reward.functions=[exact_answer]",
                 f"rollout.prompts_per_step={P_STEP}", f"rollout.group_size={G}", f"rollout.max_new_tokens={T}",
                 "optim.lr=1e-6", f"train.steps={steps + 1}", "train.preflight=off", "log.plots=false", "eval.n=1",
                 "eval.val_n=0", "data.test_fraction=0.05", "train.seed=0"]
    out = {}
    for arm in ("generic", "lean"):
        with generic_paths(arm == "generic"):
            trainer = Trainer(load_config(None, overrides), run_dir=work / arm)
            try:
                trainer.step()  # untimed: allocations, kernel choices
                metrics = [trainer.step().metrics for _ in range(steps)]
            finally:
                trainer.close()
        keys = ("perf/step_s", "perf/generate_s", "perf/update_s", "perf/reward_s", "perf/peak_rss_mb")
        out[arm] = {k: [round(m[k], 2) for m in metrics] for k in keys if k in metrics[0]}
        out[arm]["median_step_s"] = statistics.median(out[arm]["perf/step_s"])
        log(f"[lean_paths] step {arm}: {out[arm]['perf/step_s']} s (generate {out[arm]['perf/generate_s']}, "
            f"update {out[arm]['perf/update_s']})")
    out["lean_speedup"] = round(out["generic"]["median_step_s"] / out["lean"]["median_step_s"], 2)
    return {"prompts": P_STEP, "group": G, "max_new_tokens": T, "steps": steps, **out}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/lean_paths.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model directory (the docs quote Gemma 3 270M's)")
    p.add_argument("--output", default=None, help="the results file (default <GRPO_CACHE>/bench-results/"
                   f"lean_paths.json; the committed one: {COMMITTED})")
    p.add_argument("--repeats", type=int, default=3, help="timed generate calls per arm (default 3)")
    p.add_argument("--steps", type=int, default=2, help="timed training steps per arm (default 2)")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    from grpo.bench.results import results_path, wrote
    from grpo.tracking.rundir import check_output_file, write_text_atomic

    if a.output is not None:  # before measuring: a wrong path must not cost the run
        check_output_file(a.output, "--output")
    out = results_path("lean_paths.json", a.output)
    load = os.getloadavg()[0]
    result = {"model": a.model, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
              "torch": torch.__version__, "load_before": load}
    result["generation"] = generation(a.model, a.repeats)
    with tempfile.TemporaryDirectory(prefix="grpo-lean-paths-") as tmp:
        result["step"] = training_steps(a.model, a.steps, Path(tmp))
    result["load_after"] = os.getloadavg()[0]
    write_text_atomic(out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    print(wrote(out, COMMITTED, f"--model {a.model}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
