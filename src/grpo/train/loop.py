"""The whole run around `Trainer.step()`: evaluation before/during/after, metrics and samples, health
warnings, checkpoints (atomic) and resume, preemption, the non-finite guard, final model, summary and plots.
Everything written here follows DESIGN.md's run-directory contract; docs/reliability.md lists the faults.

- Resume (`--resume`, train/checkpoint/resume.py): the newest committed checkpoint of the run directory (partial ones
  are skipped with a warning) restores model, optimizer, scheduler, RNG states, data position, step, the non-finite
  streak and the health monitor and reward guard (their state_dict()), so the run continues bitwise as if never
  stopped. Changing a setting that changes what a step means (INCOMPATIBLE) is refused with a ConfigError naming
  the fields; other changes are printed.
- Preemption: SIGTERM/SIGINT finish the current step, then a committed checkpoint is written, the resume command
  is printed, and `run_training` raises `grpo.errors.Preempted` (the CLI exits 130 / 143). A second Ctrl-C aborts
  at once.
- Rewards that give no value (grpo.train.guards): `reward.max_missing_steps` steps in a row without any value from
  a weighted reward function save a checkpoint and raise RewardsMissing (a HealthGuardError: exit code 3).
- Non-finite guard: a step whose loss or gradient norm is NaN/inf is skipped by `policy_update`; here it is
  counted and the batch's prompt uids printed, and `train.max_nan_steps` consecutive ones raise NonFiniteError.
  Weights a step made NaN/inf (found by a save or the next generation) raise WeightsDiverged (train/diverged.py).
- A failed checkpoint save (disk full) raises CheckpointError naming the previous, intact checkpoint, or with
  `train.on_save_error=continue` a failed periodic save is a warning and training goes on.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from grpo.errors import HealthGuardError, Preempted, RolloutWorkerError
from grpo.parallel import NullWriter, SyncedGuard, barrier, checkpoint_views, full_state_dict, is_main
from grpo.rewards.runner import reward_mean_std
from grpo.tracking.clock import RunClock
from grpo.tracking.console import SMALL_N, RunConsole, accuracy_text
from grpo.tracking.health import HealthMonitor
from grpo.tracking.metrics import JsonlWriter, write_json_atomic
from grpo.tracking.rundir import write_text_atomic
from grpo.tracking.trackers import Trackers, open_trackers
from grpo.train.checkpoint import CheckpointError, save_checkpoint
from grpo.train.guards import RewardGuard, ZeroSpreadGuard
from grpo.train.preflight import cannot_learn_hint
from grpo.train.checkpoint.preemption import PreemptionGuard
from grpo.train.diverged import blamed_on_training, refuse_nonfinite
from grpo.train.checkpoint.resume import (  # noqa: F401 (INCOMPATIBLE, check_resume_config: re-exported)
    INCOMPATIBLE,
    check_resume_config,
    checkpointed,
    claim_run_dir,
    newest_committed,
    repair_jsonl,
    resume_from_checkpoint,
    resume_command,
    take_run_dir,
)
from grpo.train.step_result import StepResult

log = logging.getLogger("grpo.train")

# summary.json names the split behind each accuracy (docs/reliability.md): choose on validation, report on test
SUMMARY_SPLITS = {"eval/accuracy_before": "test", "eval/accuracy_after": "test",
                  "eval/accuracy_best": "test (the model chosen on validation)", "eval/val_accuracy_best": "validation",
                  "eval/best_step": "chosen on validation"}


class NonFiniteError(HealthGuardError):
    """Too many consecutive steps had a non-finite loss or gradient."""


def _evaluate(trainer, progress=None, split: str = "test") -> float:
    """Accuracy on the test or validation problems, without touching the training RNG streams: whether and how
    often the run evaluates never changes what it trains on (and a resume that skips an evaluation stays exact)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        return trainer.evaluate(progress=progress, split=split)["accuracy"]


