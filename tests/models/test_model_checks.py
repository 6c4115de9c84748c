"""grpo.models.checks: a model directory is checked (config, complete weights, tokenizer) before anything loads,
and each failure is one ModelDirError naming the field, the file and what to do."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
from helpers.tiny_models import save_small_builtin

from grpo.errors import ModelDirError, UserError
from grpo.models.checks import check_model_dir, check_safetensors

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 2, "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return save_small_builtin(tmp_path_factory.mktemp("model"), size=SMALL)


@pytest.fixture
def model(saved, tmp_path) -> Path:
    """A fresh copy of the saved model to damage."""
    return Path(shutil.copytree(saved, tmp_path / "m"))


def error(path, **kw) -> str:
    with pytest.raises(ModelDirError) as e:
        check_model_dir(path, **kw)
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)
    return str(e.value)


def test_a_complete_directory_passes_and_loads(model):
    from transformers import AutoModelForCausalLM

    assert check_model_dir(model) == model
    AutoModelForCausalLM.from_pretrained(model)  # the check and the loader agree


def test_missing_directory_and_a_file_instead(tmp_path):
    msg = error(tmp_path / "nope", field="model_dir")
    assert f"model_dir={str(tmp_path / 'nope')!r}: no such directory" in msg and "never downloaded" in msg
    (tmp_path / "f").write_text("x")
    assert "is a file, not a model directory" in error(tmp_path / "f")


def test_no_config_or_an_unreadable_one(model):
    (model / "config.json").write_text("{ cut")
    assert "config.json is not readable JSON" in error(model)
    (model / "config.json").unlink()
    assert f"no config.json in {model}" in error(model)


def test_weights_cut_short_name_the_file_and_both_sizes(model):
    file = model / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[:-100])
    msg = error(model)
    # an independent reading of the header: 8-byte length, JSON, the largest end offset
    n = struct.unpack("<Q", data[:8])[0]
    need = 8 + n + max(t["data_offsets"][1] for k, t in json.loads(data[8:8 + n]).items() if k != "__metadata__")
    assert need == len(data)
    assert f"{file} is cut short: {len(data) - 100} bytes, its header says {need}" in msg


@pytest.mark.parametrize("cut", [0, 5, 20])
def test_weights_cut_inside_the_header(model, cut):
    file = model / "model.safetensors"
    file.write_bytes(file.read_bytes()[:cut])
    msg = error(model)
    assert str(file) in msg and "cut short" in msg


def test_garbage_weights_and_no_weights(model):
    file = model / "model.safetensors"
    file.write_bytes(struct.pack("<Q", 10) + b"not json!!" + b"\0" * 100)
    assert "unreadable safetensors header" in error(model)
    file.unlink()
    assert "no weights in" in error(model)


def test_a_sharded_model_names_a_missing_shard(model):
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert "model-00002-of-00002.safetensors, listed in model.safetensors.index.json, is missing" in error(model)


def test_a_cut_pytorch_bin_is_not_a_zip(model, tmp_path):
    (model / "model.safetensors").unlink()
    good = tmp_path / "x.zip"
    with zipfile.ZipFile(good, "w") as z:
        z.writestr("archive/data.pkl", b"x" * 1000)
    (model / "pytorch_model.bin").write_bytes(good.read_bytes()[:-30])
    assert "pytorch_model.bin is not a readable torch checkpoint" in error(model)


def test_no_tokenizer(model):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    assert "no tokenizer" in error(model) and "tokenizer.save_pretrained" in error(model)
    assert check_model_dir(model, tokenizer=False) == model


def test_check_safetensors_alone(model):
    check_safetensors(model / "model.safetensors")
    (model / "model.safetensors").write_bytes(b"\xff" * 8)
    with pytest.raises(ModelDirError, match="cut short or not a safetensors file"):
        check_safetensors(model / "model.safetensors")


def test_a_pickled_payload_is_refused_with_a_clear_error(model, tmp_path):
    """Issue #40, row 10: before, the load failed later with torch's raw UnpicklingError, whose text advises
    weights_only=False (running the payload). Now check_model_dir names the file and what it names; nothing runs."""
    import os

    import torch

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (model / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(2), "x": Payload()}, model / "pytorch_model.bin")
    msg = error(model)
    assert "pytorch_model.bin is a pickle that names" in msg and "system" in msg and "weights_only" not in msg
    assert not marker.exists()
    torch.save({"w": torch.zeros(2)}, model / "pytorch_model.bin")  # tensors only: fine
    assert check_model_dir(model) == model
