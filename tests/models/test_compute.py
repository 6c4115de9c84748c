"""bf16 compute (models/compute.py, model.compute_dtype): the rule that picks it from this machine, the chunked head's
bf16 products against a naive bf16 computation, the emulation against torch.autocast itself (the independent
reference: autocast runs bf16 products on this CPU too, only slowly), the update threading it through, what the memory
plan counts for it, and a training run that takes it from model.compute_dtype=auto on a CPU said to have native bf16."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from helpers.tiny_models import tiny_config, tiny_model

from grpo.config import load_config
from grpo.errors import ConfigError
from grpo.models import precision
from grpo.models.compute import compute_context, head_products, resolve_compute

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("setting, model_dtype, device, weights, native, want", [
    ("auto", "auto", CPU, torch.float32, True, "bfloat16"),          # the case: native bf16, fp32 master
    ("auto", "auto", CPU, torch.float32, False, "weights"),          # AVX2 only: emulated bf16 products are slow
    ("auto", "float32", CPU, torch.float32, True, "weights"),        # float32 asked for by name
    ("auto", "auto", CUDA, torch.bfloat16, True, "weights"),         # CUDA's auto weights are bf16 already
    ("float32", "auto", CPU, torch.float32, True, "weights"),
    ("bfloat16", "float32", CPU, torch.float32, False, "bfloat16"),  # by name: taken (with a warning)
    ("bfloat16", "bfloat16", CPU, torch.bfloat16, False, "weights"),
    ("bfloat16_emulated", "auto", CPU, torch.float32, False, "bfloat16_emulated"),
])
def test_the_compute_rule(setting, model_dtype, device, weights, native, want, monkeypatch):
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: native)
    cfg = load_config(None, [f"model.compute_dtype={setting}", f"model.dtype={model_dtype}"])
    assert resolve_compute(cfg, device, weights) == want


@pytest.mark.parametrize("setting, weights", [("float32", torch.bfloat16), ("bfloat16", torch.float16),
                                              ("bfloat16_emulated", torch.bfloat16)])
def test_mixes_without_meaning_are_refused_naming_the_field(setting, weights):
    cfg = load_config(None, [f"model.compute_dtype={setting}"])
    with pytest.raises(ConfigError, match="model.compute_dtype"):
        resolve_compute(cfg, CPU, weights)


@pytest.mark.parametrize("emulated", [False, True])
def test_the_heads_bf16_products_against_a_naive_bf16_computation(emulated):
    """logp from bf16 logits (bf16 operands, bf16 result) with a float32 log-softmax; the gradient to the hidden
    states as autograd gives it through those bf16 logits; the weight's gradient as autocast's linear backward makes
    it, a bf16 product u^T h for each chunk of rows (5 here), summed in float32. A backward that recomputed the logits
    in float32 while the forward used bf16 fails the gradients; one whose weight gradient stayed a float32 product
    fails the last check."""
    from grpo.algo import hidden_token_logprobs

    torch.manual_seed(0)
    N, T, H, V, tau = 3, 4, 40, 70, 0.7
    h = (torch.randn(N, T, H) * 2).requires_grad_()
    w = torch.randn(V, H).requires_grad_()
    y = torch.randint(0, V, (N, T))
    g = torch.randn(N, T)  # an upstream gradient
    logp, _ = hidden_token_logprobs(h, w, y, temperature=tau, chunk_size=5, product_dtype=torch.bfloat16,
                                    emulated=emulated)
    (logp * g).sum().backward()
    # the naive computation, by hand
    hr = h.detach().clone().requires_grad_()
    z = (hr.to(torch.bfloat16) @ w.detach().to(torch.bfloat16).t()).float() / tau
    ref = torch.log_softmax(z, -1).gather(-1, y[..., None])[..., 0]
    (ref * g).sum().backward()
    p = torch.softmax(z.detach(), -1)
    u = ((torch.nn.functional.one_hot(y, V).float() - p) * (g / tau)[..., None]).reshape(-1, V)  # (N*T, V)
    rows = h.detach().reshape(-1, H)
    grad_w = sum((u[a:a + 5].t().to(torch.bfloat16) @ rows[a:a + 5].to(torch.bfloat16)).float()
                 for a in range(0, N * T, 5))
    assert torch.allclose(logp, ref, atol=1e-5)
    assert torch.allclose(h.grad, hr.grad, rtol=1e-2, atol=1e-3)  # bf16 results: one rounding apart at most
    assert torch.allclose(w.grad, grad_w, rtol=1e-2, atol=1e-3)
    assert (w.grad - u.t() @ rows).abs().max() > 1e-4  # not the float32 product
    plain, _ = hidden_token_logprobs(h.detach(), w.detach(), y, temperature=tau)
    assert (plain - logp).abs().max() > 1e-3  # the products were bf16: float32 logits differ


def _logp_and_grads(model, compute: str, batch):
    from grpo.models.forward import completion_token_logprobs

    model.zero_grad()
    prompt_ids, prompt_mask, completion_ids, completion_mask, G = batch
    with compute_context(compute, CPU):
        logp, _ = completion_token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, G)
    (logp * completion_mask).sum().backward()
    return (logp.detach() * completion_mask, torch.cat([p.grad.flatten() for p in model.parameters()]))


def _batch(vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    P, G, L, T = 2, 3, 7, 6
    prompt_ids = torch.randint(1, vocab, (P, L), generator=gen)
    prompt_mask = torch.ones(P, L, dtype=torch.long)
    prompt_mask[0, :3] = 0  # left padding
    completion_ids = torch.randint(1, vocab, (P * G, T), generator=gen)
    completion_mask = torch.ones(P * G, T)
    completion_mask[1, 4:] = 0
    return prompt_ids, prompt_mask, completion_ids, completion_mask, G


@pytest.mark.parametrize("attention, closer", [("eager", 0.3), ("sdpa", 0.75)])
def test_the_emulation_rounds_where_autocast_does(attention, closer):
    """bfloat16_emulated against torch.autocast's bf16 on a tiny Qwen2: the log-probs and gradients of the two are
    closer to each other than either is to float32's (the products round at the same places). Under eager attention
    every product is a matmul the emulation rounds as autocast does; torch's bf16 attention kernel has its own exp,
    so there the match is looser."""
    torch.manual_seed(0)
    model = tiny_model("qwen2", vocab_size=300, hidden_size=96, intermediate_size=192, num_attention_heads=4,
                       num_key_value_heads=2, tie_word_embeddings=True, attn_implementation=attention)
    batch = _batch(300)
    exact, native, emulated = (_logp_and_grads(model, c, batch) for c in ("weights", "bfloat16", "bfloat16_emulated"))
    for i in range(2):
        off_bf16 = (exact[i] - native[i]).abs().mean()
        assert off_bf16 > 1e-5  # autocast acted
        assert (emulated[i] - native[i]).abs().mean() < closer * off_bf16
        assert torch.isfinite(emulated[i]).all()


def _policy_batch(model, vocab: int):
    from grpo.train.update import PolicyBatch

    prompt_ids, prompt_mask, completion_ids, completion_mask, G = _batch(vocab, seed=1)
    return PolicyBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                       mask=completion_mask, group_size=G, adv=torch.linspace(-1, 1, completion_ids.shape[0]))


def test_the_update_computes_as_it_is_told():
    """policy_update with compute=bfloat16 / bfloat16_emulated: plain SGD (lr 1) turns the gradient into the change
    of the weights; both bf16 changes differ from float32's, and from each other less than from it."""
    from grpo.train.update import policy_update

    torch.manual_seed(0)
    base = tiny_model("qwen2", vocab_size=300, hidden_size=64, intermediate_size=128, attn_implementation="eager")
    cfg = load_config(None, ["optim.max_grad_norm=1e9", "optim.micro_batch_tokens=30"])
    changes = {}
    for compute in ("weights", "bfloat16", "bfloat16_emulated"):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        policy_update(model, opt, sched, _policy_batch(model, 300), cfg, compute=compute)
        changes[compute] = torch.cat([(a - b).flatten() for a, b in zip(model.parameters(), base.parameters())])
    off = (changes["weights"] - changes["bfloat16"]).norm()
    assert changes["weights"].norm() > 0 and off > 1e-4 * changes["weights"].norm()
    assert (changes["bfloat16_emulated"] - changes["bfloat16"]).norm() < off


