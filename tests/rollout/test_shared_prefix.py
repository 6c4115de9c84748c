"""completion_logits computes each prompt once per group; its logits and gradients equal the unshared computation
over the N full sequences (fp32), for the policy pass (with gradients) and the no-grad old-logprob / reference
passes, with left-padded prompts of different lengths and right-padded completions."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import ARCHS, make_prompts, tiny_model

from grpo.models.forward import completion_logits, unshared_completion_logits
from grpo.rollout import encode_prompts
from grpo.train import update


def batch(tok, G=3, T=7, seed=0, prompts=None):
    """Left-padded prompts (lengths 1 to 17), completions of lengths 1..T (right padding)."""
    prompt_ids, prompt_mask = encode_prompts(tok, prompts or make_prompts())
    N = prompt_ids.shape[0] * G
    g = torch.Generator().manual_seed(seed)
    completion_ids = torch.randint(3, len(tok), (N, T), generator=g)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    completion_ids = completion_ids.masked_fill(mask == 0, tok.pad_token_id)
    return prompt_ids, prompt_mask, completion_ids, mask


def assert_grad_close(got, want, name=""):
    """fp32 tolerance for sums over many terms in a different order: relative to the gradient's own scale."""
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-6 * max(1.0, float(want.abs().max())), msg=name)


def logits_and_grads(fn, model, args, weights):
    model.zero_grad(set_to_none=True)
    logits = fn(model, *args)
    mask = args[3]
    (logits * weights * mask[..., None]).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_gradients_equal_the_unshared_computation(tok, arch):
    model = tiny_model(arch, tok)
    model.train()
    G = 3
    prompt_ids, prompt_mask, completion_ids, mask = batch(tok, G)
    args = (prompt_ids, prompt_mask, completion_ids, mask, G)
    weights = torch.randn(completion_ids.shape[0], completion_ids.shape[1], len(tok),
                          generator=torch.Generator().manual_seed(1))
    shared, g_shared = logits_and_grads(completion_logits, model, args, weights)
    plain, g_plain = logits_and_grads(unshared_completion_logits, model, args, weights)
    assert shared.shape == plain.shape == (*completion_ids.shape, len(tok))
    m = mask.bool()
    torch.testing.assert_close(shared[m], plain[m], rtol=1e-5, atol=1e-5)
    assert g_shared.keys() == g_plain.keys() and len(g_shared) == len(list(model.parameters()))
    for name in g_plain:
        assert_grad_close(g_shared[name], g_plain[name], name)


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
@pytest.mark.parametrize("window", [2, 4, 12, 20, 64])
def test_sliding_window_layers_share_the_prompt_exactly(tok, arch, window):
    """Sliding-window cache layers (Gemma 3's beside its global ones, Mistral's in every layer) take the shared path:
    the prompt is computed once per group, and with a window shorter than the longest prompt (2, 4, 12: it has 17
    tokens, and the cache keeps its last window - 1), between it and the whole sequence (20: the completions cross
    the window) and longer than it (64) the logits and gradients equal the
    unshared computation over the N full sequences. The window matters to these logits (a short window's differ from
    the long one's), so a shared path that attended outside the window would fail."""
    model = tiny_model(arch, tok, sliding_window=window)
    model.train()
    G = 3
    prompt_ids, prompt_mask, completion_ids, mask = batch(tok, G)
    args = (prompt_ids, prompt_mask, completion_ids, mask, G)
    seen = []
    handle = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].numel()))
    weights = torch.randn(*completion_ids.shape, len(tok), generator=torch.Generator().manual_seed(1))
    shared, g_shared = logits_and_grads(completion_logits, model, args, weights)
    (P, L), (N, T) = prompt_ids.shape, completion_ids.shape
    assert sum(seen) == P * (L - 1) + N * T  # shared: the prompt once per group
    handle.remove()
    plain, g_plain = logits_and_grads(unshared_completion_logits, model, args, weights)
    m = mask.bool()
    torch.testing.assert_close(shared[m], plain[m], rtol=1e-5, atol=1e-5)
    assert g_shared.keys() == g_plain.keys()
    for name in g_plain:
        assert_grad_close(g_shared[name], g_plain[name], name)
    if window < L + T:
        with torch.no_grad():  # the same weights (the same seed), a window longer than every sequence
            unwindowed = unshared_completion_logits(tiny_model(arch, tok, sliding_window=10_000), *args)
        assert (unwindowed[m] - plain[m]).abs().max() > 1e-3


