"""Environment tokens of an episode are attended but get no gradient and no KL: checked on a hand-built batch
against a naive reference loss written here (one forward per full sequence, policy tokens only)."""

from __future__ import annotations

import torch

from grpo.config import load_config
from grpo.models.builtin import build_model, build_tokenizer
from grpo.train.update import PolicyBatch, completion_logprobs, policy_update

SIZE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64)


def _batch(tok):
    """P=1 prompt (left-padded to 5), G=2 episodes: policy turn, environment reply, policy turn; row 1 padded."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompt = enc("2*3?")
    rows = [(enc("ca") + [eos], enc("<6>"), enc("6") + [eos]), (enc("c") + [eos], enc("<6>"), enc("5") + [eos])]
    T = max(sum(map(len, r)) for r in rows)
    ids = torch.full((2, T), pad)
    attn, loss = torch.zeros((2, T)), torch.zeros((2, T))
    for i, (a, env, b) in enumerate(rows):
        seq = a + env + b
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        loss[i, :len(a)] = 1
        loss[i, len(a) + len(env):len(seq)] = 1
    prompt_ids = torch.tensor([[pad] + prompt])
    prompt_mask = torch.tensor([[0] + [1] * len(prompt)])
    return PolicyBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, mask=loss,
                       adv=torch.tensor([1.0, -0.5]), group_size=2, attention_mask=attn), prompt


def _model(tok):
    torch.manual_seed(0)
    return build_model(tok, seed=0, size=SIZE).float()


def test_environment_log_probs_get_zero_gradient():
    tok = build_tokenizer()
    model = _model(tok)
    batch, _ = _batch(tok)
    logp, _ = completion_logprobs(model, batch, slice(0, 1), slice(0, 2), 1.0)
    logp.retain_grad()
    cfg = load_config("grpo")
    from grpo.algo import aggregate
    from grpo.algo.registry import policy_loss

    token_loss, _ = policy_loss("clip")(logp, logp.detach(), batch.adv, batch.mask, clip_low=0.2, clip_high=0.2,
                                        level="token", dual_clip=None)
    aggregate(token_loss, batch.mask, mode=cfg.algo.aggregate, num_tokens=batch.mask.sum(), num_seqs=2).backward()
    env = (batch.attention_mask == 1) & (batch.mask == 0)
    assert env.sum() == 6 and torch.all(logp.grad[env] == 0)
    assert torch.all(logp.grad[batch.mask == 1] != 0)


def test_update_gradient_equals_a_naive_policy_token_loss_and_env_tokens_are_attended():
    tok = build_tokenizer()
    batch, prompt = _batch(tok)
    model = _model(tok)
    cfg = load_config("grpo", ["optim.max_grad_norm=1e9"])
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    got = {}  # the gradient as the optimizer is about to apply it (the update frees it afterwards)
    opt.register_step_pre_hook(lambda *_: got.update({k: p.grad.clone() for k, p in model.named_parameters()}))
    policy_update(model, opt, sched, batch, cfg)

    ref_model = _model(tok)  # the same weights
    loss = 0.0
    for i in range(2):  # seq_mean_token_mean, mu = 1: loss = -1/G sum_i adv_i * mean over policy tokens of logp
        n = int(batch.attention_mask[i].sum())
        seq = torch.tensor([prompt + batch.completion_ids[i, :n].tolist()])
        logits = ref_model(input_ids=seq).logits[0]
        lp = torch.log_softmax(logits, -1)
        P = len(prompt)
        terms = [lp[P + t - 1, seq[0, P + t]] for t in range(n) if batch.mask[i, t] == 1]
        loss = loss - batch.adv[i] * torch.stack(terms).mean() / 2
    loss.backward()
    for k, p in ref_model.named_parameters():
        torch.testing.assert_close(got[k], p.grad, atol=1e-5, rtol=1e-4, msg=k)
    # the environment's tokens are attended: a different reply changes the next policy turn's log-probs
    other = PolicyBatch(**{**batch.__dict__, "completion_ids": batch.completion_ids.clone()})
    other.completion_ids[0, 3] = tok.convert_tokens_to_ids("9")
    with torch.no_grad():
        a, _ = completion_logprobs(model, batch, slice(0, 1), slice(0, 2), 1.0)
        b, _ = completion_logprobs(model, other, slice(0, 1), slice(0, 2), 1.0)
    assert (a[0, 6:] - b[0, 6:]).abs().max() > 1e-4
