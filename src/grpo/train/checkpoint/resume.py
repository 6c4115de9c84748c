"""Resuming a run (`grpo train ... --resume`): the newest committed checkpoint of the run directory restores the
model, optimizers, schedules, RNG states, data position and step; settings that would change what a step means
(INCOMPATIBLE) are refused; half-written metrics lines are dropped. train/loop.py calls `resume` and `checkpointed`.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import yaml

from grpo.config import ConfigError, build_config, flat_dict
from grpo.errors import RunDirError
from grpo.parallel import checkpoint_views
from grpo.train.checkpoint.load import latest_checkpoint, load_checkpoint
from grpo.train.checkpoint.rng_state import restore_rng_state

__all__ = ["INCOMPATIBLE", "check_resume_config", "checkpointed", "claim_run_dir", "load_run_config",
           "newest_committed", "take_run_dir",
           "repair_jsonl", "resume_command", "resume_from_checkpoint"]

# Changing these between a checkpoint and its resume would change what a step means (or the data order, or the
# reference model of the built-in model; model.frozen_dtype: a LoRA base rounded to bf16 or not, which the memory
# plan may choose by itself; optim.name: the optimizer state's format): refuse. Every other change is allowed and
# printed.
INCOMPATIBLE = ["model.name", "model.frozen_dtype", "optim.name", "rollout.group_size", "rollout.prompts_per_step",
                "data.task", "data.difficulty", "data.path", "data.train_size", "data.filter_long_prompts",
                "algo.advantage", "algo.epochs", "train.seed", "warmup.steps", "warmup.batch_size", "warmup.lr",
                "warmup.seed"]


def check_resume_config(saved: dict, current: dict, printer) -> None:
    """Refuse (ConfigError naming the fields) if an INCOMPATIBLE setting changed; print the other changes. A setting
    the saved config lacks (written before the setting existed) counts as its default."""
    try:
        saved = build_config(saved).to_dict()
    except Exception:  # noqa: BLE001 - a config this version no longer accepts is compared as it was written
        pass
    old, new = flat_dict(saved), flat_dict(current)
    bad = [k for k in INCOMPATIBLE if old.get(k) != new.get(k)]
    if bad:
        raise ConfigError("cannot resume: these settings differ from the checkpoint's run: " + ", ".join(
            f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in bad) + "; start a new run (another --output-dir) "
            "or resume with the original values")
    changed = [k for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
    if changed:
        printer("[grpo] resuming with changed settings: " + ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})"
                                                                         for k in changed), soft_wrap=True)
    if "train.steps" in changed and new.get("optim.schedule") != "constant":
        printer(f"[grpo] note: train.steps changed, so the {new.get('optim.schedule')} learning-rate schedule "
                "is stretched to the new length from here on")


def resume_command(run_dir: Path) -> str:
    return (f"grpo train {shlex.quote(str(run_dir / 'config.yaml'))} --output-dir {shlex.quote(str(run_dir))} "
            "--resume")


def claim_run_dir(run_dir: Path, resume: bool, overwrite: bool = False) -> None:
    """The run directory's owner rule, checked before any model loads (read only: `take_run_dir` moves aside).

    A new run needs an empty or missing directory; with --overwrite, whatever is there is moved aside (never
    deleted); --resume needs a committed, intact checkpoint there and never starts over in place. Raises RunDirError
    (exit 2) naming what the directory holds and the flag to use."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirError("--resume continues the run in --output-dir and --overwrite moves it aside: pass one of them")
    held = _holds(run_dir)
    if resume:
        if latest_checkpoint(run_dir) is None:  # logs each damaged checkpoint it skips
            raise RunDirError(f"--resume: {run_dir} has no intact committed checkpoint to resume from ({held}). A "
                              "resume never starts over in place: drop --resume to start a new run in a new "
                              "--output-dir, or pass the directory of the run to continue")
        return
    if held != "nothing" and not overwrite:
        newest = newest_committed(run_dir)
        hint = (f"add --resume to continue that run (newest checkpoint {newest.name}), " if newest is not None
                else "")
        raise RunDirError(f"{run_dir} is not empty (it holds {held}); a new run never writes over another: {hint}"
                          f"pass a new --output-dir, or add --overwrite to move its contents aside to "
                          f"{run_dir.name}.old-<time> (nothing is deleted)")


