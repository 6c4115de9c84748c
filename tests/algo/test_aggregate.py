"""Loss aggregation: reference loops, and micro-batching with global counts equals the whole batch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.algo import aggregate

D = torch.float64
FAST = settings(max_examples=40, deadline=None)
MODES = [("seq_mean_token_mean", {}), ("token_mean", {}), ("seq_sum_norm", {"max_len": 16})]


def ref_aggregate(loss, mask, mode, max_len=None):
    rows = [[x for x, m in zip(lr, mr) if m] for lr, mr in zip(loss, mask)]
    n_tok = sum(len(r) for r in rows)
    if mode == "seq_mean_token_mean":
        return sum(sum(r) / len(r) for r in rows if r) / max(len(rows), 1)
    if mode == "token_mean":
        return sum(sum(r) for r in rows) / max(n_tok, 1)
    return sum(sum(r) for r in rows) / (len(rows) * max_len)


@st.composite
def loss_batch(draw):
    n, t = draw(st.integers(1, 8)), draw(st.integers(1, 6))
    loss = [[draw(st.floats(-5, 5)) for _ in range(t)] for _ in range(n)]
    mask = [[draw(st.booleans()) for _ in range(t)] for _ in range(n)]
    cuts = sorted(draw(st.lists(st.integers(1, n - 1), max_size=3, unique=True))) if n > 1 else []
    return loss, mask, cuts


@FAST
@given(loss_batch())
def test_aggregate_matches_reference_and_is_invariant_to_micro_batching(batch):
    loss, mask, cuts = batch
    lt, mt = torch.tensor(loss, dtype=D), torch.tensor(mask)
    num_tokens, num_seqs = mt.sum(), lt.shape[0]
    for mode, kw in MODES:
        whole = aggregate(lt, mt, mode=mode, **kw)
        torch.testing.assert_close(whole, torch.tensor(ref_aggregate(loss, mask, mode, **kw), dtype=D))
        bounds = [0, *cuts, lt.shape[0]]
        parts = [aggregate(lt[a:b], mt[a:b], mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, **kw)
                 for a, b in zip(bounds, bounds[1:])]
        torch.testing.assert_close(sum(parts), whole)


def test_micro_batch_gradients_accumulate_to_whole_batch_gradient():
    torch.manual_seed(0)
    base, mask = torch.randn(6, 5, dtype=D), torch.rand(6, 5) > 0.4
    for mode, kw in MODES:
        whole = base.clone().requires_grad_()
        aggregate(whole, mask, mode=mode, **kw).backward()
        parts = base.clone().requires_grad_()
        for s in (slice(0, 1), slice(1, 4), slice(4, 6)):
            aggregate(parts[s], mask[s], mode=mode, num_tokens=mask.sum(), num_seqs=6, **kw).backward()
        torch.testing.assert_close(parts.grad, whole.grad)


def test_counts_accept_ints_floats_and_tensors():
    loss, mask = torch.ones(2, 3), torch.ones(2, 3)
    for count in (12, 12.0, torch.tensor(12), torch.tensor([12.0])):
        assert aggregate(loss, mask, mode="token_mean", num_tokens=count).item() == 0.5
    assert aggregate(loss, mask, mode="seq_mean_token_mean", num_seqs=torch.tensor(4)).item() == 0.5


def test_empty_rows_and_zero_counts_give_zero_not_nan():
    loss = torch.full((2, 3), float("nan"))
    mask = torch.zeros(2, 3)
    for mode, kw in MODES:
        assert aggregate(loss, mask, mode=mode, **kw).item() == 0
        assert aggregate(loss, mask, mode=mode, num_tokens=0, num_seqs=0, **kw).item() == 0


def test_seq_sum_norm_needs_max_len():
    with pytest.raises(ValueError, match="max_len is required"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), mode="seq_sum_norm")


def test_high_entropy_mask_keeps_the_top_fraction_of_present_tokens():
    from grpo.algo import high_entropy_mask

    h = torch.tensor([[0.1, 0.5, 0.9, 0.3]])
    ones = torch.ones_like(h)
    assert high_entropy_mask(h, ones, 0.5).tolist() == [[False, True, True, False]]  # 0.5-quantile is 0.4
    assert high_entropy_mask(h, ones, 1.0).tolist() == [[True] * 4]
    assert high_entropy_mask(h, ones, 0.25).tolist() == [[False, False, True, False]]  # 0.75-quantile 0.6
    padded = torch.tensor([[0.1, 0.5, 9.0], [0.9, 0.3, 9.0]])  # 9.0 sits at padding: not counted, not kept
    pad_mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert high_entropy_mask(padded, pad_mask, 0.5).tolist() == [[False, True, False], [True, False, False]]
    assert not high_entropy_mask(h, torch.zeros_like(h), 0.5).any()
    with pytest.raises(ValueError, match="top_fraction"):
        high_entropy_mask(h, ones, 0.0)
