"""The errors `grpo` raises on purpose, and the exit code each one means to the `grpo` command.

    GrpoError
    ├── UserError (a ValueError)        bad input: a config value, data file, model or run directory, reward name
    │   ├── ConfigError                   a config key, value or file            (also `grpo.config.ConfigError`)
    │   │   ├── DataFileError             a data set file, row or column         (also `grpo.data.files.DataFileError`)
    │   │   └── MissingExtraError         a setting needs an optional package (`pip install 'grpo[...]'`)
    │   ├── ModelDirError                 a model or tokenizer directory that cannot be loaded
    │   │   ├── NonFiniteLogitsError      a model whose logits are NaN/inf (damaged weights, or overflow in its dtype)
    │   │   └── ChatTemplateError         a model's chat template that fails on a row (raise_exception, bad syntax)
    │   ├── RewardOutputError             a reward function's output breaks the protocol (NaN, wrong count, ...)
    │   └── RunDirError                   a run directory (`grpo report`) that is not one
    ├── DiskFullError                   no space left while writing a file (names the disk, the file, what is kept)
    └── RunStopped                      a run that ended before its last step, on purpose
        ├── HealthGuardError              a guard stopped a run that cannot learn (rewards missing, non-finite loss)
        └── Preempted                     SIGINT / SIGTERM: a checkpoint is committed, the run can be resumed

Every input is checked where it enters (data files: grpo.data.file_checks; model directories:
grpo.models.checks; run directories: grpo.tracking.rundir; reward names: grpo.rewards.get_reward_function; config:
grpo.config), so the library raises these same types to Python callers. The command prints one message for them,
without a traceback (unless `--debug` or GRPO_DEBUG=1), and exits with `exit_code`:

    0    the run finished all its steps (or the command did its job)
    1    a failure during the run (a reward function that keeps raising, a checkpoint that cannot be saved) or a bug
    2    bad input (UserError)
    3    stopped by a health guard (HealthGuardError)
    130  stopped by SIGINT after committing a checkpoint (Preempted); 143 for SIGTERM (128 + the signal number)
"""

from __future__ import annotations

import signal

__all__ = ["EXIT_FAILURE", "EXIT_HEALTH", "EXIT_OK", "EXIT_USER", "ChatTemplateError", "ConfigError",
           "DataFileError", "DiskFullError", "GrpoError", "HealthGuardError", "MissingExtraError", "ModelDirError",
           "NonFiniteLogitsError", "Preempted", "RewardOutputError", "RolloutWorkerError", "RunDirError",
           "RunStopped", "UserError"]

EXIT_OK, EXIT_FAILURE, EXIT_USER, EXIT_HEALTH = 0, 1, 2, 3


class GrpoError(Exception):
    """Base of the errors grpo raises on purpose; `exit_code` is what `grpo` exits with."""

    exit_code = EXIT_FAILURE


class UserError(GrpoError, ValueError):
    """Bad input (a file, directory, name or value); the message names it, and what to do."""

    exit_code = EXIT_USER


class ConfigError(UserError):
    """A config value, key or file that cannot be used; the message names the field."""


class DataFileError(ConfigError):
    """A data set file (or Hub data set) that cannot be used; the message names the file, and the line, row or
    column."""


class MissingExtraError(ConfigError, ImportError):
    """A setting needs an optional package that is not installed; the message names the pip extra."""


class ModelDirError(UserError):
    """A model or tokenizer directory that cannot be loaded (missing, no config, weights cut short, no tokenizer)."""


class NonFiniteLogitsError(ModelDirError):
    """A model whose next-token logits are NaN or +inf (or all -inf) on a prompt: its weights hold NaN/inf, or its
    activations overflow in its dtype. Raised by the sampler (grpo.rollout.sampler), so `grpo eval`, the preflight and
    every evaluation name it instead of scoring its garbage 0.

    Bad input (exit 2), like a damaged model directory, not a health guard (exit 3): it is the model the user gave
    (or its model.dtype) that is broken, it is found before step 1 (the preflight, the first evaluation, `grpo eval`),
    and no setting of the run nor a resume fixes it; there is no trained step to commit."""


class ChatTemplateError(ModelDirError):
    """A model's chat template that fails on a data row: its own `raise_exception(...)` (a role or an order it does
    not accept), a syntax error, an undefined name. The message names the model directory, the template's file,
    the row (its file and line) and jinja's words; raised by grpo.tokens.apply_chat_template."""


class RewardOutputError(UserError):
    """A reward function returned something that breaks the protocol: a wrong count, NaN/inf, a non-number."""


class RunDirError(UserError, FileNotFoundError):
    """A directory given as a run directory that is not one (also a FileNotFoundError, as before)."""


class DiskFullError(GrpoError):
    """No space left on the device (ENOSPC, or a quota: EDQUOT) while grpo wrote a file. The message names the disk
    (its mount point and free space), the file or directory, and what was kept (nothing is left half-written)."""


class RunStopped(GrpoError):
    """A training run that stopped before its last step on purpose; no `final/` was written."""


class HealthGuardError(RunStopped, RuntimeError):
    """A health guard stopped a run that cannot learn (no reward values, non-finite losses)."""

    exit_code = EXIT_HEALTH


class RolloutWorkerError(HealthGuardError):
    """The rollout worker of rollout.mode=async died, hung past rollout.worker_timeout_s, or failed; the run stops
    with a checkpoint."""


class Preempted(RunStopped):
    """SIGINT/SIGTERM (or another stop request) stopped the run after a committed checkpoint.

    summary: {"preempted": True, "steps": int, "checkpoint": str | None}; signal_name: "SIGTERM", "SIGINT" or
    the reason given to `PreemptionGuard.request`. exit_code: 128 + the signal's number (130 for SIGINT, 143 for
    SIGTERM); 143 for a stop request that is not a signal.
    """

    def __init__(self, summary: dict, signal_name: str | None) -> None:
        self.summary, self.signal_name = dict(summary), signal_name
        self.steps, self.checkpoint = summary.get("steps"), summary.get("checkpoint")
        what = f"checkpoint {self.checkpoint} committed" if self.checkpoint else "nothing saved"
        super().__init__(f"stopped by {signal_name or 'a stop request'} at step {self.steps} before the last "
                         f"step; {what}")

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        try:
            return 128 + int(signal.Signals[self.signal_name or ""])
        except KeyError:
            return 128 + int(signal.SIGTERM)
