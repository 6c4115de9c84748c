"""Sampling against its formula: many draws of the real Sampler from a stub model with fixed logits follow
softmax(logits / T) cut to the top-p nucleus and renormalised, computed independently here; the same draws are far
(in total variation) from the distribution of a wrong temperature or without the nucleus, so the bound is tight
enough to catch a temperature or top-p that is ignored or misapplied. The first token (after the prefill) and the
second (after a cached decode step) are both checked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo.rollout import Sampler
from grpo.types import Prompt

DRAWS = 20000
TV_BOUND = 0.02  # sampling noise of the empirical TV over 6 tokens at 20000 draws is about 0.006
LOGITS = {"a": 2.0, "b": 1.2, "c": 0.7, "d": 0.3, "e": -0.2, "f": -1.0}  # every other token: -30


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: one thread is fastest, and torch's spinning workers are costly on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Cache:
    def batch_repeat_interleave(self, repeats: int) -> None:
        pass

    def batch_select_indices(self, indices) -> None:
        pass


class FixedLogitsLM(torch.nn.Module):
    """Next-token logits that are the same at every position of every row."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits, requires_grad=False)
        self.config = SimpleNamespace(model_type="fixed")

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True,
                logits_to_keep=0, **kwargs):
        out = self.logits.expand(input_ids.shape[0], 1, -1)
        return SimpleNamespace(logits=out, past_key_values=past_key_values or _Cache())


@pytest.fixture(scope="module")
def fixed(tok):
    logits = torch.full((len(tok),), -30.0)
    ids = [tok.convert_tokens_to_ids(c) for c in LOGITS]
    logits[ids] = torch.tensor(list(LOGITS.values()))
    return FixedLogitsLM(logits), ids


def formula(ids: list[int], temperature: float, top_p: float) -> dict[int, float]:
    """softmax(logit / T) over the six tokens (the others' mass, ~e^-30, is left out), then the nucleus: tokens by
    decreasing probability while the mass before them is below top_p, renormalised."""
    import math

    weights = {i: math.exp(v / temperature) for i, v in zip(ids, LOGITS.values())}
    total = sum(weights.values())
    probs = sorted(((w / total, i) for i, w in weights.items()), reverse=True)
    kept, before = {}, 0.0
    for p, i in probs:
        if before >= top_p:
            break
        kept[i] = p
        before += p
    mass = sum(kept.values())
    return {i: kept.get(i, 0.0) / mass for i in ids}


def tv(counts: torch.Tensor, probs: dict[int, float]) -> float:
    """Total variation between the empirical distribution of `counts` (V,) and `probs` (zero elsewhere)."""
    emp = counts.double() / counts.sum()
    ref = torch.zeros_like(emp)
    for i, p in probs.items():
        ref[i] = p
    return 0.5 * float((emp - ref).abs().sum())


@pytest.mark.parametrize("temperature, top_p, wrong", [
    (1.0, 1.0, {"temperature": 0.7}),
    (0.7, 1.0, {"temperature": 1.0}),
    (1.6, 1.0, {"temperature": 1.0}),
    (0.8, 0.75, {"top_p": 1.0}),
    (1.3, 0.9, {"temperature": 1.0}),
])
def test_draws_follow_the_tempered_top_p_softmax(temperature, top_p, wrong, fixed, tok):
    model, ids = fixed
    sampler = Sampler(model, tok, max_new_tokens=2, temperature=temperature, top_p=top_p)
    out = sampler.generate([Prompt(uid="p", text="What is 1 + 1?\n")], DRAWS,
                           generator=torch.Generator().manual_seed(0))
    want = formula(ids, temperature, top_p)
    other = formula(ids, wrong.get("temperature", temperature), wrong.get("top_p", top_p))
    assert 0.5 * sum(abs(want[i] - other[i]) for i in ids) > 3 * TV_BOUND  # the wrong setting is detectable
    for t in range(2):
        counts = torch.bincount(out.completion_ids[:, t], minlength=len(tok))
        assert set(counts.nonzero()[:, 0].tolist()) <= {i for i in ids if want[i] > 0}, "drawn outside the nucleus"
        assert tv(counts, want) < TV_BOUND, (t, tv(counts, want))
        assert tv(counts, other) > 2 * TV_BOUND
        # the reported log-probability is that of the distribution sampled from
        drawn = out.completion_ids[:, t]
        reported = out.logp[:, t]
        for i in ids:
            if want[i] > 0 and (drawn == i).any():
                assert float(reported[drawn == i][0]) == pytest.approx(float(torch.tensor(want[i]).log()), abs=1e-4)
