"""Learning efficiency with a user's model: held-out accuracy against training time and against completions.

Builds a warm checkpoint bigger than the built-in model (the built-in warm-up code, a BOS-adding character
tokenizer), saves it, writes its task (the built-in arithmetic problems) as JSONL files, then trains it through
`grpo train model.name=... data.path=...` in a subprocess, exactly as a user would, for each configuration and seed.

    python bench/learning/run.py                      # 5.1M-parameter model, 3 seeds, default / dapo / dr_grpo
    python bench/learning/run.py --small              # 0.9M model, short warm-up, 1 seed, 30 steps: minutes on a CPU
    python bench/learning/run.py --configs default:grpo: lr5e-5:grpo:optim.lr=5e-5 --seeds 0 1 2

A configuration is NAME:PRESET:OVERRIDES (overrides comma-separated, may be empty). Everything not given is the
library's default for a model directory (grpo.train.defaults: optim.lr 1e-6 for full fine-tuning), so the `default`
configuration measures what a new user gets. Writes bench/learning/results/<tag>.json and prints a table:

    gain            final held-out accuracy minus the accuracy before training
    per_1k          gain per 1,000 completions sampled (steps x P x G; dapo's extra resampling rounds are not
                    counted, so its figure is an upper bound)
    per_min         gain per minute of training steps (the sum of perf/step_s, evaluation excluded)
    max_drop        the largest drop between consecutive evaluations (stability)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

SIZES = {
    "small": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=128),
    "default": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=4, max_position_embeddings=128),
}


def bos_tokenizer():
    """The built-in character tokenizer plus <s>, which its post-processor adds in front of every text (as Llama's)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    from grpo.models.builtin import CHARACTERS

    special = ["<pad>", "<eos>", "<unk>", "<s>"]
    vocab = {t: i for i, t in enumerate(special + CHARACTERS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    core.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                        special_tokens=[("<s>", vocab["<s>"])])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="<eos>", pad_token="<pad>",
                                  unk_token="<unk>", padding_side="left")
    tok.model_max_length = 128
    return tok


def build_checkpoint(out: Path, size: str, warm_steps: int, train_size: int, seed: int = 0) -> Path:
    """Warm a fresh model on the arithmetic task's train split (grpo.train.warmup) and save it; kept if present."""
    import torch

    from grpo.data import get_task
    from grpo.models.builtin import build_model
    from grpo.train.warmup import warm_up

    if (out / "config.json").exists():
        return out
    tok = bos_tokenizer()
    model = build_model(tok, seed=seed, size=SIZES[size])
    model.config.bos_token_id = tok.bos_token_id
    n = sum(p.numel() for p in model.parameters())
    print(f"[bench] warming a {n / 1e6:.2f}M-parameter model for {warm_steps} steps", file=sys.stderr)
    t = time.time()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        losses = warm_up(model, tok, get_task("arithmetic"), steps=warm_steps, batch_size=64, lr=2e-3, seed=seed,
                         train_size=train_size)
    print(f"[bench] warm-up loss {losses[0]:.3f} -> {losses[-1]:.3f} in {time.time() - t:.0f} s", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def write_data(out: Path, train_size: int, test_size: int) -> tuple[Path, Path]:
    """The arithmetic task's splits as the JSONL files a user would have: {"prompt": text, "answer": "85"}."""
    from grpo.data import get_task

    task = get_task("arithmetic")
    paths = []
    for split, n in (("train", train_size), ("test", test_size)):
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps({"prompt": p.text, "answer": p.answer}) + "\n"
                                for p in task.split(split, n)))
        paths.append(path)
    return paths[0], paths[1]


