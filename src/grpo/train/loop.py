"""The whole run around `Trainer.step()`: evaluation before/during/after, metrics and samples, health
warnings, checkpoints (atomic) and resume, preemption, the non-finite guard, final model, summary and plots.
Everything written here follows DESIGN.md's run-directory contract; docs/reliability.md lists the faults.

- Resume (`--resume`): the newest committed checkpoint of the run directory (partial ones are skipped with a
  warning) restores model, optimizer, scheduler, RNG states, data position, step, the non-finite streak and the
  health monitor, so the run continues bitwise as if never stopped. Changing a setting that changes what a step
  means (INCOMPATIBLE) is refused with a ConfigError naming the fields; other changes are printed.
- Preemption: SIGTERM/SIGINT finish the current step, then a committed checkpoint is written, the resume command
  is printed, and `run_training` raises `grpo.errors.Preempted` (the CLI exits 130 / 143). A second Ctrl-C aborts
  at once.
- Rewards that give no value (grpo.train.guards): `reward.max_missing_steps` steps in a row without any value from
  a weighted reward function save a checkpoint and raise RewardsMissing (a HealthGuardError: exit code 3).
- Non-finite guard: a step whose loss or gradient norm is NaN/inf is skipped by `policy_update`; here it is
  counted and the batch's prompt uids printed, and `train.max_nan_steps` consecutive ones raise NonFiniteError.
- A failed checkpoint save (disk full) raises CheckpointError naming the previous, intact checkpoint, or with
  `train.on_save_error=continue` a failed periodic save is a warning and training goes on.
"""

from __future__ import annotations

import json
import logging
import math
import shlex
import time
from pathlib import Path

import torch
import yaml

from grpo.config import ConfigError, build_config, flat_dict
from grpo.errors import HealthGuardError, Preempted
from grpo.parallel import NullWriter, SyncedGuard, barrier, checkpoint_views, full_state_dict, is_main
from grpo.tracking.clock import RunClock
from grpo.tracking.console import RunConsole
from grpo.tracking.health import HealthMonitor
from grpo.tracking.metrics import JsonlWriter, write_json_atomic
from grpo.tracking.trackers import Trackers, open_trackers
from grpo.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from grpo.train.guards import RewardGuard
from grpo.train.preemption import PreemptionGuard

log = logging.getLogger("grpo.train")

# Changing these between a checkpoint and its resume would change what a step means (or the data order, or the
# reference model of the built-in model): refuse. Every other change is allowed and printed.
INCOMPATIBLE = ["model.name", "rollout.group_size", "rollout.prompts_per_step", "data.task", "data.difficulty",
                "data.path", "data.train_size", "data.filter_long_prompts", "algo.advantage", "algo.epochs",
                "train.seed", "warmup.steps", "warmup.batch_size", "warmup.lr", "warmup.seed"]


class NonFiniteError(HealthGuardError):
    """Too many consecutive steps had a non-finite loss or gradient."""


def check_resume_config(saved: dict, current: dict, printer) -> None:
    """Refuse (ConfigError naming the fields) if an INCOMPATIBLE setting changed; print the other changes."""
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


def _has_committed(run_dir: Path) -> Path | None:
    found = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if (p / "COMMITTED").is_file())
    return found[-1] if found else None


def _repair_jsonl(path: Path, out) -> None:
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