def _log_samples(cfg, result: StepResult, writer: JsonlWriter, step: int, printer: RunConsole | None) -> None:
    """samples.jsonl: the first log.sample_groups groups of the step (and one printed every log.print_group_every)."""
    r = result.rollouts
    G, total, adv = r.group_size, result.scores.total.tolist(), result.advantages.tolist()
    show = cfg.log.print_group_every and step % cfg.log.print_group_every == 0
    for g in range(min(cfg.log.sample_groups if not show else max(cfg.log.sample_groups, 1), len(r.prompts))):
        rows = range(g * G, (g + 1) * G)
        rewards = [total[i] for i in rows]
        mean, std = reward_mean_std(result.scores.total[g * G:(g + 1) * G])
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
        self.clock = RunClock(state.get("times"))  # summary.json's time/* parts, carried on from the checkpoint
        self.clock.add("model", getattr(trainer, "model_s", 0.0))
        self.wall_before = state.get("wall_s", 0.0)
        # test accuracy before and after training (the reported result); validation accuracy, the latest (for choosing)
        self.acc_before, self.acc_after = state.get("accuracy_before"), state.get("accuracy_after")
        self.accuracy = state.get("val_accuracy")
        self.skipped_total, self.nan_streak = state.get("skipped_steps", 0), state.get("nan_streak", 0)
        self.last_saved = trainer.step_count if state else None  # resumed: that step's checkpoint exists
        self.health = HealthMonitor(data_file=self.cfg.data.path is not None)
        self.health.load_state_dict(state.get("health", {}))
        specs = getattr(getattr(trainer, "rewards", None), "specs", [])
        self.reward_guard = RewardGuard({s.name: s.weight for s in specs}, self.cfg.reward.max_missing_steps,
                                        state.get("reward_guard"))
        self.spread_guard = ZeroSpreadGuard(self.cfg.train.zero_spread_steps,
                                            cannot_learn_hint(self.cfg.model.name == "builtin:tiny",
                                                              "train.zero_spread_steps=0"),
                                            state.get("zero_spread_guard"))
        # {"step", "val_accuracy", "accuracy"}: the best validation accuracy so far (step 0 = the starting model)
        # and that model's test accuracy
        self.best = state.get("best")
        self.trackers = Trackers([])

    def state(self) -> dict:
        return {"accuracy_before": self.acc_before, "accuracy_after": self.acc_after, "val_accuracy": self.accuracy,
                "skipped_steps": self.skipped_total,
                "nan_streak": self.nan_streak, "wall_s": self.wall_before + time.time() - self.t_start,
                "times": self.clock.state_dict(),
                "config": self.cfg.to_dict(), "best": self.best,
                "health": self.health.state_dict(),
                "reward_guard": self.reward_guard.state_dict(),
                "zero_spread_guard": self.spread_guard.state_dict()}

    def evaluate(self, split: str = "test") -> float:
        """Accuracy on the test problems or ("val") the validation problems, timed (time/eval_s), with progress."""
        n = len(self.trainer.eval_prompts if split == "test" else self.trainer.val_prompts)
        label = "evaluating (test)" if split == "test" else "evaluating (validation)"
        with self.clock.time("eval"), self.con.phase(label, n, "problems") as ph:
            return _evaluate(self.trainer, ph.update, split)

    @property
    def validates(self) -> bool:
        """Whether the run has validation problems (eval.val_n > 0): without them there is no best/."""
        return bool(self.trainer.val_prompts)

    # ------------------------------------------------------------------ checkpoints
    def save(self, why: str) -> Path | None:
        with self.clock.time("save"):
            return self._save(why)

    def _save(self, why: str) -> Path | None:
        """Save a committed checkpoint of the current step (once). why: periodic | final | preempted."""
        trainer = self.trainer
        if self.last_saved == trainer.step_count:
            return newest_committed(self.run_dir)
        refuse_nonfinite(self.cfg, self.run_dir, trainer)  # never commit weights a step made NaN (WeightsDiverged)
        model, optimizer = checkpoint_views(trainer.policy, trainer.optimizer, trainer.dist, for_save=True)
        optimizers, schedulers, extra_models = checkpointed(trainer, optimizer)
        state = {"step": trainer.step_count, "stream": trainer.stream.state_dict(), **self.state()}
        try:
            path = save_checkpoint(self.run_dir, trainer.step_count, model=model,
                                   tokenizer=trainer.tokenizer, optimizers=optimizers, schedulers=schedulers,
                                   extra_models=extra_models, trainer_state=state,
                                   keep_last=self.cfg.train.keep_checkpoints) if is_main() else None
        except CheckpointError as e:
            previous = newest_committed(self.run_dir)
            why_not = e if getattr(e, "disk_full", False) else (e.__cause__ or e)  # the disk and the place
            msg = (f"the {why} checkpoint save at step {trainer.step_count} failed: {why_not}. "
                   f"The previous checkpoint is intact: {previous or 'none (no committed checkpoint yet)'}")
            if why == "periodic" and self.cfg.train.on_save_error == "continue":
                self.out(f"[grpo] warning: {msg}; training continues (train.on_save_error=continue)", soft_wrap=True)
                return None
            raise CheckpointError(msg) from e  # printed once, where it is caught (the grpo command)
        finally:
            barrier()  # several processes: the others wait for rank 0's checkpoint
        self.last_saved = trainer.step_count
        return path

    # ------------------------------------------------------------------ one step
    def note_accuracy(self, step: int, val_accuracy: float, test_accuracy: float | None = None) -> None:
        """Keep checkpoints/best/ (grpo.train.checkpoint.best) when the validation accuracy beats every earlier one,
        and measure that model on the test problems (`test_accuracy` when already measured at this step): the best
        model is chosen on validation and reported on test, never chosen on test."""
        if self.best is not None and val_accuracy <= self.best["val_accuracy"]:
            return
        if test_accuracy is None:
            test_accuracy = self.evaluate("test")
        self.best = {"step": step, "val_accuracy": val_accuracy, "accuracy": test_accuracy}
        if step == 0:  # the starting model: model.name itself
            return
        from grpo.models.lora import unwrap
        from grpo.train.checkpoint.best import save_best

        trainer = self.trainer
        gathered = full_state_dict(trainer.policy, trainer.dist)  # FSDP: every rank takes part; else None
        if is_main():
            save_best(unwrap(trainer.policy), trainer.tokenizer, self.run_dir, step, val_accuracy, test_accuracy,
                      merged=self.cfg.model.save_merged, state_dict=gathered)
        barrier()

    def step(self, metrics_file: JsonlWriter, samples_file: JsonlWriter, tb=None) -> None:
        trainer, cfg = self.trainer, self.cfg
        with self.clock.time("rl_steps"):
            try:
                result = trainer.step()
            except RolloutWorkerError as e:  # rollout.mode=async: the worker died or hung; nothing of the step ran
                if self.guard.requested:  # a SIGTERM to the job reaches the worker too: this is the stop request
                    raise Preempted(self.stop(), self.guard.signal_name) from e
                raise self.unhealthy(e) from e
        step, metrics = trainer.step_count, result.metrics
        uids = [p.uid for p in result.rollouts.prompts]
        if metrics["train/skipped_updates"] > 0:
            self.nan_streak, self.skipped_total = self.nan_streak + 1, self.skipped_total + 1
            self.out(f"[grpo] step {step}: non-finite loss or gradient norm, the update was skipped "
                     f"({self.nan_streak} in a row, {self.skipped_total} in this run; batch prompts "
                     f"{uids[:16]}{' ...' if len(uids) > 16 else ''})", soft_wrap=True)
        else:
            self.nan_streak = 0
        metrics["train/skipped_steps"] = float(self.skipped_total)
        last = step == cfg.train.steps
        test_now = last or (cfg.eval.test_every and step % cfg.eval.test_every == 0)  # a curve: eval.test_every
        if test_now and not self.guard.requested:  # the reported result: the final model on the test problems
            metrics["eval/accuracy"] = self.evaluate("test")
            if last:
                self.acc_after = metrics["eval/accuracy"]
        validate = self.validates and ((cfg.train.eval_every and step % cfg.train.eval_every == 0) or last)
        if validate and not self.guard.requested:  # a stop request skips the evaluation, saving time
            self.accuracy = metrics["eval/val_accuracy"] = self.evaluate("val")
            self.note_accuracy(step, self.accuracy, self.acc_after if last else None)
        metrics_file.write({"step": step, **metrics})
        self.trackers.log({"step": step, **metrics})
        _log_samples(cfg, result, samples_file, step, self.con)
        for warning in self.health.observe(metrics):
            self.out(f"[grpo] warning: {warning}")
        self.con.update(step, metrics, self.accuracy)
        stop, warnings = self.reward_guard.observe(step, metrics)  # rewards that give no value (guards.py)
        for warning in warnings:
            self.out(f"[grpo] warning: {warning}", soft_wrap=True)
        if stop is not None:
            raise self.unhealthy(stop)
        flat = self.spread_guard.observe(step, metrics)  # no reward spread for train.zero_spread_steps steps
        if flat is not None:
            raise self.unhealthy(flat)
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
        what = (f"checkpoint {path} committed. Resume with: {resume_command(self.run_dir)}" if path else
                "nothing trained yet, nothing saved (no checkpoint to --resume from): start again with --overwrite "
                "or a new --output-dir")
        self.out(f"[grpo] stopped by {self.guard.signal_name or 'a stop request'} at step {step}; {what}",
                 soft_wrap=True)
        return {"preempted": True, "steps": step, "checkpoint": str(path) if path else None}


