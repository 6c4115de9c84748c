"""The worker side of `grpo compare` (grpo/compare/run.py): one run in its own process (`python -m grpo.compare.worker
SPEC`), so its peak RSS and timings are its own; it trains, then measures the networks it holds, their bytes, peak
RSS, seconds per step and the accuracy curve, and writes the result JSON the parent reads."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

__all__ = ["accuracy_curve", "resident_models", "run_worker", "state_bytes"]


def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size()


def state_bytes(model, optimizer=None) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes of one network (gradients: one per trainable parameter)."""
    params = list({id(p): p for p in model.parameters()}.values())  # tied weights once
    out = {"params": sum(_tensor_bytes(p) for p in params),
           "grads": sum(_tensor_bytes(p) for p in params if p.requires_grad) if optimizer is not None else 0,
           "optimizer": 0}
    if optimizer is not None:
        import torch

        out["optimizer"] = sum(_tensor_bytes(v) for s in optimizer.state.values() for v in s.values()
                               if isinstance(v, torch.Tensor))
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def resident_models(trainer) -> dict[str, dict[str, int]]:
    """The networks a run holds, with their bytes: policy, reference (kl.coef > 0), value (PPO), reward models."""
    import torch

    nets = {"policy": state_bytes(trainer.policy, trainer.optimizer)}
    if trainer.ref is not None:
        nets["reference"] = state_bytes(trainer.ref)
    if trainer.critic is not None:
        nets["value"] = state_bytes(trainer.critic.model, trainer.critic.optimizer)
    for spec in trainer.rewards.specs:  # a learned reward model is a network; a reward function is not
        model = getattr(spec.fn, "model", None)
        if isinstance(model, torch.nn.Module):
            nets[f"reward:{spec.name}"] = state_bytes(model)
    return nets


def accuracy_curve(rows: list[dict], completions_per_step: int) -> list[dict]:
    """[{step, completions, train_s, accuracy}] from metrics.jsonl rows: the validation accuracy at every evaluation
    (step 0, before training, first). The reported before/final figures are the test accuracy (summary.json)."""
    curve, train_s = [], 0.0
    for r in rows:
        train_s += r.get("perf/step_s", 0.0)
        if r.get("eval/val_accuracy") is not None:
            curve.append({"step": r["step"], "completions": r["step"] * completions_per_step,
                          "train_s": round(train_s, 4), "accuracy": r["eval/val_accuracy"]})
    return curve


def run_worker(spec: dict) -> dict:
    """One run in this process: train, then measure. Writes spec['result'] and returns it."""
    from grpo.config import load_config
    from grpo.tracking.metrics import read_jsonl, write_json_atomic
    from grpo.tracking.memory import peak_rss_mb
    from grpo.train.trainer import Trainer

    rss_imports = peak_rss_mb()
    cfg = load_config(spec["preset"], spec["overrides"])
    run_dir = Path(spec["run_dir"])
    t0 = time.time()
    trainer = Trainer(cfg, run_dir=run_dir)
    _time_cpu(trainer)
    try:
        summary = trainer.train()
        nets = resident_models(trainer)
    finally:
        trainer.close()
    rows = read_jsonl(run_dir / "metrics.jsonl")
    P, G = cfg.rollout.prompts_per_step, cfg.rollout.group_size
    steps_s = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    result = {
        "name": spec["name"], "preset": spec["preset"], "seed": cfg.train.seed, "run_dir": str(run_dir),
        "kl_coef": cfg.kl.coef, "advantage": cfg.algo.advantage,
        "models_resident": len(nets), "models": list(nets), "model_state": nets,
        "model_state_bytes": sum(n["total"] for n in nets.values()),
        "reward": "functions: " + ", ".join(s.name for s in trainer.rewards.specs),
        "peak_rss_mb": peak_rss_mb(), "rss_after_imports_mb": rss_imports,
        "step_s": statistics.fmean(steps_s) if steps_s else float("nan"),
        "step_s_median": statistics.median(steps_s) if steps_s else float("nan"),
        "step_cpu_s": _mean(rows, "perf/step_cpu_s"),
        "generate_s": _mean(rows, "perf/generate_s"), "update_s": _mean(rows, "perf/update_s"),
        "steps": summary["steps"], "completions_per_step": P * G, "completions_seen": summary["steps"] * P * G,
        "accuracy_before": summary["eval/accuracy_before"], "accuracy_final": summary["eval/accuracy_after"],
        "accuracy_curve": accuracy_curve(rows, P * G),
        "train_s": sum(steps_s), "wall_s": time.time() - t0,
    }
    if trainer.device.type == "cuda":
        import torch

        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated(trainer.device) / 2**20
    write_json_atomic(Path(spec["result"]), result)
    return result


def _time_cpu(trainer) -> None:
    """Add perf/step_cpu_s (this process's CPU seconds, all threads) to every step's metrics: unlike wall time it
    hardly moves when other processes share the cores."""
    step = trainer.step

    def timed_step():
        c = time.process_time()
        result = step()
        result.metrics["perf/step_cpu_s"] = time.process_time() - c
        return result

    trainer.step = timed_step


def _mean(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return statistics.fmean(vals) if vals else float("nan")


def _worker_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo.compare.worker")
    parser.add_argument("--worker", required=True, help="a spec JSON written by `grpo compare`")
    spec = json.loads(Path(parser.parse_args(argv).worker).read_text())
    run_worker(spec)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
