"""Bad input raises ValueError naming the argument and, for choices, the allowed values."""

import re

import pytest
import torch

from grpo.algo import (
    aggregate,
    clipped_surrogate,
    clipped_value_loss,
    dr_grpo_advantages,
    gae,
    group_advantages,
    kl_estimate,
    rloo_advantages,
    zero_std_groups,
)

GROUP_FNS = [group_advantages, dr_grpo_advantages, rloo_advantages, zero_std_groups]
X = torch.zeros(2, 3)


@pytest.mark.parametrize("fn", GROUP_FNS)
def test_group_size_below_two(fn):
    with pytest.raises(ValueError, match="group_size must be >= 2, got 1"):
        fn(torch.zeros(4), 1)


@pytest.mark.parametrize("fn", GROUP_FNS)
def test_rows_not_divisible_by_group_size(fn):
    with pytest.raises(ValueError, match="rewards has 151 rows, not divisible by group_size=4"):
        fn(torch.zeros(151), 4)


@pytest.mark.parametrize("fn", GROUP_FNS)
def test_rewards_must_be_1d_and_group_size_an_int(fn):
    with pytest.raises(ValueError, match=re.escape("rewards must be 1-D, got shape (2, 4)")):
        fn(torch.zeros(2, 4), 4)
    with pytest.raises(ValueError, match="group_size must be an int"):
        fn(torch.zeros(4), 2.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: group_advantages(torch.zeros(4), 2, std="foo"),
         "std must be one of ['population', 'sample'], got 'foo'"),
        (lambda: group_advantages(torch.zeros(4), 2, scale="prompt"),
         "scale must be one of ['group', 'batch', 'none'], got 'prompt'"),
        (lambda: group_advantages(torch.zeros(4), 2, eps=-1.0), "eps must be >= 0.0, got -1.0"),
        (lambda: clipped_surrogate(X, X, torch.zeros(2), X, level="seq"),
         "level must be one of ['token', 'sequence'], got 'seq'"),
        (lambda: kl_estimate(X, X, kind="k4"), "kind must be one of ['k1', 'k2', 'k3'], got 'k4'"),
        (lambda: aggregate(X, X, mode="dapo"),
         "mode must be one of ['seq_mean_token_mean', 'token_mean', 'seq_sum_norm'], got 'dapo'"),
    ],
)
def test_unknown_names(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: clipped_surrogate(X, torch.zeros(2, 4), torch.zeros(2), X), "old_logp"),
        (lambda: clipped_surrogate(X, X, torch.zeros(2), torch.ones(2, 4)), "mask"),
        (lambda: clipped_surrogate(X, X, torch.zeros(3), X), "adv"),
        (lambda: clipped_surrogate(X, X, torch.zeros(2, 4), X), "adv"),
        (lambda: kl_estimate(X, torch.zeros(2, 1)), "ref_logp"),
        (lambda: aggregate(X, torch.ones(3, 2), mode="token_mean"), "mask"),
        (lambda: gae(X, torch.zeros(2, 4), X, gamma=1.0, lam=1.0), "values"),
        (lambda: gae(X, X, torch.ones(3), gamma=1.0, lam=1.0), "mask"),
        (lambda: clipped_value_loss(X, X, torch.zeros(3, 3), X, clip=0.2), "returns"),
    ],
)
def test_shape_and_mask_mismatch(call, name):
    with pytest.raises(ValueError, match=f"^{name} (has shape|must have shape)"):
        call()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"clip_low": 1.0}, "clip_low must be < 1.0"),
        ({"clip_low": -0.1}, "clip_low must be >= 0.0"),
        ({"clip_high": -0.1}, "clip_high must be >= 0.0"),
        ({"dual_clip": 1.0}, "dual_clip must be > 1.0"),
        ({"max_log_ratio": 0.0}, "max_log_ratio must be > 0.0"),
        ({"clip_low": float("nan")}, "clip_low must not be NaN"),
    ],
)
def test_bad_clip_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        clipped_surrogate(X, X, torch.zeros(2), X, **kwargs)


def test_bad_gae_and_aggregate_hyperparameters():
    with pytest.raises(ValueError, match="gamma must be <= 1.0"):
        gae(X, X, X, gamma=1.5, lam=1.0)
    with pytest.raises(ValueError, match="lam must be >= 0.0"):
        gae(X, X, X, gamma=1.0, lam=-0.5)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        aggregate(X, X, mode="seq_sum_norm", max_len=0)
    with pytest.raises(ValueError, match="num_tokens must be >= 0.0"):
        aggregate(X, X, mode="token_mean", num_tokens=-1)
    with pytest.raises(ValueError, match="num_seqs must be a number or a one-element tensor"):
        aggregate(X, X, mode="seq_mean_token_mean", num_seqs=torch.ones(2))
    with pytest.raises(ValueError, match="clip must be > 0.0"):
        clipped_value_loss(X, X, X, X, clip=0.0)


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError, match="rewards must be a torch.Tensor, got list"):
        group_advantages([1.0, 0.0], 2)
