"""`grpo train` on the real-vocabulary bench model, with the memory of each policy update measured the way the bench
measures it (peak resident set during the update above the resident set before it), to compare with the bench's
`update_peak_mb` for the same N and T.

    python scripts/vocab_train_memory.py [--full-logits] [--steps 3] [--model-dir /tmp/vocab-model] [grpo overrides]
    python scripts/vocab_train_memory.py --output bench/results/vocab_train.json     # then again with --full-logits

--full-logits forces the full (N, T, V) logits path (what the update did before), for contrast.
Prints one line per update and a JSON summary on the last line. --output also writes that summary, with the run's
largest `perf/peak_rss_mb` (the whole process), under the key `chunked` or `full_logits` of the file (the other
mode's entry is kept: the two modes run in two processes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--full-logits", action="store_true")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--model-dir", default=None)
    p.add_argument("--output", default=None, help="a JSON file (bench/results/vocab_train.json) to write the result to")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()

    from grpo.bench import vocab as bench_vocab
    from grpo.bench import peak_rss_mb, reset_peak_rss
    from grpo.cli import main as grpo_main
    from grpo.models import forward
    from grpo.train import trainer

    model_dir = Path(args.model_dir or Path(tempfile.gettempdir()) / "grpo-vocab152k-model")
    if not (model_dir / "config.json").exists():
        bench_vocab.save_vocab_model(model_dir)
    if args.full_logits:
        forward.plain_output_head = lambda model: None
    updates = []
    inner = trainer.policy_update

    def measured(model, optimizer, scheduler, batch, *args, **kwargs):
        reset_peak_rss()
        base = bench_vocab._rss_mb()
        out = inner(model, optimizer, scheduler, batch, *args, **kwargs)
        updates.append({"resident_mb": base, "update_peak_mb": peak_rss_mb() - base,
                        "completions": int(batch.mask.shape[0]), "completion_tokens": int(batch.mask.shape[1])})
        print(f"update: N={updates[-1]['completions']} T={updates[-1]['completion_tokens']} resident {base:.0f} MB, "
              f"peak above it {updates[-1]['update_peak_mb']:.0f} MB", flush=True)
        return out

    trainer.policy_update = measured
    out_dir = Path(tempfile.mkdtemp(prefix="grpo-vocab-train-"))
    rc = grpo_main(["train", f"model.name={model_dir}", f"train.steps={args.steps}", "rollout.prompts_per_step=8",
                    "rollout.group_size=8", "rollout.max_new_tokens=32", "train.eval_every=0", "eval.n=8",
                    "train.preflight=off",  # a random model cannot learn; this run measures memory
                    *args.overrides, "--output-dir", str(out_dir)])
    result = {"full_logits": args.full_logits, "updates": updates, "run_dir": str(out_dir), "rc": rc}
    print(json.dumps(result))
    if args.output:
        write_result(Path(args.output), result, out_dir, args)
    return rc


def write_result(path: Path, result: dict, run_dir: Path, args) -> None:
    """Merge this mode's result (with the run's largest perf/peak_rss_mb and the settings) into the JSON file."""
    import torch
    import transformers

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    peaks = [r["perf/peak_rss_mb"] for r in rows if "perf/peak_rss_mb" in r]
    old = json.loads(path.read_text()) if path.exists() else {}
    mode = "full_logits" if args.full_logits else "chunked"
    old[mode] = {**{k: v for k, v in result.items() if k != "run_dir"}, "steps": args.steps,
                 "overrides": args.overrides, "process_peak_rss_mb": max(peaks, default=None),
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
                 "transformers": transformers.__version__}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
