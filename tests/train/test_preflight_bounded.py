"""The preflight for base models and big ones (issue #50): completions of raw prompts that run on past the answer get
advice naming rollout.stop with the string seen repeating (never a longer max_new_tokens); the check is bounded by a
time budget (an uncertain "all the same reward" is then a warning, not fatal), measures the log-prob gap once, and
shows a progress line while a batch samples."""

from __future__ import annotations

import torch
from test_preflight import HEALTHY, constant, spread_fatal, stats

from grpo.rollout.stop import suggest_stop
from grpo.train.preflight import _run_on, judge, run_preflight
from grpo.types import Prompt, Rollouts

BASE = "Question: What is 54 - 24?\nAnswer:"


def test_suggest_stop_names_the_prompts_label_or_a_newline():
    texts = [" 30\nQuestion: What is 2 + 2?\nAnswer: 4\nQuestion:", " 31\n\nQuestion: x", " 12 and so on"]
    assert suggest_stop([BASE], texts) == ("Question:", 2)  # the prompt's first label, written again
    assert suggest_stop(["What is 54 - 24?"], [" 30\nWhat is 2 + 2? 4", " 31\n\n5 + 5 = 10", " 12"]) == ("\n", 2)
    assert suggest_stop([BASE], [" 30 and more", " 31", " 12\n"]) is None  # nothing repeats in most: no advice
    assert suggest_stop([BASE], []) is None


def _rollouts(prompts, texts, truncated):
    n = len(texts)
    z = torch.zeros((n, 1), dtype=torch.long)
    return Rollouts(prompts=prompts, group_size=n // len(prompts), prompt_ids=z[:len(prompts)],
                    prompt_mask=z[:len(prompts)], completion_ids=z, completion_mask=z, logp=z.float(),
                    truncated=torch.tensor(truncated), texts=texts)


def test_run_on_is_measured_for_raw_prompts_only():
    texts = [" 30\nQuestion: What is 1 + 1?\nAnswer: 2"] * 3 + [" 30"]
    raw = [Prompt(uid="a", text=BASE)]
    assert _run_on(raw, _rollouts(raw, texts, [True, True, True, False])) == {"stop": "Question:", "seen": 3, "of": 3}
    templated = [Prompt(uid="a", text=BASE, templated=True)]  # a chat model's turn: its template ends the answer
    assert _run_on(templated, _rollouts(templated, texts, [True, True, True, False])) is None
    assert _run_on(raw, _rollouts(raw, texts, [False] * 4)) is None  # nothing cut off


def test_run_on_advice_names_rollout_stop_not_a_longer_max_new_tokens():
    for stop, words in (("Question:", "write the prompt's own 'Question:' again"),
                        ("\n", "answer on their first line and go on to more lines")):
        s = stats(truncated_frac=0.94, zero_spread_frac=1.0, max_new_tokens=256,
                  run_on={"stop": stop, "seen": 29, "of": 30})
        fatal = [v.text for v in judge(s) if v.level == "fatal"]
        want = "rollout.stop='[\"Question:\"]'" if stop != "\n" else "rollout.stop='[\"\\n\"]'"
        assert fatal and want in fatal[0] and words in fatal[0] and "29 of the 30 cut off" in fatal[0], fatal
        assert "rollout.max_new_tokens=1024" not in fatal[0]
    plain = [v.text for v in judge(stats(truncated_frac=0.94, zero_spread_frac=1.0, max_new_tokens=256))]
    assert "raise it (e.g. rollout.max_new_tokens=1024)" in plain[0]  # without run-on evidence: as before
    assert "rollout.stop" in [v.text for v in judge(stats(truncated_frac=0.6, run_on={"stop": "\n", "seen": 5,
                                                                                     "of": 9}))][0]


def test_all_the_same_reward_within_a_cut_budget_is_a_warning(make_trainer, monkeypatch):
    """A clock on which each batch takes 25 s of a 60 s budget: the third batch would end past it, so two are sampled;
    every reward the same in 2 of the 16 planned batches is too few prompts for "cannot learn": a warning."""
    import grpo.train.preflight as pf

    now, measure = [0.0], pf.measure

    def slow(*args, **kwargs):
        now[0] += 25.0
        return measure(*args, **kwargs)

    monkeypatch.setattr(pf, "measure", slow)
    trainer = make_trainer("train.preflight_groups=4", "train.preflight_batches=16", "data.train_size=80",
                           reward_functions=[("const", constant, 1.0)])
    report = run_preflight(trainer, budget_s=60, clock=lambda: now[0])
    assert report.stats["batches"] == 2 and "another would pass its 60 CPU s budget" in report.stats["stopped_early"]
    assert not spread_fatal(report)
    assert any(v.level == "warn" and "too few prompts to say the run cannot learn" in v.text for v in report.verdicts)
    monkeypatch.setattr(pf, "measure", measure)
    report = run_preflight(trainer)  # the default budget: all 16 batches of this tiny model, and fatal as before
    assert report.stats["batches"] == 16 and spread_fatal(report)


def test_a_progress_line_while_a_batch_samples_and_the_gap_measured_once(make_trainer, monkeypatch):
    import grpo.train.preflight as pf

    calls, gaps = [], []
    gap = pf._logp_gap
    monkeypatch.setattr(pf, "_logp_gap", lambda trainer, r: gaps.append(r.num_completions) or gap(trainer, r))
    trainer = make_trainer("train.preflight_groups=2", "train.preflight_batches=3", "rollout.max_new_tokens=6",
                           reward_functions=[("const", constant, 1.0)])
    run_preflight(trainer, progress=lambda done, total=None, info="": calls.append((done, total, info)))
    tokens = [c for c in calls if c[2].startswith("batch ")]
    assert tokens and any("batch 1: 6/6 tokens" in c[2] for c in tokens) and any("batch 3:" in c[2] for c in tokens)
    assert all(" of 60 CPU s" in c[2] for c in tokens)
    assert gaps == [trainer.cfg.rollout.group_size]  # once, on the first group only
    assert trainer.sampler.on_step is None  # the hook is the preflight's only while it samples


def test_healthy_stats_have_no_run_on_advice():
    assert "rollout.stop" not in judge(dict(HEALTHY))[0].text
