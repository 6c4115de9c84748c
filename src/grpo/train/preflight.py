"""Preflight: will this run learn? A few groups sampled with the starting model, checked before step 1.

The most repeated complaint about GRPO trainers is a run that silently learns nothing: every completion cut at
max_new_tokens, every group with the same reward (advantage 0, no gradient), a reward that is always 0 or None
because of a format mismatch, a sampler that does not compute the trainer's policy. `measure` samples
`train.preflight_groups` prompts x G completions exactly as a training step would (same sampler, same reward
functions), and `judge` turns the numbers into verdicts with the setting to change:

    fatal  the run cannot learn from what was sampled (every reward identical, a reward always missing,
           most completions truncated with most groups zero-spread: cut-off answers score alike)
    warn   it may learn slowly or wrongly (most groups zero-spread, a reward constant over every sample,
           many truncated or missing, a large sampler/trainer log-prob gap, empty completions)
    ok     healthy: said in one line with the numbers

`grpo train --preflight` runs the check alone (exit 3 on a fatal verdict, as a health guard). Every run does it before
step 1 unless `train.preflight=off`; `train.preflight=stop` (the default) ends a run with a fatal verdict
(PreflightError, exit 3, with what to change), `warn` prints the verdicts and trains. When every sampled reward is
the same, or only one prompt's group has any spread, more batches of other training prompts are sampled (up to
`train.preflight_batches`), until two prompts show a reward spread; fewer than two in all of them is fatal. One
lucky prompt is not a signal (the built-in model, asked "What is 2 * 2?", answers 4 by adding), and a model right 2%
of the time on every prompt shows a spread in 15% of its groups at G=8, so 16 batches of 4 prompts stop it by bad
luck with probability 0.85^64 + 64 x 0.15 x 0.85^63 < 0.001.

Bounded (a verdict in about a minute for a 270M model on 2 cores): sampling stops once the verdict is certain (two
prompts with a spread; a reward that never gives a value), and no batch is begun that would end past BUDGET_S CPU
seconds at the pace so far (CPU time: a loaded machine gives the same verdict); all the same reward in fewer batches
than planned is then a warning, not fatal (too few prompts to be sure; train.zero_spread_steps still stops a run that
never sees a spread). The log-prob gap is measured once, on the first group. A progress line tells the batch, the
tokens sampled and the CPU seconds of the budget spent. Completions of a model without a chat template (raw prompts)
that run on past the answer get the stop string that ends them (rollout.stop; rollout/stop.py suggest_stop): the
prompt's own label ("Question:") that the model writes again, or "\n" when the answer is the first line, never a
longer max_new_tokens. The check saves and restores every global RNG (python, numpy, torch, CUDA) and draws no
prompt from the training stream, so a run trains on exactly what it would without it.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from grpo.errors import HealthGuardError
from grpo.rewards.runner import STATUS_CAUSES
from grpo.rollout.stop import suggest_stop
from grpo.tracking.health import LOGP_FIX


class PreflightError(HealthGuardError):
    """The preflight found that the run cannot learn (train.preflight=stop); the message says what to change.
    A health guard: `grpo train` exits 3."""


@dataclass
class Verdict:
    level: str  # fatal | warn | ok
    text: str


@dataclass
class PreflightReport:
    """stats: the measured numbers (see `measure`); verdicts: what they mean, worst first."""

    stats: dict
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def fatal(self) -> bool:
        return any(v.level == "fatal" for v in self.verdicts)

    def lines(self) -> list[str]:
        s = self.stats
        head = (f"[grpo] preflight: {s['groups']} groups x {s['group_size']} completions with the starting model: "
                f"truncated {s['truncated_frac']:.0%}, zero-spread groups {s['zero_spread_frac']:.0%}, "
                f"prompt {s['prompt_len_mean']:.0f} tokens (max {s['prompt_len_max']}), completion "
                f"{s['completion_len_mean']:.1f} tokens (max {s['completion_len_max']}), sampler/trainer log-prob "
                f"gap {_fmt(s['logp_gap'])} nats/token")
        rewards = "; ".join(f"{n}: mean {_fmt(r['mean'])}, missing {r['missing_frac']:.0%}"
                            for n, r in s["rewards"].items())
        return [head, f"[grpo] preflight rewards: {rewards}"] + [f"[grpo] preflight {v.level}: {v.text}"
                                                                   for v in self.verdicts]


def _fmt(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


# ------------------------------------------------------------------------------------------------ measuring
def measure(trainer, n_groups: int, start: int = 0, on_step=None) -> dict:
    """Sample training prompts start .. start + n_groups - 1 (x G) with trainer's sampler and score them like a step
    does (from the training split's list, not the prompt stream: the stream is not advanced).

    Returns {groups, group_size, truncated_frac, zero_spread_frac, all_same_reward (float or None), rewards:
    {name: {mean, min, max, missing_frac}}, logp_gap (float or None when top_p < 1), prompt_len_mean, prompt_len_max,
    completion_len_mean, completion_len_max, max_new_tokens, example (one completion text), run_on ({stop, seen, of}:
    raw prompts whose cut-off completions run on past the answer, suggest_stop; or None)}. The log-prob gap is of the
    first group, and only measured for the first batch (start 0; None after). on_step: the native sampler's per-token
    progress hook (Sampler.on_step) while this batch samples. The global RNG states are restored afterwards.
    """
    from grpo.algo import zero_std_groups
    from grpo.parallel import generation
    from grpo.rollout.episodes import run_episodes
    from grpo.train.checkpoint import capture_rng_state, restore_rng_state
    from grpo.train.episodes import env_limits, task_environment

    cfg, G = trainer.cfg, trainer.cfg.rollout.group_size
    prompts = trainer.train_prompts[start:start + n_groups]
    saved = capture_rng_state()
    try:
        torch.manual_seed(cfg.train.seed)  # the same sample on every rank and every run of this config
        env = task_environment(trainer.task, trainer.tokenizer)  # a task with tools: whole episodes, as a step
        with generation(trainer.policy, trainer.dist), _hooked(trainer.sampler, on_step):
            rollouts = run_episodes(trainer.sampler, prompts, G, env, **env_limits(cfg))
        scores = trainer.producer.score(rollouts)
        gap = _logp_gap(trainer, rollouts.select_groups([0])) if start == 0 else None  # merges keep the first's
    finally:
        restore_rng_state(saved)
    total = scores.total.float()
    present = total[~torch.isnan(total)]
    same = float(present[0]) if present.numel() and bool((present == present[0]).all()) else None
    lengths, plen = rollouts.completion_mask.sum(-1).float(), rollouts.prompt_mask.sum(-1).float()
    return {
        "groups": len(prompts), "group_size": G, "max_new_tokens": cfg.rollout.max_new_tokens,
        "truncated_frac": float(rollouts.truncated.float().mean()),
        "zero_spread_frac": float(zero_std_groups(total, G).float().mean()),
        "all_same_reward": same if present.numel() == total.numel() else None,
        "rewards": {name: _reward_stats(v, scores.status.get(name)) for name, v in scores.per_function.items()},
        "logp_gap": gap,
        "prompt_len_mean": float(plen.mean()), "prompt_len_max": int(plen.max()),
        "completion_len_mean": float(lengths.mean()), "completion_len_max": int(lengths.max()),
        "example": rollouts.texts[0] if rollouts.texts else "",
        "spread_groups": int((~zero_std_groups(total, G)).sum()), "batches": 1,
        "builtin_model": cfg.model.name == "builtin:tiny", "run_on": _run_on(prompts, rollouts),
    }


def _run_on(prompts, rollouts) -> dict | None:
    """{stop, seen, of} when the prompts are raw (no chat template: a base model) and at least half of the cut-off
    completions run on past their answer in the same way (rollout/stop.py suggest_stop), else None."""
    cut = [t for t, tr in zip(rollouts.texts, rollouts.truncated.tolist()) if tr]
    if not cut or any(p.templated for p in prompts):
        return None
    found = suggest_stop([p.text for p in prompts], cut)
    return None if found is None else {"stop": found[0], "seen": found[1], "of": len(cut)}


@contextmanager
def _hooked(sampler, on_step):
    """The native sampler's per-token hook set for one batch (other engines have none: no per-token progress)."""
    if on_step is None or not hasattr(sampler, "on_step"):
        yield
        return
    before, sampler.on_step = sampler.on_step, on_step
    try:
        yield
    finally:
        sampler.on_step = before


def merge_batches(first: dict, more: dict) -> dict:
    """The stats of two measured batches as one sample: counts add up, the zero-spread share is pooled, and every
    reward is the same only when it is the same value in both; the rest (lengths, rewards' detail) stay the
    first batch's."""
    groups = first["groups"] + more["groups"]
    same = first["all_same_reward"]
    return {**first, "groups": groups, "batches": first.get("batches", 1) + more.get("batches", 1),
            "spread_groups": first.get("spread_groups", 0) + more.get("spread_groups", 0),
            "zero_spread_frac": (first["zero_spread_frac"] * first["groups"] + more["zero_spread_frac"] * more["groups"])
            / groups,
            "all_same_reward": same if same is not None and more["all_same_reward"] == same else None}


_CAUSES = STATUS_CAUSES  # the runner's words, shared with evaluation's "could not judge"


def _reward_stats(values: torch.Tensor, status: list[str] | None = None) -> dict:
    """(N,) with NaN = missing -> {mean, min, max, missing_frac[, why]} (mean/min/max None when all are missing); why,
    when a sample is missing:
    what the function did to its missing samples, from the runner's per-sample status ("returned None for 2,
    raised for 6"), so a verdict never blames None for an exception, a NaN or a timeout."""
    v = values.float()
    present = v[~torch.isnan(v)]
    counts = {c: (status or []).count(c) for c in _CAUSES}
    why = ", ".join(f"{_CAUSES[c]} for {k}" for c, k in counts.items() if k) or _CAUSES["none"]
    if not present.numel():
        return {"mean": None, "min": None, "max": None, "missing_frac": 1.0, "why": why}
    out = {"mean": float(present.mean()), "min": float(present.min()), "max": float(present.max()),
           "missing_frac": 1.0 - present.numel() / v.numel()}
    return out | ({"why": why} if present.numel() < v.numel() else {})


def _logp_gap(trainer, rollouts) -> float | None:
    """Mean |sampler logp - trainer logp| over completion tokens (nats), as `rollout/logp_diff`; None with top-p."""
    from grpo.parallel import generation
    from grpo.train.update import PolicyBatch, batch_logprobs

    cfg = trainer.cfg
    if cfg.rollout.top_p != 1.0:  # top-p renormalises the sampler's distribution: not comparable
        return None
    episodes = rollouts.loss_mask is not None  # multi-turn: the policy's tokens, the environment's attended
    mask = (rollouts.loss_mask if episodes else rollouts.completion_mask).float()
    if not mask.sum():
        return None
    batch = PolicyBatch(prompt_ids=rollouts.prompt_ids, prompt_mask=rollouts.prompt_mask,
                        completion_ids=rollouts.completion_ids, mask=mask,
                        adv=torch.zeros(rollouts.num_completions, device=mask.device), group_size=rollouts.group_size,
                        attention_mask=rollouts.completion_mask if episodes else None)
    with torch.no_grad(), generation(trainer.policy, trainer.dist):
        logp = batch_logprobs(trainer.policy, batch, cfg.optim.micro_batch_tokens, cfg.rollout.temperature,
                              compute=trainer.compute)  # as the update's first epoch computes it
    diff = (logp - rollouts.logp.to(logp.device)).abs() * mask
    return float(diff.sum() / mask.sum())


# ------------------------------------------------------------------------------------------------ judging
def judge(stats: dict) -> list[Verdict]:
    """The verdicts of `measure`'s numbers, fatal first; one `ok` verdict when nothing is wrong. Pure."""
    s, out = stats, []
    n, mnt = s["groups"] * s["group_size"], s["max_new_tokens"]
    trunc, run_on = s["truncated_frac"], s.get("run_on")
    if run_on:  # a base model writing on past its answer: a stop string ends it, more tokens would not
        label = run_on["stop"] != "\n"
        fix = (f"they run on past the answer: {run_on['seen']} of the {run_on['of']} cut off "
               + (f"write the prompt's own {run_on['stop']!r} again" if label else "answer on their first line and go "
                  "on to more lines") + f"; end them there with rollout.stop='[{json.dumps(run_on['stop'])}]' (a "
               "longer rollout.max_new_tokens would only let them run on longer)")
    if trunc >= 0.5 and s["zero_spread_frac"] >= 0.5:  # most cut off, and the cut-off answers give no signal
        out.append(Verdict("fatal", f"{trunc:.0%} of completions hit rollout.max_new_tokens={mnt}: " + (
            fix if run_on else f"raise it (e.g. rollout.max_new_tokens={_raise(mnt)}), or check that the model can "
            "emit its end-of-sequence token") + f"; cut off, {s['zero_spread_frac']:.0%} of the groups have zero "
            "reward spread and teach nothing"))
    elif trunc >= 0.5:
        out.append(Verdict("warn", f"{trunc:.0%} of completions hit rollout.max_new_tokens={mnt}: " + (
            fix if run_on else f"raise it (e.g. rollout.max_new_tokens={_raise(mnt)}); cut-off answers usually "
            "score 0")))
    for name, r in s["rewards"].items():
        why = r.get("why", _CAUSES["none"])
        if r["missing_frac"] >= 1.0 and why.startswith(_CAUSES["none"]) and "," not in why:
            out.append(Verdict("fatal", f"reward {name!r} returned None for all {n} completions: it never "
                                        "recognises an answer; check its expected format against a completion: "
                                        f"{s['example'][:80]!r}"))
        elif r["missing_frac"] >= 1.0:
            out.append(Verdict("fatal", f"reward {name!r} gave no value for any of the {n} completions: it {why} "
                                        "(logged above); fix the function"))
        elif r["missing_frac"] >= 0.5 and why.startswith(_CAUSES["none"]) and "," not in why:
            out.append(Verdict("warn", f"reward {name!r} returned None for {r['missing_frac']:.0%} of the "
                                       "completions (no signal for them): check its expected format"))
        elif r["missing_frac"] >= 0.5:
            out.append(Verdict("warn", f"reward {name!r} gave no value for {r['missing_frac']:.0%} of the "
                                       f"completions (it {why}; no signal for them): fix the function"))
        elif r["min"] == r["max"] and len(s["rewards"]) > 1:
            out.append(Verdict("warn", f"reward {name!r} gave {r['min']:g} to all {n} completions: it adds no "
                                       "signal; a format mismatch? compare its expected format with a completion: "
                                       f"{s['example'][:80]!r}"))
    early = s.get("stopped_early")  # sampling ended before the batches that make "cannot learn" certain
    if s["all_same_reward"] is not None and early:
        out.append(Verdict("warn", f"all {n} sampled completions ({s.get('batches', 1)} batch(es) of "
                                   f"{s['group_size']} x {s['groups'] // s.get('batches', 1)} prompts) got the same "
                                   f"reward {s['all_same_reward']:g}; the preflight stopped sampling there ({early}): "
                                   "too few prompts to say the run cannot learn. If no reward varies, training stops "
                                   "after train.zero_spread_steps steps without a spread"))
    elif s["all_same_reward"] is not None:
        batches = s.get("batches", 1)
        over = f" ({batches} batches of {s['groups'] // batches} prompts)" if batches > 1 else ""
        out.append(Verdict("fatal", f"all {n} sampled completions{over} got the same reward "
                                    f"{s['all_same_reward']:g}: every group has zero spread, so every advantage is 0 "
                                    "and nothing is learned. " + cannot_learn_hint(s.get("builtin_model", False))
                                    + f" Check the reward against a completion: {s['example'][:80]!r}"))
    elif s.get("batches", 1) > 1 and s.get("spread_groups", 2) < MIN_SPREAD_GROUPS and not early:
        out.append(Verdict("fatal", f"only {s['spread_groups']} of the {s['groups']} sampled prompts "
                                    f"({s['batches']} batches) had any reward spread among its {s['group_size']} "
                                    "completions: one lucky prompt is not a signal, and every other advantage is 0. "
                                    + cannot_learn_hint(s.get("builtin_model", False))
                                    + f" Check the reward against a completion: {s['example'][:80]!r}"))
    elif s["zero_spread_frac"] >= 0.8:
        out.append(Verdict("warn", f"{s['zero_spread_frac']:.0%} of the {s['groups']} sampled groups have zero "
                                   "reward spread (advantage 0, no gradient): raise rollout.group_size, change "
                                   "data.difficulty, or use the dapo preset (drops such groups)"))
    if s["logp_gap"] is not None and s["logp_gap"] > 0.05:
        out.append(Verdict("warn", f"the sampler's log-probs differ from the trainer's by {s['logp_gap']:.3f} "
                                   "nats/token on the same tokens: the two do not compute the same policy, so "
                                   "updates are off-policy. " + LOGP_FIX))
    if s["completion_len_mean"] <= 1.0:
        out.append(Verdict("warn", f"completions are nearly empty ({s['completion_len_mean']:.1f} tokens on "
                                   "average, the end-of-sequence token included): the model ends at once; check the "
                                   "prompt format or chat template"))
    out.sort(key=lambda v: v.level != "fatal")
    if not out:
        out.append(Verdict("ok", f"healthy: {trunc:.0%} truncated, {s['zero_spread_frac']:.0%} of groups with "
                                 "zero spread, every reward varies and is present; the run can learn"))
    return out


def _reward_missing(stats: dict) -> bool:
    """Some reward never gives a value: more prompts will not change that verdict."""
    return any(r["missing_frac"] >= 1.0 for r in stats["rewards"].values())


def _raise(max_new_tokens: int) -> int:
    return max_new_tokens * 4


MIN_SPREAD_GROUPS = 2  # prompts whose groups must show a reward spread before the preflight calls the run healthy

BUILTIN_KNOWS = ("the built-in model only knows addition and subtraction of numbers below 60 (data.task=arithmetic); "
                 "for anything else train a model that knows the domain: model.name=DIR (a local Hugging Face model "
                 "directory)")


def cannot_learn_hint(builtin_model: bool, override: str = "train.preflight=warn") -> str:
    """What a user can change when no sampled reward differs: shared by the preflight and the in-training guard
    (override: the setting that trains anyway)."""
    model = BUILTIN_KNOWS if builtin_model else "a model that knows the domain (model.name)"
    return ("The task is too hard (or too easy) for the starting model, or the reward never matches. Change one of: "
            f"an easier task (data.difficulty, or easier rows); {model}; more completions per group "
            f"(rollout.group_size); or {override} to train anyway.")


def preflight_batches(trainer) -> int:
    """The most batches of train.preflight_groups prompts run_preflight samples (it stops early once two prompts
    show a reward spread)."""
    cfg = trainer.cfg
    return max(min(cfg.train.preflight_batches, len(trainer.train_prompts) // cfg.train.preflight_groups), 1)


# no preflight batch is begun that would end past this many CPU seconds of this process (all its threads: about half a
# minute of a 2-core machine's wall time for a model's dense work), at the pace of the batches so far. CPU time, not
# wall time: on a loaded machine the same work gives the same verdict
BUDGET_S = 60.0


def run_preflight(trainer, progress=None, budget_s: float = BUDGET_S, clock=time.process_time) -> PreflightReport:
    """measure + judge with trainer's config; under torchrun every rank runs it (the same prompts and seed) and the
    report is fatal on every rank when it is on one. `progress(done, total, info)` after each batch (the total: the
    batches sampled, once the check stops early) and, with the native sampler, during a batch (info: the batch, its
    tokens, the CPU seconds of the budget spent). More batches are sampled only while no verdict is certain (under two
    prompts with a spread, every reward present) and the next would end within budget_s of `clock` (CPU seconds) at
    the pace so far."""
    n, t0 = trainer.cfg.train.preflight_groups, clock()
    total = preflight_batches(trainer)
    stats = measure(trainer, n, on_step=_on_step(progress, 0, total, t0, budget_s, clock))
    for k in range(1, total):  # under two prompts with a spread: more prompts before calling it fatal
        if stats["spread_groups"] >= MIN_SPREAD_GROUPS or _reward_missing(stats):
            break
        spent = clock() - t0
        if spent / k * (k + 1) > budget_s:
            stats["stopped_early"] = (f"{k} batch(es) took {spent:.0f} CPU s; another would pass its "
                                      f"{budget_s:.0f} CPU s budget")
            break
        if progress is not None:
            progress(k, total)
        stats = merge_batches(stats, measure(trainer, n, start=k * n,
                                             on_step=_on_step(progress, k, total, t0, budget_s, clock)))
    if progress is not None:
        progress(stats["batches"], stats["batches"])
    report = PreflightReport(stats, judge(stats))
    if trainer.dist.enabled and trainer.dist.any(report.fatal) and not report.fatal:
        report.verdicts.insert(0, Verdict("fatal", "another process's preflight found that the run cannot learn"))
    return report


def _on_step(progress, k: int, total: int, t0: float, budget_s: float, clock):
    """The sampler's per-token hook of batch k: progress(k, total, 'batch k+1: t/T tokens, m rows running, s of
    budget'), at most every half CPU second."""
    if progress is None:
        return None
    last = [0.0]

    def hook(t: int, T: int, live: int) -> None:
        now = clock()
        if now - last[0] >= 0.5 or t == T:
            last[0] = now
            progress(k, total, f"batch {k + 1}: {t}/{T} tokens, {live} rows running, {now - t0:.0f} of "
                               f"{budget_s:.0f} CPU s")
    return hook
