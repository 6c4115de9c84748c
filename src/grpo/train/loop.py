"""The whole run around `Trainer.step()`: evaluation before/during/after, metrics and samples, health
warnings, checkpoints (atomic) and resume, preemption (SIGTERM/SIGINT: save, exit 0), NaN guard, final
model, summary and plots. Everything written here follows DESIGN.md's run-directory contract."""

from __future__ import annotations

import logging
import time

import torch
import yaml

from grpo.config import ConfigError, build_config
from grpo.tracking.console import RunConsole
from grpo.tracking.health import HealthMonitor
from grpo.tracking.metrics import JsonlWriter, write_json_atomic
from grpo.train.checkpoint import capture_rng_state, latest_checkpoint, load_checkpoint, restore_rng_state, save_checkpoint
from grpo.train.preemption import PreemptionGuard

log = logging.getLogger("grpo.train")

# Changing these between a checkpoint and its resume would change what a step means: refuse.
INCOMPATIBLE = ["model.name", "rollout.group_size", "rollout.prompts_per_step", "data.task", "data.difficulty",
                "data.path", "data.train_size", "algo.advantage", "algo.epochs", "train.seed"]


class NonFiniteError(RuntimeError):
    """Too many consecutive steps had a non-finite loss or gradient."""


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else None
    return d


def check_resume_config(saved: dict, current: dict, printer) -> None:
    bad = [k for k in INCOMPATIBLE if _get(saved, k) != _get(current, k)]
    if bad:
        raise ConfigError("cannot resume: these settings differ from the checkpoint's run: " + ", ".join(
            f"{k} ({_get(saved, k)!r} -> {_get(current, k)!r})" for k in bad))
    changed = [k for sec in current for k in (current[sec] if isinstance(current[sec], dict) else {})
               if _get(saved, f"{sec}.{k}") != current[sec][k]]
    if changed:
        printer(f"[grpo] resuming with changed settings: {', '.join(f'{s}' for s in changed)}")


def _trainer_state(trainer, extra: dict) -> dict:
    return {"step": trainer.step_count, "stream": trainer.stream.state_dict(), **extra}


def _save(trainer, state: dict) -> None:
    cfg = trainer.cfg
    optimizers, schedulers, extra_models = {"policy": trainer.optimizer}, {"policy": trainer.scheduler}, None
    if trainer.critic is not None:
        optimizers["value"], schedulers["value"] = trainer.critic.optimizer, trainer.critic.scheduler
        extra_models = {"value": trainer.critic.model}
    save_checkpoint(trainer.run_dir, trainer.step_count, model=trainer.policy, tokenizer=trainer.tokenizer,
                    optimizers=optimizers, schedulers=schedulers, extra_models=extra_models,
                    trainer_state=_trainer_state(trainer, state), keep_last=cfg.train.keep_checkpoints)


def _resume(trainer, out) -> dict:
    """Restore everything from the newest committed checkpoint; returns the saved extra state."""
    path = latest_checkpoint(trainer.run_dir)
    if path is None:
        out(f"[grpo] --resume: no committed checkpoint in {trainer.run_dir}/checkpoints; starting from step 0")
        return {}
    saved_cfg = yaml.safe_load((trainer.run_dir / "config.yaml").read_text())
    check_resume_config(saved_cfg, trainer.cfg.to_dict(), out)
    ckpt = load_checkpoint(path)
    ckpt.load_model_into(trainer.policy)
    optimizers, schedulers = {"policy": trainer.optimizer}, {"policy": trainer.scheduler}
    if trainer.critic is not None:
        ckpt.load_extra_models({"value": trainer.critic.model})
        optimizers["value"], schedulers["value"] = trainer.critic.optimizer, trainer.critic.scheduler
    ckpt.load_optimizers(optimizers)
    ckpt.load_schedulers(schedulers)
    restore_rng_state(ckpt.rng_state)
    state = ckpt.trainer_state
    trainer.step_count = state["step"]
    trainer.stream.load_state_dict(state["stream"])
    out(f"[grpo] resumed from {path} (step {trainer.step_count})")
    return state


def _log_samples(trainer, writer: JsonlWriter, step: int, printer: RunConsole | None) -> None:
    cfg, r = trainer.cfg, trainer.last_rollouts
    G, total, adv = r.group_size, trainer.last_scores.total.tolist(), trainer.last_adv.tolist()
    show = cfg.log.print_group_every and step % cfg.log.print_group_every == 0
    for g in range(min(cfg.log.sample_groups if not show else max(cfg.log.sample_groups, 1), len(r.prompts))):
        rows = range(g * G, (g + 1) * G)
        rewards = [total[i] for i in rows]
        present = torch.tensor([x for x in rewards if x == x])
        mean = float(present.mean()) if present.numel() else float("nan")
        std = float(present.std(correction=0)) if present.numel() else float("nan")
        record = {"step": step, "prompt": r.prompts[g].text, "answer": r.prompts[g].answer,
                  "completions": [r.texts[i] for i in rows], "rewards": rewards,
                  "advantages": [adv[i] for i in rows], "reward_mean": mean, "reward_std": std}
        writer.write(record)
        if show and g == 0 and printer is not None:
            printer.print_group(step, record["prompt"], record["completions"], rewards, record["advantages"], mean, std)


