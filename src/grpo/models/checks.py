"""Check a model directory before anything loads it: one ModelDirError naming the file and what to do, instead of a
hub "Repo id" or safetensors traceback later.

    check_model_dir(path, field="model.name")     raises ModelDirError, or returns the path

Checked, in this order (cheap: headers and sizes, no tensor is read):
- the directory exists and is a directory (models are never downloaded at run time);
- config.json is there and is a JSON object (or, for a LoRA adapter saved by `save_final`, adapter_config.json);
- the weights: each `*.safetensors` file (those a `model.safetensors.index.json` names, when sharded) has a
  readable header and is as long as its header says (a cut-off copy is caught here); a `pytorch_model.bin` is a
  readable zip archive (torch's format), which a cut-off file is not, whose pickle names only what torch's weights-only
  loader allows (read with pickletools, never unpickled: a payload is refused before anything loads it);
- the tokenizer: tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json or vocab.txt (tokenizer.json and
  tokenizer_config.json, when there, must be readable JSON);
- config.json names a model_type (or an auto_map), and the shape of every tensor in the safetensors headers is the
  one config.json gives it (the model is built on torch's meta device: no memory, no weights read), so weights and
  a config that do not belong together are named here, not as a loading traceback.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from grpo.errors import ModelDirError

__all__ = ["TOKENIZER_FILES", "check_model_dir", "check_safetensors"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
MAX_HEADER = 100 * 2**20  # safetensors refuses headers over 100 MB


def check_model_dir(path: str | Path, *, field: str = "model.name", tokenizer: bool = True) -> Path:
    """`path` as a Path once it holds a loadable config, complete weights and (if `tokenizer`) a tokenizer;
    otherwise ModelDirError naming `field`, the file and what to do."""
    p = Path(path).expanduser()
    where = f"{field}={str(path)!r}"
    if not p.exists():
        raise ModelDirError(f"{where}: no such directory. Models are never downloaded at run time: pass a directory "
                            "saved with save_pretrained (e.g. a run's final/), or 'builtin:tiny'")
    if not p.is_dir():
        raise ModelDirError(f"{where} is a file, not a model directory (a directory saved with save_pretrained)")
    adapter = (p / "adapter_config.json").is_file() and not (p / "config.json").exists()
    _check_json(p / ("adapter_config.json" if adapter else "config.json"), where)
    _check_weights(p, where, adapter)
    if tokenizer and not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise ModelDirError(f"{where}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save it into the same "
                            "directory with tokenizer.save_pretrained(path)")
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if (p / name).is_file():
                _check_json(p / name, where)
    if not adapter:
        _check_shapes(p, where)
    return p


def _safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """{tensor name: shape} from a safetensors header (checked by check_safetensors)."""
    with open(file, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n).decode("utf-8"))
    return {k: list(v.get("shape", [])) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def _check_shapes(p: Path, where: str) -> None:
    """ModelDirError naming the file and the tensor when a tensor's shape is not the one config.json gives it."""
    files = sorted(p.glob("*.safetensors"))
    if not files or "auto_map" in json.loads((p / "config.json").read_text(encoding="utf-8")):
        return  # a model with its own code is built by that code (trust_remote_code), not here
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(p)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - a config transformers cannot build a model from
        raise ModelDirError(f"{where}: {p / 'config.json'} does not describe a model transformers can build "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); fix config.json or "
                            "copy the directory again") from None
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    for file in files:
        for name, shape in _safetensors_shapes(file).items():
            if name in expected and expected[name] != shape:
                keys = ", ".join(f"{k}={config.to_dict()[k]}" for k in ("hidden_size", "intermediate_size",
                                 "num_hidden_layers", "vocab_size") if k in config.to_dict())
                raise ModelDirError(f"{where}: {file} holds tensor {name!r} of shape {shape}, but config.json "
                                    f"({keys}) gives it {expected[name]}: the weights and config.json do not belong "
                                    "together; copy or save the model again")


def _check_json(file: Path, where: str) -> None:
    if not file.is_file():
        raise ModelDirError(f"{where}: no {file.name} in {file.parent}, so it is not a model directory saved with "
                            "save_pretrained; models are never downloaded at run time")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise ModelDirError(f"{where}: {file} is not readable JSON ({e}); the directory is damaged, save the model "
                            "again") from None
    if not isinstance(data, dict):
        raise ModelDirError(f"{where}: {file} holds {type(data).__name__}, expected a JSON object")
    if file.name == "config.json":
        _check_model_type(data, file, where)


def _check_model_type(config: dict, file: Path, where: str) -> None:
    """ModelDirError when config.json names a model_type this transformers does not know (a model newer than the
    installed transformers, or a typo); models with their own code (auto_map) are left to transformers."""
    kind = config.get("model_type")
    if "auto_map" in config:
        return
    if not isinstance(kind, str):
        raise ModelDirError(f"{where}: {file} has no \"model_type\" (e.g. \"llama\"), so transformers cannot tell "
                            "which model it is; add it, or save the model again with save_pretrained")
    import difflib

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if kind in CONFIG_MAPPING_NAMES:
        return
    close = difflib.get_close_matches(kind, list(CONFIG_MAPPING_NAMES), 1)
    raise ModelDirError(f"{where}: {file} names model_type {kind!r}, which transformers {transformers.__version__} "
                        "does not know" + (f" (did you mean {close[0]!r}?)" if close else "") + "; upgrade "
                        "transformers (pip install -U transformers) if the model is newer, or fix config.json")


