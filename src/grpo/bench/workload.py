"""The measured work of `grpo bench` (grpo/bench/run.py): one (model, shape, G) `Workload` run three ways on the same
prompts (our step, the plain-torch floor, transformers generate), and `measure`, the medians over repeats."""

from __future__ import annotations

import statistics
from contextlib import contextmanager

import torch

from grpo.tokens import prompt_token_ids
from grpo.tracking.clock import Clock
from grpo.tracking.memory import peak_rss_mb, reset_peak_rss

__all__ = ["Workload", "long_prompts", "measure", "timed_forward"]


@contextmanager
def timed_forward(clock: Clock, acc: list):
    """Accumulate the seconds spent in `completion_logits` inside policy_update (the log-prob forward)."""
    from grpo.train import update

    inner = update.completion_logits

    def wrapper(*args, **kwargs):
        t = clock()
        out = inner(*args, **kwargs)
        acc.append(clock() - t)
        return out

    update.completion_logits = wrapper
    try:
        yield
    finally:
        update.completion_logits = inner


def long_prompts(task_prompts, length: int):
    """Arithmetic prompts lengthened to exactly `length` characters (= tokens) by a preamble of worked sums."""
    from grpo.types import Prompt

    examples = " ".join(f"{a} + {b} = {a + b}." for a, b in zip(range(11, 99, 7), range(3, 90, 5)))
    out = []
    for p in task_prompts:
        room = length - len(p.text)
        preamble = ("Worked examples: " + examples * (1 + length // len(examples)))[:room - 1] + "\n"
        out.append(Prompt(uid=p.uid, text=preamble + p.text, answer=p.answer, meta=p.meta, templated=p.templated))
    return out


class Workload:
    """Everything one (model, shape, G) measurement needs; the three methods run on the same prompts."""

    def __init__(self, models: dict, tokenizer, prompts, G: int, T: int, device, cfg, clock: Clock, runner):
        self.m, self.tok, self.prompts, self.G, self.T = models, tokenizer, prompts, G, T
        self.device, self.cfg, self.clock, self.runner = device, cfg, clock, runner

    # ------------------------------------------------------------------ ours
    def step(self) -> dict:
        from grpo.algo import group_advantages
        from grpo.rollout import Sampler
        from grpo.train.update import PolicyBatch, policy_update

        cfg, G, clock = self.cfg, self.G, self.clock
        policy, opt, sched = self.m["ours"], self.m["ours_opt"], self.m["ours_sched"]
        sampler = Sampler(policy, self.tok, max_new_tokens=self.T, temperature=cfg.rollout.temperature,
                          top_p=cfg.rollout.top_p, min_new_tokens=self.T)
        t0 = clock()
        rollouts = sampler.generate(self.prompts, G)
        t1 = clock()
        columns = {"answer": [p.answer for p in self.prompts for _ in range(G)]}
        scores = self.runner([p.text for p in self.prompts for _ in range(G)], rollouts.texts, columns)
        adv = group_advantages(scores.total.to(self.device), G, std=cfg.algo.std, scale=cfg.algo.scale,
                               eps=cfg.algo.eps)
        t2 = clock()
        batch = PolicyBatch(prompt_ids=rollouts.prompt_ids, prompt_mask=rollouts.prompt_mask,
                            completion_ids=rollouts.completion_ids, mask=rollouts.completion_mask.float(), adv=adv,
                            group_size=G)
        # the default config (mu = 1, beta = 0): no old-logprob and no reference pass, as the trainer; products in the
        # weights' dtype (model.compute_dtype's "weights"), as the floor's: the two are compared at one precision
        t3 = clock()
        forward: list[float] = []
        with timed_forward(clock, forward):
            policy_update(policy, opt, sched, batch, cfg)
        t4 = clock()
        tokens = int(rollouts.completion_mask.sum())
        assert tokens == len(self.prompts) * G * self.T, "the bench needs fixed-length completions"
        return {"generate_s": t1 - t0, "reward_s": t2 - t1, "logprob_s": (t3 - t2) + sum(forward),
                "backward_optimizer_s": (t4 - t3) - sum(forward), "step_s": t4 - t0, "gen_tokens": tokens}

    # ------------------------------------------------------------------ the naive floor
    @torch.no_grad()
    def floor_generate(self):
        """The usual KV-cached sampling loop over the N prompt copies (plain transformers + torch)."""
        from transformers import DynamicCache

        model, tok, G, T = self.m["floor"], self.tok, self.G, self.T
        enc = tok.pad({"input_ids": prompt_token_ids(tok, self.prompts)}, return_tensors="pt")  # grpo.tokens
        ids = enc["input_ids"].to(self.device).repeat_interleave(G, 0)
        mask = enc["attention_mask"].to(self.device).repeat_interleave(G, 0)
        model.eval()
        cache = DynamicCache(config=model.config)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        logits, pos = out.logits[:, -1], pos[:, -1:]
        new, logps = [], []
        for t in range(T):
            logits[:, tok.eos_token_id] = float("-inf")  # fixed length: no EOS before T tokens
            logp = torch.log_softmax(logits.float() / self.cfg.rollout.temperature, -1)
            nxt = torch.multinomial(logp.exp(), 1)
            new.append(nxt)
            logps.append(logp.gather(-1, nxt))
            if t == T - 1:
                break
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], 1)
            pos = pos + 1
            logits = model(input_ids=nxt, attention_mask=mask, position_ids=pos, cache=cache,
                           use_cache=True).logits[:, -1]
        completions = torch.cat(new, 1)
        texts = tok.batch_decode(completions.cpu(), skip_special_tokens=True)
        model.train()
        return ids, enc["attention_mask"].to(self.device).repeat_interleave(G, 0), completions, texts

    def floor(self) -> dict:
        clock, model, opt = self.clock, self.m["floor"], self.m["floor_opt"]
        t0 = clock()
        ids, mask, completions, _ = self.floor_generate()
        t1 = clock()
        full = torch.cat([ids, completions], 1)
        full_mask = torch.cat([mask, torch.ones_like(completions)], 1)
        pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
        adv = torch.randn(full.shape[0], device=self.device)
        L = ids.shape[1]
        logits = model(input_ids=full, attention_mask=full_mask, position_ids=pos).logits[:, L - 1:-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, completions[..., None])[..., 0]
        loss = -(adv[:, None] * logp).mean()
        loss.backward()
        t2 = clock()
        torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.optim.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = clock()
        return {"generate_s": t1 - t0, "forward_backward_s": t2 - t1, "optimizer_s": t3 - t2, "step_s": t3 - t0}

    # ------------------------------------------------------------------ transformers' generate
    @torch.no_grad()
    def hf_generate(self) -> dict:
        model, tok, clock, cfg = self.m["floor"], self.tok, self.clock, self.cfg
        model.eval()
        t0 = clock()
        enc = tok.pad({"input_ids": prompt_token_ids(tok, self.prompts)}, return_tensors="pt")  # grpo.tokens
        out = model.generate(input_ids=enc["input_ids"].to(self.device),
                             attention_mask=enc["attention_mask"].to(self.device), do_sample=True,
                             temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=0,
                             num_return_sequences=self.G, max_new_tokens=self.T, min_new_tokens=self.T,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        new = out[:, enc["input_ids"].shape[1]:]
        tok.batch_decode(new.cpu(), skip_special_tokens=True)
        t1 = clock()
        model.train()
        assert new.shape == (len(self.prompts) * self.G, self.T)
        return {"generate_s": t1 - t0}


def _median_dict(samples: list[dict]) -> dict:
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def measure(work: Workload, repeats: int, methods=("step", "floor", "hf")) -> dict:
    """One untimed pass per method (warms this shape up; measures its peak RSS), then `repeats` timed passes,
    interleaved (the starting method rotates per repeat); medians per figure, and the ratios as medians of the
    per-repeat ratios (the methods of one repeat run back to back, so a change in the load of a shared machine
    between repeats cancels out)."""
    raw: dict[str, list[dict]] = {m: [] for m in methods}
    calls = {"step": work.step, "floor": work.floor, "hf": work.hf_generate}
    peaks = {}
    for m in methods:
        reset_peak_rss()
        calls[m]()
        peaks[m] = peak_rss_mb()
    for r in range(repeats):
        for i in range(len(methods)):
            m = methods[(r + i) % len(methods)]
            raw[m].append(calls[m]())
    out = {m: _median_dict(v) | {"peak_rss_mb": peaks[m]} for m, v in raw.items()} | {"samples": raw}
    if "floor" in raw:
        out["step_over_floor"] = statistics.median(a["step_s"] / b["step_s"] for a, b in zip(raw["step"], raw["floor"]))
    if "hf" in raw:
        out["speedup_vs_hf_generate"] = statistics.median(
            b["generate_s"] / a["generate_s"] for a, b in zip(raw["step"], raw["hf"]))
    return out
