"""Sampling over a real vocabulary (151,936 logits a row) costs what it must: no sort of the vocabulary when
top_p = 1.0, one sort per step (all rows at once) when top_p < 1; the sampled distribution is still the tempered,
truncated one (checked against probabilities written here)."""

from __future__ import annotations

import pytest
import torch

from grpo.rollout.sampler import sample_tokens

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