def run_training(trainer, resume: bool = False, overwrite: bool = False) -> dict:
    """Train until cfg.train.steps and write the run directory; returns summary.json's content. Raises Preempted
    (with .summary {"preempted": True, "steps", "checkpoint"}) after SIGTERM/SIGINT once the checkpoint is committed,
    and a HealthGuardError when a guard stops a run that cannot learn; neither writes final/ or summary.json. A full
    disk at any write (final/, best/, metrics, summary, plots) is a DiskFullError naming the disk and the place
    (Trainer.train adds the last committed checkpoint and the command that finishes the run)."""
    cfg, run_dir = trainer.cfg, trainer.run_dir
    main = is_main()  # torchrun: rank 0 prints and writes files, the other ranks only compute
    con = RunConsole(cfg.train.steps, enabled=cfg.log.progress and main, console=None if main else _quiet())
    out = con.print
    claim_run_dir(run_dir, resume, overwrite)  # a new run only in an empty directory; --resume only from a checkpoint
    if main:
        take_run_dir(run_dir, overwrite, out)  # --overwrite: the old contents moved aside, never deleted
    barrier()
    run_dir.mkdir(parents=True, exist_ok=True)
    with PreemptionGuard() as local_guard:
        guard = SyncedGuard(local_guard, trainer.dist)  # every rank stops at the same step
        state = resume_from_checkpoint(trainer, out) if resume else {}
        if main:
            write_text_atomic(run_dir / "config.yaml", cfg.to_yaml())  # a full disk: one message, no 0-byte file
        run = _Run(trainer, con, guard, state)
        for name in ("metrics.jsonl", "samples.jsonl") if main else ():
            repair_jsonl(run_dir / name, out)
        metrics_file = JsonlWriter(run_dir / "metrics.jsonl", truncate_after_step=run.start_step) if main \
            else NullWriter()
        samples_file = JsonlWriter(run_dir / "samples.jsonl", truncate_after_step=run.start_step) if main \
            else NullWriter()
        run.trackers = open_trackers(cfg, run_dir, enabled=main)  # log.trackers (+ log.tensorboard)
        try:
            if run.acc_before is None:
                with run.clock.time("preflight"):  # train.preflight: can the run learn? (RNG untouched)
                    _preflight(trainer, con)
                run.acc_before = run.evaluate("test")
                row = {"step": 0, "eval/accuracy": run.acc_before}  # the curves start here
                if run.validates:
                    run.accuracy = row["eval/val_accuracy"] = run.evaluate("val")
                    run.note_accuracy(0, run.accuracy, run.acc_before)
                n, val_n = len(trainer.eval_prompts), len(trainer.val_prompts)
                out(f"[grpo] accuracy before training: test {accuracy_text(run.acc_before, n)} on {n} problems"
                    + (f", validation {accuracy_text(run.accuracy, val_n)} on {val_n}" if run.validates
                       else " (no validation problems: eval.val_n=0)")
                    + (f" (± one standard error: fewer than {SMALL_N} problems)" if min(n, val_n or n) < SMALL_N
                       else ""), soft_wrap=True)
                metrics_file.write(row)
                run.trackers.log(row)
            con.val_n = len(trainer.val_prompts)  # the step line's validation accuracy: its standard error
            con.start(run.start_step)
            while trainer.step_count < cfg.train.steps and not guard.requested:
                with blamed_on_training(cfg, run_dir, trainer, run.start_step):  # NaN logits a step caused
                    run.step(metrics_file, samples_file)
            if guard.requested:
                raise Preempted(run.stop(), guard.signal_name)
        except BaseException:
            run.trackers.close()  # a failure: close the trackers' runs (else _finish does, after the summary)
            raise
        finally:
            trainer.rollouts.close()  # rollout.mode=async: the worker stops (the final evaluation samples here)
            con.stop()
            metrics_file.close()
            samples_file.close()
        return _finish(run)