def test_prompt_tokens_are_computed_once_per_group(tok):
    model = tiny_model("llama", tok)
    G = 4
    prompt_ids, prompt_mask, completion_ids, mask = batch(tok, G)
    seen = []
    handle = model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].numel()))
    completion_logits(model, prompt_ids, prompt_mask, completion_ids, mask, G)
    shared = sum(seen)
    seen.clear()
    unshared_completion_logits(model, prompt_ids, prompt_mask, completion_ids, mask, G)
    handle.remove()
    (P, L), (N, T) = prompt_ids.shape, completion_ids.shape
    assert shared == P * (L - 1) + N * T  # the prompt once per group (its last token rides with the completions)
    assert sum(seen) == N * (L + T)


def _policy_batch(tok, G, seed):
    from grpo.train.update import PolicyBatch

    prompt_ids, prompt_mask, completion_ids, mask = batch(tok, G, seed=seed)
    adv = torch.randn(completion_ids.shape[0], generator=torch.Generator().manual_seed(seed))
    return PolicyBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                       mask=mask.float(), adv=adv, group_size=G)


@pytest.mark.parametrize("arch", ("llama", "qwen2"))
def test_policy_old_and_reference_passes_equal_the_unshared_ones(tok, arch, monkeypatch):
    """The trainer's own entry points: batch_logprobs (pi_old when mu > 1, pi_ref when beta > 0) and the
    policy update's gradient, shared vs. unshared, with micro-batches of whole groups."""
    from grpo.config import Config

    cfg = Config()
    cfg.kl.coef = 0.05
    cfg.algo.epochs = 2
    cfg.optim.micro_batch_tokens = 120  # several micro-batches
    policy, ref = tiny_model(arch, tok, seed=0), tiny_model(arch, tok, seed=1)
    results = []
    for fn in (completion_logits, unshared_completion_logits):
        monkeypatch.setattr(update, "completion_logits", fn)
        b = _policy_batch(tok, G=3, seed=4)
        b.old_logp = update.batch_logprobs(policy, b, cfg.optim.micro_batch_tokens, 0.9)
        b.ref_logp = update.batch_logprobs(ref, b, cfg.optim.micro_batch_tokens, 0.9)
        assert len(list(b.group_chunks(cfg.optim.micro_batch_tokens))) > 1
        policy.zero_grad(set_to_none=True)
        logp, _ = update.completion_logprobs(policy, b, slice(None), slice(None), 0.9)
        loss = -(logp * b.adv[:, None] * b.mask).sum() + (logp - b.ref_logp).pow(2).mul(b.mask).sum()
        loss.backward()
        results.append((b.old_logp, b.ref_logp, {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (old_s, ref_s, g_s), (old_u, ref_u, g_u) = results
    torch.testing.assert_close(old_s, old_u, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref_s, ref_u, rtol=1e-5, atol=1e-5)
    for name in g_u:
        assert_grad_close(g_s[name], g_u[name], name)


def test_policy_update_steps_identically(tok, monkeypatch):
    """One whole policy_update (clipped surrogate, KL, micro-batches, clipping, AdamW) lands on the same weights."""
    from grpo.config import Config
    from grpo.train.optim import build_optimizer

    cfg = Config()
    cfg.kl.coef = 0.05
    cfg.optim.micro_batch_tokens = 120
    weights = []
    for fn in (completion_logits, unshared_completion_logits):
        monkeypatch.setattr(update, "completion_logits", fn)
        policy = tiny_model("qwen2", tok, seed=0)
        b = _policy_batch(tok, G=3, seed=7)
        b.ref_logp = update.batch_logprobs(tiny_model("qwen2", tok, seed=1), b, 120, 1.0)
        opt, sched = build_optimizer(policy.parameters(), cfg.optim, 4)
        update.policy_update(policy, opt, sched, b, cfg)
        weights.append([p.detach().clone() for p in policy.parameters()])
    for a, b_ in zip(*weights):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-6)


def test_gradient_checkpointing_and_degenerate_shapes_take_the_plain_path(tok):
    model = tiny_model("llama", tok)
    prompt_ids, prompt_mask, completion_ids, mask = batch(tok, 2)
    w = torch.randn(*completion_ids.shape, len(tok))
    plain, g_plain = logits_and_grads(unshared_completion_logits, model, (prompt_ids, prompt_mask, completion_ids,
                                                                          mask, 2), w)
    model.gradient_checkpointing_enable()
    model.train()
    got, g_got = logits_and_grads(completion_logits, model, (prompt_ids, prompt_mask, completion_ids, mask, 2), w)
    torch.testing.assert_close(got[mask.bool()], plain[mask.bool()], rtol=1e-5, atol=1e-5)
    for name in g_plain:
        assert_grad_close(g_got[name], g_plain[name], name)
    model.gradient_checkpointing_disable()
    # one-token prompts (L = 1) and groups of one (G = 1)
    one = make_prompts(("a", "b"))
    for G, prompts in ((2, one), (1, make_prompts())):
        args = batch(tok, G, prompts=prompts) + (G,)
        torch.testing.assert_close(completion_logits(model, *args), unshared_completion_logits(model, *args))
    with pytest.raises(ValueError, match="group_size"):
        completion_logits(model, prompt_ids, prompt_mask, completion_ids, mask, 3)


def test_micro_batches_count_the_prompt_once_per_group():
    """A group costs L + G*T tokens with the shared prefix and G*(L+T) without; chunks are whole groups when one
    fits the budget, else parts of one group (L + g*T tokens for g rows), down to one row."""
    P, G, L, T = 4, 4, 10, 5
    b = update.PolicyBatch(prompt_ids=torch.zeros(P, L, dtype=torch.long), prompt_mask=torch.ones(P, L),
                           completion_ids=torch.zeros(P * G, T, dtype=torch.long), mask=torch.ones(P * G, T),
                           adv=torch.zeros(P * G), group_size=G)
    shared = list(b.group_chunks(60))  # 30 tokens a group: 2 groups a chunk
    assert shared == [(slice(0, 2), slice(0, 8), G), (slice(2, 4), slice(8, 16), G)]
    assert len(list(b.group_chunks(60, shared_prefix=False))) == 4  # 60 tokens a group
    halves = list(b.group_chunks(20))  # 10 + 2 * 5: two rows of a group a micro-batch
    assert halves[:3] == [(slice(0, 1), slice(0, 2), 2), (slice(0, 1), slice(2, 4), 2), (slice(1, 2), slice(4, 6), 2)]
    assert len(halves) == 8
    uneven = list(b.group_chunks(25))  # 3 rows fit: parts of 3 and 1 rows
    assert uneven[:2] == [(slice(0, 1), slice(0, 3), 3), (slice(0, 1), slice(3, 4), 1)]
    ones = list(b.group_chunks(1))  # never less than one row
    assert len(ones) == P * G and all(g == 1 for _, _, g in ones)
    assert [r for _, rows, _ in ones for r in range(rows.start, rows.stop)] == list(range(P * G))


def test_micro_batches_compute_their_own_columns_not_the_batchs_longest_row(tok):
    """One long completion no longer makes every micro-batch T wide: groups are packed by their own longest row,
    a micro-batch computes up to its longest attended position (`columns`), and forward_tokens counts that.
    Hand-counted: L = 3, G = 2, rows attend 2, 1 | 2, 2 | 9, 4 | 1, 0 positions of T = 10, budget 20 tokens."""
    P, G, L, T = 4, 2, 3, 10
    lengths = [2, 1, 2, 2, 9, 4, 1, 0]
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()
    b = update.PolicyBatch(prompt_ids=torch.zeros(P, L, dtype=torch.long), prompt_mask=torch.ones(P, L),
                           completion_ids=torch.zeros(P * G, T, dtype=torch.long), mask=mask,
                           adv=torch.zeros(P * G), group_size=G)
    chunks = list(b.group_chunks(20))
    # groups 0 and 1: 2 x (3 + 2 x 2) = 14 tokens; with group 2 (9 wide) 3 x (3 + 2 x 9) = 63: no.
    # group 2 alone: 3 + 2 x 9 = 21 > 20: parts of (20 - 3) // 9 = 1 row. group 3: 3 + 2 x 1 = 5.
    assert chunks == [(slice(0, 2), slice(0, 4), G), (slice(2, 3), slice(4, 5), 1), (slice(2, 3), slice(5, 6), 1),
                      (slice(3, 4), slice(6, 8), G)]
    assert [b.columns(rows) for _, rows, _ in chunks] == [2, 9, 4, 1]
    model = tiny_model("llama", tok)  # not sharded, a plain cache: the shared prefix
    assert b.forward_tokens(model, 20) == (2 * 3 + 4 * 2) + (3 + 9) + (3 + 4) + (3 + 2 * 1)
    assert b.forward_tokens(model) == P * L + P * G * 9  # one micro-batch: the longest row's 9 columns
    episodes = update.PolicyBatch(prompt_ids=b.prompt_ids, prompt_mask=b.prompt_mask, completion_ids=b.completion_ids,
                                  mask=torch.zeros_like(mask), adv=b.adv, group_size=G, attention_mask=mask)
    assert [episodes.columns(rows) for _, rows, _ in chunks] == [2, 9, 4, 1]  # the attended length, not the loss's


@pytest.mark.parametrize("case", ["llama", "gemma3", "checkpointing", "no shareable cache"])
def test_the_update_packs_micro_batches_by_the_path_its_forward_takes(tok, case, monkeypatch):
    """The micro-batches are packed, and forward_tokens counted, by the cost the forward really has: each prompt
    once per group where completion_logits shares it (a plain or sliding-window cache), every row's prompt where it
    cannot (gradient checkpointing; a cache that cannot share). Counted by hand and against what the embedding sees
    during one policy_update: a packing that assumed sharing where the forward repeats the prompt (Gemma 3 before its
    sliding layers shared) computes more tokens a micro-batch than the budget it was planned for. The model starts
    in eval mode, as the trainer's policy is after sampling: the update puts it in train mode, where checkpointing
    acts (each layer's forward run again in the backward: twice the tokens through a layer), and back after."""
    from grpo.config import Config
    from grpo.models import forward
    from grpo.train.optim import build_optimizer

    model = tiny_model("gemma3" if case == "gemma3" else "llama", tok)
    if case == "checkpointing":
        model.gradient_checkpointing_enable()
    if case == "no shareable cache":
        monkeypatch.setattr(forward, "_shareable", lambda cache: False)
    shared = case in ("llama", "gemma3")
    model.eval()
    cfg = Config()
    cfg.kl.coef = 0.0
    cfg.optim.micro_batch_tokens = budget = 60
    b = _policy_batch(tok, G=3, seed=5)
    L = b.prompt_ids.shape[1]
    chunks = list(b.group_chunks(budget, shared_prefix=shared))
    cost = [(rn.stop - rn.start) * b.columns(rn) + (rp.stop - rp.start) * L if shared else
            (rn.stop - rn.start) * (L + b.columns(rn)) for rp, rn, _ in chunks]
    assert len(chunks) > 1 and all(c <= budget or rn.stop - rn.start == 1 for c, (_, rn, _) in zip(cost, chunks))
    assert b.forward_tokens(model, budget) == sum(cost)
    forward.plain_output_head(model)  # the lean head's once-per-model probe (8 tokens, twice), before counting
    seen, layer = [], []  # the embedding's tokens; a layer's MLP's (checkpointing runs it again, not its layer's hooks)
    hooks = [model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].numel())),
             model.model.layers[0].mlp.register_forward_pre_hook(lambda mod, a: layer.append(a[0].shape[:2].numel()))]
    opt, sched = build_optimizer(model.parameters(), cfg.optim, 4)
    update.policy_update(model, opt, sched, b, cfg)
    for h in hooks:
        h.remove()
    assert not model.training  # back in eval mode
    # shared: a group's prompt but its last token once (the last rides with each completion row, in its columns)
    groups = sum(rp.stop - rp.start for rp, _, _ in chunks)
    assert sum(seen) == (sum(cost) - groups if shared else sum(cost))
    assert sum(layer) == (2 if case == "checkpointing" else 1) * sum(seen)
