"""Clipped surrogate (token and GSPO sequence ratio) and KL estimators against reference loops and gradients."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.algo import aggregate, clipped_surrogate, kl_estimate

D = torch.float64
FAST = settings(max_examples=40, deadline=None)


def ref_surrogate(logp, old, adv, mask, clip_low, clip_high, level, dual_clip):
    """Per-token loss and clip counts with Python floats, one token at a time."""
    n, t = len(logp), len(logp[0])
    loss = [[0.0] * t for _ in range(n)]
    low = high = dual = 0
    ratios = []
    for i in range(n):
        present = [k for k in range(t) if mask[i][k]]
        seq_lr = sum(logp[i][k] - old[i][k] for k in present) / max(len(present), 1)
        for k in present:
            lr = seq_lr if level == "sequence" else logp[i][k] - old[i][k]
            w = math.exp(max(-20.0, min(20.0, lr)))
            a = adv[i][k] if isinstance(adv[i], list) else adv[i]
            obj = min(w * a, min(max(w, 1 - clip_low), 1 + clip_high) * a)
            if dual_clip is not None and a < 0:
                obj = max(obj, dual_clip * a)
            loss[i][k] = -obj
            ratios.append(w)
            low += a < 0 and w < 1 - clip_low
            high += a > 0 and w > 1 + clip_high
            dual += dual_clip is not None and a < 0 and w > dual_clip
    count = max(len(ratios), 1)
    return loss, {"clip_frac_low": low / count, "clip_frac_high": high / count, "clip_frac_dual": dual / count,
                  "clip_frac": (low + high + dual) / count,
                  "ratio_mean": sum(ratios) / count if ratios else 1.0,
                  "ratio_min": min(ratios, default=1.0), "ratio_max": max(ratios, default=1.0)}


@st.composite
def policy_batch(draw):
    n, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    logp_f = st.floats(-8, 0, allow_nan=False)
    logp = [[draw(logp_f) for _ in range(t)] for _ in range(n)]
    # old_logp near logp (so ratios straddle the clip band) or far (to reach the dual clip and the clamp)
    shift = st.floats(-0.6, 0.6) | st.floats(-30, 30)
    old = [[x + draw(shift) for x in row] for row in logp]
    adv_f = st.floats(-3, 3, allow_nan=False)
    per_token = draw(st.booleans())
    adv = [[draw(adv_f) for _ in range(t)] if per_token else draw(adv_f) for _ in range(n)]
    mask = [[draw(st.booleans()) for _ in range(t)] for _ in range(n)]
    if draw(st.booleans()):
        mask[0] = [False] * t  # a fully masked row
    return logp, old, adv, mask


@FAST
@given(policy_batch(), st.sampled_from([(0.2, 0.2), (0.2, 0.28), (3e-4, 4e-4), (0.0, 0.5)]),
       st.sampled_from(["token", "sequence"]), st.sampled_from([None, 3.0, 1.5]))
def test_surrogate_matches_reference(batch, clips, level, dual_clip):
    logp, old, adv, mask = batch
    loss, metrics = clipped_surrogate(torch.tensor(logp, dtype=D), torch.tensor(old, dtype=D),
                                      torch.tensor(adv, dtype=D), torch.tensor(mask), clip_low=clips[0],
                                      clip_high=clips[1], level=level, dual_clip=dual_clip)
    want_loss, want_metrics = ref_surrogate(logp, old, adv, mask, *clips, level, dual_clip)
    assert torch.isfinite(loss).all()
    torch.testing.assert_close(loss, torch.tensor(want_loss, dtype=D), rtol=1e-9, atol=1e-9)
    assert set(metrics) == set(want_metrics)
    for key, want in want_metrics.items():
        assert metrics[key].ndim == 0 and not metrics[key].requires_grad
        assert metrics[key].item() == pytest.approx(want, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("mode, kw", [("seq_mean_token_mean", {}), ("token_mean", {}),
                                      ("seq_sum_norm", {"max_len": 9})])
@pytest.mark.parametrize("adv_shape", ["seq", "token"])
def test_on_policy_gradient_is_reinforce(mode, kw, adv_shape):
    """With old_logp = logp.detach() the ratio is 1 and d loss / d logp = -adv * mask / normaliser."""
    torch.manual_seed(1)
    logp = (-torch.rand(5, 7, dtype=D) * 3).requires_grad_()
    mask = torch.rand(5, 7) > 0.3
    mask[2] = False
    adv = torch.randn(5, dtype=D) if adv_shape == "seq" else torch.randn(5, 7, dtype=D)
    loss, metrics = clipped_surrogate(logp, logp.detach(), adv, mask)
    aggregate(loss, mask, mode=mode, **kw).backward()
    a = adv[:, None].expand(5, 7) if adv.ndim == 1 else adv
    lengths = mask.sum(-1, keepdim=True).clamp(min=1).to(D)
    norm = {"seq_mean_token_mean": 5 * lengths, "token_mean": mask.sum().to(D), "seq_sum_norm": 5 * 9.0}[mode]
    torch.testing.assert_close(logp.grad, -a * mask / norm)
    assert metrics["clip_frac"].item() == 0 and metrics["ratio_min"].item() == metrics["ratio_max"].item() == 1


def test_gspo_gradient_is_equal_per_token():
    # GSPO: every token of o_i gets gradient s_i * A_i / |o_i| (inside the clip band), whatever its own ratio.
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[-1.1, -1.8, -0.5, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, _ = clipped_surrogate(logp, old, torch.tensor([2.0], dtype=D), mask, level="sequence")
    aggregate(loss, mask, mode="seq_mean_token_mean").backward()
    s = math.exp((0.1 - 0.2 + 0.0) / 3)
    torch.testing.assert_close(logp.grad, torch.tensor([[-s * 2 / 3] * 3 + [0.0]], dtype=D))


def test_token_and_sequence_agree_when_one_token():
    logp, old = torch.randn(6, 1, dtype=D), torch.randn(6, 1, dtype=D)
    adv, mask = torch.randn(6, dtype=D), torch.ones(6, 1)
    tok, m_tok = clipped_surrogate(logp, old, adv, mask, level="token")
    seq, m_seq = clipped_surrogate(logp, old, adv, mask, level="sequence")
    torch.testing.assert_close(tok, seq)
    for key in m_tok:
        torch.testing.assert_close(m_tok[key], m_seq[key])


def test_fully_masked_batch_gives_zero_loss_and_finite_metrics():
    logp = torch.full((3, 4), float("nan"), requires_grad=True)  # garbage at padding must not leak
    mask = torch.zeros(3, 4, dtype=torch.bool)
    for level in ("token", "sequence"):
        for mode in ("seq_mean_token_mean", "token_mean", "seq_sum_norm"):
            loss, metrics = clipped_surrogate(logp, torch.zeros(3, 4), torch.ones(3), mask, level=level)
            assert torch.equal(loss, torch.zeros(3, 4))
            assert all(torch.isfinite(v) for v in metrics.values())
            out = aggregate(loss, mask, mode=mode, max_len=4)
            assert out.item() == 0
            out.backward()
            assert torch.equal(logp.grad, torch.zeros(3, 4))
            logp.grad = None
    _, metrics = clipped_surrogate(torch.zeros(0, 5), torch.zeros(0, 5), torch.zeros(0), torch.zeros(0, 5))
    assert metrics["ratio_min"].item() == 1 and metrics["clip_frac"].item() == 0


def test_extreme_log_ratios_stay_finite():
    logp = torch.tensor([[-1e4, 0.0, -0.1]], requires_grad=True)
    old = torch.tensor([[0.0, -1e4, -0.1]])
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    for level in ("token", "sequence"):
        loss, metrics = clipped_surrogate(logp, old, adv, torch.ones(1, 3), level=level)
        aggregate(loss, torch.ones(1, 3), mode="token_mean").backward()
        assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
        assert all(torch.isfinite(v) for v in metrics.values())
        logp.grad = None
    loss, metrics = clipped_surrogate(logp, old, adv, torch.ones(1, 3))
    assert metrics["ratio_max"].item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert loss[0, 1].item() == pytest.approx(math.exp(20.0), rel=1e-5)  # unclipped A<0 branch, but finite


def test_does_not_modify_inputs():
    logp, old, adv, mask = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2), torch.ones(2, 3)
    copies = [x.clone() for x in (logp, old, adv, mask)]
    clipped_surrogate(logp, old, adv, mask, level="sequence", dual_clip=2.0)
    assert all(torch.equal(a, b) for a, b in zip((logp, old, adv, mask), copies))


# ---- KL ---------------------------------------------------------------------------------------------------------


@FAST
@given(st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0)), min_size=1, max_size=12))
def test_kl_matches_reference(pairs):
    logp = torch.tensor([[p for p, _ in pairs]], dtype=D)
    ref = torch.tensor([[r for _, r in pairs]], dtype=D)
    want = {"k1": [p - r for p, r in pairs], "k2": [0.5 * (p - r) ** 2 for p, r in pairs],
            "k3": [math.exp(d) - d - 1 for d in (max(-20.0, min(20.0, r - p)) for p, r in pairs)]}
    for kind, values in want.items():
        got = kl_estimate(logp, ref, kind=kind)
        torch.testing.assert_close(got, torch.tensor([values], dtype=D), rtol=1e-9, atol=1e-9)
    assert (kl_estimate(logp, ref, kind="k3") >= 0).all() and (kl_estimate(logp, ref, kind="k2") >= 0).all()


def test_k3_is_zero_when_policies_match_and_finite_when_far_apart():
    x = torch.randn(3, 4)
    assert torch.equal(kl_estimate(x, x), torch.zeros(3, 4))
    far = kl_estimate(torch.tensor([[0.0, -1000.0]]), torch.tensor([[-1000.0, 0.0]]))
    assert torch.isfinite(far).all()
    assert far[0, 1].item() == pytest.approx(math.exp(20.0) - 21, rel=1e-6)  # the documented exponent clamp


def test_kl_gradients():
    logp = torch.tensor([[-1.0, -2.0]], dtype=D, requires_grad=True)
    ref = torch.tensor([[-2.0, -1.0]], dtype=D)
    for kind, grad in [("k1", [1.0, 1.0]), ("k2", [1.0, -1.0]), ("k3", [1 - math.exp(-1), 1 - math.e])]:
        kl_estimate(logp, ref, kind=kind).sum().backward()
        torch.testing.assert_close(logp.grad, torch.tensor([grad], dtype=D))
        logp.grad = None


# ------------------------------------------------------------------ CISPO
def test_cispo_vectors_by_hand():
    """w = exp(logp - old) = [e^0.5, e^-1] = [1.6487, 0.3679]; A = 2; clip_low 1 (no lower bound), clip_high 0.28:
    weight [1.28, 0.3679]; loss = -w * A * logp = [2.56, 1.4715]; d loss / d logp = -w * A = [-2.56, -0.7358]."""
    from grpo.algo import cispo_surrogate

    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    loss, m = cispo_surrogate(logp, old, torch.tensor([2.0], dtype=torch.float64), torch.ones(1, 2), clip_low=1.0,
                              clip_high=0.28)
    w2 = math.exp(-1.0)
    torch.testing.assert_close(loss, torch.tensor([[2.56, 4 * w2]], dtype=torch.float64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.56, -2 * w2]], dtype=torch.float64))
    assert float(m["clip_frac_high"]) == 0.5 and float(m["clip_frac_low"]) == 0.0 and float(m["clip_frac"]) == 0.5
    # a lower bound of 0.5 lifts the second weight to 0.5
    loss, m = cispo_surrogate(logp.detach(), old, torch.tensor([2.0], dtype=torch.float64), torch.ones(1, 2),
                              clip_low=0.5, clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[2.56, 2.0]], dtype=torch.float64))
    assert float(m["clip_frac_low"]) == 0.5


def test_cispo_keeps_the_gradient_that_the_clip_zeroes():
    """Ratio 1.65 with A > 0: PPO's clip gives that token no gradient, CISPO gives it -1.28 * A."""
    from grpo.algo import cispo_surrogate

    old = torch.tensor([[-1.5]])
    for fn, want in ((clipped_surrogate, 0.0), (cispo_surrogate, -1.28)):
        logp = torch.tensor([[-1.0]], requires_grad=True)
        loss, _ = fn(logp, old, torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
        loss.sum().backward()
        assert float(logp.grad) == pytest.approx(want)


def test_cispo_on_policy_gradient_equals_the_clipped_surrogate():
    from grpo.algo import cispo_surrogate

    torch.manual_seed(0)
    base = torch.randn(3, 5, dtype=torch.float64)
    adv, mask = torch.randn(3, dtype=torch.float64), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    grads = []
    for fn in (clipped_surrogate, cispo_surrogate):
        logp = base.clone().requires_grad_()
        loss, _ = fn(logp, logp.detach(), adv, mask)
        aggregate(loss, mask, mode="token_mean").backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1])
    with pytest.raises(ValueError, match="clip_low"):
        cispo_surrogate(base, base, adv, mask, clip_low=1.5)
