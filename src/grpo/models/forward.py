"""Forward passes shared by rollout, training and evaluation.

Sequences are left-padded prompts followed by right-padded completions. Hugging Face models derive
positions from the cache length, not from the attention mask, so with left padding the position ids are
passed explicitly (cumulative sum of the mask), which keeps a prompt's positions identical whatever its
padding.

`completion_logits` computes each prompt once per group of G completions (shared prefix):

    prompts minus their last token  (P, L-1)  -> one forward, KV cache of P rows (with gradients)
    repeat each cache row G times             -> N = P*G rows; autograd sums the G gradients back
    [last prompt token, completion[:T-1]]     (N, T) -> one forward on top of that cache -> (N, T, V)

so prompt tokens cost once per group in the forward and in the backward pass, and the output head runs
only at the T positions that predict completion tokens. The result equals the unshared computation over
the N full sequences (tests/rollout/test_shared_prefix.py checks logits and gradients in fp32).
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

        name, inner = "past_key_values", model
        for _ in range(4):  # look through wrappers that forward **kwargs (DDP's .module, PEFT's base model)
            params = inspect.signature(inner.forward).parameters
            if "cache" in params or "past_key_values" in params:
                name = "cache" if "cache" in params else "past_key_values"
                break
            inner = getattr(inner, "module", None) or getattr(inner, "base_model", None)
            if inner is None or not hasattr(inner, "forward"):
                break
        model._grpo_cache_kw = name
    return {name: cache}


def output_cache(out):
    """The KV cache returned by a forward pass (attribute name differs across transformers versions)."""
    return getattr(out, "cache", None) or getattr(out, "past_key_values", None)


def _shareable(cache) -> bool:
    """True when every layer of `cache` is a plain growing (concatenating) cache layer that repeats
    differentiably; anything else (sliding windows, quantised or static layers, no cache) takes the
    unshared path."""
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        return False
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:  # older transformers: legacy caches; stay on the simple path
        return False
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _checkpointing(model) -> bool:
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # the name changed in transformers 5
        if hasattr(type(model), name) or hasattr(model, name):
            return bool(getattr(model, name))
    return False


def unshared_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size: int):
    """The straightforward computation: every prompt repeated G times, one forward over N full sequences."""
    ids = torch.cat([prompt_ids.repeat_interleave(group_size, 0), completion_ids], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0), completion_mask.to(prompt_mask.dtype)], dim=1)
    T = completion_ids.shape[1]
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                use_cache=False, logits_to_keep=T + 1)
    return out.logits[:, :-1]


def completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size: int):
    """Logits predicting each completion token. Returns (N, T, V); [:, t] predicts completion token t.

    prompt_ids/prompt_mask: (P, L) left-padded; completion_ids/completion_mask: (N, T) right-padded with
    N = P*G (row i belongs to prompt i // G). Each prompt is computed once for its G completions (see the
    module docstring); models or caches that cannot share fall back to `unshared_completion_logits`.
    """
    P, L = prompt_ids.shape
    N, T = completion_ids.shape
    G = group_size
    if N != P * G:
        raise ValueError(f"completion rows ({N}) must be prompts ({P}) x group_size ({G})")
    checkpointing = model.training and torch.is_grad_enabled() and _checkpointing(model)
    if G == 1 or L == 1 or checkpointing:  # nothing to share, or no cache (checkpointed layers drop it)
        return unshared_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, G)
    prompt_mask = prompt_mask.long()
    positions = position_ids_from_mask(prompt_mask)
    out = model(input_ids=prompt_ids[:, :-1], attention_mask=prompt_mask[:, :-1], position_ids=positions[:, :-1],
                use_cache=True, logits_to_keep=1)
    cache = output_cache(out)
    if not _shareable(cache):  # sliding-window or other special cache layers
        return unshared_completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask, G)
    cache.batch_repeat_interleave(G)  # keys = keys.repeat_interleave(G): autograd sums the G gradients
    ids = torch.cat([prompt_ids[:, -1:].repeat_interleave(G, 0), completion_ids[:, :-1]], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask[:, :-1].long()], dim=1)
    start = positions[:, -1:]  # position of the last prompt token (the last column is always a real token)
    pos = (start + torch.arange(T, device=start.device)).repeat_interleave(G, 0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                **cache_kwargs(model, cache))
    return out.logits
