"""`grpo bench`, real-vocabulary part: the policy update's memory and time on a Qwen2-shaped model with Qwen's
151,936-token vocabulary, against the naive floor, and rollout throughput beside `transformers` generate.

    python -m grpo.bench.vocab [--quick] [--output PATH]     this part alone (default <GRPO_CACHE>/bench-results/
                                                             vocab.json; the committed one, which the docs quote:
                                                             --output bench/results/vocab.json)
    grpo bench                                               appends it to the main bench's JSON

Model: random Qwen2ForCausalLM, vocab 151,936, hidden 64, 2 layers, tied embeddings (as Qwen2.5-0.5B), so the
head's (N, T, V) logits, not the layers, are what a step's memory is made of. Tokenizer: the built-in character
tokenizer with filler tokens up to the vocabulary size (`vocab_tokenizer`).

For N = P x G completions of T tokens (fixed length) after the arithmetic task's prompts, one micro-batch:

  update  `policy_update` (train/update.py) with the default config: log-probs and entropy from the final hidden
          states in chunks of `optim.logprob_chunk_tokens` positions (algo.hidden_token_logprobs), clipped surrogate,
          backward, gradient clipping, AdamW.
  floor   the same forward (shared-prefix `completion_logits`), then the usual way: the (N, T, V) logits, float,
          log_softmax, gather; the same surrogate and aggregation, backward, clipping, AdamW.

Peak memory above the resident state (model, AdamW moments, gradients, the batch): on CUDA
torch.cuda.max_memory_allocated minus memory_allocated before the call; on CPU the process's resident-set high-water
mark (VmHWM, reset through /proc/self/clear_refs after returning freed heap with malloc_trim) minus the resident set
before the call. Seconds: bench.Clock (CPU time of the process on CPU). First an untimed call of each method (its
peak), then `repeats` timed calls, alternating; medians.

Generation: `Sampler.generate` against `model.generate(num_return_sequences=G)`, same settings, top_p 1.0 and 0.9.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.tokens import prompt_token_ids

VOCAB_SIZE = 151_936
MODEL_NAME = "qwen2-vocab152k"
SIZE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512)
COMMITTED = "bench/results/vocab.json"  # what the docs quote: written only with --output naming it (results.py)


@dataclass(frozen=True)
class VocabPlan:
    prompts: int  # P
    group_size: int  # G
    lengths: tuple[int, ...]  # T values of the update runs (same N)
    chunk_sweep: tuple[int, ...]  # logprob_chunk_tokens values measured (update only) at the longest T
    gen: tuple[int, int, int]  # (P, G, T) of the generation comparison
    repeats: int


def full_plan() -> VocabPlan:
    # N = 64 at T = 16 and 32: the floor's (N, T, V) float32 logits are 0.62 and 1.25 GB; the N = 64,
    # T = 256 (10 GB of logits, a floor peak of about 4x that) does not fit a shared 24 GB machine
    return VocabPlan(prompts=8, group_size=8, lengths=(16, 32), chunk_sweep=(128, 512), gen=(4, 8, 32), repeats=3)


def quick_plan() -> VocabPlan:
    return VocabPlan(prompts=2, group_size=2, lengths=(4, 8), chunk_sweep=(4,), gen=(1, 2, 4), repeats=1)


# ---------------------------------------------------------------------------------------------- model
def vocab_tokenizer(vocab_size: int = VOCAB_SIZE):
    """The built-in character tokenizer with filler tokens `<x123>` up to `vocab_size` ids (text still encodes one
    token per character; the fillers only decode)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    from grpo.models.builtin import CHARACTERS, SPECIAL_TOKENS

    base = SPECIAL_TOKENS + CHARACTERS
    vocab = {t: i for i, t in enumerate(base + [f"<x{i}>" for i in range(vocab_size - len(base))])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                  padding_side="left")
    tok.model_max_length = SIZE["max_position_embeddings"]
    return tok


def vocab_model(tok, *, seed: int = 0, size: dict | None = None):
    """A random Qwen2ForCausalLM with the tokenizer's vocabulary and tied embeddings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=True, **(size or SIZE))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def save_vocab_model(directory: str | Path) -> Path:
    """Write the bench's real-vocabulary model and tokenizer to `directory` (for `grpo train model.name=DIR`)."""
    directory = Path(directory)
    tok = vocab_tokenizer()
    vocab_model(tok).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


