"""The one builder of tiny, randomly initialised `transformers` models for the tests (nothing is downloaded).

    tiny_model("llama", vocab_size=50, seed=0)                     a causal LM
    tiny_model("llama", head="sequence", num_labels=1, ...)        a sequence classifier (a reward model)

Every field of the architecture's config can be overridden; the defaults are a 2-layer, 32-wide model with grouped
attention (2 query heads, 1 key/value head) and 256 positions. Gemma 3 (text) and Mistral have sliding-window
attention: their defaults (ARCH_DEFAULTS) make the window 4 positions, shorter than any test sequence, and Gemma 3's
layers alternate sliding-window and global ones (3 layers: sliding, global, sliding), with 16-wide heads.
`spread(model)` makes a random model's norms and logits matter (see there).
"""

from __future__ import annotations

import torch

DEFAULTS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=256)
ARCHS = {  # arch -> (config class, causal LM class, sequence classifier class), names in transformers
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaForSequenceClassification"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "Gemma3TextForSequenceClassification"),
    "mistral": ("MistralConfig", "MistralForCausalLM", "MistralForSequenceClassification"),
}
WINDOW = 4  # the sliding window of the Gemma 3 and Mistral defaults: shorter than every test sequence
ARCH_DEFAULTS = {"gemma3": dict(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW),
                 "mistral": dict(sliding_window=WINDOW)}


def _layer_types(layers: int) -> list[str]:
    """Gemma 3's pattern in small: sliding-window layers with a global one between (sliding, full, sliding, ...)."""
    return ["full_attention" if i % 2 else "sliding_attention" for i in range(layers)]


def tiny_config(arch: str = "llama", **fields):
    """The `arch` config with DEFAULTS, overridden by `fields` (vocab_size, pad_token_id, ...)."""
    import transformers

    fields = {**DEFAULTS, **ARCH_DEFAULTS.get(arch, {}), **fields}
    if arch == "gemma3" and "layer_types" not in fields:
        fields["layer_types"] = _layer_types(fields["num_hidden_layers"])
    return getattr(transformers, ARCHS[arch][0])(**fields)


def tiny_model(arch: str = "llama", *, head: str = "causal", seed: int | None = None, **fields):
    """A random `arch` model ('causal' LM or 'sequence' classifier) of `tiny_config(arch, **fields)`. seed: seeds
    the global torch RNG first (torch.manual_seed), as the tests that call it expect; None draws from it as it is."""
    import transformers

    cls = getattr(transformers, ARCHS[arch][1 if head == "causal" else 2])
    if seed is not None:
        torch.manual_seed(seed)
    return cls(tiny_config(arch, **fields))


@torch.no_grad()
def spread(model, logit_scale: float = 20.0, seed: int = 0):
    """`model` with its norm weights drawn from N(0, 0.5) (a random init leaves them at their neutral value: 1, or 0
    for Gemma's (1 + w) norms, which would hide a norm applied in the wrong place or not at all) and its output head's
    weight times `logit_scale` (the random init's logits are too flat for a wrong formula to show: the tied embedding
    grows too, which the norms absorb). Seeds a private generator; returns the model."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (0.0 if "gemma" in type(model).__name__.lower() else 1))
    model.get_output_embeddings().weight.mul_(logit_scale)
    return model


SMALL_BUILTIN = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2, max_position_embeddings=128)


def save_small_builtin(path, size: dict = SMALL_BUILTIN):
    """A small random model of the built-in architecture (`size`: its config fields) and its character tokenizer
    (which has a chat template), saved in `path` (a model directory for CLI tests: fast to load, nothing to warm
    up). Returns path."""
    import torch

    from grpo.models.builtin import build_model, build_tokenizer

    tok = build_tokenizer()
    with torch.random.fork_rng():
        build_model(tok, seed=0, size=size).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path
