"""Reduce a per-token loss (N, T) to the scalar that is minimised, with counts that can be global.

    seq_mean_token_mean   sum_i [ sum_t loss_it * m_it / max(|o_i|, 1) ] / num_seqs     GRPO, the seed's 4.2
    token_mean            sum_it loss_it * m_it / num_tokens                            DAPO (token-level loss)
    seq_sum_norm          sum_it loss_it * m_it / (num_seqs * max_len)                  Dr. GRPO (TRL dr_grpo)

`seq_mean_token_mean` is the seed's 1/G sum_i 1/|o_i| sum_t: each completion weighs the same whatever its length.
`token_mean` weighs every token the same. `seq_sum_norm` divides by a constant (the generation budget max_len), so
neither the completion's length nor the batch's token count changes a token's weight.

num_tokens (the number of unmasked tokens) and num_seqs (the number of completions, counting empty ones) default to
this batch's. Pass the counts of the whole optimizer batch (all micro-batches, all ranks) and summing the
micro-batch results gives exactly the whole-batch value; the per-sequence 1/|o_i| is always local to the row, so
it needs no global count. A row with no unmasked token contributes 0; a count of 0 is treated as 1, so an empty
batch gives 0, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.algo._checks import as_bool_mask, check_choice, check_number, check_same_shape, check_tensor

__all__ = ["AGGREGATE_MODES", "aggregate"]

AGGREGATE_MODES = ("seq_mean_token_mean", "token_mean", "seq_sum_norm")


def _count(name: str, value: Tensor | float | None, default: Tensor, like: Tensor) -> Tensor:
    if value is None:
        value = default
    elif not isinstance(value, Tensor):
        check_number(name, value, low=0.0)
    elif value.numel() != 1:
        raise ValueError(f"{name} must be a number or a one-element tensor, got shape {tuple(value.shape)}")
    return torch.as_tensor(value, device=like.device).to(like.dtype).reshape(()).clamp(min=1)


def aggregate(
    loss: Tensor,
    mask: Tensor,
    *,
    mode: str,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Scalar loss from a per-token loss.

    loss: (N, T).  mask: (N, T) bool or 0/1.  mode: "seq_mean_token_mean", "token_mean" or "seq_sum_norm".
    num_tokens: global count of unmasked tokens (token_mean).  num_seqs: global count of completions
    (seq_mean_token_mean, seq_sum_norm).  max_len: the generation budget, required by seq_sum_norm.
    Returns a 0-d tensor.
    """
    check_choice("mode", mode, AGGREGATE_MODES)
    check_tensor("loss", loss, ndim=2)
    check_same_shape("loss", loss, mask=mask)
    m = as_bool_mask(mask)
    masked = loss.where(m, 0)
    if mode == "token_mean":
        return masked.sum() / _count("num_tokens", num_tokens, m.sum(), loss)
    seqs = _count("num_seqs", num_seqs, torch.tensor(loss.shape[0]), loss)
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(dim=-1) / m.sum(dim=-1).clamp(min=1)
        return per_seq.sum() / seqs
    if max_len is None:
        raise ValueError("max_len is required for mode='seq_sum_norm' (the constant normaliser, e.g. max_new_tokens)")
    check_number("max_len", max_len, low=1, integer=True)
    return masked.sum() / (seqs * max_len)
