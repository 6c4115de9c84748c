"""The sampler under bf16 compute (Sampler(compute=...), models/compute.py): the forward the trainer runs, in bf16
products over float32 weights, so its log-probs are those of the trainer's policy up to bf16's rounding; its KV cache
in bf16; each weight cast to bf16 once a call (autocast's cache), not once a token. On the lean path (GroupedPrefix-
Layer) and on the model's own forward (BufferedLayer)."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer
from helpers.precision import BF16_UNIT
from rollout_helpers import ARCHS, make_prompts, tiny_model

from grpo.models.compute import compute_context
from grpo.models.forward import position_ids_from_mask
from grpo.rollout import Sampler, decode

CPU = torch.device("cpu")


@torch.no_grad()
def forward_logprobs(model, rollouts, compute: str) -> torch.Tensor:
    """(N, T) log-probs of the sampled tokens from one plain forward of each row's prompt + completion under
    `compute`, no cache (the reference)."""
    G, out = rollouts.group_size, torch.zeros_like(rollouts.logp)
    for i in range(rollouts.num_completions):
        p = rollouts.prompt_ids[i // G][rollouts.prompt_mask[i // G] == 1]
        n = int(rollouts.completion_mask[i].sum())
        ids = torch.cat([p, rollouts.completion_ids[i, :n]])[None]
        with compute_context(compute, CPU):
            logits = model(input_ids=ids, position_ids=position_ids_from_mask(torch.ones_like(ids))).logits
        logp = torch.log_softmax(logits[0, len(p) - 1:len(p) - 1 + n].float(), -1)
        out[i, :n] = logp.gather(-1, rollouts.completion_ids[i, :n, None])[:, 0]
    return out


def sample(model, tok, compute: str, lean: bool, monkeypatch):
    if not lean:
        monkeypatch.setattr(decode.LeanDecoder, "for_model", classmethod(lambda cls, model: None))
    caches = []
    real = decode.expand_cache

    def spy(*args, **kwargs):
        cache, grouped = real(*args, **kwargs)
        caches.append(cache)
        return cache, grouped

    monkeypatch.setattr("grpo.rollout.sampler.expand_cache", spy)
    sampler = Sampler(model, tok, max_new_tokens=10, compute=compute)
    out = sampler.generate(make_prompts(), 3, generator=torch.Generator().manual_seed(7))
    return out, caches[0]


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_sampling_is_the_bf16_forward_with_a_bf16_cache(tok, arch, lean, monkeypatch):
    """The sampler's log-probs are the bf16 forward's (teacher-forced, uncached) within bf16's rounding
    (2 BF16_UNIT, mean over tokens; the float32 forward of the same tokens is farther), and its cache holds bf16."""
    model = tiny_model(arch, tok)
    out, cache = sample(model, tok, "bfloat16", lean, monkeypatch)
    mask = out.completion_mask.bool()
    bf16_gap = float((out.logp - forward_logprobs(model, out, "bfloat16"))[mask].abs().mean())
    fp32_gap = float((out.logp - forward_logprobs(model, out, "weights"))[mask].abs().mean())
    assert bf16_gap < 2 * BF16_UNIT, bf16_gap
    assert bf16_gap < fp32_gap, (bf16_gap, fp32_gap)  # bf16's roundings, not float32's arithmetic
    layer = cache.layers[0]
    # the generic path buffers plain layers in place; Gemma 3's sliding-window layers stay the model's own
    generic = DynamicSlidingWindowLayer if arch == "gemma3" else decode.BufferedLayer
    assert type(layer) is (decode.GroupedPrefixLayer if lean else generic)
    if generic is decode.BufferedLayer or lean:  # our layers hold bf16; the model's own keep what its layers give
        assert layer.keys.dtype == layer.values.dtype == torch.bfloat16  # (Gemma's k_norm returns float32 keys)
    f32, _ = sample(model, tok, "weights", lean, monkeypatch)
    assert float((f32.logp - forward_logprobs(model, f32, "weights"))[f32.completion_mask.bool()].abs().max()) < 1e-4


def test_each_weight_is_cast_to_bf16_once_a_call(tok, monkeypatch):
    """autocast caches a parameter's bf16 copy for the whole generate call: the casts of (64, 32) weights (the gate
    and up projections; a shape no activation has) number those weights, not the weights times the decode steps."""
    from torch.profiler import ProfilerActivity, profile

    model = tiny_model("llama", tok)
    gate = tuple(model.model.layers[0].mlp.gate_proj.weight.shape)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out, _ = sample(model, tok, "bfloat16", True, monkeypatch)
    assert out.completion_mask.sum(-1).max() > 2  # several decode steps
    casts = [e for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes and
             tuple(e.input_shapes[0]) == gate]
    weights = [p for p in model.parameters() if tuple(p.shape) == gate]
    assert len(weights) == 2 * len(model.model.layers) and len(casts) == len(weights), len(casts)