# ---------------------------------------------------------------------------------------------- measuring
def _rss_mb() -> float:
    """The process's resident set now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def peak_above_resident(fn, clock, device) -> tuple[float, float, float]:
    """(MB of peak memory during fn() above what was resident before it, seconds of fn(), resident MB before)."""
    from grpo.tracking.memory import peak_rss_mb, reset_peak_rss

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t = clock()
        fn()
        seconds = clock() - t
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20, seconds, base / 2 ** 20
    reset_peak_rss()
    base = _rss_mb()
    t = clock()
    fn()
    seconds = clock() - t
    return peak_rss_mb() - base, seconds, base


def floor_update(model, optimizer, batch, cfg) -> None:
    """The naive update: the same forward, (N, T, V) logits, log_softmax, gather, surrogate, backward, AdamW."""
    from grpo.algo import aggregate, clipped_surrogate
    from grpo.models.forward import completion_logits

    optimizer.zero_grad(set_to_none=True)
    logits = completion_logits(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.mask,
                               batch.group_size)
    logp = torch.log_softmax(logits.float() / cfg.rollout.temperature, -1).gather(
        -1, batch.completion_ids[..., None])[..., 0]
    token_loss, _ = clipped_surrogate(logp, logp.detach(), batch.adv, batch.mask, clip_low=cfg.algo.clip_low,
                                      clip_high=cfg.algo.clip_high)
    loss = aggregate(token_loss, batch.mask, mode=cfg.algo.aggregate, num_tokens=batch.mask.sum(),
                     num_seqs=batch.mask.shape[0], max_len=batch.mask.shape[1])
    loss.backward()
    del logits, logp, token_loss, loss
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm)
    optimizer.step()


def _batch(tok, prompts, G: int, T: int, device):
    from grpo.rollout import encode_prompts
    from grpo.train.update import PolicyBatch

    prompt_ids, prompt_mask = encode_prompts(tok, prompts)
    g = torch.Generator().manual_seed(T)
    N = len(prompts) * G
    completions = torch.randint(3, len(tok), (N, T), generator=g)
    return PolicyBatch(prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device),
                       completion_ids=completions.to(device), mask=torch.ones(N, T, device=device),
                       adv=torch.randn(N, generator=g).to(device), group_size=G)


def update_entry(model, optimizer, sched, tok, prompts, plan: VocabPlan, T: int, cfg, clock, device) -> dict:
    """One `runs` entry: update vs floor at N = P*G, T (peak above resident, seconds)."""
    from grpo.train.update import policy_update

    batch = _batch(tok, prompts, plan.group_size, T, device)
    N = batch.mask.shape[0]
    cfg.optim.micro_batch_tokens = batch.prompt_ids.numel() + N * T  # one micro-batch: only the logits differ
    calls = {"update": lambda: policy_update(model, optimizer, sched, batch, cfg),
             "floor": lambda: floor_update(model, optimizer, batch, cfg)}
    peaks, resident, samples = {}, {}, {m: [] for m in calls}
    for m, fn in calls.items():
        optimizer.zero_grad(set_to_none=True)
        peaks[m], _, resident[m] = peak_above_resident(fn, clock, device)
    for r in range(plan.repeats):
        for m in (("update", "floor") if r % 2 == 0 else ("floor", "update")):
            optimizer.zero_grad(set_to_none=True)
            samples[m].append(peak_above_resident(calls[m], clock, device)[1])
    logits_mb = N * T * VOCAB_SIZE * 4 / 2 ** 20
    upd, flo = statistics.median(samples["update"]), statistics.median(samples["floor"])
    return {
        "kind": "vocab", "model": MODEL_NAME, "shape": f"vocab_T{T}", "prompts": len(prompts),
        "group_size": plan.group_size, "completions": N, "prompt_tokens": int(batch.prompt_ids.shape[1]),
        "completion_tokens": T, "vocab_size": VOCAB_SIZE, "logprob_chunk_tokens": cfg.optim.logprob_chunk_tokens,
        "full_logits_fp32_mb": logits_mb,
        "update_peak_mb": peaks["update"], "floor_update_peak_mb": peaks["floor"],
        "resident_mb": resident["update"],  # the process (CPU: RSS) or torch (CUDA) before our update
        "peak_over_floor": peaks["update"] / peaks["floor"],
        "update_s": upd, "floor_update_s": flo, "update_over_floor_s": statistics.median(
            a / b for a, b in zip(samples["update"], samples["floor"])),
        "samples": {k: [round(x, 4) for x in v] for k, v in samples.items()},
    }


def chunk_entry(model, optimizer, sched, tok, prompts, plan: VocabPlan, T: int, chunk: int, cfg, clock,
                device) -> dict:
    """Our update's peak at another chunk size (same batch): the peak follows the chunk."""
    from grpo.train.update import policy_update

    batch = _batch(tok, prompts, plan.group_size, T, device)
    cfg.optim.micro_batch_tokens = batch.prompt_ids.numel() + batch.mask.numel()
    saved, cfg.optim.logprob_chunk_tokens = cfg.optim.logprob_chunk_tokens, chunk
    try:
        optimizer.zero_grad(set_to_none=True)
        peak, seconds, _ = peak_above_resident(lambda: policy_update(model, optimizer, sched, batch, cfg), clock,
                                               device)
    finally:
        cfg.optim.logprob_chunk_tokens = saved
    return {"completion_tokens": T, "completions": batch.mask.shape[0], "logprob_chunk_tokens": chunk,
            "update_peak_mb": peak, "update_s": seconds}


