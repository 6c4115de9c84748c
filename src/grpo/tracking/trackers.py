"""Experiment trackers: `log.trackers=[tensorboard, wandb, trackio, mlflow]`.

metrics.jsonl stays the source of truth; each tracker gets the same rows (every key of every step, step 0's held-out
accuracy included), the resolved config once at the start, and summary.json's content at the end. Each is optional:
a tracker whose package is missing is one ConfigError naming the extra to install (`pip install 'grpo[wandb]'`).
Only rank 0 opens trackers (the loop passes `enabled=False` elsewhere).

Start-up problems are found in seconds, before the model loads (`check_trackers`, called by the Trainer): a missing
package, W&B online (WANDB_MODE=online) without an API key, an MLflow server (an http(s) MLFLOW_TRACKING_URI) that
does not answer within TRACKER_PROBE_S. A tracker that still fails to start is one ConfigError naming it.

Where each one writes, with no network:
- tensorboard: RUN_DIR/tensorboard/ (event files; the config and the summary as text).
- wandb: RUN_DIR/wandb/; offline unless WANDB_MODE is set (then `wandb sync RUN_DIR/wandb/offline-run-*` uploads).
- trackio: trackio's local database (TRACKIO_DIR, default ~/.cache/huggingface/trackio), project `log.project`,
  run named after the run directory; the summary is logged as `summary/<key>` at the last step.
- mlflow: MLFLOW_TRACKING_URI if set, else a local SQLite store RUN_DIR/mlflow.db with artifacts in
  RUN_DIR/mlartifacts/ (`mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`); the config is logged as
  params (dotted keys) and config.yaml, the summary as summary.json and `summary/<key>` metrics.
"""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path

from grpo.config import ConfigError, flat_dict

EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
          "trackio": ("trackio", "trackio"), "mlflow": ("mlflow", "mlflow")}  # name -> (module, extra)
TRACKER_PROBE_S = 5.0  # how long a tracking server may take to accept a connection at start-up


def _require(name: str):
    module, extra = EXTRAS[name]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"log.trackers includes {name!r}, but the `{module}` package is not installed "
                          f"({e}): pip install 'grpo[{extra}]'") from e