def _resume(trainer, out) -> dict:
    """Restore everything from the newest committed checkpoint; returns the saved extra state ({} if none)."""
    path = latest_checkpoint(trainer.run_dir)  # logs a warning for each partial or corrupt directory it skips
    if path is None:
        out(f"[grpo] --resume: no committed checkpoint in {trainer.run_dir}/checkpoints; starting from step 0")
        return {}
    ckpt = load_checkpoint(path)
    state = ckpt.trainer_state
    saved_cfg = state.get("config")
    if saved_cfg is None:  # written by an older version: the run directory's config.yaml
        saved_cfg = yaml.safe_load((trainer.run_dir / "config.yaml").read_text())
    check_resume_config(saved_cfg, trainer.cfg.to_dict(), out)
    model, optimizer = checkpoint_views(trainer.policy, trainer.optimizer, trainer.dist, for_save=False)
    ckpt.load_model_into(model)
    optimizers, schedulers = {"policy": optimizer}, {"policy": trainer.scheduler}
    if trainer.critic is not None:
        ckpt.load_extra_models({"value": trainer.critic.model})
        optimizers["value"], schedulers["value"] = trainer.critic.optimizer, trainer.critic.scheduler
    ckpt.load_optimizers(optimizers)
    ckpt.load_schedulers(schedulers)
    trainer.stream.load_state_dict(state["stream"])
    trainer.step_count = state["step"]
    restore_rng_state(ckpt.rng_state)  # last: nothing after this may draw from an RNG before the next step
    out(f"[grpo] resumed from {path} (step {trainer.step_count})", soft_wrap=True)
    return state


