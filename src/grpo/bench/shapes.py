"""Model directories of real models' shapes with random weights, for memory and speed measurements (memory and time
do not depend on the weights' values). Nothing is downloaded: the tokenizer is the bench's character tokenizer with
filler tokens up to the model's vocabulary size (grpo.bench.vocab.vocab_tokenizer), so a 151,936-token head and
embedding are real.

    python -m grpo.bench.shapes NAME DIR        write the shape NAME (see SHAPES) to DIR

The weights are saved in bfloat16, as the published checkpoints of these models are, and load as model.dtype says.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

# The published configs' sizes (Qwen2.5-*-Instruct, config.json): tied embeddings, 151,936-token vocabulary.
SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2),
}
VOCAB = 151_936


def write_shape(name: str, directory: str | Path, *, seed: int = 0) -> Path:
    """Write a random Qwen2ForCausalLM of SHAPES[name] (bf16 safetensors) and its tokenizer to `directory`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo.bench.vocab import vocab_tokenizer

    if name not in SHAPES:
        raise SystemExit(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    directory = Path(directory)
    tok = vocab_tokenizer(VOCAB)
    tok.model_max_length = 32768
    config = Qwen2Config(vocab_size=VOCAB, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=True, max_position_embeddings=32768,
                         **SHAPES[name])
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    model.tie_weights()  # to_empty gives every parameter its own storage: the head shares the embedding again
    with torch.no_grad():  # small normal weights (what init_weights would give), made in place, layer by layer
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.fill_(1.0 if p.dim() == 1 else 0.0)
        for name_, p in model.named_parameters():
            if name_.endswith(".bias"):
                p.zero_()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(write_shape(sys.argv[1], sys.argv[2]))
