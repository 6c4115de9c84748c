"""Clipped value loss and DAPO overlong shaping against reference loops."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.algo import clipped_value_loss, overlong_penalty

D = torch.float64
FAST = settings(max_examples=40, deadline=None)
num = st.floats(-3, 3, allow_nan=False)


@FAST
@given(st.lists(st.tuples(num, num, num, st.booleans()), min_size=1, max_size=10),
       st.sampled_from([0.2, 0.5, None]))
def test_value_loss_matches_reference(rows, clip):
    v, old, ret = (torch.tensor([[r[k] for r in rows]], dtype=D) for k in range(3))
    m = torch.tensor([[r[3] for r in rows]])
    want = []
    for value, value_old, target, present in rows:
        clipped = value_old + max(-clip, min(clip, value - value_old)) if clip is not None else value
        want.append(0.5 * max((value - target) ** 2, (clipped - target) ** 2) if present else 0.0)
    torch.testing.assert_close(clipped_value_loss(v, old, ret, m, clip=clip), torch.tensor([want], dtype=D))


def test_value_loss_gradient_stops_when_clipped_branch_wins():
    v = torch.tensor([[0.9, 0.6]], dtype=D, requires_grad=True)  # V=0.9 clipped to 0.7 (its branch wins)
    loss = clipped_value_loss(v, torch.full((1, 2), 0.5, dtype=D), torch.ones(1, 2, dtype=D), torch.ones(1, 2),
                              clip=0.2)
    loss.sum().backward()
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, 0.6 - 1.0]], dtype=D))


@FAST
@given(st.lists(st.integers(0, 300), min_size=1, max_size=10), st.integers(1, 200), st.data())
def test_overlong_matches_reference(lengths, max_len, data):
    cache_len = data.draw(st.integers(0, max_len))
    want = []
    for n in lengths:
        if n <= max_len - cache_len:
            want.append(0.0)
        elif n <= max_len:
            want.append(((max_len - cache_len) - n) / cache_len)
        else:
            want.append(-1.0)
    got = overlong_penalty(torch.tensor(lengths), max_len=max_len, cache_len=cache_len)
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype))


def test_overlong_checks():
    with pytest.raises(ValueError, match="cache_len must be <= 100"):
        overlong_penalty(torch.tensor([1]), max_len=100, cache_len=101)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        overlong_penalty(torch.tensor([1]), max_len=0, cache_len=0)
