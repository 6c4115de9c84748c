"""log.trackers: a real (tiny, 2-step) run logs to TensorBoard, W&B (offline), trackio (local database) and MLflow
(local SQLite store) at once, with no network; each store is read back with its own reader and holds every numeric
value of every metrics.jsonl row at its step (step 0's accuracy before training included), the config, and the
summary. A missing package is one ConfigError naming the extra, before any tracker has started."""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import grpo
from grpo.config import ConfigError, load_config
from grpo.tracking.trackers import EXTRAS, open_trackers, tracker_names

SRC = str(Path(grpo.__file__).resolve().parents[1])
NAMES = ["tensorboard", "wandb", "trackio", "mlflow"]
TINY = ["warmup.steps=0", "train.steps=2", "train.eval_every=1", "eval.n=4", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_new_tokens=4", "data.train_size=20", "log.plots=false",
        "log.progress=false", "train.preflight=off", "log.project=grpo-test"]


def test_tracker_names_and_the_tensorboard_flag():
    assert tracker_names(load_config(None, ["log.trackers=[mlflow, wandb, mlflow]"]).log) == ["mlflow", "wandb"]
    assert tracker_names(load_config(None, ["log.tensorboard=true", "log.trackers=[wandb]"]).log) == [
        "tensorboard", "wandb"]
    with pytest.raises(ConfigError, match="log.trackers.0"):
        load_config(None, ["log.trackers=[neptune]"])


@pytest.mark.parametrize("name", NAMES)
def test_a_missing_package_is_one_error_naming_the_extra(name, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, EXTRAS[name][0], None)  # `import X` now raises ImportError
    cfg = load_config(None, [f"log.trackers=[{'wandb' if name == 'tensorboard' else 'tensorboard'}, {name}]"])
    with pytest.raises(ConfigError, match=rf"log.trackers includes '{name}', but the `{EXTRAS[name][0]}` package is "
                                          rf"not installed .*pip install 'grpo\[{EXTRAS[name][1]}\]'"):
        open_trackers(cfg, tmp_path)
    assert list(tmp_path.iterdir()) == []  # checked before any tracker started a run
    assert open_trackers(cfg, tmp_path, enabled=False).trackers == []  # other ranks open none


# ----------------------------------------------------------------------------------------------- readers
def wandb_records(path: Path) -> list:
    """The records of a W&B .wandb file: a 7-byte header, then LevelDB-log framing (32 KiB blocks; each piece has
    crc32 (4), length (2, little-endian), type (1: full, 2: first, 3: middle, 4: last)) around protobuf Records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, out, buf = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def wandb_read(run_dir: Path) -> tuple[dict, dict, dict]:
    """(history {step: {key: value}}, summary {key: value}, config {key: value}) of the run's offline W&B run."""
    [path] = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, summary, config = {}, {}, {}
    for rec in wandb_records(Path(path)):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history[items["_step"]] = items
        elif kind == "summary":
            summary |= {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update}
        elif kind == "run":
            config |= {i.key: json.loads(i.value_json) for i in rec.run.config.update}
    return history, summary, config


def tensorboard_read(run_dir: Path) -> tuple[dict, str, str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    text = {tag: acc.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"]}
    return scalars, text.get("config/text_summary", ""), text.get("summary/text_summary", "")


def numeric(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


@pytest.mark.slow
def test_every_tracker_gets_every_metric_the_config_and_the_summary(tmp_path):
    pytest.importorskip("tensorboard", reason="the dev extra installs tensorboard: pip install -e '.[dev]'")
    for name in ("wandb", "trackio", "mlflow"):
        pytest.importorskip(name, reason=f"the dev extra installs {name}: pip install -e '.[dev]'")
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_"))}
    env |= {"PYTHONPATH": SRC, "GRPO_CACHE": str(tmp_path / "cache"), "TRACKIO_DIR": str(tmp_path / "trackio"),
            "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
            "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "grpo.cli", "train", *TINY, f"log.trackers=[{', '.join(NAMES)}]",
                           "--output-dir", str(run), "--quiet"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    config = load_config(run / "config.yaml").to_dict()
    assert [r["step"] for r in rows] == [0, 1, 2] and set(numeric(rows[0])) == {"eval/accuracy", "eval/val_accuracy"}

    scalars, tb_config, tb_summary = tensorboard_read(run)
    history, wb_summary, wb_config = wandb_read(run)
    db = sqlite3.connect(tmp_path / "trackio" / "grpo-test.db")
    tk_rows: dict[int, dict] = {}
    for step, m in db.execute("select step, metrics from metrics where run_name = ?", (run.name,)):
        tk_rows.setdefault(step, {}).update(json.loads(m))  # the summary is a second row at the last step
    [tk_config] = [json.loads(c) for (c,) in db.execute("select config from configs where run_name = ?", (run.name,))]
    from mlflow import MlflowClient

    ml = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    [ml_run] = ml.search_runs([ml.get_experiment_by_name("grpo-test").experiment_id])

    for row in rows:
        step = row["step"]
        for key, value in numeric(row).items():
            assert scalars[key][step] == pytest.approx(value, rel=1e-6, abs=1e-7), ("tensorboard", key, step)
            assert history[step][key] == pytest.approx(value, rel=1e-9), ("wandb", key, step)
            assert tk_rows[step][key] == pytest.approx(value, rel=1e-9), ("trackio", key, step)
            got = {m.step: m.value for m in ml.get_metric_history(ml_run.info.run_id, key)}
            assert got[step] == pytest.approx(value, rel=1e-9), ("mlflow", key, step)
    # the config
    assert "lr: 0.0001" in tb_config and f"name: {config['model']['name']}" in tb_config
    assert wb_config["rollout"] == config["rollout"] and tk_config["optim"] == config["optim"]
    assert ml_run.data.params["rollout.group_size"] == "2" and ml_run.data.params["train.steps"] == "2"
    # the summary
    after = summary["eval/accuracy_after"]
    assert f"eval/accuracy_after: {after}" in tb_summary and scalars["summary/eval/accuracy_after"][2] == after
    assert wb_summary["eval/accuracy_after"] == after and wb_summary["eval/best_step"] == summary["eval/best_step"]
    assert tk_rows[2]["summary/eval/accuracy_after"] == after
    assert ml_run.data.metrics["summary/eval/accuracy_after"] == after
    art = Path(ml.download_artifacts(ml_run.info.run_id, "summary.json", str(tmp_path / "dl")))
    assert json.loads(art.read_text())["steps"] == 2
    assert ml_run.info.status == "FINISHED"
