"""A GGUF file (llama.cpp's format: one file of quantized weights, tokenizer and chat template) as a plain model
directory, through transformers' GGUF reader (the `gguf` package: pip install 'grpo[gguf]').

    grpo import-gguf SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2      # once, then model.name=models/smollm2
    grpo train model.name=SmolLM2-135M-Instruct.Q4_1.gguf ...           # imported once into $GRPO_CACHE

The weights are dequantized to float32 (training needs real numbers; a Q4 file of 98 MB becomes a 540 MB
directory for 135M parameters) and saved with `save_pretrained`, the tokenizer with its chat template and special
tokens as the file names them (SmolLM2-Instruct: EOS `<|im_end|>`, the token that ends an assistant turn, so
generation stops where the model stops). The directory is written under a temporary name and renamed into place:
an interrupted import leaves nothing that looks like a model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from grpo.errors import MissingExtraError, ModelDirError
from grpo.models.builtin import sha256_file

__all__ = ["import_gguf", "gguf_model_dir"]


def import_gguf(gguf: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Dequantize the GGUF file `gguf` into the model directory `out_dir` (which must not exist, or be empty)."""
    gguf, out_dir = Path(gguf), Path(out_dir)
    if not gguf.is_file():
        raise ModelDirError(f"{gguf}: no such GGUF file")
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelDirError(f"{gguf}: not a GGUF file (it does not start with the GGUF magic)")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelDirError(f"{out_dir}: exists and is not an empty directory; choose a new directory to import into")
    try:
        import gguf as _  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError as e:
        raise MissingExtraError("reading a GGUF file needs the gguf package: pip install 'grpo[gguf]'") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except (ValueError, KeyError, RuntimeError) as e:  # an architecture or quantization transformers cannot read
            raise ModelDirError(f"{gguf}: transformers cannot read this GGUF file: {e}") from e
        if tokenizer.eos_token is None:
            raise ModelDirError(f"{gguf}: the file's tokenizer has no end-of-sequence token; generation could not stop")
        model.generation_config.eos_token_id = tokenizer.eos_token_id  # stop where the tokenizer's turn ends
        # the weights are plain float32 tensors now; transformers still marks the model as GGUF-quantized and
        # refuses to save it, so the marks go (what is saved is an ordinary model directory)
        model.hf_quantizer = None
        for attr in ("is_quantized", "quantization_method"):
            if hasattr(model, attr):
                setattr(model, attr, False if attr == "is_quantized" else None)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "grpo_source.txt").write_text(f"imported from {gguf.resolve()} (sha256 {sha256_file(gguf)})\n")
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def gguf_model_dir(gguf: str | os.PathLike, cache: Path, console=None) -> Path:
    """The model directory of `gguf` under `cache` (keyed by the file's sha256), imported on first use."""
    gguf = Path(gguf)
    if not gguf.is_file():
        raise ModelDirError(f"model.name: {gguf}: no such GGUF file")
    out = cache / f"gguf-{sha256_file(gguf)[:16]}"
    if not (out / "config.json").is_file():
        if console is not None:
            console.print(f"[grpo] importing {gguf} (dequantized to float32, once) into {out}", soft_wrap=True,
                          markup=False, highlight=False)
        import_gguf(gguf, out)
    return out