def train(model: Path, train_file: Path, test_file: Path, run_dir: Path, preset: str, overrides: list[str],
          seed: int, args) -> dict:
    """One `grpo train` subprocess; returns its curve from metrics.jsonl and summary.json."""
    cmd = [sys.executable, "-m", "grpo.cli", "train", preset, f"model.name={model}", f"data.path={train_file}",
           f"data.test_path={test_file}", "reward.functions=[exact_answer]", f"train.seed={seed}",
           f"train.steps={args.steps}", f"train.eval_every={args.eval_every}", f"eval.n={args.eval_n}",
           f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
           f"rollout.max_new_tokens={args.max_new_tokens}", "log.plots=false", "log.sample_groups=0",
           f"train.output_dir={run_dir}", *overrides, "--quiet", "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    t = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train_s, curve = 0.0, [(0, 0, 0.0, summary["eval/accuracy_before"])]
    for r in rows:
        train_s += r.get("perf/step_s", 0.0)
        if "eval/accuracy" in r and r["step"] > 0:  # step 0 (the row some versions write first) is curve[0]
            curve.append((r["step"], r["step"] * args.prompts * args.group, train_s, r["eval/accuracy"]))
    return {"curve": curve, "wall_s": time.time() - t, "lr": _saved_lr(run_dir)}


def _saved_lr(run_dir: Path) -> float:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())["optim"]["lr"]


def figures(curve) -> dict:
    """gain, gain per 1k completions and per minute of training, largest drop between consecutive evaluations."""
    (_, _, _, before), (_, completions, seconds, after) = curve[0], curve[-1]
    gain = after - before
    drops = [a[3] - b[3] for a, b in zip(curve, curve[1:])]
    return {"before": before, "after": after, "best": max(c[3] for c in curve), "gain": gain,
            "per_1k": 1000 * gain / max(completions, 1), "per_min": 60 * gain / max(seconds, 1e-9),
            "max_drop": max([0.0, *drops]), "completions": completions, "train_s": seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="0.9M model, 300 warm-up steps, 1 seed, 30 steps")
    p.add_argument("--configs", nargs="+", default=["default:grpo:", "dapo:dapo:", "dr_grpo:dr_grpo:"])
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--steps", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--warm-steps", type=int)
    p.add_argument("--work", type=Path, default=Path("/tmp/grpo-bench-learning"))
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    size = "small" if args.small else "default"
    args.seeds = args.seeds or ([0] if args.small else [0, 1, 2])
    args.steps = args.steps or (30 if args.small else 300)
    args.eval_every = args.eval_every or (10 if args.small else 25)
    warm = args.warm_steps or (300 if args.small else 1500)
    work = args.work / f"{size}-w{warm}"
    work.mkdir(parents=True, exist_ok=True)
    model = build_checkpoint(work / "model", size, warm, train_size=20000)
    train_file, test_file = write_data(work, 20000, args.eval_n)
    results = []
    for spec in args.configs:
        name, preset, extra = (spec.split(":", 2) + ["", ""])[:3]
        for seed in args.seeds:
            run_dir = work / "runs" / f"{name}-s{seed}-{int(time.time())}"
            res = train(model, train_file, test_file, run_dir, preset, [o for o in extra.split(",") if o], seed, args)
            row = {"config": name, "preset": preset, "overrides": extra, "seed": seed, "lr": res["lr"],
                   **figures(res["curve"]), "curve": res["curve"], "wall_s": res["wall_s"]}
            results.append(row)
            print(f"[bench] {name} seed {seed}: lr {row['lr']:g}, {row['before']:.3f} -> {row['after']:.3f} "
                  f"(best {row['best']:.3f}), {row['per_1k']:+.4f}/1k completions, {row['per_min']:+.3f}/min, "
                  f"max drop {row['max_drop']:.3f}", file=sys.stderr)
    print(table(results))
    out = args.output or (ROOT / "bench" / "learning" / "results" / f"{size}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"size": size, "warm_steps": warm, "args": {k: str(v) for k, v in vars(args).items()},
                               "results": results}, indent=1))
    return 0


def table(results) -> str:
    lines = ["| config | lr | seeds | before | after | gain | per 1k completions | per minute | max drop |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["config"] for r in results):
        rows = [r for r in results if r["config"] == name]

        def m(key):
            vals = [r[key] for r in rows]
            return f"{statistics.mean(vals):+.3f}" + (f" ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else "")

        lines.append(f"| {name} | {rows[0]['lr']:g} | {len(rows)} | {m('before')} | {m('after')} | {m('gain')} | "
                     f"{m('per_1k')} | {m('per_min')} | {max(r['max_drop'] for r in rows):.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
