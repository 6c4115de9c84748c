"""Chunked log-probabilities and entropy against torch.log_softmax, values and gradients, and their memory."""

import pytest
import torch

from grpo.algo import entropy_from_logits, token_logprobs

D = torch.float64


def ref_logprobs(logits, targets, temperature=1.0):
    return torch.log_softmax(logits.to(D) / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)


def ref_entropy(logits, temperature=1.0):
    logp = torch.log_softmax(logits.to(D) / temperature, -1)
    return -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("contiguous", [True, False])
def test_token_logprobs_value_and_gradient(chunk_size, temperature, contiguous):
    torch.manual_seed(chunk_size)
    leaf = (torch.randn(3, 7, 11, dtype=D) * 3).requires_grad_()
    logits = leaf if contiguous else leaf[:, :-1]  # a non-contiguous view, as when slicing off the last position
    targets = torch.randint(0, 11, logits.shape[:2])
    upstream = torch.randn(logits.shape[:2], dtype=D)
    got = token_logprobs(logits, targets, temperature=temperature, chunk_size=chunk_size)
    (got * upstream).sum().backward()
    grad_got, leaf.grad = leaf.grad.clone(), None
    want = ref_logprobs(logits, targets, temperature)
    (want * upstream).sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad_got, leaf.grad)


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
@pytest.mark.parametrize("temperature", [1.0, 1.3])
def test_entropy_value_and_gradient(chunk_size, temperature):
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 9, dtype=D) * 2).requires_grad_()
    upstream = torch.randn(2, 5, dtype=D)
    got = entropy_from_logits(logits, temperature=temperature, chunk_size=chunk_size)
    (got * upstream).sum().backward()
    grad_got, logits.grad = logits.grad.clone(), None
    want = ref_entropy(logits, temperature)
    (want * upstream).sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grad_got, logits.grad)


def test_banned_tokens_with_minus_inf_logits():
    logits = torch.randn(2, 3, 5, dtype=D)
    logits[..., 0] = -torch.inf
    logits.requires_grad_()
    targets = torch.ones(2, 3, dtype=torch.long)
    ent = entropy_from_logits(logits, chunk_size=2)
    (token_logprobs(logits, targets, chunk_size=2).sum() + ent.sum()).backward()
    assert torch.isfinite(ent).all() and torch.isfinite(logits.grad).all()
    torch.testing.assert_close(ent, ref_entropy(logits.detach()))
    assert (logits.grad[..., 0] == 0).all()


def test_nan_logits_are_not_hidden():
    logits = torch.randn(1, 2, 4)
    logits[0, 1, 2] = float("nan")
    targets = torch.zeros(1, 2, dtype=torch.long)
    assert torch.isnan(entropy_from_logits(logits)[0, 1]) and torch.isnan(token_logprobs(logits, targets)[0, 1])
    assert torch.isfinite(entropy_from_logits(logits)[0, 0])


def test_bfloat16_logits_computed_in_float32():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 50).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 50, (2, 4))
    got = token_logprobs(logits, targets, chunk_size=3)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref_logprobs(logits.detach().float(), targets).float())
    got.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_saved_tensors_are_only_the_logits_and_per_position_floats():
    """The backward pass keeps no (N*T, V) float32 copy: only the logits themselves plus O(N*T) floats."""
    n, t, v = 4, 16, 1000
    logits = torch.randn(n, t, v, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, v, (n, t))
    saved = []

    def pack(x):
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        token_logprobs(logits, targets, chunk_size=8)
        entropy_from_logits(logits, chunk_size=8)
    big = [x for x in saved if x.numel() >= n * t * v]
    assert all(x.dtype == torch.bfloat16 and x.data_ptr() == logits.data_ptr() for x in big)
    assert sum(x.numel() for x in saved if x.numel() < n * t * v) <= 4 * n * t


def test_logprobs_checks():
    with pytest.raises(ValueError, match="targets must be logits.shape"):
        token_logprobs(torch.randn(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        token_logprobs(torch.randn(2, 3, 4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(torch.randn(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match="logits must be 3-D"):
        entropy_from_logits(torch.randn(3, 4))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        entropy_from_logits(torch.randn(1, 3, 4), chunk_size=0)
