"""Truncated importance sampling (algo/tis.py): the weight min(exp(logp_train - logp_engine), C) by hand."""

import math

import pytest
import torch

from grpo.algo.tis import truncated_is_weight

D = torch.float64


def test_hand_vector():
    train = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, -1.0]], dtype=D)
    engine = torch.tensor([[-1.0, -1.0, -1.5], [-1.0, -0.1, -9.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w, m = truncated_is_weight(train, engine, mask, cap=2.0)
    # ratios e^0 = 1, e^-1, e^1 = 2.718 -> capped at 2; e^-2, e^0 = 1, masked (ratio e^8, not counted)
    want = [[1.0, math.exp(-1), 2.0], [math.exp(-2), 1.0, 0.0]]
    assert torch.allclose(w, torch.tensor(want, dtype=D), atol=1e-12)
    assert m["weight_mean"].item() == pytest.approx((1 + math.exp(-1) + 2 + math.exp(-2) + 1) / 5)
    assert m["capped_frac"].item() == pytest.approx(1 / 5)


def test_equal_log_probs_give_weight_one_and_no_gradient():
    train = torch.randn(3, 4, dtype=D, requires_grad=True)
    w, m = truncated_is_weight(train, train.detach().clone(), torch.ones(3, 4), cap=1.5)
    assert torch.equal(w, torch.ones(3, 4, dtype=D)) and not w.requires_grad
    assert m["capped_frac"].item() == 0.0


def test_an_impossible_engine_token_stays_finite():
    w, _ = truncated_is_weight(torch.tensor([[0.0]]), torch.tensor([[float("-inf")]]), torch.ones(1, 1), cap=3.0)
    assert w.item() == 3.0
    w, _ = truncated_is_weight(torch.tensor([[-1e9]]), torch.tensor([[0.0]]), torch.ones(1, 1), cap=3.0)
    assert w.item() == pytest.approx(math.exp(-20.0))  # the log-ratio clamp


@pytest.mark.parametrize("cap,err", [(0.0, "cap"), (-1.0, "cap"), (float("inf"), "finite"), (float("nan"), "NaN")])
def test_bad_cap_is_named(cap, err):
    with pytest.raises(ValueError, match=err):
        truncated_is_weight(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), cap=cap)


def test_shapes_must_match():
    with pytest.raises(ValueError, match="logp_engine"):
        truncated_is_weight(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), cap=2.0)


# ------------------------------------------------- issue #51: the sampler/trainer correction attacked


def test_a_nan_or_positive_infinite_engine_log_prob_gets_weight_zero_and_is_counted():
    nan, inf = float("nan"), float("inf")
    train = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], dtype=D)
    engine = torch.tensor([[nan, inf, -inf, -1.5]], dtype=D)
    w, m = truncated_is_weight(train, engine, torch.ones(1, 4), cap=2.0)
    # NaN, +inf: no probability, weight 0 (never NaN); -inf: probability 0, the ratio clamps at e^20 -> the cap
    assert torch.allclose(w, torch.tensor([[0.0, 0.0, 2.0, math.exp(0.5)]], dtype=D), rtol=1e-6, atol=0)  # fp32 exp
    assert m["invalid_frac"].item() == pytest.approx(2 / 4) and m["capped_frac"].item() == pytest.approx(1 / 4)
    assert m["weight_mean"].item() == pytest.approx((2.0 + math.exp(0.5)) / 4)


def test_zero_length_completions_and_an_empty_batch_give_finite_zero_metrics():
    train, engine = torch.zeros(2, 3), torch.full((2, 3), float("nan"))
    w, m = truncated_is_weight(train, engine, torch.zeros(2, 3), cap=2.0)  # no sampled token at all
    assert torch.equal(w, torch.zeros(2, 3)) and all(v.item() == 0.0 for v in m.values())
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])  # the second completion has zero length
    w, m = truncated_is_weight(train, torch.zeros(2, 3), mask, cap=2.0)
    assert torch.equal(w, mask.float()) and m["weight_mean"].item() == 1.0 and m["invalid_frac"].item() == 0.0