def test_old_and_reference_logprobs_compute_as_the_update():
    from grpo.train.update import batch_logprobs

    torch.manual_seed(0)
    model = tiny_model("qwen2", vocab_size=300, hidden_size=64, intermediate_size=128, attn_implementation="eager")
    batch = _policy_batch(model, 300)
    exact = batch_logprobs(model, batch, 10_000, 1.0)
    bf16 = batch_logprobs(model, batch, 10_000, 1.0, compute="bfloat16")
    emulated = batch_logprobs(model, batch, 10_000, 1.0, compute="bfloat16_emulated")
    assert bf16.dtype == emulated.dtype == torch.float32
    assert (exact - bf16).abs().max() > 1e-4
    assert (emulated - bf16).abs().mean() < 0.3 * (exact - bf16).abs().mean()
    assert head_products() == (None, False)  # nothing leaks out of the blocks


def _weight_casts(model, tokens: int):
    """The reference for what bf16 compute keeps: the saved tensors that are a parameter's exact bf16 copy (by
    value), and the rest, summed by storage."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    casts = {tuple(p.to(torch.bfloat16).flatten()[:8].tolist()): p.numel() for p in model.parameters() if p.dim() == 2}
    kept, copies = {}, {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() in params:
            return t
        if t.dtype == torch.bfloat16 and t.dim() == 2 and any(casts.get(tuple(x.flatten()[:8].tolist())) == t.numel()
                                                              for x in (t, t.t())):  # saved transposed
            copies[s.data_ptr()] = s.nbytes()
        else:
            kept[s.data_ptr()] = s.nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), compute_context("bfloat16", CPU):
        model.model(input_ids=torch.randint(0, 50, (1, tokens)), use_cache=False)
    return sum(kept.values()), sum(copies.values())


def test_the_memory_plan_counts_bf16_activations_and_the_weight_copies():
    """The probe's per-token bytes under bf16 compute against a direct measurement of the whole model (its weight
    copies told apart by value), and the weight copies against 2 bytes per linear weight (the plan's term)."""
    from grpo.models.footprint import parameter_counts, saved_bytes_per_token

    fields = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000)
    config = tiny_config("qwen2", **fields)
    tokens = 64
    kept, copies = _weight_casts(tiny_model("qwen2", seed=0, **fields), tokens)
    got = saved_bytes_per_token(config, torch.float32, compute="bfloat16")
    assert abs(got - kept / tokens) / (kept / tokens) < 0.05, (got, kept / tokens)
    assert got < 0.8 * saved_bytes_per_token(config, torch.float32)  # bf16 activations are smaller
    assert copies == 2 * parameter_counts(config).linear


