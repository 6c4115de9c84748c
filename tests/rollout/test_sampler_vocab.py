"""Sampling over a real vocabulary (151,936 logits a row) costs what it must: no sort of the vocabulary when
top_p = 1.0, one sort per step (all rows at once) when top_p < 1; the sampled distribution is still the tempered,
truncated one (checked against probabilities written here)."""

from __future__ import annotations

import pytest
import torch

from grpo.rollout.sampler import CDF_BLOCK, _inverse_cdf, sample_tokens

V = 151_936


def count_sorts(monkeypatch):
    calls = []
    real = torch.Tensor.sort

    def sort(self, *args, **kwargs):
        calls.append(tuple(self.shape))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sort", sort)
    return calls


def test_no_sort_at_top_p_one_and_one_sort_per_step_below(monkeypatch):
    calls = count_sorts(monkeypatch)
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(0)) * 3
    u = torch.rand(6, generator=torch.Generator().manual_seed(1))
    sample_tokens(logits, 0.8, 1.0, u)
    assert calls == []
    sample_tokens(logits, 0.8, 0.9, u)
    assert calls == [(6, V)]  # once, all rows together


def test_top_p_tokens_and_logp_against_the_truncated_distribution():
    """Every sampled token lies in the top-p set; its logp is log(p / mass of the set), computed here in float64."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, V, generator=g) * 4
    temperature, top_p = 0.7, 0.5
    u = torch.rand(4, generator=g)
    tok, logp = sample_tokens(logits, temperature, top_p, u)
    p = torch.softmax(logits.double() / temperature, -1)
    for row in range(4):
        order = p[row].argsort(descending=True)
        mass_before = p[row][order].cumsum(0) - p[row][order]
        keep = order[mass_before <= top_p]  # the smallest prefix whose mass reaches top_p
        assert int(tok[row]) in set(keep.tolist())
        want = torch.log(p[row, tok[row]] / p[row, keep].sum())
        torch.testing.assert_close(logp[row].double(), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_top_p_one_logp_is_the_tempered_log_softmax_in_float64(temperature):
    """At top_p = 1 the log-prob is the log of the sampled token's softmax probability (two passes over the
    vocabulary): the same as log_softmax computed in float64, to float32's accuracy, including tiny uniforms that
    pick improbable tokens; the token is the inverse CDF of the float64 distribution at u (up to rounding at a
    boundary)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, V, generator=g) * 4
    u = torch.cat([torch.rand(6, generator=g), torch.tensor([0.0, 1e-7])])
    tok, logp = sample_tokens(logits, temperature, 1.0, u)
    want = torch.log_softmax(logits.double() / temperature, -1)
    torch.testing.assert_close(logp.double(), want.gather(-1, tok[:, None])[:, 0], rtol=0, atol=2e-4)
    cdf = want.exp().cumsum(-1)
    expected = torch.searchsorted(cdf, u.double()[:, None] * cdf[:, -1:], right=True)[:, 0]
    assert (tok - expected).abs().max() <= 1


def reference_token_bounds(probs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One running sum over each whole row in float64: (the row's running sum before the token, at the token) for
    every token, and the target u x total x (1 - 1e-6) the inverse CDF looks for."""
    cdf = probs.double().cumsum(-1)
    return cdf, u.double()[:, None] * cdf[:, -1:] * (1 - 1e-6)


@pytest.mark.parametrize("vocab", [V, 5 * CDF_BLOCK + 17, 3 * CDF_BLOCK])
def test_the_two_level_inverse_cdf_is_one_running_sum_over_the_row(vocab):
    """The block totals' running sum, then the block's own (sampler._inverse_cdf, a vocabulary larger than a few
    blocks): the token whose float64 running sum over the whole row crosses the target, up to float32 rounding at
    the crossing; never a token of probability 0 (a row with zeros spread through it, the tail block shorter than the
    others, all mass in the tail block, uniforms at 0 and just below 1); a small vocabulary takes one running sum."""
    g = torch.Generator().manual_seed(4)
    probs = torch.softmax(torch.randn(64, vocab, generator=g) * 3, -1)
    probs[8:16] *= torch.rand(8, vocab, generator=g) > 0.7  # zeros spread through the rows
    probs[16:24, : vocab - 5] = 0  # all mass in the row's last 5 tokens (the tail block where vocab % CDF_BLOCK)
    probs[24:32, CDF_BLOCK - 3:] = 0  # all mass in the first block but its last three tokens
    u = torch.rand(64, generator=g)
    u[::7], u[1::7] = 0.0, 1 - 2 ** -24  # the ends of [0, 1)
    tok = _inverse_cdf(probs, u)
    cdf, target = reference_token_bounds(probs, u)
    rows = torch.arange(64)
    assert (probs[rows, tok] > 0).all()
    before, at = cdf[rows, tok] - probs[rows, tok].double(), cdf[rows, tok]
    slack = 1e-6 * cdf[:, -1]  # float32 running sums against float64 ones
    assert (before <= target[:, 0] + slack).all() and (at > target[:, 0] - slack).all()


def test_a_block_whose_running_sum_rounds_short_of_its_total_gives_its_last_token_with_probability():
    """A target between a block's own running sum (summed in order, 1.0 then 1019 tokens of 2e-7) and its total
    (summed pairwise, slightly more): the token is the block's last with probability, never the next block's first
    token, whose probability is 0."""
    vocab = 6 * CDF_BLOCK
    probs = torch.zeros(1, vocab)
    probs[0, 0], probs[0, 1:1020] = 1.0, 2e-7  # block 0; its tokens 1020..1023 have probability 0
    probs[0, CDF_BLOCK + 10:2 * CDF_BLOCK] = 1e-3  # block 1 starts with 10 zeros
    total_0 = probs[0, :CDF_BLOCK].reshape(1, -1).sum(-1)  # as the sampler sums a block
    running_0 = probs[0, :CDF_BLOCK].cumsum(-1)[-1]
    assert total_0 > running_0  # the rounding this test needs (float32 on this CPU)
    total = probs[0, :CDF_BLOCK].sum() + probs[0, CDF_BLOCK:].sum()
    target = (total_0 + running_0) / 2
    u = (target / (total * (1 - 1e-6))).reshape(1)
    assert int(_inverse_cdf(probs, u)) == 1019