def _check_weights(p: Path, where: str, adapter: bool) -> None:
    prefix = "adapter_model" if adapter else "model"
    index = p / f"{prefix}.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
            raise ModelDirError(f"{where}: {index} is not a readable shard index ({type(e).__name__}: {e})") from None
        for name in shards:
            if not (p / name).is_file():
                raise ModelDirError(f"{where}: {name}, listed in {index.name}, is missing; copy the whole directory")
            check_safetensors(p / name, where)
        return
    safetensors = sorted(p.glob("*.safetensors"))
    if safetensors:
        for file in safetensors:
            check_safetensors(file, where)
        return
    bins = sorted(p.glob(f"{prefix}*.bin")) or sorted(p.glob("pytorch_model*.bin"))
    if bins:
        for file in bins:
            if not zipfile.is_zipfile(file):
                raise ModelDirError(f"{where}: {file} is not a readable torch checkpoint (cut short or damaged); "
                                    "copy or save the model again")
            _check_pickle(file, where)
        return
    raise ModelDirError(f"{where}: no weights in {p} ({prefix}.safetensors, {prefix}.safetensors.index.json or "
                        "pytorch_model.bin); save the model with model.save_pretrained(path)")


def _check_pickle(file: Path, where: str) -> None:
    """Refuse a torch checkpoint whose pickle names anything torch's weights-only loader does not allow (code that
    would run on loading): read with pickletools, never unpickled. Without this the load failed later with torch's
    own UnpicklingError, whose text advises weights_only=False, i.e. running the payload."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals

        allowed = set(_get_allowed_globals())
    except (ImportError, AttributeError):  # pragma: no cover - another torch: allow torch's own names only
        allowed = None
    try:
        with zipfile.ZipFile(file) as z:
            name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
            data = z.read(name) if name else b""
        for found in _pickle_globals(data):
            if not (found in allowed if allowed is not None else found.startswith("torch.")) and not (
                    found.startswith("torch.") and found.endswith("Storage")):
                raise ModelDirError(f"{where}: {file} is a pickle that names {found!r}, which is not a tensor type: "
                                    "loading it would run code, so it is refused (nothing of it ran). Use a model "
                                    "saved as safetensors (model.save_pretrained(path), safe_serialization=True) "
                                    "from a source you trust")
    except ModelDirError:
        raise
    except (ValueError, zipfile.BadZipFile, OSError, KeyError) as e:
        raise ModelDirError(f"{where}: {file} is not a readable torch checkpoint ({type(e).__name__}: {e}); copy or "
                            "save the model again") from None


def _pickle_globals(data: bytes) -> list[str]:
    """The "module.name" of every global a pickle loads (GLOBAL, INST, STACK_GLOBAL), read without unpickling: the
    stack is followed only as far as strings go (a STACK_GLOBAL whose names are not plain strings is "?")."""
    import pickletools

    stack: list[str | None] = []
    memo: dict = {}
    out = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("GLOBAL", "INST"):
            out.append(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            module, name = (stack[-2:] if len(stack) >= 2 else [None, None])
            out.append(f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else "?")
        if op.name == "MEMOIZE":
            memo[len(memo)] = stack[-1] if stack else None
        elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1] if stack else None
        elif op.name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo.get(arg))
        elif op.name in ("UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
                         "SHORT_BINSTRING"):
            stack.append(arg)
        elif op.stack_after:
            stack.append(None)
    return out


def check_safetensors(file: Path, where: str = "") -> None:
    """ModelDirError unless `file` has a readable safetensors header and is at least as long as the header says.

    Layout: 8 bytes little-endian header length n, n bytes of JSON {name: {"dtype", "shape", "data_offsets":
    [begin, end]}, "__metadata__": {...}}, then the tensor bytes; every end must fit in the file."""
    size = file.stat().st_size
    lead = f"{where}: " if where else ""
    again = "copy or save the model again (an interrupted copy or download?)"
    try:
        with open(file, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ModelDirError(f"{lead}{file} is cut short ({size} bytes, not even a header); {again}")
            n = struct.unpack("<Q", raw)[0]
            if n > MAX_HEADER or 8 + n > size:
                raise ModelDirError(f"{lead}{file} is cut short or not a safetensors file (its header claims {n} "
                                    f"bytes, the file has {size}); {again}")
            header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        if isinstance(e, ModelDirError):
            raise
        raise ModelDirError(f"{lead}{file} has an unreadable safetensors header ({e}); {again}") from None
    if not isinstance(header, dict):
        raise ModelDirError(f"{lead}{file} has an unreadable safetensors header; {again}")
    ends = []
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) and name != "__metadata__" else [0, 0]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(x, int) for x in offsets)):
            raise ModelDirError(f"{lead}{file}: the header entry {name!r} has no valid data_offsets; {again}")
        ends.append(offsets[1])
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise ModelDirError(f"{lead}{file} is cut short: {size} bytes, its header says {need}; {again}")
