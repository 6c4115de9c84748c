"""The hand-computed vectors of ALGORITHMS.md §9 and the seed's own worked examples, hard-coded."""

import math

import pytest
import torch

from grpo.algo import (
    aggregate,
    clipped_surrogate,
    clipped_value_loss,
    dr_grpo_advantages,
    gae,
    group_advantages,
    kl_estimate,
    overlong_penalty,
    rloo_advantages,
)

D = torch.float64
R = torch.tensor([10.0, 0.0, 10.0, 7.0], dtype=D)


def close(got, want, tol=1e-6):
    torch.testing.assert_close(got, torch.as_tensor(want, dtype=got.dtype), rtol=0, atol=tol)


# ---- group normalisation of [10, 0, 10, 7] ----------------------------------------------------------------------


def test_group_population_std_no_eps():
    close(group_advantages(R, 4, std="population", eps=0.0), [0.795587, -1.652373, 0.795587, 0.061199])


def test_group_sample_std_no_eps():
    close(group_advantages(R, 4, std="sample", eps=0.0), [0.688999, -1.430997, 0.688999, 0.053000])


def test_group_sample_std_with_trl_and_verl_eps():
    close(group_advantages(R, 4, std="sample", eps=1e-4), [0.688984, -1.430967, 0.688984, 0.052999])
    close(group_advantages(R, 4, std="sample", eps=1e-6), [0.688998, -1.430997, 0.688998, 0.053000])


def test_dr_grpo_and_rloo_vectors():
    close(dr_grpo_advantages(R, 4), [3.25, -6.75, 3.25, 0.25])
    close(rloo_advantages(R, 4), [4.333333, -9.0, 4.333333, 0.333333])
    close(rloo_advantages(R, 4), 4 / 3 * (R - R.mean()), tol=1e-12)


def test_zero_std_group_is_exactly_zero():
    for fn in (group_advantages, dr_grpo_advantages, rloo_advantages):
        out = fn(torch.ones(4, dtype=D), 4)
        assert torch.equal(out, torch.zeros(4, dtype=D))


@pytest.mark.parametrize(
    "n_correct, sample, population",
    [
        (1, [1.4997, -0.4999, -0.4999, -0.4999], [1.732051, -0.57735, -0.57735, -0.57735]),
        (2, [0.865875, 0.865875, -0.865875, -0.865875], [1.0, 1.0, -1.0, -1.0]),
        (3, [0.4999, 0.4999, 0.4999, -1.4997], [0.57735, 0.57735, 0.57735, -1.732051]),
    ],
)
def test_binary_groups(n_correct, sample, population):
    r = torch.tensor([1.0] * n_correct + [0.0] * (4 - n_correct), dtype=D)
    # ALGORITHMS.md prints the sample-std row with TRL's eps 1e-4 and 4 decimals; the population row without eps.
    close(group_advantages(r, 4, std="sample", eps=1e-4), sample, tol=1e-4)
    close(group_advantages(r, 4, std="population", eps=0.0), population)


# ---- the seed's worked examples ----------------------------------------------------------------------------------
# The seed prints std 4.27 for [10, 0, 10, 7], and 4.2 / 0.58 for its §3.3 cases A [10, 9, 2, 1] and B [6, 6, 5, 5].
# Those match neither definition: population std (its own formula 4.1, 1/G) is 4.085 / 4.031 / 0.5 and sample std
# (1/(G-1)) is 4.717 / 4.655 / 0.577 (0.58 is the latter rounded, but then case A would be 4.65, not 4.2).
# We assert the formula's values, not the printed ones.


@pytest.mark.parametrize(
    "rewards, mean, pop_std, sample_std, printed",
    [
        ([10, 0, 10, 7], 6.75, 4.085034, 4.716991, 4.27),
        ([10, 9, 2, 1], 5.5, 4.031129, 4.654747, 4.2),  # case A
        ([6, 6, 5, 5], 5.5, 0.5, 0.577350, 0.58),  # case B
    ],
)
def test_seed_examples_follow_formula_4_1(rewards, mean, pop_std, sample_std, printed):
    r = torch.tensor(rewards, dtype=D)
    close(group_advantages(r, 4, std="population", eps=0.0), (r - mean) / pop_std)
    close(group_advantages(r, 4, std="sample", eps=0.0), (r - mean) / sample_std)
    # No single definition reproduces the printed values: none is the population std, and only case B's 0.58
    # equals the sample std rounded to two decimals (4.27 and 4.2 are neither).
    assert round(pop_std, 2) != printed
    assert (round(sample_std, 2) == printed) == (rewards == [6, 6, 5, 5])


