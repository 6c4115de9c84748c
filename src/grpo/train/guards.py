"""The run-cannot-learn guards: stop a run whose rewards give no value or no spread, instead of training on nothing.

A reward function that returns None for every sample, always times out or always raises makes every sample's
total reward missing (NaN): every advantage is 0, the loss is 0, and without this guard the run would go on to
`final/` and exit 0 as if it had trained. The guard reads the step's reward metrics (the same on every process,
so all ranks stop at the same step):

    reward/<fn>/missing_frac, reward/<fn>/error_frac, reward/<fn>/timeout_frac     per function
    reward/missing_frac                                                            the weighted total

A step is "dead" for a weighted function when it gave no value for any sample; for the run when no sample has a
total reward (also when several functions miss different samples). After `reward.max_missing_steps` dead steps
in a row (default 3; 1 = stop at the first) the guard returns a RewardsMissing error naming the function(s) and
the cause (returned None / timed out / raised); the loop saves a checkpoint and raises it (exit code 3). A function
with weight 0 (logged only) gets one warning instead: the run can still learn without it.

ZeroSpreadGuard: a step in which every group had zero reward spread (`adv/zero_std_frac` 1) and every reward was the
same (`reward/std` 0) teaches nothing: every advantage is 0. After `train.zero_spread_steps` such steps in a row
(default 20; 0 = never) it returns a NoLearningSignal error with what to change; the loop saves a checkpoint and
raises it (exit code 3). With algo.drop_zero_std_groups (DAPO) a step counts only when every resampling round came
back without spread, since any informative group is kept.
"""

from __future__ import annotations

from grpo.errors import HealthGuardError

__all__ = ["NoLearningSignal", "RewardGuard", "RewardsMissing", "ZeroSpreadGuard"]

FULL = 1.0 - 1e-9  # a missing fraction this high means every sample


class RewardsMissing(HealthGuardError):
    """Reward functions gave no value for any sample for `reward.max_missing_steps` steps in a row."""