def _evaluate(trainer, progress=None) -> float:
    """Held-out accuracy, without touching the training RNG streams: whether and how often the run evaluates never
    changes what it trains on (and a resume that skips an evaluation stays exact)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        return trainer.evaluate(progress=progress)["accuracy"]


def _log_samples(trainer, writer: JsonlWriter, step: int, printer: RunConsole | None) -> None:
    cfg, r = trainer.cfg, trainer.last_rollouts
    G, total, adv = r.group_size, trainer.last_scores.total.tolist(), trainer.last_adv.tolist()
    show = cfg.log.print_group_every and step % cfg.log.print_group_every == 0
    for g in range(min(cfg.log.sample_groups if not show else max(cfg.log.sample_groups, 1), len(r.prompts))):
        rows = range(g * G, (g + 1) * G)
        rewards = [total[i] for i in rows]
        present = torch.tensor([x for x in rewards if not math.isnan(x)])
        mean = float(present.mean()) if present.numel() else float("nan")
        std = float(present.std(correction=0)) if present.numel() else float("nan")
        record = {"step": step, "prompt": r.prompts[g].text, "answer": r.prompts[g].answer,
                  "completions": [r.texts[i] for i in rows], "rewards": rewards,
                  "advantages": [adv[i] for i in rows], "reward_mean": mean, "reward_std": std}
        if r.episodes is not None:  # multi-turn: each episode's turns, marked policy or environment (their role)
            record["episodes"] = [r.episodes[i] for i in rows]
        writer.write(record)
        if show and g == 0 and printer is not None:
            printer.print_group(step, record["prompt"], record["completions"], rewards, record["advantages"], mean, std)


class _Run:
    """The state of one `run_training` call (one process's part of a run)."""

    def __init__(self, trainer, con: RunConsole, guard: PreemptionGuard, state: dict):
        self.trainer, self.cfg, self.run_dir, self.con, self.out, self.guard = (
            trainer, trainer.cfg, trainer.run_dir, con, con.print, guard)
        self.start_step = trainer.step_count
        self.t_start = time.time() - getattr(trainer, "setup_s", 0.0)  # the wall time includes the model load
        self.clock = RunClock(state.get("times"))  # summary.json's time/* parts
        self.clock.add("model", getattr(trainer, "model_s", 0.0))
        self.wall_before = state.get("wall_s", 0.0)
        self.acc_before, self.accuracy = state.get("accuracy_before"), state.get("accuracy")
        self.skipped_total, self.nan_streak = state.get("skipped_steps", 0), state.get("nan_streak", 0)
        self.last_saved = trainer.step_count if state else None  # resumed: that step's checkpoint exists
        self.health = HealthMonitor(data_file=self.cfg.data.path is not None)
        h = state.get("health", {})
        self.health._fired, self.health._streak = set(h.get("fired", [])), dict(h.get("streak", {}))
        self.health._rewards = list(h.get("rewards", []))
        specs = getattr(getattr(trainer, "rewards", None), "specs", [])
        self.reward_guard = RewardGuard({s.name: s.weight for s in specs}, self.cfg.reward.max_missing_steps,
                                        state.get("reward_guard"))
        self.best = state.get("best")  # {"step", "accuracy"}: the best held-out accuracy so far (step 0 = before)
        self.trackers = Trackers([])

    def state(self) -> dict:
        h = self.health
        return {"accuracy_before": self.acc_before, "accuracy": self.accuracy, "skipped_steps": self.skipped_total,
                "nan_streak": self.nan_streak, "wall_s": self.wall_before + time.time() - self.t_start,
                "times": self.clock.state(),
                "config": self.cfg.to_dict(), "best": self.best,
                "health": {"fired": sorted(h._fired), "streak": h._streak, "rewards": h._rewards[-h.flat_window:]},
                "reward_guard": self.reward_guard.state_dict()}

    def evaluate(self) -> float:
        """Held-out accuracy, timed (time/eval_s) and with progress."""
        with self.clock.time("eval"), self.con.phase("evaluating", len(self.trainer.eval_prompts), "problems") as ph:
            return _evaluate(self.trainer, ph.update)

    # ------------------------------------------------------------------ checkpoints
    def save(self, why: str) -> Path | None:
        with self.clock.time("save"):
            return self._save(why)

    def _save(self, why: str) -> Path | None:
        """Save a committed checkpoint of the current step (once). why: periodic | final | preempted."""
        trainer = self.trainer
        if self.last_saved == trainer.step_count:
            return _has_committed(self.run_dir)
        model, optimizer = checkpoint_views(trainer.policy, trainer.optimizer, trainer.dist, for_save=True)
        optimizers, schedulers, extra_models = {"policy": optimizer}, {"policy": trainer.scheduler}, None
        if trainer.critic is not None:
            optimizers["value"], schedulers["value"] = trainer.critic.optimizer, trainer.critic.scheduler
            extra_models = {"value": trainer.critic.model}
        state = {"step": trainer.step_count, "stream": trainer.stream.state_dict(), **self.state()}
        try:
            path = save_checkpoint(self.run_dir, trainer.step_count, model=model,
                                   tokenizer=trainer.tokenizer, optimizers=optimizers, schedulers=schedulers,
                                   extra_models=extra_models, trainer_state=state,
                                   keep_last=self.cfg.train.keep_checkpoints) if is_main() else None
        except CheckpointError as e:
            previous = _has_committed(self.run_dir)
            msg = (f"the {why} checkpoint save at step {trainer.step_count} failed: {e.__cause__ or e}. "
                   f"The previous checkpoint is intact: {previous or 'none (no committed checkpoint yet)'}")
            if why == "periodic" and self.cfg.train.on_save_error == "continue":
                self.out(f"[grpo] warning: {msg}; training continues (train.on_save_error=continue)", soft_wrap=True)
                return None
            self.out(f"[grpo] error: {msg}", soft_wrap=True)
            raise CheckpointError(msg) from e
        finally:
            barrier()  # several processes: the others wait for rank 0's checkpoint
        self.last_saved = trainer.step_count
        return path

    # ------------------------------------------------------------------ one step
    def note_accuracy(self, step: int, accuracy: float) -> None:
        """Keep checkpoints/best/ (grpo.train.best) when `accuracy` beats every earlier evaluation."""
        if self.best is not None and accuracy <= self.best["accuracy"]:
            return
        self.best = {"step": step, "accuracy": accuracy}
        if step == 0:  # the starting model: model.name itself
            return
        from grpo.models.lora import unwrap
        from grpo.train.best import save_best

        trainer = self.trainer
        gathered = full_state_dict(trainer.policy, trainer.dist)  # FSDP: every rank takes part; else None
        if is_main():
            save_best(unwrap(trainer.policy), trainer.tokenizer, self.run_dir, step, accuracy,
                      merged=self.cfg.model.save_merged, state_dict=gathered)
        barrier()

    def step(self, metrics_file: JsonlWriter, samples_file: JsonlWriter, tb=None) -> None:
        trainer, cfg = self.trainer, self.cfg
        with self.clock.time("rl_steps"):
            metrics = trainer.step()
        step = trainer.step_count
        uids = [p.uid for p in trainer.last_rollouts.prompts]
        if metrics["train/skipped_updates"] > 0:
            self.nan_streak, self.skipped_total = self.nan_streak + 1, self.skipped_total + 1
            self.out(f"[grpo] step {step}: non-finite loss or gradient norm, the update was skipped "
                     f"({self.nan_streak} in a row, {self.skipped_total} in this run; batch prompts "
                     f"{uids[:16]}{' ...' if len(uids) > 16 else ''})", soft_wrap=True)
        else:
            self.nan_streak = 0
        metrics["train/skipped_steps"] = float(self.skipped_total)
        evaluate = (cfg.train.eval_every and step % cfg.train.eval_every == 0) or step == cfg.train.steps
        if evaluate and not self.guard.requested:  # a stop request skips the evaluation, saving time
            self.accuracy = metrics["eval/accuracy"] = self.evaluate()
            self.note_accuracy(step, self.accuracy)
        metrics_file.write({"step": step, **metrics})
        self.trackers.log({"step": step, **metrics})
        _log_samples(trainer, samples_file, step, self.con)
        for warning in self.health.observe(metrics):
            self.out(f"[grpo] warning: {warning}")
        self.con.update(step, metrics, self.accuracy)
        stop, warnings = self.reward_guard.observe(step, metrics)  # rewards that give no value (guards.py)
        for warning in warnings:
            self.out(f"[grpo] warning: {warning}", soft_wrap=True)
        if stop is not None:
            raise self.unhealthy(stop)
        if self.nan_streak >= cfg.train.max_nan_steps:
            raise NonFiniteError(f"{self.nan_streak} consecutive steps (the last is step {step}) had a non-finite "
                                 f"loss or gradient norm (train.max_nan_steps={cfg.train.max_nan_steps}); last batch "
                                 f"prompts {uids[:16]}. Lower optim.lr, check the rewards and the data, then resume "
                                 f"from the last checkpoint: {resume_command(self.run_dir)}")
        if (cfg.train.save_every and step % cfg.train.save_every == 0 and step < cfg.train.steps
                and not self.guard.requested):
            self.save("periodic")

    def unhealthy(self, err: HealthGuardError) -> HealthGuardError:
        """A health guard's error, after committing this step's checkpoint (to resume from once fixed)."""
        path = self.save("stopped")
        self.con.stop()
        return type(err)(f"{err}: {resume_command(self.run_dir)}" if path else str(err))

    def stop(self) -> dict:
        """After a stop request: save, print how to resume, return the preempted summary."""
        step = self.trainer.step_count
        path = self.save("preempted") if step > 0 else None
        self.con.stop()
        self.trackers.close()
        what = f"checkpoint {path} committed" if path else "nothing trained yet, nothing saved"
        self.out(f"[grpo] stopped by {self.guard.signal_name or 'a stop request'} at step {step}; {what}. "
                 f"Resume with: {resume_command(self.run_dir)}", soft_wrap=True)
        return {"preempted": True, "steps": step, "checkpoint": str(path) if path else None}


def run_training(trainer, resume: bool = False) -> dict:
    """Train until cfg.train.steps and write the run directory; returns summary.json's content. Raises Preempted
    (with .summary {"preempted": True, "steps", "checkpoint"}) after SIGTERM/SIGINT once the checkpoint is committed,
    and a HealthGuardError when a guard stops a run that cannot learn; neither writes final/ or summary.json."""
    cfg, run_dir = trainer.cfg, trainer.run_dir
    main = is_main()  # torchrun: rank 0 prints and writes files, the other ranks only compute
    con = RunConsole(cfg.train.steps, enabled=cfg.log.progress and main, console=None if main else _quiet())
    out = con.print
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume and (existing := _has_committed(run_dir)) is not None:
        raise ConfigError(f"the run directory {run_dir} already holds checkpoints of an earlier run (newest "
                          f"{existing.name}): add --resume to continue it, or pass another --output-dir")
    with PreemptionGuard() as local_guard:
        guard = SyncedGuard(local_guard, trainer.dist)  # every rank stops at the same step
        state = _resume(trainer, out) if resume else {}
        if main:
            (run_dir / "config.yaml").write_text(cfg.to_yaml())
        run = _Run(trainer, con, guard, state)
        for name in ("metrics.jsonl", "samples.jsonl") if main else ():
            _repair_jsonl(run_dir / name, out)
        metrics_file = JsonlWriter(run_dir / "metrics.jsonl", truncate_after_step=run.start_step) if main \
            else NullWriter()
        samples_file = JsonlWriter(run_dir / "samples.jsonl", truncate_after_step=run.start_step) if main \
            else NullWriter()
        run.trackers = open_trackers(cfg, run_dir, enabled=main)  # log.trackers (+ log.tensorboard)
        try:
            if run.acc_before is None:
                _preflight(trainer, out)  # train.preflight: a cheap check that the run can learn (RNG untouched)
                run.acc_before = run.evaluate()
                out(f"[grpo] held-out accuracy before training: {run.acc_before:.3f} on "
                    f"{len(trainer.eval_prompts)} problems")
                metrics_file.write({"step": 0, "eval/accuracy": run.acc_before})  # the curves start here
                run.trackers.log({"step": 0, "eval/accuracy": run.acc_before})
                run.note_accuracy(0, run.acc_before)
            con.start(run.start_step)
            while trainer.step_count < cfg.train.steps and not guard.requested:
                run.step(metrics_file, samples_file)
            if guard.requested:
                raise Preempted(run.stop(), guard.signal_name)
        except BaseException:
            run.trackers.close()  # a failure: close the trackers' runs (else _finish does, after the summary)
            raise
        finally:
            con.stop()
            metrics_file.close()
            samples_file.close()
        return _finish(run)


def _finish(run: _Run) -> dict:
    trainer, cfg, run_dir, con = run.trainer, run.cfg, run.run_dir, run.con
    if trainer.step_count > 0:
        run.save("final")
    final = run_dir / "final"
    from grpo.models.lora import save_final

    with run.clock.time("save"):
        gathered = full_state_dict(trainer.policy, trainer.dist)  # FSDP: every rank takes part; else None
        if is_main():
            final.mkdir(exist_ok=True)
            save_final(trainer.policy, final, merged=cfg.model.save_merged, state_dict=gathered)  # LoRA: adapter
            trainer.tokenizer.save_pretrained(final)
    if run.accuracy is None:
        run.accuracy = run.evaluate()
        run.note_accuracy(trainer.step_count, run.accuracy)
    state = run.state()
    summary = {"eval/accuracy_before": run.acc_before, "eval/accuracy_after": run.accuracy,
               "eval/n": len(trainer.eval_prompts), "steps": trainer.step_count, "wall_s": state["wall_s"],
               "skipped_steps": run.skipped_total, "preset": cfg.preset, "model": cfg.model.name,
               "task": cfg.data.task if cfg.data.path is None else cfg.data.path,
               "model_source": getattr(trainer, "model_source", None), **run.clock.summary(state["wall_s"])}
    if run.best is not None:  # the best evaluation (checkpoints/best/ unless it is step 0, the starting model)
        summary |= {"eval/best_step": run.best["step"], "eval/accuracy_best": run.best["accuracy"]}
    if not is_main():
        barrier()  # matches rank 0's barrier below
        return summary
    write_json_atomic(run_dir / "summary.json", summary)
    run.trackers.summary(summary)
    run.trackers.close()
    plot = None
    if cfg.log.plots:
        from grpo.tracking.plots import plot_run

        plot = plot_run(run_dir)[0]
    con.summary(summary, run_dir, plot)
    barrier()  # several processes: the others leave once rank 0 has written everything
    return summary


def _quiet():
    from rich.console import Console

    return Console(quiet=True)


def _preflight(trainer, out) -> None:
    """train.preflight (warn | stop | off): grpo.train.preflight before step 1 of a fresh run; its RNG use is undone."""
    mode = trainer.cfg.train.preflight
    if mode == "off":
        return
    from grpo.train.preflight import PreflightError, run_preflight

    report = run_preflight(trainer)
    for line in report.lines():
        out(line, soft_wrap=True)
    if report.fatal and mode == "stop":
        raise PreflightError("the preflight found that this run cannot learn (see the verdicts above); fix the "
                             "setting it names, or set train.preflight=warn to train anyway")


def load_run_config(run_dir):
    return build_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
