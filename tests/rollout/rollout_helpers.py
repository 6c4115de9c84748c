"""Test helpers of tests/rollout: tiny random Llama / Qwen2 / Qwen3 / Gemma 3 models on the built-in character
tokenizer (Gemma 3's sliding window, 4 positions, is shorter than every prompt + completion here), and prompts of
different lengths (so left padding is exercised). Everything is built in memory."""

from __future__ import annotations

import torch

from grpo.types import Prompt

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


def tiny_model(arch: str, tok, *, seed: int = 0, eos_bias: float | None = None):
    """2 layers (Gemma 3: 3, sliding, global, sliding), 4 query heads sharing 2 key/value heads (GQA), fp32,
    eval-independent (no dropout). Gemma 3's norms are drawn at random and its logits spread (helpers.tiny_models
    spread): its (1 + w) norms would otherwise all be the identity."""
    from helpers.tiny_models import spread
    from helpers.tiny_models import tiny_model as build

    kwargs = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                  tie_word_embeddings=eos_bias is None)
    if arch in ("qwen3", "gemma3"):
        kwargs["head_dim"] = 8
    with torch.random.fork_rng():
        model = build(arch, seed=seed, **kwargs).float()
        if arch == "gemma3":
            spread(model, logit_scale=5.0, seed=seed)
        if eos_bias is not None:  # an output head that favours EOS: rows end early, at different steps
            head = torch.nn.Linear(32, len(tok), bias=True)
            with torch.no_grad():
                head.weight.copy_(model.lm_head.weight)
                head.bias.zero_()
                head.bias[tok.eos_token_id] = eos_bias
            model.lm_head = head
    return model


def make_prompts(texts=("What is 12 + 30?\n", "hi", "What is 7 - 3?\n", "a")):
    return [Prompt(uid=f"p{i}", text=t, answer="0") for i, t in enumerate(texts)]
