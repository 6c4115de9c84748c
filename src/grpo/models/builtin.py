"""The built-in model `builtin:tiny`: a small Llama-architecture `transformers` model with a character tokenizer.

It is a real Hugging Face model (saved with `save_pretrained`, loadable with `AutoModelForCausalLM`), so the
trainer treats it exactly like a downloaded checkpoint. It is created with a fixed seed, warmed up by a short
supervised run on the task's *training* split (never the held-out split), and cached under
`$GRPO_CACHE` (default `~/.cache/grpo`), keyed by everything that determines it. A cache entry is written
atomically (temporary directory, then rename) and rebuilt when missing or unreadable.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import string
from pathlib import Path
from typing import Callable

log = logging.getLogger("grpo.models")

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
# Printable ASCII plus the multiplication sign of the seed's examples ("13 × 17").
CHARACTERS = sorted(set(string.printable) - set("\x0b\x0c\r") | {"×", "÷"})

TINY = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=128)


def build_tokenizer():
    """A character-level `PreTrainedTokenizerFast`: one token per character, plus pad/eos/unk."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # no merges: characters only
    core.decoder = decoders.Fuse()  # join characters back without spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tok.model_max_length = TINY["max_position_embeddings"]
    return tok


def build_model(tokenizer, *, seed: int = 0, size: dict | None = None):
    """A randomly initialised LlamaForCausalLM sized by `size` (default TINY), seeded for reproducibility."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, tie_word_embeddings=True, rope_theta=10000.0, **(size or TINY),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def cache_root() -> Path:
    return Path(os.environ.get("GRPO_CACHE", Path.home() / ".cache" / "grpo"))


def cache_key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _loads(path: Path) -> bool:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(path)
        AutoModelForCausalLM.from_pretrained(path)
        return True
    except Exception as e:  # any unreadable file means: rebuild
        log.warning("cached built-in model at %s is unreadable (%s); rebuilding it", path, e)
        return False


def cached_model_dir(spec: dict, build: Callable[[Path], None]) -> Path:
    """Return the cache directory for `spec`, calling `build(tmp_dir)` to create it when missing or corrupt."""
    root = cache_root()
    final = root / f"builtin-tiny-{cache_key(spec)}"
    if (final / "grpo_builtin.json").exists() and _loads(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    (tmp / "grpo_builtin.json").write_text(json.dumps(spec, indent=2, sort_keys=True))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final
