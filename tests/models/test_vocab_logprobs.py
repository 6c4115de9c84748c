"""Log-probs without the (N, T, V) logits on a real vocabulary (Qwen2-shaped, 151,936 tokens, hidden 32), fp32:
values, entropies and every parameter's gradient equal the full-logits path (the model's logits, log_softmax and
gather written here), with tied and untied embeddings, temperature != 1, the shared-prefix and the plain forward,
LoRA, a whole policy update with top_entropy_quantile; heads that are not a plain linear layer take the full path
with one log line."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from grpo.models import forward
from grpo.models.forward import completion_logits, completion_token_logprobs, unshared_completion_logits

V = 151_936
D = torch.float64


def qwen2(tie: bool, seed: int = 0, **extra):
    from helpers.tiny_models import tiny_model

    with torch.random.fork_rng():
        model = tiny_model("qwen2", seed=seed, vocab_size=V, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=64, tie_word_embeddings=tie, pad_token_id=0, eos_token_id=1,
                           bos_token_id=None, **extra).float()
        with torch.no_grad():  # random init is tiny (std 0.02): spread the logits so the softmax is not flat
            model.get_output_embeddings().weight.mul_(40)
    return model


def batch(G=3, T=6, seed=0):
    """2 left-padded prompts (lengths 5 and 3), N = 2G completions of lengths 1..T, ids over the whole vocabulary."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(2, V, (2, 5), generator=g)
    prompt_mask = torch.ones(2, 5, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_ids[1, :2] = 0
    completion_ids = torch.randint(2, V, (2 * G, T), generator=g)
    lengths = torch.randint(1, T + 1, (2 * G,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    return prompt_ids, prompt_mask, completion_ids.masked_fill(mask == 0, 0), mask, G


def reference(model, args, fn, temperature):
    """The full path: (N, T, V) logits from the model, log_softmax in float64, gather; entropy -sum p log p."""
    logits = fn(model, *args)
    logp_all = torch.log_softmax(logits.to(D) / temperature, -1)
    logp = logp_all.gather(-1, args[2][..., None])[..., 0]
    return logp, -(logp_all.exp() * logp_all).sum(-1).detach()


def run(model, compute, args, weights):
    model.zero_grad(set_to_none=True)
    logp, entropy = compute()
    (logp * weights * args[3]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy, grads


def assert_same(got, want, mask):
    (logp, ent, grads), (logp_w, ent_w, grads_w) = got, want
    m = mask.bool()
    torch.testing.assert_close(logp[m].to(D), logp_w[m], rtol=2e-5, atol=5e-5)
    # the entropy is a float32 sum over 152k entries (about 12 nats): its rounding depends on the CPU's vector width
    # (6e-5 on an AVX2-only EPYC, under 5e-5 with AVX-512); a bug is O(0.1) off
    torch.testing.assert_close(ent[m].to(D), ent_w[m], rtol=2e-5, atol=2e-4)
    assert grads.keys() == grads_w.keys() and grads
    for name in grads_w:  # fp32: a gradient is a sum over 152k vocabulary entries (the skinny matmuls of small
        scale = float(grads_w[name].abs().max())  # chunks round at about 2e-5 of its scale; a bug is O(1) off)
        torch.testing.assert_close(grads[name], grads_w[name].to(grads[name].dtype), rtol=1e-4, atol=3e-5 * scale,
                                   msg=name)


def saved_shapes():
    """Context recording the shapes autograd saves for the backward pass (to see that no (N, T, V) block is kept)."""
    shapes = []

    def pack(x):
        shapes.append(tuple(x.shape))
        return x

    return shapes, torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("fn", [completion_logits, unshared_completion_logits], ids=["shared", "unshared"])
def test_values_and_gradients_equal_the_full_logits_path(tie, temperature, fn):
    model = qwen2(tie)
    args = batch()
    N, T = args[2].shape
    weights = torch.randn(N, T, generator=torch.Generator().manual_seed(3))
    assert forward.plain_output_head(model) is model.lm_head
    shapes, hooks = saved_shapes()
    with hooks:
        got = run(model, lambda: completion_token_logprobs(model, *args, temperature=temperature, chunk_size=5,
                                                           with_entropy=True, forward_fn=fn), args, weights)
    assert not [s for s in shapes if s[-1] == V and math.prod(s[:-1]) >= N * T]  # no (N, T, V) block kept
    want = run(model, lambda: reference(model, args, fn, temperature), args, weights)
    assert_same(got, want, args[3])
    if tie:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_lora_adapters_get_the_same_gradients():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(qwen2(tie=True), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                       lora_dropout=0.0, task_type="CAUSAL_LM"))
    with torch.no_grad():  # B = 0 at start: make the adapters matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    assert forward.plain_output_head(model) is not None  # all-linear leaves the head alone
    args = batch(G=2, seed=5)
    weights = torch.randn(args[2].shape, generator=torch.Generator().manual_seed(4))
    got = run(model, lambda: completion_token_logprobs(model, *args, temperature=0.8, chunk_size=7,
                                                       with_entropy=True), args, weights)
    want = run(model, lambda: reference(model, args, completion_logits, 0.8), args, weights)
    assert got[2] and all("lora_" in n for n in got[2])
    assert_same(got, want, args[3])


def gemma2_softcapped():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                          final_logit_softcapping=5.0, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    return Gemma2ForCausalLM(config).float()


def biased_head():
    model = qwen2(tie=False)
    head = torch.nn.Linear(32, V, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.normal_()
    model.lm_head = head
    return model


def hooked_head():
    """A head whose forward is wrapped on the instance (as accelerate's offload hooks do)."""
    model = qwen2(tie=True)
    head = model.lm_head
    original = head.forward
    head.forward = lambda x: original(x)
    return model


def head_with_a_forward_hook():
    """A forward hook that rewrites the logits (as a test that bans a token does) must see logits."""
    model = qwen2(tie=True)
    model.lm_head.register_forward_hook(lambda module, args, out: out * 0.5)
    return model


@pytest.mark.parametrize("make, why", [(gemma2_softcapped, "final_logit_softcapping"), (biased_head, "bias"),
                                       (hooked_head, "already replaced"), (head_with_a_forward_hook, "forward hooks")])
def test_heads_that_are_not_plain_take_the_full_path_with_one_log_line(make, why, caplog):
    model = make()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    args = (torch.randint(2, vocab, (2, 4), generator=g), torch.ones(2, 4, dtype=torch.long),
            torch.randint(2, vocab, (4, 5), generator=g), torch.ones(4, 5, dtype=torch.long), 2)
    weights = torch.randn(4, 5, generator=g)
    with caplog.at_level(logging.WARNING, logger="grpo.models"):
        got = run(model, lambda: completion_token_logprobs(model, *args, temperature=0.9, with_entropy=True),
                  args, weights)
        completion_token_logprobs(model, *args)
    lines = [r.getMessage() for r in caplog.records if "full (N, T, V) logits path" in r.getMessage()]
    assert len(lines) == 1 and why in lines[0]
    want = run(model, lambda: reference(model, args, completion_logits, 0.9), args, weights)
    assert_same(got, want, args[3])


def test_policy_update_with_top_entropy_quantile_lands_on_the_same_weights(monkeypatch):
    """A whole policy_update (clipped surrogate, KL, entropy-quantile mask, micro-batches, AdamW): chunked vs the
    full-logits path (plain_output_head forced to None)."""
    from grpo.config import Config
    from grpo.train import update
    from grpo.train.optim import build_optimizer

    cfg = Config()
    cfg.kl.coef = 0.05
    cfg.rollout.temperature = 0.7
    cfg.algo.top_entropy_quantile = 0.5
    cfg.optim.micro_batch_tokens = 30  # 2 micro-batches of one group
    cfg.optim.logprob_chunk_tokens = 4
    prompt_ids, prompt_mask, completion_ids, mask, G = batch(G=3, seed=9)
    results = []
    for chunked in (True, False):
        if not chunked:
            monkeypatch.setattr(forward, "plain_output_head", lambda model: None)
        policy = qwen2(tie=True)
        b = update.PolicyBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                               mask=mask.float(), adv=torch.randn(completion_ids.shape[0],
                                                                  generator=torch.Generator().manual_seed(2)),
                               group_size=G)
        b.ref_logp = update.batch_logprobs(qwen2(tie=True, seed=1), b, 30, 0.7, 4)
        assert len(list(b.group_chunks(30))) == 2
        opt, sched = build_optimizer(policy.parameters(), cfg.optim, 4)
        metrics = update.policy_update(policy, opt, sched, b, cfg)
        results.append((b.ref_logp, metrics, [p.detach().clone() for p in policy.parameters()]))
    (ref_c, m_c, w_c), (ref_f, m_f, w_f) = results
    torch.testing.assert_close(ref_c, ref_f, rtol=0, atol=2e-5)
    for key in ("policy/entropy", "policy/entropy_kept_frac", "loss/policy", "loss/kl", "policy/grad_norm"):
        assert m_c[key] == pytest.approx(m_f[key], rel=1e-4, abs=1e-6), key
    assert 0.3 < m_c["policy/entropy_kept_frac"] < 0.7
    for a, b_ in zip(w_c, w_f):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-6)
