"""The KV-cached group sampler gives the same tokens and log-probs as an uncached reference on the same uniforms,
whatever path it takes (grouped prefix with the lean decode step, or the model's own forward), with rows that
end at different steps leaving the batch."""

from __future__ import annotations

import itertools

import pytest
import torch
from rollout_helpers import ARCHS, make_prompts, tiny_model

from grpo.models.forward import position_ids_from_mask
from grpo.rollout import Sampler, decode, encode_prompts
from grpo.rollout.sampler import sample_tokens


@torch.no_grad()
def reference(model, tok, prompts, G, T, seed, temperature=1.0, top_p=1.0, min_new_tokens=0):
    """Straightforward sampling: every step recomputes the whole sequence of every row, no cache, no compaction.
    Returns (tokens, mask, logp) with pad/0 after a row's EOS."""
    uniforms = torch.rand((len(prompts) * G, T), generator=torch.Generator().manual_seed(seed))
    ids, mask = encode_prompts(tok, prompts)
    ids, mask = ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)
    N = ids.shape[0]
    tokens = torch.full((N, T), tok.pad_token_id)
    logp = torch.zeros(N, T)
    out_mask = torch.zeros(N, T, dtype=torch.long)
    alive = torch.ones(N, dtype=torch.bool)
    for t in range(T):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, -1]
        if t < min_new_tokens:
            logits[:, tok.eos_token_id] = float("-inf")
        nxt, lp = sample_tokens(logits, temperature, top_p, uniforms[:, t])
        tokens[alive, t] = nxt[alive]
        logp[alive, t] = lp[alive]
        out_mask[alive, t] = 1
        ids = torch.cat([ids, nxt[:, None]], 1)
        mask = torch.cat([mask, alive.long()[:, None]], 1)
        alive &= nxt != tok.eos_token_id
    return tokens, out_mask, logp


def check_same(out, ref, tok):
    tokens, mask, logp = ref
    assert torch.equal(out.completion_ids, tokens)
    assert torch.equal(out.completion_mask, mask)
    torch.testing.assert_close(out.logp, logp, rtol=1e-4, atol=1e-5)
    assert torch.equal(out.truncated, ~(tokens == tok.eos_token_id).any(-1))
    assert out.texts == tok.batch_decode(tokens, skip_special_tokens=True)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.85), (0.0, 1.0)])
def test_tokens_and_logp_match_uncached_reference(tok, arch, temperature, top_p):
    model = tiny_model(arch, tok)
    assert decode.LeanDecoder.for_model(model) is not None  # the fast path is the one under test
    prompts, G, T = make_prompts(), 3, 12
    sampler = Sampler(model, tok, max_new_tokens=T, temperature=temperature, top_p=top_p)
    out = sampler.generate(prompts, G, generator=torch.Generator().manual_seed(5))
    check_same(out, reference(model, tok, prompts, G, T, 5, temperature, top_p), tok)
    assert out.completion_ids.shape == (len(prompts) * G, T) and out.group_size == G


@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_rows_that_end_leave_the_batch_and_decoding_stops(tok, arch, monkeypatch):
    model = tiny_model(arch, tok, eos_bias=2.5)
    prompts, G, T = make_prompts(), 4, 30
    batch_sizes = []
    update = decode.GroupedPrefixLayer.update

    def spy(self, k, v, *args, **kwargs):
        if self is self_first[0]:
            batch_sizes.append(k.shape[0])
        return update(self, k, v, *args, **kwargs)

    self_first = [None]
    expand = decode.expand_cache

    def expand_spy(*args, **kwargs):
        cache, grouped = expand(*args, **kwargs)
        self_first[0] = cache.layers[0]
        return cache, grouped

    monkeypatch.setattr(decode.GroupedPrefixLayer, "update", spy)
    monkeypatch.setattr("grpo.rollout.sampler.expand_cache", expand_spy)
    out = Sampler(model, tok, max_new_tokens=T).generate(prompts, G, generator=torch.Generator().manual_seed(1))
    check_same(out, reference(model, tok, prompts, G, T, 1), tok)
    lengths = out.completion_mask.sum(-1)
    assert lengths.max() < T  # every row ended early ...
    assert len(batch_sizes) == lengths.max() - 1  # ... and decoding stopped with the last one
    N = len(prompts) * G
    assert batch_sizes[0] <= N and batch_sizes[-1] < N
    assert all(a >= b for a, b in itertools.pairwise(batch_sizes))  # finished rows leave, never come back
    # a row is computed at most until 1/8 of the batch has finished after it, never to the end of the longest
    assert sum(batch_sizes) < len(batch_sizes) * N


@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_model_forward_path_matches_reference(tok, arch, monkeypatch):
    """Models without the lean step decode through model(...) with the buffered (repeated) cache."""
    monkeypatch.setattr(decode.LeanDecoder, "for_model", classmethod(lambda cls, model: None))
    model = tiny_model(arch, tok, eos_bias=1.5)
    prompts, G, T = make_prompts(), 3, 16
    out = Sampler(model, tok, max_new_tokens=T, temperature=0.9, top_p=0.95).generate(
        prompts, G, generator=torch.Generator().manual_seed(2))
    check_same(out, reference(model, tok, prompts, G, T, 2, 0.9, 0.95), tok)


def test_min_new_tokens_fixes_the_length(tok):
    model = tiny_model("llama", tok, eos_bias=4.0)
    prompts, G, T = make_prompts(), 2, 10
    out = Sampler(model, tok, max_new_tokens=T, min_new_tokens=T).generate(
        prompts, G, generator=torch.Generator().manual_seed(0))
    assert out.completion_mask.sum() == len(prompts) * G * T and out.truncated.all()
    check_same(out, reference(model, tok, prompts, G, T, 0, min_new_tokens=T), tok)


def test_one_generator_per_prompt_makes_groups_independent_of_the_batch(tok):
    model = tiny_model("qwen2", tok)
    prompts, G, T = make_prompts(), 3, 8
    sampler = Sampler(model, tok, max_new_tokens=T)
    together = sampler.generate(prompts, G, generator=[torch.Generator().manual_seed(10 + i) for i in range(4)])
    for i, p in enumerate(prompts):
        alone = sampler.generate([p], G, generator=[torch.Generator().manual_seed(10 + i)])
        assert torch.equal(together.completion_ids[i * G:(i + 1) * G], alone.completion_ids)
    with pytest.raises(ValueError, match="generators"):
        sampler.generate(prompts, G, generator=[torch.Generator()])


def test_generate_keeps_the_model_state(tok):
    model = tiny_model("llama", tok)
    model.train()
    impl = model.config._attn_implementation
    Sampler(model, tok, max_new_tokens=4).generate(make_prompts(), 2)
    assert model.training and model.config._attn_implementation == impl
    model.eval()
    Sampler(model, tok, max_new_tokens=4).generate(make_prompts(), 2)
    assert not model.training


def test_lean_step_declines_models_it_does_not_know(tok):
    model = tiny_model("llama", tok)
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert decode.LeanDecoder.for_model(model) is None  # a hook would be skipped: take the model's forward
    handle.remove()
    assert decode.LeanDecoder.for_model(model) is not None
    import transformers

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2))
    assert decode.LeanDecoder.for_model(gpt2) is None
