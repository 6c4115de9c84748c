"""hidden_token_logprobs (log-probs and entropy from hidden states and a linear head's weight, in chunks) against
log_softmax(h @ W^T / tau) + gather written here: a hand vector, values and gradients (to h and to W), frozen
weights, bf16, what the backward keeps, and the argument checks."""

import math

import pytest
import torch

from grpo.algo import hidden_token_logprobs

D = torch.float64


def reference(hidden, weight, targets, temperature=1.0):
    """The full path: (N, T, V) logits, log_softmax, gather; entropy -sum p log p."""
    logp_all = torch.log_softmax((hidden.to(D) @ weight.to(D).t()) / temperature, -1)
    return logp_all.gather(-1, targets[..., None])[..., 0], -(logp_all.exp() * logp_all).sum(-1)


def test_hand_vector():
    # logits: row 0 = [1, 0, 1], row 1 = [0, 2, 2]
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=D)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=D)
    targets = torch.tensor([[0, 1]])
    logp, ent = hidden_token_logprobs(hidden, weight, targets, chunk_size=1, with_entropy=True)
    e = math.e
    want_logp = [1 - math.log(2 * e + 1), 2 - math.log(1 + 2 * e ** 2)]
    p0 = [e / (2 * e + 1), 1 / (2 * e + 1), e / (2 * e + 1)]
    p1 = [1 / (1 + 2 * e ** 2), e ** 2 / (1 + 2 * e ** 2), e ** 2 / (1 + 2 * e ** 2)]
    want_ent = [-sum(p * math.log(p) for p in p0), -sum(p * math.log(p) for p in p1)]
    torch.testing.assert_close(logp, torch.tensor([want_logp], dtype=D))
    torch.testing.assert_close(ent, torch.tensor([want_ent], dtype=D))
    # temperature 2: logits halved
    logp2, _ = hidden_token_logprobs(hidden, weight, targets, temperature=2.0)
    want2 = [0.5 - math.log(2 * e ** 0.5 + 1), 1 - math.log(1 + 2 * e)]
    torch.testing.assert_close(logp2, torch.tensor([want2], dtype=D))


@pytest.mark.parametrize("chunk_size", [1, 5, 256])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_the_full_path(chunk_size, temperature):
    torch.manual_seed(chunk_size)
    N, T, H, V = 3, 7, 6, 41
    hidden = torch.randn(N, T, H, dtype=D, requires_grad=True)
    weight = (torch.randn(V, H, dtype=D) * 0.8).requires_grad_()
    targets = torch.randint(0, V, (N, T))
    upstream = torch.randn(N, T, dtype=D)
    logp, ent = hidden_token_logprobs(hidden, weight, targets, temperature=temperature, chunk_size=chunk_size,
                                      with_entropy=True)
    assert not ent.requires_grad
    (logp * upstream).sum().backward()
    got_h, got_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want_logp, want_ent = reference(hidden, weight, targets, temperature)
    (want_logp * upstream).sum().backward()
    torch.testing.assert_close(logp, want_logp)
    torch.testing.assert_close(ent, want_ent.detach())
    torch.testing.assert_close(got_h, hidden.grad)
    torch.testing.assert_close(got_w, weight.grad)


def test_non_contiguous_hidden_and_frozen_weight():
    """A sliced hidden (as hidden[:, :-1]) and a weight without gradient (LoRA: the head is frozen)."""
    torch.manual_seed(1)
    leaf = torch.randn(2, 6, 5, dtype=D, requires_grad=True)
    hidden = leaf[:, :-1]
    weight = torch.randn(30, 5, dtype=D)
    targets = torch.randint(0, 30, (2, 5))
    logp, ent = hidden_token_logprobs(hidden, weight, targets, chunk_size=3)
    assert ent is None
    logp.sum().backward()
    got = leaf.grad.clone()
    leaf.grad = None
    reference(hidden, weight, targets)[0].sum().backward()
    torch.testing.assert_close(got, leaf.grad)
    assert weight.grad is None


def test_shared_weight_accumulates_both_uses():
    """Tied embeddings: the head weight is also used elsewhere; autograd sums both gradients."""
    torch.manual_seed(2)
    weight = torch.randn(20, 4, dtype=D, requires_grad=True)
    ids = torch.randint(0, 20, (2, 3))
    targets = torch.randint(0, 20, (2, 3))

    def loss(fn):
        hidden = torch.tanh(weight[ids] * 1.5)  # "embedding" then a layer
        return fn(hidden).sum()

    loss(lambda h: hidden_token_logprobs(h, weight, targets, chunk_size=2)[0]).backward()
    got, weight.grad = weight.grad.clone(), None
    loss(lambda h: reference(h, weight, targets)[0]).backward()
    torch.testing.assert_close(got, weight.grad)


def test_bfloat16_inputs_computed_in_float32():
    torch.manual_seed(3)
    hidden = torch.randn(2, 4, 16).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(300, 16) * 0.3).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 300, (2, 4))
    logp, ent = hidden_token_logprobs(hidden, weight, targets, chunk_size=3, with_entropy=True)
    assert logp.dtype == ent.dtype == torch.float32
    # the reference: the bf16 logits (as the full path computes them), then log_softmax in float64
    logits = (hidden.detach() @ weight.detach().t()).to(D)
    want = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(logp.to(D), want, rtol=0, atol=1e-5)
    logp.sum().backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16
    h32, w32 = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    reference(h32, w32, targets)[0].sum().backward()
    torch.testing.assert_close(weight.grad.float(), w32.grad, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(hidden.grad.float(), h32.grad, rtol=2e-2, atol=2e-3)


def test_backward_keeps_no_vocabulary_sized_tensor():
    """Saved for the backward: the hidden states, the weight, the targets and one float per position."""
    N, T, H, V = 4, 16, 8, 5000
    hidden = torch.randn(N, T, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    targets = torch.randint(0, V, (N, T))
    saved = []

    def pack(x):
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        logp, _ = hidden_token_logprobs(hidden, weight, targets, chunk_size=8, with_entropy=True)
    ptrs = {hidden.data_ptr(), weight.data_ptr(), targets.data_ptr()}
    others = [x for x in saved if x.data_ptr() not in ptrs]
    assert [tuple(x.shape) for x in others] == [(N * T,), (N * T,)]  # each position's max and sum of exp
    assert len(saved) == 5


def test_checks():
    h, w, y = torch.randn(2, 3, 4), torch.randn(10, 4), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="targets must be hidden.shape"):
        hidden_token_logprobs(h, w, y[:, :2])
    with pytest.raises(ValueError, match="integer tensor"):
        hidden_token_logprobs(h, w, y.float())
    with pytest.raises(ValueError, match=r"must be \(vocab, 4\)"):
        hidden_token_logprobs(h, torch.randn(10, 5), y)
    with pytest.raises(ValueError, match="share one floating-point dtype"):
        hidden_token_logprobs(h, w.double(), y)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        hidden_token_logprobs(h, w, y, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        hidden_token_logprobs(h, w, y, chunk_size=0)
    with pytest.raises(ValueError, match="hidden must be 3-D"):
        hidden_token_logprobs(h[0], w, y)
