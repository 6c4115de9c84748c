"""GRPO in one file: the seed's formulas in order, in plain torch + transformers.

This is the map to read before the library. `grpo train` runs the same algorithm with the engineering around it
(a KV-cached sampler that computes each prompt once per group, micro-batches, checkpoints, resume, many processes);
tests/test_examples.py checks that one update of this file and one of the library give the same parameters.

    python examples/grpo_minimal.py --model DIR            # any local Hugging Face causal LM directory
    python examples/grpo_minimal.py                        # the built-in model (arithmetic, "What is 47 + 38?")
    python examples/grpo_minimal.py --model DIR --train train.jsonl --test test.jsonl --eval-every 25 --log curve.jsonl
                                                           # own problems ({"prompt": ..., "answer": "85"} rows),
                                                           # held-out accuracy every 25 steps written to curve.jsonl

One step, for P prompts and G completions each (N = P*G):

    1. sample      o_1..o_G ~ pi_old(. | q)                              (N, T) token ids, right-padded
    2. reward      r_i = 1 if the last integer of o_i is the answer      (P, G)
    3. advantage   A_i = (r_i - mean(r)) / std(r), std over 1/G         (the seed's formula 4.1)
    4. ratio       rho_t = pi_theta(o_t | q, o_<t) / pi_old(o_t | q, o_<t)
    5. objective   J = 1/G sum_i 1/|o_i| sum_t min(rho_t A_i, clip(rho_t, 1-eps, 1+eps) A_i) - beta KL
    6. update      one AdamW step on -J (gradient norm clipped)

No value model: the group's own mean is the baseline. No reference model unless beta > 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

# ----------------------------------------------------------------------------------------------- 0. the task


def make_problems(n: int, *, seed: int, test: bool) -> list[tuple[str, int]]:
    """n (prompt, answer) pairs "What is a + b?" / "a - b" with operands 0-59. A problem belongs to the held-out
    split when a hash of it is 0 mod 10, so training never sees an evaluation problem."""
    rng, out = random.Random(seed), {}
    while len(out) < n:
        a, b, op = rng.randint(0, 59), rng.randint(0, 59), rng.choice("+-")
        a, b = (max(a, b), min(a, b)) if op == "-" else (a, b)
        if (hashlib.sha1(f"{a}{op}{b}".encode()).digest()[0] % 10 == 0) == test:  # stable on every machine
            out[f"What is {a} {op} {b}?\n"] = a + b if op == "+" else a - b
    return list(out.items())


def read_problems(path: str, n: int | None = None) -> list[tuple[str, int]]:
    """(prompt, answer) pairs from a JSONL file of {"prompt": text, "answer": integer or its text} rows."""
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    return [(r["prompt"], int(r["answer"])) for r in rows[:n]]


def reward(completion: str, answer: int) -> float:
    """The verifiable reward: 1.0 when the last integer of the completion is the answer."""
    found = re.findall(r"-?\d+", completion)
    return float(bool(found) and int(found[-1]) == answer)


# ------------------------------------------------------------------------------------------ 1. sample G each


@torch.no_grad()
def sample(model, tok, prompts: list[str], G: int, max_new_tokens: int, temperature: float):
    """G completions per prompt. -> prompt_ids (P, L) left-padded, prompt_mask (P, L),
    completion_ids (N, T) and completion_mask (N, T): 1 up to and including the first EOS, 0 after it."""
    enc = tok(prompts, return_tensors="pt", padding=True)  # tokenized as at inference (special tokens included)
    out = model.generate(**enc, do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                         max_new_tokens=max_new_tokens, num_return_sequences=G, pad_token_id=tok.pad_token_id)
    completion_ids = out[:, enc.input_ids.shape[1]:]
    return enc.input_ids, enc.attention_mask, completion_ids, completion_mask(completion_ids, tok.eos_token_id)


def completion_mask(ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(N, T) ids -> (N, T) float mask: tokens up to and including the first EOS count; later ones are padding."""
    is_eos = (ids == eos_id).long()
    after_first_eos = (is_eos.cumsum(1) - is_eos) > 0
    return (~after_first_eos).float()


# ------------------------------------------------------------------------------------------- 3. advantages


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages (r - mean) / (std + eps), std over 1/G (the seed's formula 4.1).
    A group whose rewards are all equal teaches nothing: its advantages are exactly 0."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, correction=0)  # population std: 1/G, not 1/(G-1)
    adv = (rewards - mean) / (std + eps)
    flat = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(adv), adv)


# ------------------------------------------------------------------------------------ 4. per-token log-probs


def token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float):
    """log pi(o_t | q, o_<t) of each completion token: (N, T). Each prompt row is repeated for its G completions;
    positions count real tokens only, so left padding does not shift them."""
    G = completion_ids.shape[0] // prompt_ids.shape[0]
    ids = torch.cat([prompt_ids.repeat_interleave(G, 0), completion_ids], dim=1)
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask.long()], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    L = prompt_ids.shape[1]
    logits = logits[:, L - 1:-1].float() / temperature  # the logits that predict completion tokens 1..T
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)


# ----------------------------------------------------------------------------------------- 5. the objective


