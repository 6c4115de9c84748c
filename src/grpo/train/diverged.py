"""Weights that go NaN/inf in training: named as what the run did in memory, never as damaged weights on disk.

`optim.lr=inf` (refused at load now) once made every weight NaN at step 1, and the sampler's check then said "the model
.../models/weights/arithmetic produces non-finite logits ...: its weights are damaged" of weights that were intact
on disk. The sampler cannot tell a model loaded with NaN from one a step made NaN; the loop can:

    nonfinite_weights(model)      the names of the parameters that hold NaN/inf (every rank agrees under torchrun)
    WeightsDiverged               a HealthGuardError (exit 3): the step whose update made them non-finite, the
                                  settings that likely did it (the learning rate, the rewards' scale), the model on
                                  disk untouched, and the last committed checkpoint (intact: a checkpoint is never
                                  committed with non-finite weights, `_Run._save` checks them first)

The loop raises WeightsDiverged when a generation after a step of this process finds non-finite logits (the
sampler's NonFiniteLogitsError: the weights were finite when the step before sampled, so that step's update did it)
and when a save finds non-finite weights. A model whose logits are non-finite before any step of this process is
still NonFiniteLogitsError (exit 2): the model the user gave is broken.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from grpo.errors import HealthGuardError, NonFiniteLogitsError
from grpo.train.checkpoint.resume import newest_committed, resume_command

__all__ = ["WeightsDiverged", "blamed_on_training", "diverged", "nonfinite_weights", "refuse_nonfinite"]


class WeightsDiverged(HealthGuardError):
    """The policy's weights (or its logits) went NaN/inf during training; nothing of the step is saved."""


def nonfinite_weights(model: torch.nn.Module, dist=None) -> tuple[list[str], int]:
    """(the names of `model`'s parameters that hold NaN/inf, the number of parameters); under torchrun (`dist`
    enabled) a rank whose shard is finite answers ['(another rank's shard)'] when another rank's is not, so every
    rank takes the same branch."""
    params = list(model.named_parameters())
    broken = []
    for name, p in params:
        local = p.to_local() if hasattr(p, "to_local") else p  # FSDP: this rank's shard
        if not bool(torch.isfinite(local.detach()).all()):
            broken.append(name)
    if dist is not None and getattr(dist, "enabled", False) and dist.any(bool(broken)) and not broken:
        broken = ["(another rank's shard)"]
    return broken, len(params)


def _likely_causes(cfg) -> str:
    causes = [f"the learning rate, optim.lr={cfg.optim.lr:g}, too large for this model (the defaults: 1e-4 for the "
              "built-in model, 1e-6 to 1e-5 for a model directory, docs/scale.md)"]
    if cfg.algo.scale == "none":
        causes.append(f"the rewards' scale: algo.scale=none passes rewards up to reward.max_abs={cfg.reward.max_abs:g}"
                      + (f" (reward.weights={cfg.reward.weights})" if cfg.reward.weights else "")
                      + " into the advantages unnormalised")
    elif cfg.reward.weights and max(abs(w) for w in cfg.reward.weights) > 100:
        causes.append(f"the rewards' scale (reward.weights={cfg.reward.weights})")
    if cfg.kl.coef > 10:
        causes.append(f"kl.coef={cfg.kl.coef:g}")
    return "; ".join(causes)


def diverged(cfg, run_dir: Path, step: int, broken: list[str], n_params: int, logits: str | None = None,
             source: str | None = None) -> WeightsDiverged:
    """The error for weights found non-finite after the update of `step` (`logits`: what the sampler saw in them,
    when it found it; `source`: the directory the weights were loaded from, default model.name)."""
    if broken:
        what = (f"{len(broken)} of its {n_params} weight tensors {'holds' if len(broken) == 1 else 'hold'} NaN/inf "
                f"(the first: {broken[0]})")
    else:
        what = "its weights are finite but so large that its logits overflow"
    seen = f" ({logits} in its next-token logits)" if logits else ""
    last = newest_committed(Path(run_dir))
    if last is not None:
        command = resume_command(run_dir).replace(" --output-dir", f" optim.lr={cfg.optim.lr / 10:g} --output-dir", 1)
        then = (f"The last committed checkpoint, {last}, is intact (a checkpoint is never committed with non-finite "
                f"weights): resume from it with a lower learning rate: {command}")
    else:
        then = ("No checkpoint was committed before it (train.save_every saves one every K steps): lower optim.lr "
                "and start again with --overwrite")
    when = f"after the update of step {step}"
    if cfg.rollout.mode == "async" and logits:  # the worker samples with weights up to K steps old
        when += f" or one of the {cfg.rollout.max_staleness} before it (rollout.mode=async samples behind)"
    return WeightsDiverged(
        f"the policy's weights became non-finite in training: {when}, {what}{seen}. The model on disk "
        f"({source or cfg.model.name}) is untouched: only the copy this run trained in memory changed, and nothing of "
        f"step {step} was saved. Likely cause: {_likely_causes(cfg)}. {then}")


def refuse_nonfinite(cfg, run_dir: Path, trainer) -> None:
    """Raise WeightsDiverged when the policy's weights hold NaN/inf (before a save: a checkpoint is never committed
    with them)."""
    broken, n = nonfinite_weights(trainer.policy, trainer.dist)
    if broken:
        raise diverged(cfg, run_dir, trainer.step_count, broken, n, source=_source(trainer))


@contextmanager
def blamed_on_training(cfg, run_dir: Path, trainer, start_step: int) -> Iterator[None]:
    """Non-finite logits (NonFiniteLogitsError) found after a step of this process are that training's doing:
    WeightsDiverged. Before any (`trainer.step_count == start_step`) the weights are the ones loaded: as it was."""
    try:
        yield
    except NonFiniteLogitsError as e:
        if trainer.step_count == start_step:
            raise
        broken, n = nonfinite_weights(trainer.policy, trainer.dist)
        raise diverged(cfg, run_dir, trainer.step_count, broken, n, getattr(e, "logits", None), _source(trainer)
                       ) from e


def _source(trainer) -> str | None:
    """The directory the policy's weights were loaded from (its config's _name_or_path), or None."""
    return str(getattr(getattr(trainer.policy, "config", None), "_name_or_path", "") or "") or None
