"""Test helpers of tests/rollout: tiny random Llama / Qwen2 / Qwen3 / Gemma 3 models on the built-in character
tokenizer (Gemma 3's sliding window, 4 positions, is shorter than every prompt + completion here), prompts of
different lengths (so left padding is exercised), and the naive reference of rollout.stop (decode every prefix, end
the row at the first that holds a stop string). Everything is built in memory."""

from __future__ import annotations

import torch

from grpo.types import Prompt

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


def tiny_model(arch: str, tok, *, seed: int = 0, eos_bias: float | None = None, **fields):
    """2 layers (Gemma 3: a sliding-window one, then a global one), 4 query heads sharing 2 key/value heads (GQA), fp32,
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
    kwargs |= fields
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


def naive(tok, ids: list[int], stops) -> tuple[int, str, bool]:
    """(tokens kept, the text a reward sees, stopped) of one sampled row: decode everything, prefix by prefix; the
    first prefix whose text holds a stop string ends the row, its text cut before the occurrence that ends first."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=True)
        found = sorted((text.index(s) + len(s), text.index(s)) for s in stops if s in text)
        if found:
            return k, text[:found[0][1]], True
    return len(ids), tok.decode(ids, skip_special_tokens=True), False


def check_against_naive(tok, free, stopped, stops):
    """`stopped` (Rollouts sampled with `stops`) against `free` (the same draws without stop strings) cut by naive."""
    eos = tok.eos_token_id
    n_stopped = 0
    for i in range(free.num_completions):
        ids = free.completion_ids[i, :int(free.completion_mask[i].sum())].tolist()
        k, text, hit = naive(tok, ids, stops)
        n_stopped += hit
        assert int(stopped.completion_mask[i].sum()) == k, (i, ids, stops)
        assert stopped.completion_ids[i, :k].tolist() == ids[:k]
        assert (stopped.completion_ids[i, k:] == tok.pad_token_id).all()
        torch.testing.assert_close(stopped.logp[i, :k], free.logp[i, :k])
        assert stopped.texts[i] == text, (i, stopped.texts[i], text)
        assert bool(stopped.truncated[i]) == (not hit and eos not in ids[:k]), i  # a stop string finishes the row
    return n_stopped
