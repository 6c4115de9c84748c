"""The recipe of a warm model: build the built-in model with the warm-up, measure it, write `recipe.json` (the
`grpo warmup` command, grpo.cli).

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
from typing import Any, Callable

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


def build_with_recipe(cfg, out_dir: Path, console=None,
                      heldout: Callable[[Any, Path, Any], dict] | None = None) -> dict:
    """Warm up the built-in model of `cfg` into `out_dir`, then write and return its recipe. heldout(cfg, dir,
    console): the held-out measurement stored under "heldout" (grpo.train.evaluate.heldout_accuracy); None: none."""
    import torch
    import transformers

    from grpo.models.loading import builtin_spec
    from grpo.warmup.supervised import build_warm_model, warm_task

    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    build_warm_model(cfg, None, out_dir, console=console)
    seconds = time.perf_counter() - t0
    recipe = {"spec": builtin_spec(cfg), "sha256": sha256_file(out_dir / "model.safetensors"),
              "built_on": {"cpu": cpu_name(), "torch": torch.__version__, "transformers": transformers.__version__,
                           "warmup_s": round(seconds, 1)}}
    start = getattr(warm_task(cfg), "warm_start", None)
    if start:  # the warm-up started from another task's shipped model (grpo.warmup.shipped_task_model)
        from grpo.models.builtin import SHIPPED_DIR, read_recipe

        recipe["warm_start"] = {"task": start, "sha256": (read_recipe(SHIPPED_DIR / start) or {}).get("sha256")}
    if heldout is not None:
        with torch.random.fork_rng():
            recipe["heldout"] = heldout(cfg, out_dir, console)
    (out_dir / RECIPE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
    return recipe
