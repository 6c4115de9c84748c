"""Forward passes shared by rollout, training and evaluation.

Sequences are left-padded prompts followed by right-padded completions. Hugging Face models derive
positions from the cache length, not from the attention mask, so with left padding the position ids are
passed explicitly (cumulative sum of the mask), which keeps a prompt's positions identical whatever its
padding.
"""

from __future__ import annotations

import torch


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, S) 0/1 mask -> (B, S) positions 0, 1, ... over the real tokens (0 at left padding)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def cache_kwargs(model, cache) -> dict:
    """The keyword for passing a KV cache: `cache` in recent transformers, `past_key_values` before."""
    name = getattr(model, "_grpo_cache_kw", None)
    if name is None:
        import inspect

        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model._grpo_cache_kw = name
    return {name: cache}


def output_cache(out):
    """The KV cache returned by a forward pass (attribute name differs across transformers versions)."""
    return getattr(out, "cache", None) or out.past_key_values


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size: int):
    """Logits predicting each completion token. Returns (N, T, V).

    prompt_ids/prompt_mask: (P, L); completion_ids/completion_mask: (N, T) with N = P*G. Only the positions
    that predict completion tokens (the last prompt position and the first T-1 completion positions) go
    through the output head.
    """
    ids = torch.cat([prompt_ids.repeat_interleave(group_size, 0), completion_ids], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0), completion_mask], dim=1)
    T = completion_ids.shape[1]
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                use_cache=False, logits_to_keep=T + 1)
    return out.logits[:, :-1]