def _finish(run: _Run) -> dict:
    trainer, cfg, run_dir, con = run.trainer, run.cfg, run.run_dir, run.con
    if trainer.step_count > 0:
        run.save("final")
    final = run_dir / "final"
    from grpo.models.lora import save_final, saved_bytes
    from grpo.train.checkpoint.files import tokenizer_bytes
    from grpo.train.checkpoint.final import publish_dir

    def write_final(tmp: Path) -> None:  # a fresh directory each time: exactly this step's model (issue #41)
        save_final(trainer.policy, tmp, merged=cfg.model.save_merged, state_dict=gathered)  # LoRA: adapter
        trainer.tokenizer.save_pretrained(tmp)

    with run.clock.time("save"):
        gathered = full_state_dict(trainer.policy, trainer.dist)  # FSDP: every rank takes part; else None
        if is_main():  # a full disk: retried once into a fresh directory, then one message (the checkpoint is kept)
            publish_dir(final, write_final, what=f"the final model (step {trainer.step_count})", attempts=2,
                        share_with=[newest_committed(run_dir), run_dir / "checkpoints" / "best"],
                        needed=lambda: saved_bytes(trainer.policy, merged=cfg.model.save_merged)
                        + tokenizer_bytes(trainer.tokenizer))
    if run.acc_after is None:  # no evaluation at the last step (a run resumed there): the result is still measured
        run.acc_after = run.evaluate("test")
        if run.validates:
            run.accuracy = run.evaluate("val")
            run.note_accuracy(trainer.step_count, run.accuracy, run.acc_after)
    state = run.state()
    summary = {"eval/accuracy_before": run.acc_before, "eval/accuracy_after": run.acc_after,
               "eval/n": len(trainer.eval_prompts), "eval/val_n": len(trainer.val_prompts),
               "eval/splits": SUMMARY_SPLITS, "steps": trainer.step_count, "wall_s": state["wall_s"],
               "skipped_steps": run.skipped_total, "preset": cfg.preset, "model": cfg.model.name,
               "task": cfg.data.task if cfg.data.path is None else cfg.data.path,
               "model_source": getattr(trainer, "model_source", None), **run.clock.summary(state["wall_s"]),
               **_memory_summary(trainer)}
    if run.best is not None:  # chosen on validation (checkpoints/best/ unless it is step 0, the starting model)
        summary |= {"eval/best_step": run.best["step"], "eval/val_accuracy_best": run.best["val_accuracy"],
                    "eval/accuracy_best": run.best["accuracy"]}
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
    from grpo.train.checkpoint.final import disk_report

    con.print(disk_report(run_dir), soft_wrap=True)  # what the run wrote, and what can go (issue #42)
    barrier()  # several processes: the others leave once rank 0 has written everything
    return summary