def take_run_dir(run_dir: Path, overwrite: bool, out) -> None:
    """--overwrite: move a non-empty run directory aside to <name>.old-<time> and start with an empty one."""
    run_dir = Path(run_dir)
    if overwrite and _holds(run_dir) != "nothing":
        aside = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        os.rename(run_dir, aside)
        out(f"[grpo] --overwrite: moved the earlier contents of {run_dir} aside to {aside}", soft_wrap=True)
    run_dir.mkdir(parents=True, exist_ok=True)


def _holds(run_dir: Path) -> str:
    """What a directory holds, for a message: 'nothing', or its first entries (checkpoints named)."""
    if not run_dir.exists():
        return "nothing"
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a run directory")
    names = sorted(p.name for p in run_dir.iterdir())
    if not names:
        return "nothing"
    ckpts = (sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) if (run_dir / "checkpoints").is_dir()
             else [])
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} entries)" if len(names) > 8 else "")
    return shown + (f"; checkpoints {', '.join(ckpts[-3:])}" if ckpts else "")


def newest_committed(run_dir: Path) -> Path | None:
    found = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / "COMMITTED").is_file())
    return found[-1] if found else None


def disk_full_note(run_dir: Path) -> str:
    """What a full disk during a run leaves to resume from, for its DiskFullError: the last committed checkpoint
    (intact) and the command that finishes the run once space is freed."""
    last = newest_committed(Path(run_dir))
    if last is not None:
        return (f"The last committed checkpoint is intact: {last}; free space, then finish the run with: "
                f"{resume_command(Path(run_dir))}")
    return (f"No checkpoint was committed yet (nothing to --resume from): free space, then start the run again "
            f"(with --overwrite if {run_dir} holds its files)")


def repair_jsonl(path: Path, out) -> None:
    """Drop lines a kill left half-written (not valid JSON), so the resume can read the file."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    good = []
    for line in lines:
        try:
            json.loads(line)
            good.append(line)
        except ValueError:
            pass
    if len(good) != len([x for x in lines if x.strip()]):
        out(f"[grpo] warning: dropped {len(lines) - len(good)} unreadable line(s) of {path} (a write was cut off)")
        path.write_text("".join(x + "\n" for x in good), encoding="utf-8")


def checkpointed(trainer, policy_optimizer) -> tuple[dict, dict, dict | None]:
    """The optimizers, schedules and extra models a checkpoint holds, by name: the policy's (`policy_optimizer`: its
    checkpoint view, parallel/), and the critic's ("value") for PPO. Save and resume both read this one list."""
    optimizers, schedulers, extra_models = {"policy": policy_optimizer}, {"policy": trainer.scheduler}, None
    if trainer.critic is not None:
        optimizers["value"], schedulers["value"] = trainer.critic.optimizer, trainer.critic.scheduler
        extra_models = {"value": trainer.critic.model}
    return optimizers, schedulers, extra_models


def resume_from_checkpoint(trainer, out) -> dict:
    """Restore everything from the newest committed checkpoint; returns the saved extra state ({} if none)."""
    path = latest_checkpoint(trainer.run_dir)  # logs a warning for each partial or corrupt directory it skips
    if path is None:  # claim_run_dir refused this already; an API caller gets the same refusal, never a restart
        claim_run_dir(trainer.run_dir, resume=True)
    ckpt = load_checkpoint(path)
    state = ckpt.trainer_state
    saved_cfg = state.get("config")
    if saved_cfg is None:  # written by an older version: the run directory's config.yaml
        saved_cfg = yaml.safe_load((trainer.run_dir / "config.yaml").read_text())
    check_resume_config(saved_cfg, trainer.cfg.to_dict(), out)
    model, optimizer = checkpoint_views(trainer.policy, trainer.optimizer, trainer.dist, for_save=False)
    ckpt.load_model_into(model)
    optimizers, schedulers, extra_models = checkpointed(trainer, optimizer)
    if extra_models:
        ckpt.load_extra_models(extra_models)
    ckpt.load_optimizers(optimizers)
    ckpt.load_schedulers(schedulers)
    trainer.stream.load_state_dict(state["stream"])
    trainer.step_count = state["step"]
    restore_rng_state(ckpt.rng_state)  # last: nothing after this may draw from an RNG before the next step
    out(f"[grpo] resumed from {path} (step {trainer.step_count})", soft_wrap=True)
    return state


def load_run_config(run_dir):
    return build_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
