"""Answers to "is it learning?" and "why is the loss 0?": each warning fires once, with the likely cause
and the setting to change, when its condition has held for `patience` consecutive steps."""

from __future__ import annotations

from dataclasses import dataclass, field

CHECKS = {
    "zero_std": (
        lambda m: m.get("adv/zero_std_frac", 0.0) >= 0.8,
        "{frac:.0%} of groups have the same reward for every completion, so their advantage is 0 and they give "
        "no gradient (the loss stays near 0 by design). {cause}: raise rollout.group_size, {fix}, or use the dapo "
        "preset (drops such groups).",
    ),
    "truncated": (
        lambda m: m.get("rollout/truncated_frac", 0.0) >= 0.5,
        "{trunc:.0%} of completions hit rollout.max_new_tokens without ending; they are usually scored as wrong. "
        "Raise rollout.max_new_tokens.",
    ),
    "logp_diff": (
        lambda m: m.get("rollout/logp_diff", 0.0) > 0.05,
        "the sampler's log-probabilities differ from the trainer's by {logp_diff:.3f} nats per token on the same "
        "tokens: the two do not compute the same policy (another precision or engine, a stale or differently loaded "
        "copy), so the updates are off-policy. " + "{logp_fix}",
    ),
    "kl": (
        lambda m: m.get("policy/kl", 0.0) > 1.0,
        "the KL to the reference model is {kl:.2f} nats per token and growing: the policy is drifting far from "
        "its start. Lower optim.lr or raise kl.coef.",
    ),
}


LOGP_FIX = ("model.compute_dtype=float32 computes the sampler and the trainer in float32; with rollout.engine=vllm, "
            "algo.tis_cap=2 corrects for the engine's drift; else check how the model is loaded.")

# The zero-spread warning's cause and fix, by where the prompts come from (a built-in task has difficulty levels;
# a data set file has rows and reward functions).
ZERO_STD_ADVICE = {
    False: ("The task is too easy or too hard for the model", "change data.difficulty"),
    True: ("The prompts are too easy or too hard for the model, or the reward functions give every completion the "
           "same value (check the reward/<name> metrics and the answers)",
           "filter the data file to rows the model solves some of the time"),
}


@dataclass
class HealthMonitor:
    """Feeds on each step's metrics (`observe`); `state_dict()`/`load_state_dict()` carry it across a resume."""

    data_file: bool = False  # the prompts come from data.path (the advice differs)
    patience: int = 3
    flat_window: int = 20
    _streak: dict[str, int] = field(default_factory=dict)
    _fired: set[str] = field(default_factory=set)
    _rewards: list[float] = field(default_factory=list)

    def state_dict(self) -> dict:
        """What a resumed run needs to warn as this one would: the warnings fired, the current streaks, and the
        mean rewards of the flat-reward window (JSON-able)."""
        return {"fired": sorted(self._fired), "streak": dict(self._streak),
                "rewards": list(self._rewards[-self.flat_window:])}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()` ({} = a fresh monitor)."""
        self._fired = set(state.get("fired", []))
        self._streak = dict(state.get("streak", {}))
        self._rewards = list(state.get("rewards", []))

    def observe(self, metrics: dict[str, float]) -> list[str]:
        """Feed one step's metrics; returns the warnings that fire now (each at most once per run)."""
        out = []
        cause, fix = ZERO_STD_ADVICE[self.data_file]
        values = dict(cause=cause, fix=fix, frac=metrics.get("adv/zero_std_frac", 0.0), trunc=metrics.get("rollout/truncated_frac", 0.0),
                      kl=metrics.get("policy/kl", 0.0), logp_diff=metrics.get("rollout/logp_diff", 0.0),
                      logp_fix=LOGP_FIX)
        for name, (cond, text) in CHECKS.items():
            self._streak[name] = self._streak.get(name, 0) + 1 if cond(metrics) else 0
            if self._streak[name] >= self.patience and name not in self._fired:
                self._fired.add(name)
                out.append(text.format(**values))
        self._rewards.append(metrics.get("reward/mean", 0.0))
        window = self._rewards[-self.flat_window:]
        if len(window) == self.flat_window and "flat" not in self._fired and max(window) - min(window) < 1e-6:
            self._fired.add("flat")
            out.append(f"the mean reward has not changed for {self.flat_window} steps: check that the reward "
                       "functions see the completions (reward/<name> metrics) and that optim.lr is not too small.")
        return out