@pytest.mark.slow
@pytest.mark.parametrize("native", [True, False])
def test_auto_trains_in_bf16_only_on_a_cpu_with_native_bf16(native, tmp_path, monkeypatch, caplog):
    """model.compute_dtype=auto on a CPU said to have AVX512-BF16: the trainer computes in bf16 (autocast, which runs
    here too, slowly) and says so, two steps train with finite metrics, the weights stay float32 and change. On a CPU
    said to lack it: float32 compute ("weights"), and no note."""
    from helpers.tiny_hf import save_tiny_model, small_run, varied_reward, write_chat_jsonl

    from grpo.train.trainer import Trainer

    monkeypatch.setattr(precision, "cpu_native_bf16", lambda cpuinfo=None: native)
    model_dir = save_tiny_model(tmp_path / "model")
    cfg = load_config(None, small_run(model_dir, write_chat_jsonl(tmp_path / "d.jsonl"), tmp_path / "run",
                                      "model.compute_dtype=auto"))  # small_run pins float32: the choice under test
    with caplog.at_level(logging.INFO):
        trainer = Trainer(cfg, reward_functions=[("varied", varied_reward, 1.0)])
    try:
        assert trainer.compute == ("bfloat16" if native else "weights")
        # the user is told, and how to turn it off; nothing is said where nothing changed
        assert ("multiplies bf16 natively" in caplog.text) is native
        before = [p.detach().clone() for p in trainer.policy.parameters()]
        for _ in range(2):
            metrics = trainer.step().metrics
            assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith(("loss", "policy")))
        assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
    finally:
        trainer.close()


def test_a_mix_without_meaning_stops_the_trainer_before_the_model_loads(tmp_path):
    from grpo.train.trainer import Trainer

    cfg = load_config(None, ["model.dtype=bfloat16", "model.compute_dtype=float32", "train.steps=1"])
    with pytest.raises(ConfigError, match="model.compute_dtype=float32"):
        Trainer(cfg, run_dir=tmp_path / "run")


def test_the_emulation_refuses_gradient_checkpointing():
    """The layers checkpointing recomputes in the backward would run outside the emulation (autocast is restored
    there, the mode is not): refused, naming both settings."""
    cfg = load_config(None, ["model.compute_dtype=bfloat16_emulated", "model.gradient_checkpointing=true"])
    with pytest.raises(ConfigError, match="gradient_checkpointing"):
        resolve_compute(cfg, CPU, torch.float32)
