"""KV-cached sampling of G completions per prompt, with the prompt computed once per group.

    prefill the P distinct prompts once            (P, L) -> KV cache of P rows
    repeat each cache row G times                   -> KV cache of N = P*G rows (no prompt recompute)
    decode: sample, append, one cached step         until every row has emitted EOS or max_new_tokens
    rows that finished are dropped from the cache   (finished sequences stop costing)

Sampling is temperature / top-p; `temperature=0` means greedy. The log-probability of each sampled token
under the sampling distribution is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.models.forward import cache_kwargs, output_cache, position_ids_from_mask
from grpo.types import Prompt, Rollouts


def encode_prompts(tokenizer, prompts: list[Prompt], max_prompt_tokens: int | None = None):
    """Left-padded (P, L) ids and mask. Raises ValueError naming the prompt that is empty or too long."""
    texts = [p.text for p in prompts]
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
    for p, ids in zip(prompts, enc):
        if not ids:
            raise ValueError(f"prompt {p.uid!r} is empty after tokenisation")
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            raise ValueError(
                f"prompt {p.uid!r} has {len(ids)} tokens, more than data.max_prompt_tokens={max_prompt_tokens}"
            )
    L = max(len(ids) for ids in enc)
    pad = tokenizer.pad_token_id
    prompt_ids = torch.full((len(enc), L), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(enc), L), dtype=torch.long)
    for i, ids in enumerate(enc):
        prompt_ids[i, L - len(ids):] = torch.tensor(ids)
        prompt_mask[i, L - len(ids):] = 1
    return prompt_ids, prompt_mask


def _sample(logits: torch.Tensor, temperature: float, top_p: float, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V) -> (tokens (B,), logp (B,)) under the tempered, top-p truncated distribution."""
    if temperature == 0:
        logp = torch.log_softmax(logits.float(), -1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]
    logp = torch.log_softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sorted_logp, order = logp.sort(-1, descending=True)
        cum = sorted_logp.exp().cumsum(-1)
        drop = cum - sorted_logp.exp() > top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
        logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
        logp = torch.log_softmax(logp, -1)
    tok = torch.multinomial(logp.exp(), 1, generator=generator)[:, 0]
    return tok, logp.gather(-1, tok[:, None])[:, 0]


@dataclass
class Sampler:
    """Samples completions from a causal LM with the Hugging Face forward and its KV cache."""

    model: torch.nn.Module
    tokenizer: object
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_prompt_tokens: int | None = None

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], n: int, *, generator: torch.Generator | None = None,
                 temperature: float | None = None) -> Rollouts:
        temperature = self.temperature if temperature is None else temperature
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.max_prompt_tokens)
        ids, mask = prompt_ids.to(device), prompt_mask.to(device)
        was_training = self.model.training
        self.model.eval()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                         use_cache=True, logits_to_keep=1)
        cache = output_cache(out)
        if n > 1:
            cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1].repeat_interleave(n, 0)  # (N, V)
        mask = mask.repeat_interleave(n, 0)
        N, T = logits.shape[0], self.max_new_tokens
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        tokens = torch.full((N, T), pad, dtype=torch.long, device=device)
        logps = torch.zeros((N, T), device=device)
        lengths = torch.full((N,), T, dtype=torch.long, device=device)
        alive = torch.arange(N, device=device)  # rows of the full batch still decoding, in cache order
        for t in range(T):
            tok, lp = _sample(logits, temperature, self.top_p, generator)
            tokens[alive, t] = tok
            logps[alive, t] = lp
            done = tok == eos
            lengths[alive[done]] = t + 1
            if t == T - 1 or bool(done.all()):
                break
            if bool(done.any()):  # compact: finished rows leave the cache and stop costing compute
                keep = (~done).nonzero()[:, 0]
                cache.batch_select_indices(keep)
                alive, tok, mask = alive[keep], tok[keep], mask[keep]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            pos = mask.sum(-1, keepdim=True) - 1
            logits = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos,
                                use_cache=True, **cache_kwargs(self.model, cache)).logits[:, -1]
        self.model.train(was_training)
        steps = torch.arange(T, device=device)
        completion_mask = (steps[None, :] < lengths[:, None]).long()
        tokens = tokens.masked_fill(completion_mask == 0, pad)
        logps = logps * completion_mask
        ended = (tokens == eos).any(-1)
        texts = self.tokenizer.batch_decode(tokens.cpu(), skip_special_tokens=True)
        return Rollouts(
            prompts=list(prompts), group_size=n, prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device),
            completion_ids=tokens, completion_mask=completion_mask, logp=logps, truncated=~ended, texts=texts,
        )
