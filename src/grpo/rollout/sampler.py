"""KV-cached sampling of G completions per prompt, with the prompt computed once per group.

    prefill the P distinct prompts once             (P, L) -> KV cache of P rows
    share it with the G samples of each prompt       -> N = P*G decoding rows (decode.py: the prompt's
                                                        keys/values are kept once per prompt, not G times)
    decode: sample, append in place, one cached step until every row has emitted EOS, completed a stop
            string (rollout.stop: rollout/stop.py) or reached max_new_tokens
    finished rows leave the batch                    (finished sequences stop costing)

Finished rows leave the batch once they are at least 1/8 of it, so a compaction, which copies the generated
part of the cache, is paid rarely; until then they ride along and their samples are ignored.

The prefill's next-token logits are checked once per call (check_logits; no per-token cost): a model whose logits
are NaN/inf is a NonFiniteLogitsError naming it, never completions of garbage scored 0.

Sampling is temperature / top-p; `temperature=0` means greedy. All the randomness of a call is one
(N, T) tensor of uniforms drawn up front and each token is the inverse CDF at its own uniform, so the
tokens do not depend on batching or compaction (the tests compare them with an uncached reference). The
log-probability of each sampled token under the sampling distribution is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.errors import NonFiniteLogitsError
from grpo.models.compute import compute_context
from grpo.models.forward import cache_kwargs, output_cache, position_ids_from_mask
from grpo.rollout.decode import LeanDecoder, expand_cache
from grpo.rollout.stop import StopScan
from grpo.tokens import prompt_token_ids
from grpo.types import Prompt, Rollouts


def encode_prompts(tokenizer, prompts: list[Prompt], max_prompt_tokens: int | None = None):
    """Left-padded (P, L) ids and mask, each prompt tokenized by grpo.tokens' rule (plain text with the
    tokenizer's special tokens, templated text without). Raises ValueError naming the prompt that is empty or
    too long."""
    enc = prompt_token_ids(tokenizer, prompts)
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


TRAINED_STEPS = "grpo_trained_steps"  # a model attribute: the training steps of this process applied to its weights


def check_logits(model: torch.nn.Module, logits: torch.Tensor) -> None:
    """Raise NonFiniteLogitsError when a row of the next-token logits (B, V) holds a NaN or +inf, or has no finite
    value at all; a -inf for some tokens (a token the model never emits) is fine. The message names the model (the
    directory it was loaded from), what the logits hold, and the cause: weight tensors holding NaN/inf (named), or
    else finite weights whose activations overflow in the model's dtype. A model the trainer has updated (its
    `grpo_trained_steps` attribute, TRAINED_STEPS, above 0) is said to have been made so by training, the model on
    disk untouched; the training loop turns that into grpo.train.diverged's message (the step, the settings, the
    last checkpoint)."""
    nan, posinf = torch.isnan(logits).any(-1), torch.isposinf(logits).any(-1)
    bad = nan | posinf | torch.isneginf(logits).all(-1)
    if not bool(bad.any()):
        return
    what = "NaN" if bool(nan.any()) else "+inf" if bool(posinf.any()) else "-inf for every token"
    config = getattr(model, "config", None)
    name = str(getattr(config, "_name_or_path", "") or "")
    params = list(model.named_parameters())
    broken = [n for n, p in params if not bool(torch.isfinite(p).all())]
    dtype = str(params[0][1].dtype).removeprefix("torch.") if params else "its dtype"
    trained = getattr(model, TRAINED_STEPS, 0)  # set by the trainer: the weights in memory are no longer the disk's
    if trained:
        held = (f"{len(broken)} of its {len(params)} weight tensors {'holds' if len(broken) == 1 else 'hold'} NaN/inf "
                f"(the first: {broken[0]})" if broken else "its weights are finite but so large that they overflow")
        cause = (f"{held} after {trained} training step(s) of this run: the training made them so (the learning "
                 "rate or the rewards' scale), the model on disk is untouched")
    elif broken:
        cause = (f"{len(broken)} of its {len(params)} weight tensors {'holds' if len(broken) == 1 else 'hold'} NaN/inf "
                 f"(the first: {broken[0]}): its weights are damaged; copy or save the model again from a good source")
    else:
        cause = (f"its weights are all finite, so its activations overflow in {dtype}"
                 + ("; load it in float32 (model.dtype=float32)" if dtype != "float32" else
                    ": some weights are too large (a bad conversion or merge?)"))
    rows = "its prompt" if bad.numel() == 1 else f"{int(bad.sum())} of {bad.numel()} prompts"
    err = NonFiniteLogitsError(f"the model {name or '(in memory)'} produces non-finite logits ({what} in the "
                               f"next-token logits of {rows}): {cause}. Its completions would be garbage, scored 0")
    err.logits = what  # what the logits hold, for the trainer's own message (grpo.train.diverged)
    raise err


@torch.no_grad()
def check_model_logits(model: torch.nn.Module, tokenizer, prompts: list[Prompt]) -> None:
    """One forward pass of `prompts` (the trainer passes its first training prompt, before a run writes anything),
    then check_logits on their next-token logits."""
    device = next(model.parameters()).device
    ids, mask = encode_prompts(tokenizer, prompts)
    was_training = model.training
    model.eval()
    try:
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                    position_ids=position_ids_from_mask(mask).to(device), logits_to_keep=1)
    finally:
        model.train(was_training)
    check_logits(model, out.logits[:, -1])


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor | None):
    """logits (B, V), uniforms u (B,) in [0, 1) -> (tokens (B,), logp (B,)) under the tempered, top-p
    truncated distribution. The token is the inverse CDF at u, so a row's token depends on its own logits
    and uniform only. temperature 0 is greedy (u unused)."""
    if temperature == 0:
        logp = torch.log_softmax(logits.float(), -1)
        tok = logp.argmax(-1)
        return tok, logp.gather(-1, tok[:, None])[:, 0]
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    if top_p >= 1.0:  # two passes over the vocabulary: the probabilities and their block totals
        probs = torch.softmax(scaled, -1)
        tok = _inverse_cdf(probs, u)
        # the log of the token's probability, as accurate as log_softmax's (tests/rollout/test_sampler_vocab.py): a
        # token whose probability rounds to 0 adds nothing to the running sum, so it is never the one sampled
        return tok, probs.gather(-1, tok[:, None])[:, 0].log()
    logp = torch.log_softmax(scaled, -1)
    sorted_logp, order = logp.sort(-1, descending=True)
    probs = sorted_logp.exp()
    drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
    sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
    logp = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
    logp = torch.log_softmax(logp, -1)
    tok = _inverse_cdf(logp.exp(), u)
    return tok, logp.gather(-1, tok[:, None])[:, 0]


CDF_BLOCK = 1024  # tokens per block of the two-level inverse CDF (_inverse_cdf)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs (B, V) each row's unnormalized probabilities, u (B,) uniforms in [0, 1) -> (B,) the token at u x the
    row's total of the running sum: the first token whose running sum exceeds it, so one with positive probability.

    Two levels, so that no running sum spans the vocabulary (a cumsum is one sequential pass: 66 ms a decode step
    over 64 rows of Gemma 3's 262,144 tokens on one core): the running sum of the rows' CDF_BLOCK-token block totals
    finds the block, then the running sum inside that block alone finds the token. The same token as one running sum
    over the row, but for rounding in the last bits of the sums."""
    B, V = probs.shape
    if V <= 4 * CDF_BLOCK:  # a small vocabulary: one running sum costs less than the blocks' bookkeeping
        cdf = probs.cumsum(-1)
        target = u.to(cdf.dtype)[:, None] * cdf[:, -1:] * (1 - 1e-6)  # the factor: below the total despite rounding
        return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=V - 1)
    whole = V - V % CDF_BLOCK  # the tokens in whole blocks; the rest (fewer than CDF_BLOCK) are one last block
    totals = probs[:, :whole].reshape(B, -1, CDF_BLOCK).sum(-1)  # (B, nb) block totals
    if whole < V:
        totals = torch.cat([totals, probs[:, whole:].sum(-1, keepdim=True)], -1)
    cdf = totals.cumsum(-1)
    # the factor keeps u*total below the total despite rounding
    target = u.to(cdf.dtype)[:, None] * cdf[:, -1:] * (1 - 1e-6)  # (B, 1)
    b = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)  # (B, 1) the block
    index = b * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)  # (B, CDF_BLOCK) its tokens
    inside = probs.gather(1, index.clamp(max=V - 1)).masked_fill_(index >= V, 0)
    running = inside.cumsum(-1) + (cdf.gather(1, b) - totals.gather(1, b))  # the row's running sum in the block
    j = torch.searchsorted(running, target, right=True)[:, 0]
    # past the block's end only by rounding (its total summed in another order): its last token with probability
    last = CDF_BLOCK - 1 - (inside.flip(-1) > 0).to(torch.int8).argmax(-1)
    j = torch.where(j >= CDF_BLOCK, last, j)
    return (b[:, 0] * CDF_BLOCK + j).clamp_(max=V - 1)