def run_training(trainer, resume: bool = False) -> dict:
    """Train for cfg.train.steps steps and write the run directory; returns summary.json's content."""
    cfg, run_dir = trainer.cfg, trainer.run_dir
    con = RunConsole(cfg.train.steps, enabled=cfg.log.progress)
    out = con.print
    run_dir.mkdir(parents=True, exist_ok=True)
    state = _resume(trainer, out) if resume else {}
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    start_step, t_start = trainer.step_count, time.time()
    wall_before = state.get("wall_s", 0.0)
    metrics_file = JsonlWriter(run_dir / "metrics.jsonl", truncate_after_step=start_step)
    samples_file = JsonlWriter(run_dir / "samples.jsonl", truncate_after_step=start_step)
    health, tb = HealthMonitor(), _tensorboard(cfg, run_dir)
    if "accuracy_before" in state:
        acc_before = state["accuracy_before"]
    else:
        acc_before = trainer.evaluate()["accuracy"]
        out(f"[grpo] held-out accuracy before training: {acc_before:.3f} on {len(trainer.eval_prompts)} problems")
    accuracy, nan_streak, skipped_total, preempted = state.get("accuracy"), 0, state.get("skipped_steps", 0), False
    extra = lambda: {"accuracy_before": acc_before, "accuracy": accuracy, "skipped_steps": skipped_total,  # noqa: E731
                     "wall_s": wall_before + time.time() - t_start}
    con.start(start_step)
    try:
        with PreemptionGuard() as guard:
            while trainer.step_count < cfg.train.steps:
                if guard.requested:
                    preempted = True
                    break
                metrics = trainer.step()
                step = trainer.step_count
                if metrics["train/skipped_updates"] > 0:
                    nan_streak, skipped_total = nan_streak + 1, skipped_total + 1
                    out(f"[grpo] step {step}: non-finite loss or gradient; update skipped "
                        f"(prompts {[p.uid for p in trainer.last_rollouts.prompts][:8]}...)")
                    if nan_streak >= cfg.train.max_nan_steps:
                        raise NonFiniteError(f"{nan_streak} consecutive steps had a non-finite loss or gradient "
                                             f"(last at step {step}); lower optim.lr or check the rewards")
                else:
                    nan_streak = 0
                if (cfg.train.eval_every and step % cfg.train.eval_every == 0) or step == cfg.train.steps:
                    accuracy = metrics["eval/accuracy"] = trainer.evaluate()["accuracy"]
                metrics_file.write({"step": step, **metrics})
                if tb is not None:
                    for k, v in metrics.items():
                        tb.add_scalar(k, v, step)
                _log_samples(trainer, samples_file, step, con)
                for warning in health.observe(metrics):
                    out(f"[grpo] warning: {warning}")
                con.update(step, metrics, accuracy)
                if cfg.train.save_every and step % cfg.train.save_every == 0 and step < cfg.train.steps:
                    _save(trainer, extra())
            if preempted or guard.requested:
                _save(trainer, extra())
                con.stop()
                out(f"[grpo] stopped by {guard.signal_name or 'signal'} at step {trainer.step_count}; checkpoint "
                    f"saved. Resume with: grpo train {run_dir / 'config.yaml'} --output-dir {run_dir} --resume")
                return {"preempted": True, "steps": trainer.step_count}
    finally:
        con.stop()
        metrics_file.close()
        samples_file.close()
        if tb is not None:
            tb.close()
    return _finish(trainer, con, acc_before, extra())


def _finish(trainer, con: RunConsole, acc_before: float, state: dict) -> dict:
    cfg, run_dir = trainer.cfg, trainer.run_dir
    if trainer.step_count > 0:
        _save(trainer, state)
    final = run_dir / "final"
    final.mkdir(exist_ok=True)
    from grpo.models.lora import save_final

    save_final(trainer.policy, final, merged=cfg.model.save_merged)  # LoRA: the adapter, or merged weights
    trainer.tokenizer.save_pretrained(final)
    accuracy = state["accuracy"] if state["accuracy"] is not None else trainer.evaluate()["accuracy"]
    summary = {"eval/accuracy_before": acc_before, "eval/accuracy_after": accuracy, "eval/n": len(trainer.eval_prompts),
               "steps": trainer.step_count, "wall_s": state["wall_s"], "skipped_steps": state["skipped_steps"],
               "preset": cfg.preset, "model": cfg.model.name, "task": cfg.data.task}
    write_json_atomic(run_dir / "summary.json", summary)
    plot = None
    if cfg.log.plots:
        from grpo.tracking.plots import plot_run

        plot = plot_run(run_dir)[0]
    con.summary(summary, run_dir, plot)
    return summary


def _tensorboard(cfg, run_dir):
    if not cfg.log.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:  # pragma: no cover - depends on the optional extra
        raise ConfigError("log.tensorboard=true needs the tensorboard extra: pip install 'grpo[tensorboard]'") from e
    return SummaryWriter(str(run_dir / "tensorboard"))


def load_run_config(run_dir):
    return build_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
