"""Advantage estimators and masked reductions against plain-Python reference loops (hypothesis-generated inputs)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.algo import (
    dr_grpo_advantages,
    gae,
    group_advantages,
    masked_mean,
    masked_var,
    masked_whiten,
    rloo_advantages,
    zero_std_groups,
)

D = torch.float64
NAN = float("nan")
FAST = settings(max_examples=40, deadline=None)


# ---- reference loops --------------------------------------------------------------------------------------------


def _std(xs, std):
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / max(len(xs) - (std == "sample"), 1))


def ref_group(rewards, g, std, scale, eps):
    batch = [x for x in rewards if not math.isnan(x)]
    out = []
    for k in range(0, len(rewards), g):
        group = rewards[k:k + g]
        present = [x for x in group if not math.isnan(x)]
        if len(present) < 2 or len(set(present)) == 1:
            out += [0.0] * g
            continue
        mean = sum(present) / len(present)
        denom = {"group": lambda: _std(present, std) + eps, "batch": lambda: _std(batch, std) + eps,
                 "none": lambda: 1.0}[scale]()
        out += [0.0 if math.isnan(x) or denom == 0 else (x - mean) / denom for x in group]
    return out


def ref_rloo(rewards, g):
    out = []
    for k in range(0, len(rewards), g):
        group = rewards[k:k + g]
        present = [x for x in group if not math.isnan(x)]
        for i, x in enumerate(group):
            others = [y for j, y in enumerate(group) if j != i and not math.isnan(y)]
            flat = len(present) < 2 or len(set(present)) == 1
            out.append(0.0 if math.isnan(x) or flat else x - sum(others) / len(others))
    return out


def ref_gae(rewards, values, mask, gamma, lam):
    """Standard GAE on the unmasked positions of each row only (the masked ones are cut out), scattered back."""
    adv_rows, ret_rows = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask):
        idx = [t for t, m in enumerate(m_row) if m]
        r, v = [r_row[t] for t in idx], [v_row[t] for t in idx]
        a, last = [0.0] * len(idx), 0.0
        for k in reversed(range(len(idx))):
            next_v = v[k + 1] if k + 1 < len(idx) else 0.0
            last = r[k] + gamma * next_v - v[k] + gamma * lam * last
            a[k] = last
        adv, ret = [0.0] * len(m_row), [0.0] * len(m_row)
        for k, t in enumerate(idx):
            adv[t], ret[t] = a[k], a[k] + v[k]
        adv_rows.append(adv)
        ret_rows.append(ret)
    return adv_rows, ret_rows


# ---- strategies -------------------------------------------------------------------------------------------------

value = st.floats(-10, 10, allow_nan=False, width=64)


@st.composite
def grouped_rewards(draw):
    """Rewards (P*G) mixing ordinary, constant, tiny-variance and partly/fully missing (NaN) groups."""
    g, p = draw(st.integers(2, 6)), draw(st.integers(1, 5))
    rewards = []
    for _ in range(p):
        kind = draw(st.sampled_from(["random", "constant", "tiny", "binary"]))
        base = draw(value)
        if kind == "random":
            group = [draw(value) for _ in range(g)]
        elif kind == "constant":
            group = [base] * g
        elif kind == "tiny":
            delta = draw(st.sampled_from([1e-7, 1e-5, 1e-3]))
            group = [base + delta * draw(st.integers(0, 3)) for _ in range(g)]
        else:
            group = [float(draw(st.integers(0, 1))) for _ in range(g)]
        missing = draw(st.lists(st.booleans(), min_size=g, max_size=g))
        rewards += [NAN if m and draw(st.booleans()) else x for x, m in zip(group, missing)]
    return rewards, g


def _assert_matches(got, want):
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, torch.tensor(want, dtype=D), rtol=1e-6, atol=1e-6)


@FAST
@given(grouped_rewards(), st.sampled_from(["population", "sample"]), st.sampled_from(["group", "batch", "none"]),
       st.sampled_from([0.0, 1e-6, 1e-4]))
def test_group_advantages_match_reference(data, std, scale, eps):
    rewards, g = data
    got = group_advantages(torch.tensor(rewards, dtype=D), g, std=std, scale=scale, eps=eps)
    _assert_matches(got, ref_group(rewards, g, std, scale, eps))


@FAST
@given(grouped_rewards())
def test_dr_grpo_and_rloo_match_reference(data):
    rewards, g = data
    r = torch.tensor(rewards, dtype=D)
    _assert_matches(dr_grpo_advantages(r, g), ref_group(rewards, g, "population", "none", 0.0))
    _assert_matches(rloo_advantages(r, g), ref_rloo(rewards, g))


@FAST
@given(grouped_rewards())
def test_group_properties(data):
    rewards, g = data
    r = torch.tensor(rewards, dtype=D)
    adv = group_advantages(r, g).view(-1, g)
    flat = zero_std_groups(r, g)
    assert torch.equal(adv[flat], torch.zeros_like(adv[flat]))  # exactly 0, never NaN or eps-sized noise
    assert torch.equal(adv.view(-1)[torch.isnan(r)], torch.zeros(int(torch.isnan(r).sum()), dtype=D))
    torch.testing.assert_close(adv.sum(1), torch.zeros(adv.shape[0], dtype=D), atol=1e-6, rtol=0)


def test_float32_constant_group_is_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in floating point, so a "numerator is 0" argument alone would leave ~1e-8 noise / eps.
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], dtype=torch.float32)
    for fn in (group_advantages, dr_grpo_advantages, rloo_advantages):
        assert torch.equal(fn(r, 3), torch.zeros(6))


def test_missing_rewards():
    r = torch.tensor([1.0, NAN, 0.0, 1.0, NAN, NAN, NAN, 5.0, NAN, NAN, NAN, NAN])
    adv = group_advantages(r, 4)
    # Group 0: present [1, 0, 1], mean 2/3, population std sqrt(2)/3.
    want0 = (torch.tensor([1.0, 0.0, 1.0]) - 2 / 3) / (math.sqrt(2) / 3 + 1e-6)
    torch.testing.assert_close(adv[[0, 2, 3]], want0)
    assert adv[1] == 0 and torch.equal(adv[4:], torch.zeros(8))  # one present / none present -> 0
    assert zero_std_groups(r, 4).tolist() == [False, True, True]


def test_integer_rewards_are_accepted():
    want = torch.tensor([0.75, -0.25, -0.25, -0.25])
    torch.testing.assert_close(dr_grpo_advantages(torch.tensor([1, 0, 0, 0]), 4), want)


def test_batch_scale_is_trl_batch_std():
    r = torch.tensor([1.0, 0.0, 3.0, 5.0], dtype=D)  # groups [1, 0], [3, 5]
    adv = group_advantages(r, 2, std="sample", scale="batch", eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -1.0, 1.0], dtype=D) / r.std())


# ---- GAE --------------------------------------------------------------------------------------------------------


@st.composite
def token_batch(draw):
    n, t = draw(st.integers(1, 4)), draw(st.integers(1, 7))
    grid = lambda: [[draw(value) for _ in range(t)] for _ in range(n)]  # noqa: E731
    mask = [[draw(st.booleans()) for _ in range(t)] for _ in range(n)]
    return grid(), grid(), mask


@FAST
@given(token_batch(), st.sampled_from([1.0, 0.99, 0.5, 0.0]), st.sampled_from([1.0, 0.95, 0.0]))
def test_gae_matches_reference(batch, gamma, lam):
    rewards, values, mask = batch
    adv, ret = gae(torch.tensor(rewards, dtype=D), torch.tensor(values, dtype=D), torch.tensor(mask),
                   gamma=gamma, lam=lam)
    want_adv, want_ret = ref_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, torch.tensor(want_adv, dtype=D))
    torch.testing.assert_close(ret, torch.tensor(want_ret, dtype=D))


def test_gae_ignores_masked_values_and_rewards():
    # verl's multi-turn test: changing values (or rewards) at observation tokens does not change anything.
    torch.manual_seed(0)
    r, v = torch.randn(3, 8), torch.randn(3, 8)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1]] * 3)
    noisy = lambda x: torch.where(mask.bool(), x, torch.full_like(x, float("nan")))  # noqa: E731
    base = gae(r, v, mask, gamma=0.9, lam=0.8)
    for got, want in zip(gae(noisy(r), noisy(v), mask, gamma=0.9, lam=0.8), base):
        torch.testing.assert_close(got, want)
    assert (base[0][:, [2, 3, 6]] == 0).all() and (base[1][:, [2, 3, 6]] == 0).all()


def test_gae_has_no_gradient():
    v = torch.randn(2, 3, requires_grad=True)
    adv, ret = gae(torch.randn(2, 3), v, torch.ones(2, 3), gamma=1.0, lam=1.0)
    assert not adv.requires_grad and not ret.requires_grad


# ---- masked reductions and whitening ---------------------------------------------------------------------------


@FAST
@given(token_batch(), st.booleans())
def test_masked_stats_match_reference(batch, unbiased):
    x, _, mask = batch
    xt, mt = torch.tensor(x, dtype=D), torch.tensor(mask)
    present = [v for row, mrow in zip(x, mask) for v, m in zip(row, mrow) if m]
    mean = sum(present) / len(present) if present else 0.0
    k = len(present) - unbiased
    var = sum((v - mean) ** 2 for v in present) / k if k > 0 else 0.0
    torch.testing.assert_close(masked_mean(xt, mt), torch.tensor(mean, dtype=D))
    torch.testing.assert_close(masked_var(xt, mt, unbiased), torch.tensor(var, dtype=D))
    row_means = [sum(v for v, m in zip(r, mr) if m) / max(sum(mr), 1) for r, mr in zip(x, mask)]
    torch.testing.assert_close(masked_mean(xt, mt, dim=-1), torch.tensor(row_means, dtype=D))
    var_w = masked_var(xt, mt, True)
    want = [[(v - mean) / math.sqrt(var_w.item() + 1e-8) if m else 0.0 for v, m in zip(r, mr)]
            for r, mr in zip(x, mask)]
    torch.testing.assert_close(masked_whiten(xt, mt), torch.tensor(want, dtype=D))
    shifted = [[w + mean if m else 0.0 for w, m in zip(wr, mr)] for wr, mr in zip(want, mask)]
    torch.testing.assert_close(masked_whiten(xt, mt, shift_mean=False), torch.tensor(shifted, dtype=D))


def test_masked_reductions_ignore_nan_at_padding_and_empty_is_zero():
    x = torch.tensor([[1.0, NAN], [NAN, NAN]])
    m = torch.tensor([[True, False], [False, False]])
    assert masked_mean(x, m).item() == 1.0
    assert masked_mean(x, m, dim=-1).tolist() == [1.0, 0.0]
    assert masked_var(x, m).item() == 0.0
    assert torch.equal(masked_whiten(x, m), torch.zeros(2, 2))


@pytest.mark.parametrize("fn", [masked_mean, masked_var, masked_whiten])
def test_masked_shape_mismatch(fn):
    with pytest.raises(ValueError, match="mask has shape"):
        fn(torch.zeros(2, 3), torch.ones(2, 4))


def test_masked_whiten_with_given_stats_uses_them():
    """stats=(mean, var) replaces the tensor's own (a batch split over processes); its own stats give the default."""
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    torch.testing.assert_close(masked_whiten(x, m, stats=(2.5, 5.0 / 3.0)), masked_whiten(x, m))
    want = torch.tensor([[-1.0, 0.0, 1.0], [2.0, 0.0, 0.0]], dtype=torch.float64) / (1.0 + 1e-8) ** 0.5
    torch.testing.assert_close(masked_whiten(x, m, stats=(2.0, 1.0)), want)
