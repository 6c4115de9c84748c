"""The lean paths are chosen by evidence, not by a list of architectures: the lean head (log-probs from the final
hidden states x the head's weight, models/forward.py head_probe) and the lean decoder (rollout/decode.py
decoder_probe) are checked once per model against its own forward on a probe, and taken where they agree. Each family
the tests build (Llama, Qwen2, Qwen3, Mistral and Gemma 3 with sliding windows of 4 positions, shorter than every test
sequence) passes both, and its lean paths equal its full forward: the head's log-probs and every gradient against the
full-logits path, the decoder's sampled tokens and log-probs against an uncached full-forward reference, in float32
and under bf16 compute. A model whose check fails keeps the generic paths with one log line each and trains."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.precision import BF16_UNIT, bf16_compute
from helpers.tiny_models import WINDOW, spread
from rollout_helpers import make_prompts
from rollout_helpers import tiny_model as rollout_model

from grpo.models import forward
from grpo.models.compute import compute_context
from grpo.models.forward import completion_token_logprobs, position_ids_from_mask
from grpo.rollout import Sampler, encode_prompts
from grpo.rollout.decode import LeanDecoder, check_lean_paths

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
CPU = torch.device("cpu")


def family_model(arch: str, tok, seed: int = 0):
    """A tiny random model of `arch` on the character tokenizer, its norms and logits spread (tiny_models.spread)."""
    from helpers.tiny_models import tiny_model

    with torch.random.fork_rng():
        model = tiny_model(arch, seed=seed, vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None).float()
    return spread(model, logit_scale=5.0, seed=seed)


def _lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize("arch", FAMILIES)
def test_each_family_passes_both_checks_which_are_logged_once(tok, arch, caplog):
    model = family_model(arch, tok)
    with caplog.at_level(logging.INFO):
        notes = check_lean_paths(model)
        check_lean_paths(model)
        Sampler(model, tok, max_new_tokens=3).generate(make_prompts(), 2)
        assert forward.plain_output_head(model) is model.lm_head and LeanDecoder.for_model(model) is not None
    assert len(notes) == 2 and notes[0].startswith("lean head checked") and notes[1].startswith("lean decoder checked")
    assert len(_lines(caplog, "lean head checked")) == 1 and len(_lines(caplog, "lean decoder checked")) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("grpo")]


def _batch(tok, G=3, T=7, seed=0):
    """Left-padded prompts (1 to 17 tokens), completions of lengths 1..T: prompt + completion up to 24 positions."""
    prompt_ids, prompt_mask = encode_prompts(tok, make_prompts())
    N = prompt_ids.shape[0] * G
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    completion = torch.randint(3, len(tok), (N, T), generator=g).masked_fill(mask == 0, tok.pad_token_id)
    return prompt_ids, prompt_mask, completion, mask, G


def _logp_and_grads(model, batch, compute: str, lean: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not lean:
            m.setattr(forward, "plain_output_head", lambda model: None)
        model.zero_grad(set_to_none=True)
        with compute_context(compute, CPU):
            logp, entropy = completion_token_logprobs(model, *batch, temperature=0.8, chunk_size=5, with_entropy=True)
        weights = torch.linspace(-1, 1, logp.numel()).view(logp.shape)
        (logp * weights * batch[3]).sum().backward()
    return logp.detach() * batch[3], entropy * batch[3], {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_the_lean_heads_log_probs_and_gradients_equal_the_full_logits_path(tok, arch, precision, monkeypatch):
    """float32: equal up to the order of float32 sums. bf16 compute: both take bf16 products (the lean head's chunks,
    autocast's head), so the log-probs agree within a few bf16 units of the logits and the gradients within a few
    percent of their scale; a head that skipped the model's norm or took another weight is off by O(1)."""
    model = family_model(arch, tok)
    model.train()
    batch = _batch(tok)
    compute = "weights" if precision == "float32" else bf16_compute()
    assert forward.plain_output_head(model) is model.lm_head
    got = _logp_and_grads(model, batch, compute, True, monkeypatch)
    want = _logp_and_grads(model, batch, compute, False, monkeypatch)
    if precision == "float32":
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=5e-5)
        rtol, atol = 1e-4, 2e-6
    else:  # the same bf16 products (the lean head's chunks, autocast's linear head), summed in another order
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)
        rtol, atol = 0.0, 2 * BF16_UNIT  # the gradients' bf16 results round at their own places
    assert got[2].keys() == want[2].keys()
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, rtol=rtol, atol=atol * max(1.0, float(g.abs().max())), msg=name)


