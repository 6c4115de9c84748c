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
import struct
from pathlib import Path

from grpo.errors import MissingExtraError, ModelDirError
from grpo.models.builtin import sha256_file

__all__ = ["check_gguf", "import_gguf", "gguf_model_dir"]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Short(Exception):
    """The file ended inside its header."""


class _Header:
    """A cursor over a GGUF file's header (little-endian: the magic, version, tensor count, key/value count, the
    key/values, then one info per tensor: name, dims, ggml type, offset from the data start)."""

    def __init__(self, f, size: int):
        self.f, self.size = f, size

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) < n:
            raise _Short()
        return data

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > self.size:
            raise _Short()
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            inner, count = self.unpack("<I"), self.unpack("<Q")
            if count > self.size:
                raise _Short()
            return [self.value(inner) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"an unknown value type {kind}")
        return self.unpack(_SCALARS[kind])


def check_gguf(gguf: str | os.PathLike) -> None:
    """ModelDirError naming the file unless it is a whole GGUF file: the magic, a header that ends inside the
    file, and as many bytes as its tensors declare ("cut short at X of Y bytes" for an interrupted copy or
    download). Reads the header only (the tensor sizes come from the gguf package's table of ggml types)."""
    gguf = Path(gguf)
    size = gguf.stat().st_size
    again = "download or copy it again (an interrupted copy?)"
    with open(gguf, "rb") as f:
        head, tensors = _Header(f, size), None
        try:
            if f.read(4) != b"GGUF":
                raise ModelDirError(f"{gguf}: not a GGUF file (it does not start with the GGUF magic)")
            version, tensors, kvs = head.unpack("<I"), head.unpack("<Q"), head.unpack("<Q")
            if version < 2:
                raise ModelDirError(f"{gguf}: GGUF version {version}; only versions 2 and 3 are read")
            meta = {}
            for _ in range(kvs):
                key = head.string()
                meta[key] = head.value(head.unpack("<I"))
            infos = []
            for _ in range(tensors):
                name, dims = head.string(), head.unpack("<I")
                shape = [head.unpack("<Q") for _ in range(dims)]
                infos.append((name, shape, head.unpack("<I"), head.unpack("<Q")))
            end_of_header = f.tell()
        except _Short:
            declares = f" (it declares {tensors} tensors)" if tensors is not None else ""  # read before the cut
            raise ModelDirError(f"{gguf} is cut short at {size} bytes, inside its header{declares}; {again}") from None
        except (ValueError, struct.error) as e:
            raise ModelDirError(f"{gguf}: an unreadable GGUF header ({e}); {again}") from None
    try:
        from gguf import GGML_QUANT_SIZES
    except ImportError:
        return  # the import itself says which package it needs
    align = meta.get("general.alignment", 32) or 32
    start = -(-end_of_header // align) * align
    need = start
    for name, shape, kind, offset in infos:
        if kind not in GGML_QUANT_SIZES:
            continue  # a type this gguf package does not know: transformers will say so
        block, nbytes = GGML_QUANT_SIZES[kind]
        count = 1
        for d in shape:
            count *= d
        need = max(need, start + offset + count // block * nbytes)
    if size < need:
        raise ModelDirError(f"{gguf} is cut short at {size} of {need} bytes (its header declares {len(infos)} "
                            f"tensors); {again}")


def import_gguf(gguf: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Dequantize the GGUF file `gguf` into the model directory `out_dir` (which must not exist, or be empty)."""
    gguf, out_dir = Path(gguf), Path(out_dir)
    if not gguf.is_file():
        raise ModelDirError(f"{gguf}: no such GGUF file")
    check_gguf(gguf)  # the magic, the header, the declared sizes: "cut short at X of Y bytes"
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