def test_seed_headline_advantages():
    # The seed prints +0.76 / -1.58 / +0.76 / +0.06 (dividing by 4.27); formula 4.1 gives these.
    close(group_advantages(R, 4, eps=0.0), [0.7956, -1.6524, 0.7956, 0.0612], tol=1e-4)
    # Case A first completion: (10 - 5.5) / 4.031 = 1.116 (seed: 1.07); case B: (6 - 5.5) / 0.5 = 1.0 (seed: 0.86).
    close(group_advantages(torch.tensor([10.0, 9, 2, 1], dtype=D), 4, eps=0.0)[0], 1.116313)
    close(group_advantages(torch.tensor([6.0, 6, 5, 5], dtype=D), 4, eps=0.0)[0], 1.0)


# ---- clipped surrogate ------------------------------------------------------------------------------------------


def _objective(w, a, **kw):
    logp = torch.tensor([[math.log(w)]], dtype=D, requires_grad=True)
    loss, metrics = clipped_surrogate(logp, torch.zeros(1, 1, dtype=D), torch.tensor([a], dtype=D),
                                      torch.ones(1, 1), **kw)
    loss.sum().backward()
    return -loss.item(), logp.grad.item(), metrics


@pytest.mark.parametrize(
    "w, a, obj, clipped",
    [(0.5, 1, 0.5, False), (1.0, 1, 1.0, False), (1.5, 1, 1.2, True),
     (0.5, -1, -0.8, True), (1.0, -1, -1.0, False), (1.5, -1, -1.5, False)],
)
def test_clip_table(w, a, obj, clipped):
    got, grad, metrics = _objective(w, a)
    assert got == pytest.approx(obj, abs=1e-9)
    assert (grad == 0) == clipped
    assert metrics["clip_frac"].item() == float(clipped)
    assert metrics["clip_frac_high" if a > 0 else "clip_frac_low"].item() == float(clipped)


@pytest.mark.parametrize("w, eps_obj, dapo_obj", [(0.5, 0.5, 0.5), (1.0, 1.0, 1.0), (1.5, 1.2, 1.28),
                                                  (1.25, 1.2, 1.25), (1.3, 1.2, 1.28)])
def test_clip_higher(w, eps_obj, dapo_obj):
    assert _objective(w, 1)[0] == pytest.approx(eps_obj, abs=1e-9)
    assert _objective(w, 1, clip_low=0.2, clip_high=0.28)[0] == pytest.approx(dapo_obj, abs=1e-9)


@pytest.mark.parametrize("w, obj, grad_zero", [(2.0, -2.0, False), (3.5, -3.0, True), (5.0, -3.0, True)])
def test_dual_clip(w, obj, grad_zero):
    got, grad, metrics = _objective(w, -1, dual_clip=3.0)
    assert got == pytest.approx(obj, abs=1e-9)
    assert (grad == 0) == grad_zero
    assert metrics["clip_frac_dual"].item() == float(grad_zero)


def test_nemo_clip_vector():
    w = torch.tensor([[0.5, 1.0, 1.5]], dtype=D)
    loss, _ = clipped_surrogate(w.log(), torch.zeros_like(w), torch.tensor([[1.0, -1.0, 2.0]], dtype=D),
                                torch.ones_like(w))
    close(aggregate(loss, torch.ones_like(w), mode="token_mean"), -0.633333)


def test_gspo_sequence_ratio():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=D)
    old = torch.tensor([[-1.1, -1.8, -0.5]], dtype=D)
    ones = torch.ones_like(logp)
    _, m_tok = clipped_surrogate(logp, old, torch.ones(1, dtype=D), ones, clip_low=10.0 / 11, clip_high=10.0)
    close(torch.stack([m_tok["ratio_min"], m_tok["ratio_max"]]), [0.818731, 1.105171])
    loss, m_seq = clipped_surrogate(logp, old, torch.ones(1, dtype=D), ones, level="sequence")
    close(loss, -torch.full((1, 3), 0.967216, dtype=D))
    close(m_seq["ratio_mean"], 0.967216)
    close(m_seq["ratio_mean"], (1.105171 * 0.818731 * 1.0) ** (1 / 3))