@dataclass
class Sampler:
    """Samples completions from a causal LM with its KV cache (decode.py: the prompt shared by its group; Llama-family
    models decode through LeanDecoder, others through their own forward).

    `generate(prompts, n, generator=...)`: `generator` is one torch.Generator for the call, or a list with one per
    prompt (each group's samples then depend only on its own generator, whatever the batch around it).
    min_new_tokens: EOS cannot be sampled before this many tokens (as in `transformers`' generate); the
    benchmark sets it to max_new_tokens to fix the token count.
    stop: stop strings (rollout.stop; rollout/stop.py has the rule): a row ends at the token that completes one in its
    decoded text, keeps that token, counts as finished, and its text ends before the stop string.
    on_step: None, or a function called after each decode step with (tokens done, T, rows still running) (the
    preflight's progress line).
    compute: what the forwards compute in, model.compute_dtype resolved (models/compute.py): "weights", or
    "bfloat16" (float32 weights, bf16 products under autocast, each weight cast once per call; a bf16 KV cache), the
    computation the trainer's forwards run, so the sampler's log-probs are the trainer's policy's up to bf16's rounding
    (`rollout/logp_diff`: about 0.03 nats a token on SmolLM2-135M, what two of the trainer's own bf16 forwards of a
    batch in other micro-batches differ by; algo.tis_cap=auto corrects for it).
    """

    model: torch.nn.Module
    tokenizer: object
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_prompt_tokens: int | None = None
    min_new_tokens: int = 0
    compute: str = "weights"
    stop: tuple[str, ...] = ()
    on_step: object = None  # called after each decode step with (tokens done, T, rows still running): progress

    def __post_init__(self):
        self.stop = tuple(self.stop or ())
        self._scan = StopScan(self.tokenizer, self.stop) if self.stop else None

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do: the sampler decodes with the training model itself (rollout/engine.py's contract)."""

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], n: int, *,
                 generator: torch.Generator | list[torch.Generator] | None = None,
                 temperature: float | None = None) -> Rollouts:
        temperature = self.temperature if temperature is None else temperature
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.max_prompt_tokens)
        prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
        N, T = len(prompts) * n, self.max_new_tokens
        if isinstance(generator, (list, tuple)):  # one per prompt: a group's samples depend on its own only
            if len(generator) != len(prompts):
                raise ValueError(f"got {len(generator)} generators for {len(prompts)} prompts")
            uniforms = torch.cat([torch.rand((n, T), generator=g, device=g.device).to(device) for g in generator])
        else:
            uniforms = torch.rand((N, T), generator=generator,
                                  device=generator.device if generator is not None else device).to(device)
        was_training = self.model.training
        self.model.eval()
        try:
            with compute_context(self.compute, device):  # autocast's weight casts are cached for the whole call
                tokens, logps, lengths = self._decode(prompt_ids, prompt_mask, n, uniforms, temperature)
        finally:
            self.model.train(was_training)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        stopped = torch.zeros_like(lengths, dtype=torch.bool)
        if self._scan is not None:  # the rule on whole rows: texts cut before their stop string
            lengths, stopped, texts = self._scan.finish(tokens, lengths)
        completion_mask = (torch.arange(T, device=device)[None, :] < lengths[:, None]).long()
        tokens = tokens.masked_fill(completion_mask == 0, pad)
        logps = logps * completion_mask
        ended = (tokens == eos).any(-1) | stopped
        if self._scan is None:
            texts = self.tokenizer.batch_decode(tokens.cpu(), skip_special_tokens=True)
        return Rollouts(
            prompts=list(prompts), group_size=n, prompt_ids=prompt_ids, prompt_mask=prompt_mask,
            completion_ids=tokens, completion_mask=completion_mask, logp=logps, truncated=~ended, texts=texts,
        )

    @torch.no_grad()
    def generate_from_ids(self, contexts: list[list[int]], uniforms: torch.Tensor, *,
                          temperature: float | None = None) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Continue B token contexts (the ids as they are, nothing re-tokenized) by at most T = uniforms.shape[1]
        new tokens each, one sample per context; uniforms (B, T) in [0, 1) are the draws (see sample_tokens).
        Returns, per context, the new ids (EOS, or the token completing a stop string, included), their log-probs
        under the sampling distribution, and whether EOS or a stop string ended it. Each context is prefilled in
        full (no cache is kept across calls: a later turn of an episode costs the prefill of its whole context;
        rollout/episodes.py)."""
        temperature = self.temperature if temperature is None else temperature
        if not contexts or any(len(c) == 0 for c in contexts):
            raise ValueError("generate_from_ids: every context needs at least one token")
        device = next(self.model.parameters()).device
        L = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), L), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), L), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, L - len(c):] = torch.tensor(c, dtype=torch.long)
            mask[i, L - len(c):] = 1
        was_training = self.model.training
        self.model.eval()
        try:
            with compute_context(self.compute, device):
                tokens, logps, lengths = self._decode(ids.to(device), mask.to(device), 1, uniforms.to(device),
                                                      temperature)
        finally:
            self.model.train(was_training)
        eos = self.tokenizer.eos_token_id
        stopped = [False] * len(contexts)
        if self._scan is not None:
            lengths, stopped, _ = self._scan.finish(tokens, lengths)
            stopped = stopped.tolist()
        tokens, logps, lengths = tokens.cpu().tolist(), logps.cpu().tolist(), lengths.cpu().tolist()
        out_ids = [t[:n] for t, n in zip(tokens, lengths)]
        ended = [s or (bool(t) and t[-1] == eos) for s, t in zip(stopped, out_ids)]
        return out_ids, [lp[:n] for lp, n in zip(logps, lengths)], ended

    def _decode(self, prompt_ids, prompt_mask, n: int, uniforms, temperature: float):
        """(tokens (N, T), logp (N, T), lengths (N,)) with T = uniforms.shape[1]; positions past a row's length
        are garbage. A row ends at EOS, at the token completing a stop string (StopScan.hits) or at T."""
        model, device = self.model, prompt_ids.device
        (P, L), T = prompt_ids.shape, uniforms.shape[1]
        N = P * n
        eos = self.tokenizer.eos_token_id
        positions = position_ids_from_mask(prompt_mask)
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True,
                    logits_to_keep=1)
        lean = LeanDecoder.for_model(model)
        kv_dtype = torch.bfloat16 if self.compute != "weights" else None  # what bf16 attention takes its keys in
        cache, grouped = expand_cache(output_cache(out), prompt_mask, n, T, grouped=lean is not None, dtype=kv_dtype)
        step = lean if grouped else None
        check_logits(model, out.logits[:, -1])  # once a call: a model with NaN/inf logits is named, not scored 0
        logits = out.logits[:, -1].repeat_interleave(n, 0)  # (N, V)
        del out
        # the attention mask of the whole run, written once; step t passes its first L+t+1 columns
        mask = torch.ones((N, L + T), dtype=torch.long, device=device)
        mask[:, :L] = prompt_mask.repeat_interleave(n, 0)
        pos = positions[:, -1:].repeat_interleave(n, 0)  # (N, 1) position of the last token fed
        tokens = torch.zeros((N, T), dtype=torch.long, device=device)
        logps = torch.zeros((N, T), device=device)
        lengths = torch.full((N,), T, dtype=torch.long, device=device)
        rows = torch.arange(N, device=device)  # batch row -> full-batch row (changes on compaction)
        live = torch.ones(N, dtype=torch.bool, device=device)  # batch rows still decoding
        n_live = N
        for t in range(T):
            if t < self.min_new_tokens and eos is not None:
                logits[:, eos] = float("-inf")
            tok, lp = sample_tokens(logits, temperature, self.top_p, uniforms[rows, t])
            tokens[rows, t] = tok  # rows that already ended write garbage past their length
            logps[rows, t] = lp
            done = (tok == eos) & live if eos is not None else torch.zeros_like(live)
            if self._scan is not None:  # the newest tokens' text of the live rows holds a stop string
                done |= self._scan.hits(tokens, rows, t, live & ~done)
            n_done = int(done.sum())
            if n_done:
                lengths[rows[done]] = t + 1
                live = live & ~done
                n_live -= n_done
            if self.on_step is not None:
                self.on_step(t + 1, T, n_live)
            if t == T - 1 or n_live == 0:
                break
            if (live.numel() - n_live) * 8 >= live.numel():  # compact: finished rows stop costing
                keep = live.nonzero()[:, 0]
                cache.batch_select_indices(keep)
                mask, pos, rows, tok, live = mask[keep], pos[keep], rows[keep], tok[keep], live[keep]
            pos = pos + 1
            if step is not None:
                logits = step(tok, pos, cache)
            else:
                logits = model(input_ids=tok[:, None], attention_mask=mask[:, :L + t + 1], position_ids=pos,
                               use_cache=True, **cache_kwargs(model, cache)).logits[:, -1]
        return tokens, logps, lengths