def _numbers(row: dict) -> dict[str, float]:
    """The finite numeric entries of a row (trackers take numbers; JSON nulls and strings are left out)."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardTracker:
    def __init__(self, run_dir: Path, config: dict, project: str):
        _require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        import yaml

        self.writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def log(self, row: dict, step: int) -> None:
        for k, v in _numbers(row).items():
            self.writer.add_scalar(k, v, step)

    def summary(self, summary: dict, step: int) -> None:
        for k, v in _numbers(summary).items():
            self.writer.add_scalar(f"summary/{k}", v, step)
        self.writer.add_text("summary", "\n".join(f"    {k}: {v}" for k, v in sorted(summary.items())), step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, config: dict, project: str):
        wandb = _require("wandb")
        self.run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), config=config,
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit="create_new")

    def log(self, row: dict, step: int) -> None:
        self.run.log(_numbers(row), step=step)

    def summary(self, summary: dict, step: int) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if v is not None})

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    def __init__(self, run_dir: Path, config: dict, project: str):
        self.trackio = _require("trackio")
        self.run = self.trackio.init(project=project, name=run_dir.name, config=config, auto_log_cpu=False,
                                     auto_log_gpu=False, embed=False)

    def log(self, row: dict, step: int) -> None:
        self.run.log(_numbers(row), step=step)

    def summary(self, summary: dict, step: int) -> None:
        self.run.log({f"summary/{k}": v for k, v in _numbers(summary).items()}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, run_dir: Path, config: dict, project: str):
        mlflow = self.mlflow = _require("mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            local = None if os.environ.get("MLFLOW_TRACKING_URI") else (run_dir / "mlartifacts").resolve().as_uri()
            experiment_id = self.client.create_experiment(project, artifact_location=local)
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        params = [mlflow.entities.Param(k, str(v)[:6000]) for k, v in flat_dict(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_dict(self.run_id, config, "config.yaml")

    def log(self, row: dict, step: int) -> None:
        import time

        now = int(time.time() * 1000)
        metrics = [self.mlflow.entities.Metric(k, v, now, step) for k, v in _numbers(row).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def summary(self, summary: dict, step: int) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")
        self.log({f"summary/{k}": v for k, v in summary.items()}, step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "trackio": TrackioTracker,
            "mlflow": MlflowTracker}


class Trackers:
    """Every configured tracker behind one object: `log(row)`, `summary(summary)`, `close()`."""

    def __init__(self, trackers: list):
        self.trackers = trackers
        self.last_step = 0

    def log(self, row: dict) -> None:
        """One metrics.jsonl row (it has a `step`)."""
        self.last_step = int(row["step"])
        for t in self.trackers:
            t.log(row, self.last_step)

    def summary(self, summary: dict) -> None:
        for t in self.trackers:
            t.summary(summary, self.last_step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()
        self.trackers = []


def tracker_names(log_cfg) -> list[str]:
    """log.trackers, with the older `log.tensorboard=true` meaning the same as naming tensorboard."""
    names = list(dict.fromkeys(log_cfg.trackers))
    if log_cfg.tensorboard and "tensorboard" not in names:
        names.insert(0, "tensorboard")
    return names


def check_trackers(cfg) -> None:
    """The start-up problems of cfg.log's trackers, in seconds and before any model loads: a missing package, W&B
    online without an API key, an MLflow server that does not answer. ConfigError naming the tracker and the fix."""
    names = tracker_names(cfg.log)
    for name in names:
        _require(name)
    if "wandb" in names:
        _check_wandb_key()
    if "mlflow" in names:
        _check_mlflow_server(os.environ.get("MLFLOW_TRACKING_URI", ""))


def _check_wandb_key() -> None:
    """W&B logs offline here unless WANDB_MODE says otherwise; online it needs a key (WANDB_API_KEY or the
    ~/.netrc entry `wandb login` writes)."""
    mode = os.environ.get("WANDB_MODE", "offline")
    if mode in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if netrc.netrc().authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise ConfigError(f"log.trackers includes wandb with WANDB_MODE={mode}, but there is no W&B API key "
                      f"(WANDB_API_KEY, or `wandb login` for {host}); log in, or unset WANDB_MODE to log offline "
                      "(`wandb sync` uploads later)")


def _check_mlflow_server(uri: str) -> None:
    """An http(s) MLFLOW_TRACKING_URI must accept a connection within TRACKER_PROBE_S (MLflow itself retries for
    minutes, then fails after the run's first evaluation)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(uri)
    if url.scheme not in ("http", "https") or not url.hostname:
        return
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=TRACKER_PROBE_S).close()
    except OSError as e:
        raise ConfigError(f"log.trackers includes mlflow, but MLFLOW_TRACKING_URI={uri} does not answer "
                          f"({e.strerror or e or 'timed out'} within {TRACKER_PROBE_S:.0f} s); start the server, or "
                          "unset MLFLOW_TRACKING_URI to log to RUN/mlflow.db") from None


def open_trackers(cfg, run_dir: Path, enabled: bool = True) -> Trackers:
    """Open the trackers of `cfg.log` for run_dir (none when `enabled` is False: the other ranks). The packages are
    checked first, so a missing one fails before any tracker has created a run."""
    names = tracker_names(cfg.log) if enabled else []
    for name in names:
        _require(name)
    opened: list = []
    try:
        for name in names:
            try:
                opened.append(TRACKERS[name](Path(run_dir), cfg.to_dict(), cfg.log.project))
            except (ConfigError, KeyboardInterrupt):
                raise
            except Exception as e:  # the tracker's own start-up error (a login, a server): one message naming it
                raise ConfigError(f"log.trackers: {name} could not start ({type(e).__name__}: {e}); fix that, or "
                                  f"leave {name} out of log.trackers") from e
    except BaseException:
        Trackers(opened).close()
        raise
    return Trackers(opened)
