"""`grpo warmup`: build the built-in model with the warm-up, measure it, and write its recipe.

    grpo warmup --task arithmetic --output src/grpo/models/weights/arithmetic    # rebuilds the shipped model
    grpo warmup --task code --output src/grpo/models/weights/code
    grpo warmup warmup.steps=200 --output /tmp/warm                             # any other warm-up

The output directory holds the model (safetensors, config), its tokenizer (with the chat template), and
`recipe.json`:
    spec      everything that determines the model (grpo.models.loading.builtin_spec); a packaged directory
              whose spec equals a run's is what that run loads, so the default run never warms up
    sha256    of model.safetensors; the shipped model is checked against it before it is used
    heldout   greedy pass@1 on the task's first eval.n held-out problems, with the settings that measured it
    built_on  the CPU, library versions and seconds of the build (the warm-up is bitwise reproducible on one
              CPU, not across CPUs: float kernels differ, and that is why the result ships)
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from grpo.models.builtin import RECIPE, sha256_file


def cpu_name() -> str:
    """The CPU's model name as lscpu prints it (from /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def heldout_accuracy(cfg, model_dir: Path, console=None) -> dict:
    """Greedy pass@1 of the model in `model_dir` on the first eval.n held-out problems of cfg's built-in task,
    with the settings a `grpo train` run of this config evaluates with."""
    from transformers import AutoModelForCausalLM

    from grpo.data import get_task
    from grpo.models.loading import load_tokenizer
    from grpo.tracking.progress import Phase
    from grpo.train.episodes import env_limits
    from grpo.train.evaluate import evaluate_model

    task = get_task(cfg.data.task, difficulty=cfg.data.difficulty)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    prompts = task.split("test", cfg.eval.n)
    max_new = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    with Phase("evaluating", len(prompts), "problems", console=console) as ph:
        res = evaluate_model(model, tokenizer, task, prompts, batch_size=cfg.eval.batch_size, max_new_tokens=max_new,
                             max_prompt_tokens=cfg.data.max_prompt_tokens, progress=ph.update,
                             **env_limits(cfg))
    out = {"task": cfg.data.task, "difficulty": cfg.data.difficulty, "n": res["n"], "accuracy": res["accuracy"],
           "max_new_tokens": max_new, "batch_size": cfg.eval.batch_size, "metric": "greedy pass@1, float32, CPU"}
    if "tool_use_frac" in res:  # a task with tools: the share of greedy episodes that called one
        out["tool_use_frac"] = res["tool_use_frac"]
    return out


def build_with_recipe(cfg, out_dir: Path, console=None, evaluate: bool = True) -> dict:
    """Warm up the built-in model of `cfg` into `out_dir`, then write and return its recipe."""
    import torch
    import transformers

    from grpo.models.loading import builtin_spec
    from grpo.train.warmup import build_warm_model, warm_task

    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    build_warm_model(cfg, None, out_dir, console=console)
    seconds = time.perf_counter() - t0
    recipe = {"spec": builtin_spec(cfg), "sha256": sha256_file(out_dir / "model.safetensors"),
              "built_on": {"cpu": cpu_name(), "torch": torch.__version__, "transformers": transformers.__version__,
                           "warmup_s": round(seconds, 1)}}
    start = getattr(warm_task(cfg), "warm_start", None)
    if start:  # the warm-up started from another task's shipped model (grpo.train.warmup.shipped_task_model)
        from grpo.models.builtin import SHIPPED_DIR, read_recipe

        recipe["warm_start"] = {"task": start, "sha256": (read_recipe(SHIPPED_DIR / start) or {}).get("sha256")}
    if evaluate:
        with torch.random.fork_rng():
            recipe["heldout"] = heldout_accuracy(cfg, out_dir, console)
    (out_dir / RECIPE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
    return recipe


def main(args) -> int:
    """The `grpo warmup` command."""
    from rich.console import Console

    from grpo.config import load_config
    from grpo.models.builtin import shipped_model_dir

    preset = args.preset or (args.task if args.task in ("code", "tools") else "grpo")
    overrides = list(args.overrides) + ([f"data.task={args.task}"] if args.task else [])
    cfg = load_config(preset, overrides)
    console = Console(highlight=False, markup=False)
    out = Path(args.output or f"warm-{cfg.data.task}")
    recipe = build_with_recipe(cfg, out, console=console, evaluate=not args.no_eval)
    console.print(f"[grpo] wrote {out} (sha256 {recipe['sha256'][:16]}..., warm-up "
                  f"{recipe['built_on']['warmup_s']:.0f} s on {recipe['built_on']['cpu']})", soft_wrap=True)
    if "heldout" in recipe:
        h = recipe["heldout"]
        console.print(f"[grpo] held-out accuracy {h['accuracy']:.3f} on {h['n']} problems ({h['metric']})")
    shipped = shipped_model_dir(recipe["spec"])
    if shipped is not None and shipped.resolve() != out.resolve():
        same = (shipped / "model.safetensors").exists() and sha256_file(shipped / "model.safetensors") == recipe["sha256"]
        console.print(f"[grpo] the shipped model of these settings ({shipped}) is "
                      + ("bitwise the same" if same else "different: the warm-up's float kernels differ across CPUs; "
                         "`grpo train` uses the shipped one"), soft_wrap=True)
    return 0