# ---- KL estimators --------------------------------------------------------------------------------------------

KL_ROWS = [
    (-1.0, -1.0, 0.0, 0.0, 0.0),
    (-1.0, -2.0, 1.0, 0.5, 0.367879),
    (-2.0, -1.0, -1.0, 0.5, 0.718282),
    (-0.5, math.log(0.5), 0.193147, 0.018653, 0.017508),
    (math.log(0.5), math.log(0.25), 0.693147, 0.240227, 0.193147),
    (-0.1, -3.0, 2.9, 4.205, 1.955023),
    (-1.0, -15.0, 14.0, 98.0, 13.000001),  # no output clamp (NeMo would give 10)
]


@pytest.mark.parametrize("kind, col", [("k1", 2), ("k2", 3), ("k3", 4)])
def test_kl_table(kind, col):
    logp = torch.tensor([[row[0] for row in KL_ROWS]], dtype=D)
    ref = torch.tensor([[row[1] for row in KL_ROWS]], dtype=D)
    close(kl_estimate(logp, ref, kind=kind), [[row[col] for row in KL_ROWS]])


# ---- aggregation -----------------------------------------------------------------------------------------------


def test_aggregation_vectors():
    loss = torch.tensor([[1.0, 1, 0, 0, 0, 0], [2, 2, 2, 2, 2, 2]], dtype=D)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    close(aggregate(loss, mask, mode="seq_mean_token_mean"), 1.5)
    close(aggregate(loss, mask, mode="token_mean"), 1.75)
    close(aggregate(loss, mask, mode="seq_sum_norm", max_len=8), 0.875)


def test_aggregation_token_weights():
    # Per-token weights (gradient of the aggregate w.r.t. each token's loss) in a group of lengths 2 and 6.
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    for mode, kw, w_short, w_long in [("seq_mean_token_mean", {}, 0.25, 1 / 12), ("token_mean", {}, 0.125, 0.125),
                                      ("seq_sum_norm", {"max_len": 8}, 0.0625, 0.0625)]:
        loss = torch.zeros(2, 6, dtype=D, requires_grad=True)
        aggregate(loss, mask, mode=mode, **kw).backward()
        close(loss.grad, torch.where(mask.bool(), torch.tensor([[w_short], [w_long]], dtype=D), 0.0))


# ---- GAE, value clip, overlong shaping ---------------------------------------------------------------------------


@pytest.mark.parametrize("gamma, lam, want", [(1.0, 1.0, [0.5, 0.4, 0.3]), (1.0, 0.95, [0.46575, 0.385, 0.3]),
                                              (0.99, 0.95, [0.446829, 0.37515, 0.3])])
def test_gae_vectors(gamma, lam, want):
    values = torch.tensor([[0.5, 0.6, 0.7]], dtype=D)
    adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]], dtype=D), values, torch.ones(1, 3), gamma=gamma, lam=lam)
    close(adv, [want])
    close(ret, adv + values)
    if gamma == lam == 1.0:
        close(ret, [[1.0, 1.0, 1.0]])


@pytest.mark.parametrize("v, want", [(0.6, 0.08), (0.9, 0.045), (0.2, 0.32)])
def test_value_clip_vectors(v, want):
    # ALGORITHMS.md quotes the loss with the 0.5 factor included: 0.5 * max((V-R)^2, (Vclip-R)^2).
    full = lambda x: torch.full((1, 1), x, dtype=D)  # noqa: E731
    close(clipped_value_loss(full(v), full(0.5), full(1.0), torch.ones(1, 1), clip=0.2), [[want]])


def test_overlong_vectors():
    lengths = torch.tensor([16000, 16384, 18432, 20480, 20481])
    close(overlong_penalty(lengths, max_len=20480, cache_len=4096), [0.0, 0.0, -0.5, -1.0, -1.0])
    close(overlong_penalty(torch.tensor([80, 90, 100, 101]), max_len=100, cache_len=20), [0.0, -0.5, -1.0, -1.0])