@torch.no_grad()
def _teacher_forced(model, tok, prompts, out, temperature: float, compute: str) -> torch.Tensor:
    """The model's own uncached forward over each sampled row's prompt + completion (left-padded as the sampler
    pads), under `compute`: the log-probabilities (N, T, V) of the tempered distribution each token was drawn from."""
    ids, mask = encode_prompts(tok, prompts)
    G = out.group_size
    full = torch.cat([ids.repeat_interleave(G, 0), out.completion_ids], 1)
    full_mask = torch.cat([mask.repeat_interleave(G, 0), out.completion_mask], 1)
    T, L = out.completion_ids.shape[1], ids.shape[1]
    with compute_context(compute, CPU):
        logits = model(input_ids=full, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask)).logits
    return torch.log_softmax(logits[:, L - 1:L + T - 1].float() / temperature, -1)


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_lean_decoder_under_bf16_compute_against_the_full_forward(tok, arch):
    """Under bf16 compute (the lean decoder's float32 products of bf16 operands, the model's autocast forward: not
    the same roundings) the sampler's log-probs of the tokens it drew equal the model's own full forward's over the
    sampled sequences within eps = BF16_UNIT of the logits' scale (bf16's relative spacing), and each token is the one
    its uniform picks from that forward's distribution but where the uniform lies within 2 eps of a boundary of the
    running sum (a distribution whose log-probs move by eps moves its running sum by at most about 2 eps). A decoder
    that ignored the window, a norm or the layer type's rotary frequency is off by O(1)."""
    model = family_model(arch, tok)
    compute = bf16_compute()
    prompts, G, T, temperature = make_prompts(), 3, 12, 0.9
    sampler = Sampler(model, tok, max_new_tokens=T, temperature=temperature, compute=compute)
    out = sampler.generate(prompts, G, generator=torch.Generator().manual_seed(3))
    assert LeanDecoder.for_model(model) is not None
    logp_all = _teacher_forced(model, tok, prompts, out, temperature, compute)  # (N, T, V)
    m = out.completion_mask.bool()
    want = logp_all.gather(-1, out.completion_ids[..., None])[..., 0]
    eps = BF16_UNIT * (float(want[m].abs().max()) + 1)
    assert (out.logp - want)[m].abs().max() <= eps
    uniforms = torch.rand(out.completion_ids.shape, generator=torch.Generator().manual_seed(3))
    cdf = logp_all.exp().cumsum(-1)
    above = cdf.gather(-1, out.completion_ids[..., None])[..., 0]  # the running sum through the token
    below = above - want.exp()
    target = uniforms * cdf[..., -1]
    assert ((below - 2 * eps <= target) & (target <= above + 2 * eps))[m].all()
    assert m.sum() > len(prompts) * G  # rows longer than one token: the cache was used


def test_sliding_windows_are_honoured_where_the_sequence_outgrows_them(tok):
    """Gemma 3's sliding-window layers (4 positions) beside its global one: the lean decoder's tokens and log-probs
    are the uncached reference's though every prompt + completion is longer than the window, and the window changes
    the tokens (the same weights with a window longer than the sequences sample others), so this fails if the KV cache
    stops honouring it. The decode steps past the window see its prompt part shrink to nothing."""
    from test_sampler import check_same, reference

    model = rollout_model("gemma3", tok)
    prompts, G, T = make_prompts(), 3, 12
    lengths = encode_prompts(tok, prompts)[1].sum(-1)
    assert model.config.sliding_window == WINDOW and int(lengths.min()) + T > WINDOW
    assert LeanDecoder.for_model(model) is not None
    out = Sampler(model, tok, max_new_tokens=T).generate(prompts, G, generator=torch.Generator().manual_seed(7))
    check_same(out, reference(model, tok, prompts, G, T, 7), tok)
    wide = rollout_model("gemma3", tok)
    wide.config.sliding_window = 64
    for layer in wide.model.layers:
        layer.self_attn.sliding_window = 64 if layer.self_attn.sliding_window else None
    other = Sampler(wide, tok, max_new_tokens=T).generate(prompts, G, generator=torch.Generator().manual_seed(7))
    assert not torch.equal(other.completion_ids, out.completion_ids)


class ScaledLogits(torch.nn.Module):
    """A causal LM whose forward returns its head's logits times 2, a post-processing its config does not name."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config
        self.model, self.lm_head = inner.model, inner.lm_head

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                logits_to_keep=0):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         use_cache=use_cache, logits_to_keep=logits_to_keep)
        out.logits = out.logits * 2
        return out


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_model_whose_checks_fail_keeps_the_generic_paths_with_one_line_each_and_trains(tok, arch, caplog):
    from test_sampler import check_same, reference

    model = ScaledLogits(family_model(arch, tok))
    with caplog.at_level(logging.INFO):
        assert check_lean_paths(model) == []
        assert forward.plain_output_head(model) is None and LeanDecoder.for_model(model) is None
        out = Sampler(model, tok, max_new_tokens=8).generate(make_prompts(), 2,
                                                             generator=torch.Generator().manual_seed(1))
        batch = _batch(tok, G=2)
        logp, _ = completion_token_logprobs(model, *batch)
        (logp * batch[3]).sum().backward()
    head, decoder = (_lines(caplog, "full (N, T, V) logits path"), _lines(caplog, "the model's own forward"))
    assert len(head) == 1 and "post-processes" in head[0]
    assert len(decoder) == 1 and "disagrees with the model's forward" in decoder[0]
    assert not _lines(caplog, "checked")
    check_same(out, reference(model, tok, make_prompts(), 2, 8, 1), tok)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_check_that_raises_is_a_refusal_naming_it(tok, caplog, monkeypatch):
    model = family_model("gemma3", tok)

    def broken(*args, **kwargs):
        raise RuntimeError("no rotary today")

    monkeypatch.setattr(type(model.model.rotary_emb), "forward", broken)
    with caplog.at_level(logging.WARNING):
        assert LeanDecoder.for_model(model) is None and LeanDecoder.for_model(model) is None
    assert [m for m in _lines(caplog, "own forward") if "RuntimeError: no rotary today" in m] == \
        _lines(caplog, "own forward")
    assert len(_lines(caplog, "own forward")) == 1


def test_the_decoder_check_fails_a_decoder_that_skips_gemmas_norms(tok, monkeypatch):
    """The probe is the evidence: a LeanDecoder that ran Gemma 3's layers in Llama's order (no norms after attention
    and around the MLP) disagrees with the model's forward and is refused."""
    init = LeanDecoder.__init__

    def llama_order(self, *args):
        init(self, *args)
        self.sandwich = False

    monkeypatch.setattr(LeanDecoder, "__init__", llama_order)
    model = family_model("gemma3", tok)
    assert LeanDecoder.for_model(model) is None
    assert "disagrees" in vars(model)["_grpo_decoder_probe"][1]
