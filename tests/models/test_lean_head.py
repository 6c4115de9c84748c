"""models.forward.lean_head_gradients with hidden_token_logprobs(weight_grad_in_place=True): the output head's and
a tied embedding's gradient reach .grad without a (V, H) temporary, and the gradient is the one plain autograd gives
through the model's own logits."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpo.models.forward import completion_token_logprobs, lean_head_gradients

V, H = 6000, 64  # (V, H) is the largest tensor of a backward by far (the 24 positions' logits: 24 x V)


def _model(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, tie_word_embeddings=tied, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).float()


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, V, (2, 5), generator=g)
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[1, 0] = 0  # left padding
    completion = torch.randint(0, V, (4, 6), generator=g)
    completion_mask = torch.ones_like(completion)
    completion_mask[3, 4:] = 0
    weights = torch.randn(4, 6, generator=g)
    return prompt, prompt_mask, completion, completion_mask, weights


def _loss(model, batch, in_place: bool):
    prompt, prompt_mask, completion, completion_mask, weights = batch
    logp, _ = completion_token_logprobs(model, prompt, prompt_mask, completion, completion_mask, 2,
                                       head_grad_in_place=in_place)
    return (logp * weights * completion_mask).sum()


def _reference_grads(model, batches) -> dict[str, torch.Tensor]:
    """Plain autograd through the model's full logits: each row's prompt and completion as one sequence."""
    model.zero_grad(set_to_none=True)
    for prompt, prompt_mask, completion, completion_mask, weights in batches:
        for n in range(completion.shape[0]):
            p = prompt[n // 2][prompt_mask[n // 2].bool()]
            ids = torch.cat([p, completion[n]])[None]
            logits = model(ids).logits[0, len(p) - 1:-1]  # the positions predicting the completion's tokens
            logp = torch.log_softmax(logits.float(), -1).gather(-1, completion[n][:, None])[:, 0]
            (logp * weights[n] * completion_mask[n]).sum().backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_gradient_is_plain_autograds_over_two_micro_batches(tied):
    model = _model(tied)
    batches = [_batch(1), _batch(2)]
    want = _reference_grads(model, batches)
    model.zero_grad(set_to_none=True)
    for batch in batches:  # the second adds into the .grad the first left
        with lean_head_gradients(model, enabled=True) as in_place:
            loss = _loss(model, batch, in_place)
        assert in_place
        loss.backward()
    for name, p in model.named_parameters():
        assert not p.grad.is_sparse, name
        torch.testing.assert_close(p.grad, want[name], rtol=1e-4, atol=1e-6, msg=name)
    assert not model.get_input_embeddings().sparse  # restored after the block


def _largest_backward_allocation(model, in_place: bool) -> int:
    from torch.profiler import ProfilerActivity, profile

    model.zero_grad(set_to_none=True)
    with lean_head_gradients(model, enabled=in_place) as applies:
        loss = _loss(model, _batch(1), applies)
    loss.backward()  # .grad exists now: the next micro-batch's backward is the one measured
    with lean_head_gradients(model, enabled=in_place) as applies:
        loss = _loss(model, _batch(2), applies)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss.backward()
    return max(e.cpu_memory_usage for e in prof.events() if e.name.startswith("aten::"))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_micro_batchs_backward_builds_no_vocabulary_sized_gradient(tied):
    """Fails without the in-place head gradient (the head's (V, H) gradient) or without the sparse embedding
    gradient (a dense (V, H) per lookup); the plain path is measured too, so the test can fail."""
    model = _model(tied)
    vh = V * H * 4
    assert _largest_backward_allocation(model, in_place=False) >= vh
    assert _largest_backward_allocation(model, in_place=True) < vh / 2


def test_not_enabled_or_a_frozen_head_changes_nothing():
    model = _model(True)
    with lean_head_gradients(model, enabled=False) as applies:
        assert not applies and not model.get_input_embeddings().sparse
    assert model.get_input_embeddings().weight.grad is None
    model.get_output_embeddings().weight.requires_grad_(False)  # tied: the embedding is frozen too (LoRA's base)
    with lean_head_gradients(model, enabled=True) as applies:
        assert not applies and not model.get_input_embeddings().sparse
    assert model.get_input_embeddings().weight.grad is None
