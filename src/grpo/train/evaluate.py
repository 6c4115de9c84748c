"""Held-out evaluation: greedy pass@1 on the task's test split (problems never seen in training)."""

from __future__ import annotations

import torch

from grpo.rollout import Sampler


@torch.no_grad()
def evaluate_model(model, tokenizer, task, prompts, *, batch_size: int = 250, max_new_tokens: int = 24,
                   max_prompt_tokens: int | None = None, progress=None) -> dict:
    """{'accuracy': float, 'n': int, 'correct': list[bool], 'completions': list[str]} under greedy decoding.
    `progress(done, total)` is called after each batch (grpo.tracking.progress.Phase.update)."""
    sampler = Sampler(model, tokenizer, max_new_tokens=max_new_tokens, temperature=0.0,
                      max_prompt_tokens=max_prompt_tokens)
    completions: list[str] = []
    for i in range(0, len(prompts), batch_size):
        completions += sampler.generate(prompts[i:i + batch_size], 1).texts
        if progress is not None:
            progress(len(completions), len(prompts))
    if hasattr(task, "is_correct_batch"):  # e.g. the code task: its programs run concurrently in the sandbox
        correct = [bool(x) for x in task.is_correct_batch(prompts, completions)]
    else:
        correct = [bool(task.is_correct(p, c)) for p, c in zip(prompts, completions)]
    return {"accuracy": sum(correct) / max(len(correct), 1), "n": len(correct), "correct": correct,
            "completions": completions}
