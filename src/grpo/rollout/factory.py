"""The rollout engine of a config (rollout.engine): `native` (grpo.rollout.Sampler, our decoder on the training
model) or `vllm` (grpo.rollout.vllm_engine.VllmEngine, a vLLM engine in this process, weights synced every step)."""

from __future__ import annotations

from pathlib import Path

from grpo.rollout.engine import RolloutEngine
from grpo.rollout.sampler import Sampler


def build_engine(cfg, model, tokenizer, model_dir: str | Path, dist=None, compute: str = "weights") -> RolloutEngine:
    """The engine that generates the trainer's rollouts. model_dir: the Hugging Face directory `model` was loaded
    from (vLLM builds its copy from it); dist: grpo.parallel.Dist or None (one process); compute: model.compute_dtype
    resolved (models/compute.py), what the native sampler computes in, as the trainer's forwards do. Both engines
    stop at rollout.stop's strings (rollout/stop.py)."""
    r = cfg.rollout
    if r.engine == "native":
        return Sampler(model, tokenizer, max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                       max_prompt_tokens=cfg.data.max_prompt_tokens, compute=compute, stop=tuple(r.stop))
    if r.engine == "vllm":
        from grpo.rollout.vllm_engine import VllmEngine

        world = getattr(dist, "world_size", 1) or 1
        prompt_tokens = cfg.data.max_prompt_tokens or getattr(model.config, "max_position_embeddings", 2048)
        rows = -(-r.prompts_per_step // world) * r.group_size * max(cfg.algo.max_resample_batches, 1)
        return VllmEngine(model, tokenizer, model_dir, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                          top_p=r.top_p, max_prompt_tokens=cfg.data.max_prompt_tokens, seed=cfg.train.seed,
                          gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                          max_batch_tokens=rows * (prompt_tokens + r.max_new_tokens), dist=dist,
                          probe_tolerance=r.vllm_probe_tolerance, stop=tuple(r.stop))
    raise ValueError(f"rollout.engine must be 'native' or 'vllm', got {r.engine!r}")