def generation_entries(model, tok, task, plan: VocabPlan, clock, device) -> list[dict]:
    """Rollout tokens/s: Sampler.generate vs transformers generate, top_p 1.0 and 0.9, fixed length."""
    from grpo.rollout import Sampler

    P, G, T = plan.gen
    prompts = task.split("train", P)
    out = []
    for top_p in (1.0, 0.9):
        sampler = Sampler(model, tok, max_new_tokens=T, temperature=1.0, top_p=top_p, min_new_tokens=T)

        def ours():
            r = sampler.generate(prompts, G, generator=torch.Generator(device=device).manual_seed(0))
            assert int(r.completion_mask.sum()) == P * G * T

        @torch.no_grad()
        def hf():
            enc = tok.pad({"input_ids": prompt_token_ids(tok, prompts)}, return_tensors="pt").to(device)
            new = model.generate(**enc, do_sample=True, temperature=1.0, top_p=top_p, top_k=0,
                                 num_return_sequences=G, max_new_tokens=T, min_new_tokens=T,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            tok.batch_decode(new[:, enc["input_ids"].shape[1]:].cpu(), skip_special_tokens=True)

        ours(), hf()  # warm-up
        times = {"ours": [], "hf": []}
        for r in range(plan.repeats):
            for name, fn in ((("ours", ours), ("hf", hf)) if r % 2 == 0 else (("hf", hf), ("ours", ours))):
                t = clock()
                fn()
                times[name].append(clock() - t)
        ours_s, hf_s = statistics.median(times["ours"]), statistics.median(times["hf"])
        out.append({"top_p": top_p, "prompts": P, "group_size": G, "completion_tokens": T,
                    "gen_tokens_per_s": P * G * T / ours_s, "hf_generate_tokens_per_s": P * G * T / hf_s,
                    "speedup_vs_hf_generate": statistics.median(b / a for a, b in zip(times["ours"], times["hf"]))})
    return out


# ---------------------------------------------------------------------------------------------- running
def run_vocab(plan: VocabPlan, log=print) -> dict:
    """{"models": {name: {...}}, "runs": [...], "chunk_sweep": [...], "generation": [...], "acceptance": [...]}."""
    from grpo.tracking.clock import Clock
    from grpo.config import Config
    from grpo.data.arithmetic import ArithmeticTask
    from grpo.models.loading import resolve_dtype
    from grpo.train.optim import build_optimizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = resolve_dtype("auto", device)  # the training's rule (models/loading.py)
    clock = Clock(device)
    cfg = Config()
    tok = vocab_tokenizer()
    model = vocab_model(tok).to(device=device, dtype=dtype)
    model.train()
    optimizer, sched = build_optimizer(model.parameters(), cfg.optim, total_steps=10_000)
    task = ArithmeticTask()
    prompts = task.split("train", plan.prompts)
    from grpo.train.update import policy_update

    warm = _batch(tok, prompts, plan.group_size, plan.lengths[0], device)  # AdamW's moments exist from here on
    policy_update(model, optimizer, sched, warm, cfg)
    runs = []
    for T in plan.lengths:
        entry = update_entry(model, optimizer, sched, tok, prompts, plan, T, cfg, clock, device)
        runs.append(entry)
        log(f"  {MODEL_NAME} N={entry['completions']} T={T}: update peak {entry['update_peak_mb']:.0f} MB "
            f"(floor {entry['floor_update_peak_mb']:.0f} MB, x{entry['peak_over_floor']:.3f}), "
            f"{entry['update_s']:.2f} s (floor {entry['floor_update_s']:.2f} s)")
    sweep = [chunk_entry(model, optimizer, sched, tok, prompts, plan, plan.lengths[-1], c, cfg, clock, device)
             for c in plan.chunk_sweep]
    for s in sweep:
        log(f"  chunk {s['logprob_chunk_tokens']}: update peak {s['update_peak_mb']:.0f} MB")
    model.eval()
    generation = generation_entries(model, tok, task, plan, clock, device)
    for g in generation:
        log(f"  generate top_p={g['top_p']}: {g['gen_tokens_per_s']:.0f} tok/s, transformers "
            f"{g['hf_generate_tokens_per_s']:.0f} tok/s")
    params = sum(p.numel() for p in model.parameters())
    result = {"models": {MODEL_NAME: {"params": params, "size": SIZE, "vocab_size": VOCAB_SIZE,
                                      "tie_word_embeddings": True}},
              "runs": runs, "chunk_sweep": sweep, "generation": generation,
              "config": {"logprob_chunk_tokens": cfg.optim.logprob_chunk_tokens, "dtype": str(dtype)}}
    result["acceptance"] = acceptance(result)
    return result


def acceptance(result: dict) -> list[dict]:
    """The issue's targets on the largest N*T measured (not the issue's N = 64, T = 256: see full_plan)."""
    runs = result["runs"]
    big = max(runs, key=lambda r: r["completions"] * r["completion_tokens"])
    small = min(runs, key=lambda r: r["completions"] * r["completion_tokens"])
    label = f"{MODEL_NAME}, N={big['completions']}, T={big['completion_tokens']}"
    checks = [(f"update peak / floor peak above resident state, {label}", big["peak_over_floor"], "<=", 0.15),
              (f"update time / floor time, {label}", big["update_over_floor_s"], "<=", 1.1)]
    if big is not small:
        grow = big["update_peak_mb"] / small["update_peak_mb"]
        checks.append((f"{MODEL_NAME}: update peak at T={big['completion_tokens']} / at T={small['completion_tokens']} "
                       f"(T x{big['completion_tokens'] / small['completion_tokens']:.0f}; the floor's: "
                       f"x{big['floor_update_peak_mb'] / small['floor_update_peak_mb']:.2f})", grow, "<=", 1.3))
    return [{"check": n, "value": v, "threshold": f"{op} {t}", "met": v <= t} for n, v, op, t in checks]


def summary(result: dict) -> str:
    lines = [f"real vocabulary ({MODEL_NAME}, V={VOCAB_SIZE}; chunk {result['config']['logprob_chunk_tokens']}):",
             f"{'N':>4} {'T':>4} {'logits MB':>10} {'update MB':>10} {'floor MB':>9} {'ratio':>6} {'update s':>9} "
             f"{'floor s':>8} {'ratio':>6}"]
    for r in result["runs"]:
        lines.append(f"{r['completions']:>4} {r['completion_tokens']:>4} {r['full_logits_fp32_mb']:>10.0f} "
                     f"{r['update_peak_mb']:>10.0f} {r['floor_update_peak_mb']:>9.0f} {r['peak_over_floor']:>6.3f} "
                     f"{r['update_s']:>9.2f} {r['floor_update_s']:>8.2f} {r['update_over_floor_s']:>6.2f}")
    for s in result["chunk_sweep"]:
        lines.append(f"  chunk {s['logprob_chunk_tokens']:>5} at T={s['completion_tokens']}: update peak "
                     f"{s['update_peak_mb']:.0f} MB")
    for g in result["generation"]:
        lines.append(f"  generate top_p={g['top_p']}: ours {g['gen_tokens_per_s']:.0f} tok/s, transformers "
                     f"{g['hf_generate_tokens_per_s']:.0f} tok/s (x{g['speedup_vs_hf_generate']:.2f})")
    for a in result["acceptance"]:
        lines.append(f"  {a['check']}: {a['value']:.3f} (want {a['threshold']}) {'met' if a['met'] else 'NOT met'}")
    return "\n".join(lines)


def merge_into(result: dict, vocab: dict) -> dict:
    """Add the real-vocabulary part to the main bench result (runs, models, acceptance, and its own keys)."""
    result["models"].update(vocab["models"])
    result["runs"].extend(vocab["runs"])
    result["acceptance"].extend(vocab["acceptance"])
    result["vocab"] = {k: vocab[k] for k in ("chunk_sweep", "generation", "config")}
    return result


def main(argv=None) -> int:
    import argparse
    import logging

    p = argparse.ArgumentParser(prog="python -m grpo.bench.vocab")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--output", default=None, help="the results file (default <GRPO_CACHE>/bench-results/vocab.json; "
                   "the committed one: bench/results/vocab.json)")
    args = p.parse_args(argv)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if not torch.cuda.is_available():
        torch.set_num_threads(int(os.environ.get("GRPO_BENCH_THREADS", "1")))
    t0 = time.time()
    result = run_vocab(quick_plan() if args.quick else full_plan(),
                       log=lambda m: print(m, file=sys.stderr, flush=True))
    result["wall_s"] = time.time() - t0
    result["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0))
    from grpo.bench.results import results_path, wrote

    out = results_path("vocab.json", args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(wrote(out, COMMITTED))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