def _memory_summary(trainer) -> dict:
    """summary.json's memory figures: the measured peak (this process and its live children, MiB) beside the
    plan printed at start (train/memory_plan.py)."""
    from grpo.tracking.memory import peak_rss_tree_mb

    plan = getattr(trainer, "memory_plan", None)
    out = {"memory/peak_rss_mb": round(peak_rss_tree_mb(), 1)}
    if plan is not None:
        out |= {"memory/planned_peak_mb": round(plan.peak / 2**20, 1),
                "memory/micro_batch_tokens": plan.micro_batch_tokens}
        if plan.limit.bytes is not None:
            out["memory/limit_mb"] = round(plan.limit.bytes / 2**20, 1)
    return out


def _quiet():
    from rich.console import Console

    return Console(quiet=True)


def _preflight(trainer, con: RunConsole) -> None:
    """train.preflight (stop | warn | off): grpo.train.preflight before step 1 of a fresh run, with its progress; its
    RNG use is undone."""
    mode = trainer.cfg.train.preflight
    if mode == "off":
        return
    from grpo.train.preflight import PreflightError, preflight_batches, run_preflight

    with con.phase("preflight", preflight_batches(trainer), "batches (at most)") as ph:
        report = run_preflight(trainer, progress=ph.update)
    for line in report.lines():
        con.print(line, soft_wrap=True)
    if report.fatal and mode == "stop":
        raise PreflightError("the preflight found that this run cannot learn (see the verdicts above); fix the "
                             "setting it names, or set train.preflight=warn to train anyway")


