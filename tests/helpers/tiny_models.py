"""The one builder of tiny, randomly initialised `transformers` models for the tests (nothing is downloaded).

    tiny_model("llama", vocab_size=50, seed=0)                     a causal LM
    tiny_model("llama", head="sequence", num_labels=1, ...)        a sequence classifier (a reward model)

Every field of the architecture's config can be overridden; the defaults are a 2-layer, 32-wide model with grouped
attention (2 query heads, 1 key/value head) and 256 positions.
"""

from __future__ import annotations

import torch

DEFAULTS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=256)
ARCHS = {  # arch -> (config class, causal LM class, sequence classifier class), names in transformers
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaForSequenceClassification"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification"),
}


def tiny_config(arch: str = "llama", **fields):
    """The `arch` config with DEFAULTS, overridden by `fields` (vocab_size, pad_token_id, ...)."""
    import transformers

    return getattr(transformers, ARCHS[arch][0])(**{**DEFAULTS, **fields})


def tiny_model(arch: str = "llama", *, head: str = "causal", seed: int | None = None, **fields):
    """A random `arch` model ('causal' LM or 'sequence' classifier) of `tiny_config(arch, **fields)`. seed: seeds
    the global torch RNG first (torch.manual_seed), as the tests that call it expect; None draws from it as it is."""
    import transformers

    cls = getattr(transformers, ARCHS[arch][1 if head == "causal" else 2])
    if seed is not None:
        torch.manual_seed(seed)
    return cls(tiny_config(arch, **fields))


SMALL_BUILTIN = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2, max_position_embeddings=128)


def save_small_builtin(path):
    """A small random model of the built-in architecture and its character tokenizer, saved in `path` (a model
    directory for CLI tests: fast to load, nothing to warm up)."""
    import torch

    from grpo.models.builtin import build_model, build_tokenizer

    tok = build_tokenizer()
    with torch.random.fork_rng():
        build_model(tok, seed=0, size=SMALL_BUILTIN).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path
