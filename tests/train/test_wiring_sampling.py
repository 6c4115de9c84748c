"""Trainer-level wiring of rollout.temperature and rollout.top_p: the trainer's sampler draws from
softmax(logits / T) cut to the top-p nucleus and reports the log-probability of that distribution, and the
training log-probs use the same temperature over the full vocabulary (as TRL and verl: the nucleus is a sampling
device, the loss's log pi_theta is the tempered softmax). The references are written here: a plain forward over
each row's own tokens, a sort, a cumulative sum.
"""

from __future__ import annotations

import copy

import torch
from wiring_helpers import one_thread  # noqa: F401  (an autouse fixture)
from wiring_helpers import Setting, assert_matches, fixed_step, perturb_, reference_grad, rows_of

TEMP, TOP_P = 0.7, 0.8


@torch.no_grad()
def next_token_logp(model, ids: list[int], temperature: float, top_p: float) -> torch.Tensor:
    """(V,) log-probabilities of the next token: tempered softmax, tokens outside the nucleus at -inf, renormalised.
    The nucleus: tokens by decreasing probability while the mass before them is below top_p."""
    probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].double() / temperature, -1)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    before = 0.0
    for v in probs.argsort(descending=True).tolist():
        if before > top_p:
            break
        keep[v] = True
        before += float(probs[v])
    kept = probs.where(keep, 0)
    return (kept / kept.sum()).log()


def test_the_sampler_draws_from_the_tempered_nucleus_and_reports_its_log_probs(make_trainer):
    trainer = make_trainer(f"rollout.temperature={TEMP}", f"rollout.top_p={TOP_P}", "rollout.group_size=4",
                           "rollout.max_new_tokens=4")
    perturb_(trainer.policy, 0.1)  # random weights are nearly uniform: spread the next-token distributions
    policy, seen = copy.deepcopy(trainer.policy), []
    generate = trainer.sampler.generate

    def record(*args, **kwargs):
        seen.append(generate(*args, **kwargs))
        return seen[-1]

    trainer.sampler.generate = record
    trainer.step()
    r = seen[0]
    G, checked, worst = r.group_size, 0, {"T=1": 0.0, "no top-p": 0.0}
    for i in range(r.num_completions):
        prompt = r.prompt_ids[i // G][r.prompt_mask[i // G] == 1].tolist()
        toks = r.completion_ids[i][r.completion_mask[i] == 1].tolist()
        for t, tok in enumerate(toks):
            want = next_token_logp(policy, prompt + toks[:t], TEMP, TOP_P)
            assert want[tok] > -float("inf"), f"row {i} token {t}: drawn from outside the top-p nucleus"
            assert abs(float(r.logp[i, t]) - float(want[tok])) < 1e-4, (i, t)
            worst["T=1"] = max(worst["T=1"], abs(float(next_token_logp(policy, prompt + toks[:t], 1.0, TOP_P)[tok])
                                                 - float(want[tok])))
            worst["no top-p"] = max(worst["no top-p"], abs(float(next_token_logp(policy, prompt + toks[:t], TEMP,
                                                                                 1.0)[tok]) - float(want[tok])))
            checked += 1
    assert checked >= 8
    assert min(worst.values()) > 1e-2, worst  # with T or top-p ignored the reported log-probs would not match


def test_training_log_probs_use_the_temperature_over_the_whole_vocabulary(make_trainer):
    s = Setting(temperature=TEMP)
    trainer, spy, calls, initial = fixed_step(make_trainer, s, f"rollout.top_p={TOP_P}",
                                              before=lambda t: perturb_(t.policy, 0.1))
    rows = rows_of(calls[0])
    assert_matches(spy.grads[0], reference_grad(initial, rows, s, G=4), reference_grad(initial, rows, Setting(), G=4))
