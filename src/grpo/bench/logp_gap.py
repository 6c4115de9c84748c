"""How far apart log-probs of the same tokens come out of computations that should agree: the sampler's and the
trainer's, in float32 and under bf16 compute, beside the trainer's own bf16 forward in two micro-batch layouts.

    python -m grpo.bench.logp_gap --model DIR [--prompts 8 --group 8 --max-new-tokens 48] [--seed 0] [--output PATH]

Results: --output, else <GRPO_CACHE>/bench-results/logp_gap.json; the committed bench/results/logp_gap_smollm2.json,
which docs/memory.md quotes, is rewritten only with --output naming it.

The model samples P x G completions of the arithmetic task's training prompts (through its chat template) with the
native sampler in each compute; then the trainer's log-probs of those tokens (train/update.py batch_logprobs, as the
update's first epoch computes them) are taken in float32 and in bf16, the latter with the whole batch in one
micro-batch and with one completion a micro-batch. Each figure is the mean over completion tokens of |a - b|, nats:
what `rollout/logp_diff` logs for the sampler against the trainer. bf16 compute is `bfloat16` where the CPU
multiplies bf16 natively, `bfloat16_emulated` elsewhere (the file says which).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

COMMITTED = "bench/results/logp_gap_smollm2.json"


def measure(model_dir: str, prompts: int, group: int, max_new_tokens: int, seed: int) -> dict:
    from pathlib import Path

    from grpo.bench.engines import chat_prompts
    from grpo.data.arithmetic import ArithmeticTask
    from grpo.models.loading import load_causal_lm, load_tokenizer
    from grpo.models.precision import cpu_native_bf16
    from grpo.rollout import Sampler
    from grpo.train.update import PolicyBatch, batch_logprobs

    model, tok = load_causal_lm(Path(model_dir)).eval(), load_tokenizer(Path(model_dir))
    bf16 = "bfloat16" if cpu_native_bf16() else "bfloat16_emulated"
    problems = chat_prompts(tok, ArithmeticTask().split("train", prompts))
    out = {"bf16": bf16, "gaps": {}}
    for sampler_compute in ("weights", bf16):
        sampler = Sampler(model, tok, max_new_tokens=max_new_tokens, compute=sampler_compute)
        r = sampler.generate(problems, group, generator=torch.Generator().manual_seed(seed))
        mask = r.completion_mask.float()
        batch = PolicyBatch(prompt_ids=r.prompt_ids, prompt_mask=r.prompt_mask, completion_ids=r.completion_ids,
                            mask=mask, adv=torch.zeros(r.num_completions), group_size=group)
        trainer = {"float32": batch_logprobs(model, batch, None, 1.0, compute="weights"),
                   "bf16_whole_batch": batch_logprobs(model, batch, None, 1.0, compute=bf16),
                   "bf16_one_row_micro_batches": batch_logprobs(model, batch, 1, 1.0, compute=bf16)}

        def gap(a, b):
            return float(((a - b).abs() * mask).sum() / mask.sum())

        name = "sampler_float32" if sampler_compute == "weights" else "sampler_bf16"
        out["gaps"] |= {f"{name}_vs_trainer_{k}": gap(r.logp, v) for k, v in trainer.items()}
        if sampler_compute == bf16:  # the trainer against itself, and each layout against float32
            out["gaps"]["trainer_bf16_layouts"] = gap(trainer["bf16_whole_batch"], trainer["bf16_one_row_micro_batches"])
            out["gaps"]["trainer_bf16_vs_float32"] = gap(trainer["bf16_whole_batch"], trainer["float32"])
        out[f"{name}_tokens"] = int(mask.sum())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m grpo.bench.logp_gap", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help=f"the results file (committed: {COMMITTED})")
    a = p.parse_args(argv)
    from grpo.bench.results import results_path, wrote
    from grpo.models.precision import cpu_bf16_flags
    from grpo.tracking.rundir import check_output_file, write_text_atomic

    if a.output is not None:
        check_output_file(a.output, "--output")
    out = results_path("logp_gap.json", a.output)
    result = measure(a.model, a.prompts, a.group, a.max_new_tokens, a.seed)
    result |= {"spec": vars(a) | {"output": None}, "cpu_bf16_flags": cpu_bf16_flags(), "torch": torch.__version__}
    write_text_atomic(out, json.dumps(result, indent=1) + "\n")
    for name, value in result["gaps"].items():
        print(f"{name:<52} {value:.4f} nats a token")
    print(wrote(out, COMMITTED, "--model <SmolLM2-135M-Instruct dir>"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