class RewardGuard:
    """Counts consecutive steps without any reward value, per function and for the total.

    weights: {function name: weight}; limit: reward.max_missing_steps; state: a `state_dict()` of a checkpoint.
    `observe(step, metrics)` returns (a RewardsMissing to raise or None, one-time warnings of weight-0 functions).
    """

    def __init__(self, weights: dict[str, float], limit: int, state: dict | None = None) -> None:
        self.weights, self.limit = dict(weights), int(limit)
        self.load_state_dict(state or {})

    def state_dict(self) -> dict:
        return {"streak": dict(self.streak), "first": dict(self.first), "warned": sorted(self.warned)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict()` ({} = a fresh guard)."""
        self.streak: dict[str, int] = dict(state.get("streak", {}))
        self.first: dict[str, int] = dict(state.get("first", {}))
        self.warned: set[str] = set(state.get("warned", []))

    def observe(self, step: int, metrics: dict[str, float]) -> tuple[RewardsMissing | None, list[str]]:
        """(the error to raise or None, warnings to print) after step `step` with these metrics."""
        warnings = []
        for name, weight in self.weights.items():
            dead = metrics.get(f"reward/{name}/missing_frac", 0.0) >= FULL
            if weight == 0:
                if dead and name not in self.warned:
                    self.warned.add(name)
                    warnings.append(f"reward function {name!r} (weight 0, logged only) gave no value for any sample "
                                    f"at step {step}: it {_cause(name, metrics)}")
                continue
            self._count(name, dead, step)
        self._count("", metrics.get("reward/missing_frac", 0.0) >= FULL, step)
        dead = [n for n, w in self.weights.items() if w != 0 and self.streak.get(n, 0) >= self.limit]
        if dead:
            return RewardsMissing(self._message(dead, step, metrics)), warnings
        if self.streak.get("", 0) >= self.limit:
            return RewardsMissing(self._message_total(step, metrics)), warnings
        return None, warnings

    def _count(self, key: str, dead: bool, step: int) -> None:
        if dead:
            self.streak[key] = self.streak.get(key, 0) + 1
            self.first.setdefault(key, step)
        else:
            self.streak.pop(key, None)
            self.first.pop(key, None)

    def _steps(self, key: str, step: int) -> str:
        n = self.streak[key]
        return f"step {step}" if n == 1 else f"{n} steps in a row (steps {self.first[key]}-{step})"

    def _message(self, dead: list[str], step: int, metrics: dict[str, float]) -> str:
        parts = [f"reward function {n!r} gave no value for any sample in {self._steps(n, step)}: it "
                 f"{_cause(n, metrics)}" for n in dead]
        return ("; ".join(parts) + f" (reward.max_missing_steps={self.limit}). The run cannot learn without "
                "rewards: every advantage is 0. " + _HINT)

    def _message_total(self, step: int, metrics: dict[str, float]) -> str:
        fracs = ", ".join(f"{n!r} {metrics.get(f'reward/{n}/missing_frac', 0.0):.0%}" for n, w in
                          self.weights.items() if w != 0)
        return (f"no sample had a total reward in {self._steps('', step)} (reward.max_missing_steps={self.limit}): "
                f"each sample misses some weighted reward function (missing per function: {fracs}), so every "
                "advantage is 0. " + _HINT)


class NoLearningSignal(HealthGuardError):
    """Every group had zero reward spread and every reward was the same for `train.zero_spread_steps` steps."""


class ZeroSpreadGuard:
    """Counts consecutive steps without any reward spread. limit: train.zero_spread_steps (0 = off); hint: what to
    change (grpo.train.preflight.cannot_learn_hint); state: a `state_dict()` of a checkpoint."""

    def __init__(self, limit: int, hint: str = "", state: dict | None = None) -> None:
        self.limit, self.hint = int(limit), hint
        self.load_state_dict(state or {})

    def state_dict(self) -> dict:
        return {"streak": self.streak, "first": self.first}

    def load_state_dict(self, state: dict) -> None:
        self.streak, self.first = int(state.get("streak", 0)), state.get("first")

    def observe(self, step: int, metrics: dict[str, float]) -> NoLearningSignal | None:
        """The error to raise after step `step` with these metrics, or None."""
        flat = metrics.get("adv/zero_std_frac", 0.0) >= FULL and metrics.get("reward/std", 1.0) == 0.0
        if not flat:
            self.streak, self.first = 0, None
            return None
        self.streak += 1
        self.first = step if self.first is None else self.first
        if not self.limit or self.streak < self.limit:
            return None
        return NoLearningSignal(
            f"every group had zero reward spread and every reward was {metrics.get('reward/mean', float('nan')):g} in "
            f"{self.streak} steps in a row (steps {self.first}-{step}; train.zero_spread_steps={self.limit}): every "
            f"advantage is 0 and nothing is learned. {self.hint}".rstrip())


_HINT = ("Fix the function (None means 'no signal for this sample'), raise reward.timeout_s if it timed out, "
         "then start again or resume from the checkpoint")


def _cause(name: str, metrics: dict[str, float]) -> str:
    """What the function did to its samples: returned None, timed out, raised, or a mix."""
    error = metrics.get(f"reward/{name}/error_frac", 0.0)
    timeout = metrics.get(f"reward/{name}/timeout_frac", 0.0)
    invalid = metrics.get(f"reward/{name}/invalid_frac", 0.0)
    none = max(0.0, metrics.get(f"reward/{name}/missing_frac", 0.0) - error - timeout - invalid)
    causes = [(none, "returned None"), (timeout, "timed out (reward.timeout_s)"),
              (error, "raised (see the traceback logged above)"),
              (invalid, "returned values that cannot be stored (NaN, inf or past reward.max_abs; logged above)")]
    present = [(f, text) for f, text in causes if f > 1e-9]
    if len(present) == 1:
        return f"{present[0][1]} for every sample"
    return "; ".join(f"{text} for {f:.0%} of the samples" for f, text in present) or "gave no value"