def grpo_loss(logp, old_logp, adv, mask, *, clip_eps: float = 0.2, beta: float = 0.0, ref_logp=None):
    """-J for logp, old_logp, ref_logp, mask (N, T) and adv (N,):
    J = mean over completions of 1/|o_i| sum_t [min(rho_t A_i, clip(rho_t, 1-eps, 1+eps) A_i) - beta KL_t],
    with KL_t = pi_ref/pi - log(pi_ref/pi) - 1 (the k3 estimator, DeepSeekMath eq. 4). The mean over all N
    completions is the seed's 1/G sum_i averaged over the P groups (every group has G completions)."""
    ratio = torch.exp(logp - old_logp)
    A = adv[:, None]
    per_token = torch.minimum(ratio * A, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * A)
    if beta > 0:
        log_r = ref_logp - logp
        per_token = per_token - beta * (torch.exp(log_r) - log_r - 1)
    per_completion = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1)  # 1/|o_i| sum_t
    return -per_completion.mean()


# -------------------------------------------------------------------------------------------- 6. one update


def update(model, optimizer, batch, adv, *, temperature: float, clip_eps: float = 0.2, beta: float = 0.0,
           ref_model=None, max_grad_norm: float = 1.0) -> float:
    """One optimizer step on the batch (mu = 1: pi_old is the policy that sampled, so rho_t = 1 in value and
    the gradient is A_i * grad log pi; the clip only binds when the same batch is reused, mu > 1)."""
    prompt_ids, prompt_mask, completion_ids, mask = batch
    ref_logp = None
    if beta > 0:
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, prompt_ids, prompt_mask, completion_ids, mask, temperature)
    logp = token_logprobs(model, prompt_ids, prompt_mask, completion_ids, mask, temperature)
    loss = grpo_loss(logp, logp.detach(), adv, mask, clip_eps=clip_eps, beta=beta, ref_logp=ref_logp)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


# --------------------------------------------------------------------------------------- evaluation and run


@torch.no_grad()
def accuracy(model, tok, problems, max_new_tokens: int) -> float:
    """Greedy pass@1 on held-out problems."""
    enc = tok([q for q, _ in problems], return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    return sum(reward(t, a) for t, (_, a) in zip(texts, problems)) / len(problems)


def builtin_model_dir() -> str:
    """The built-in model's directory (the only line that uses the library: to find the weights)."""
    from grpo.config import load_config
    from grpo.models.loading import model_directory

    return str(model_directory(load_config(None)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="local model directory (default: the built-in model)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--prompts", type=int, default=16, help="P, prompts per step")
    p.add_argument("--group", type=int, default=8, help="G, completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", help="JSONL file of training problems (default: generated arithmetic)")
    p.add_argument("--test", help="JSONL file of held-out problems (default: generated arithmetic)")
    p.add_argument("--eval-n", type=int, default=200, help="held-out problems evaluated")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every K steps (0: before and after only)")
    p.add_argument("--log", help="write one JSON row per evaluation here: step, completions, accuracy, seconds")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    path = args.model or builtin_model_dir()
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref_model = None
    if args.beta > 0:  # a frozen copy of the starting policy
        ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    train = read_problems(args.train) if args.train else make_problems(5000, seed=1, test=False)
    test = read_problems(args.test, args.eval_n) if args.test else make_problems(args.eval_n, seed=2, test=True)
    rng = random.Random(args.seed)
    log = open(args.log, "w", encoding="utf-8") if args.log else None
    train_s = train_cpu_s = 0.0  # time in training steps, evaluation excluded: wall and this process's CPU

    def evaluate(step: int) -> float:
        acc = accuracy(model, tok, test, args.max_new_tokens)
        if log:
            log.write(json.dumps({"step": step, "completions": step * args.prompts * args.group, "accuracy": acc,
                                  "train_s": train_s, "train_cpu_s": train_cpu_s}) + "\n")
            log.flush()
        return acc

    print(f"held-out accuracy before: {evaluate(0):.3f}")
    for step in range(1, args.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        problems = rng.sample(train, args.prompts)
        batch = sample(model, tok, [q for q, _ in problems], args.group, args.max_new_tokens, args.temperature)
        texts = tok.batch_decode(batch[2], skip_special_tokens=True)
        rewards = torch.tensor([reward(t, a) for t, (_, a) in zip(texts, [x for x in problems
                                                                           for _ in range(args.group)])])
        adv = group_advantages(rewards.view(args.prompts, args.group)).view(-1)
        loss = update(model, optimizer, batch, adv, temperature=args.temperature, beta=args.beta,
                      ref_model=ref_model)
        train_s, train_cpu_s = train_s + time.perf_counter() - t0, train_cpu_s + time.process_time() - c0
        if step % 10 == 0:
            print(f"step {step:4d}  reward {rewards.mean():.3f}  loss {loss:+.4f}")
        if args.eval_every and step % args.eval_every == 0 and step < args.steps:
            print(f"step {step:4d}  held-out accuracy {evaluate(step):.3f}")
    print(f"held-out accuracy after:  {evaluate(args.steps):.3f}")


if __name__ == "__main__":
    main()
