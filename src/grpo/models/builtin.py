"""The built-in model `builtin:tiny`: a small Llama-architecture `transformers` model with a character tokenizer.

It is a real Hugging Face model (saved with `save_pretrained`, loadable with `AutoModelForCausalLM`), so the
trainer treats it exactly like a downloaded checkpoint. It is created with a fixed seed and warmed up by a short
supervised run on the task's *training* split (never the held-out split; grpo.warmup).

Where it comes from (`spec` = everything that determines it, see grpo.models.loading.builtin_spec):
  shipped   the warm models of the default settings are part of the package (`weights/<task>/`: safetensors,
            tokenizer, and `recipe.json` with the spec, the sha256 of the weights and their held-out accuracy),
            so every machine starts RL from the same weights, at once;
  cached    any other spec is built by the warm-up once and cached under `$GRPO_CACHE` (default
            `~/.cache/grpo`), written atomically (temporary directory, then rename), rebuilt when unreadable.
This module only finds and checks directories; the warm-up (it owns an optimizer) lives in grpo.train.
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

# The built-in tasks end every prompt with one newline ("What is 20 + 9?\n"); the template writes a user's message
# that way, so a plain question from a data file reads as the prompts the model was warmed up on. A system message
# is written the same way; an assistant turn ends with EOS. Nothing is added for the generation prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{ message['content'] }}{{ eos_token }}"
    "{%- else -%}{{ message['content'] | trim }}{{ '\n' }}{%- endif -%}"
    "{%- endfor -%}"
)
# tokenizer_config.json entry saying "my chat template is how plain-text prompts are written" (data.plain_prompts)
PLAIN_PROMPTS_KEY = "grpo_plain_prompts"

SHIPPED_DIR = Path(__file__).parent / "weights"
RECIPE = "recipe.json"


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
    tok.chat_template = CHAT_TEMPLATE
    tok.init_kwargs[PLAIN_PROMPTS_KEY] = "template"  # saved in tokenizer_config.json, read by data/files.py
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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_recipe(path: Path) -> dict | None:
    """A model directory's recipe.json (None when it has none or it is unreadable)."""
    try:
        return json.loads((path / RECIPE).read_text())
    except (OSError, ValueError):
        return None


def shipped_model_dir(spec: dict) -> Path | None:
    """The packaged warm model made with exactly `spec`, its weights checked against the recorded sha256; None
    when no shipped model has this spec (then the warm-up builds it) or its weights do not match (a warning)."""
    for recipe_path in sorted(SHIPPED_DIR.glob(f"*/{RECIPE}")):
        path = recipe_path.parent
        recipe = read_recipe(path)
        if recipe is None or recipe.get("spec") != spec:
            continue
        weights = path / "model.safetensors"
        if weights.is_file() and sha256_file(weights) == recipe.get("sha256"):
            return path
        log.warning("the shipped built-in model at %s does not match its recorded sha256 (a damaged install?); "
                    "building it with the warm-up instead", path)
    return None


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
