"""Learning efficiency with a user's model: held-out accuracy against training time and against completions.

Builds a warm checkpoint bigger than the built-in model (the built-in warm-up code, a BOS-adding character
tokenizer), saves it, writes its task (the built-in arithmetic problems) as JSONL files, then trains it through
`grpo train model.name=... data.path=...` in a subprocess, exactly as a user would, for each configuration and seed,
beside examples/grpo_minimal.py on the same checkpoint and files.

    python bench/learning/run.py --lr 1e-4 --steps 60      # 3.4M-parameter model, seeds 0 1 2, default / dapo /
                                                           # dr_grpo / grpo_minimal.py: about 40 minutes on 1 core
    python bench/learning/run.py --small                   # 0.9M model, 1 seed, 30 steps
    python bench/learning/run.py --configs default:grpo: lr5e-5:grpo:optim.lr=5e-5 --seeds 0 1 2

A configuration is NAME:PRESET:OVERRIDES (overrides comma-separated, may be empty; the preset `minimal` runs the
example). Everything not given is the library's default for a model directory (grpo.train.defaults: optim.lr 1e-6
for full fine-tuning); --lr sets one learning rate for every configuration, the example's included. Seeds are the
outer loop, so the configurations of one seed run back to back and see the same machine load. Each run has one
torch thread (--threads). Writes --output, else <GRPO_CACHE>/bench-results/learning/<size>.json, after every run
(the committed bench/learning/results/*.json, which the docs quote, are rewritten only with --output naming one;
bench/learning/README.md gives their commands), and a table:

    gain            final held-out accuracy minus the accuracy before training
    per_1k          gain per 1,000 completions sampled (steps x P x G; dapo's extra resampling rounds are not
                    counted, so its figure is an upper bound)
    per_min         gain per minute of training steps, wall time (the sum of perf/step_s, evaluation excluded)
    per_cpu_min     the same per minute of the process's CPU time in training steps (perf/step_cpu_s, added by
                    timed_cli.py; grpo_minimal.py measures its own): hardly moved by other processes' load
    max_drop        the largest drop between consecutive evaluations (stability)

Each library run's checkpoints/best is loaded back with `from_pretrained` and evaluated with `generate`; the
result records both accuracies (they should agree).
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
COMMITTED_DIR = "bench/learning/results"  # what the docs quote: written only with --output naming a file there

SIZES = {
    "small": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=128),
    "medium": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
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


class _Warm(Exception):
    """Raised from the warm-up's step callback once the held-out accuracy reached the target."""


def greedy_accuracy(model, tok, problems, max_new_tokens: int = 24) -> float:
    """Greedy pass@1 of `problems` ((text, answer) pairs) with `generate`, prompts tokenized as `tokenizer(text)`
    does: an evaluation independent of the library's sampler."""
    import torch

    from grpo.data.arithmetic import last_integer

    model.eval()
    with torch.no_grad():
        enc = tok([text for text, _ in problems], return_tensors="pt", padding=True)
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
    model.train()
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    return sum(last_integer(t) == int(answer) for t, (_, answer) in zip(texts, problems)) / len(problems)


def check_best(run_dir: Path, test_file: Path, args) -> dict | None:
    """Load run_dir/checkpoints/best as a user would (`from_pretrained`) and evaluate it with `generate`: its
    accuracy should be the one its best.json records. None when the run has no best (no step beat the start)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    best = run_dir / "checkpoints" / "best"
    if not (best / "best.json").exists():
        return None
    recorded = json.loads((best / "best.json").read_text())
    tok = AutoTokenizer.from_pretrained(best, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(best, dtype=torch.float32)
    rows = [json.loads(x) for x in test_file.read_text().splitlines() if x.strip()][:args.eval_n]
    acc = greedy_accuracy(model, tok, [(r["prompt"], r["answer"]) for r in rows], args.max_new_tokens)
    return {"step": recorded["step"], "recorded": recorded["eval/accuracy"], "reloaded": acc}


def build_checkpoint(out: Path, size: str, warm_steps: int, train_size: int, seed: int = 0, *, lr: float = 1e-3,
                     batch_size: int = 32, until: float = 1.0, check_every: int = 50,
                     worked_frac: float = 0.8, probe: list[tuple[str, str]] | None = None) -> Path:
    """Warm a fresh model on the arithmetic task's train split (grpo.warmup) and save it; kept if present.
    The warm-up stops early, after a multiple of `check_every` steps, once the greedy accuracy on the validation
    problems `probe` ((prompt, answer) pairs, never the test problems) reaches `until` (a checkpoint with room to
    improve, as a user's starting point is). `worked_frac`: the
    share of demonstrations in the worked style ("47 + 38 = 70 + 15 = 85"), the rest direct ("Let me think... 85");
    the worked style is the easier one to get right, so a higher share reaches a given accuracy sooner."""
    import torch

    from grpo.data.arithmetic import ArithmeticTask
    from grpo.models.builtin import build_model
    from grpo.warmup import warm_up

    if (out / "config.json").exists():
        return out
    tok = bos_tokenizer()
    model = build_model(tok, seed=seed, size=SIZES[size])
    model.config.bos_token_id = tok.bos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    n = sum(p.numel() for p in model.parameters())
    print(f"[bench] warming a {n / 1e6:.2f}M-parameter model for at most {warm_steps} steps (lr {lr:g}, batch "
          f"{batch_size}, worked_frac {worked_frac}), until validation accuracy >= {until}", file=sys.stderr)
    task = ArithmeticTask(worked_frac=worked_frac)
    if probe is None:  # the held-out pool's problems 500-554: after any eval.n <= 500 test problems
        probe = [(p.text, p.answer) for p in task.split("test", 555)[500:]]
    t, c, log = time.time(), time.process_time(), []

    def check(step: int, loss: float) -> None:
        if step % check_every and step != warm_steps:
            return
        acc = greedy_accuracy(model, tok, probe)
        log.append({"step": step, "loss": loss, "accuracy": acc, "wall_s": time.time() - t,
                    "cpu_s": time.process_time() - c})
        print(f"[bench] warm-up step {step}: loss {loss:.3f}, validation accuracy {acc:.3f}, "
              f"{time.time() - t:.0f} s wall, {time.process_time() - c:.0f} s CPU", file=sys.stderr)
        if acc >= until:
            raise _Warm

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        try:
            warm_up(model, tok, task, steps=warm_steps, batch_size=batch_size, lr=lr, seed=seed,
                    train_size=train_size, on_step=check)
        except _Warm:
            pass
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "warmup_log.json").write_text(json.dumps({"parameters": n, "lr": lr, "batch_size": batch_size,
                                                    "until": until, "worked_frac": worked_frac, "log": log}, indent=1))
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


def _child_env(args) -> dict:
    threads = str(args.threads)
    return dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)


def _run(cmd: list[str], args, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float, float]:
    """(the finished process, its wall seconds, its CPU seconds: user + system, all threads and children)."""
    import resource

    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    proc = subprocess.run(cmd, env=_child_env(args) | (env or {}), capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc, time.time() - t, cpu


def train(model: Path, train_file: Path, test_file: Path, run_dir: Path, preset: str, overrides: list[str],
          seed: int, args) -> dict:
    """One `grpo train` subprocess; returns its curve from metrics.jsonl and summary.json.
    A curve point is (step, completions, training wall seconds, training CPU seconds, held-out accuracy);
    training time is the sum over steps, evaluation excluded."""
    env = {"GRPO_BENCH_NO_BOS": "1"} if "bench.no_bos=true" in overrides else {}  # the ablation (timed_cli.py)
    overrides = [o for o in overrides if o != "bench.no_bos=true"]
    lr = [f"optim.lr={args.lr:g}"] if args.lr and not any(o.startswith("optim.lr=") for o in overrides) else []
    cmd = [sys.executable, str(Path(__file__).with_name("timed_cli.py")), "train", preset, f"model.name={model}",
           f"data.path={train_file}", f"data.test_path={test_file}", "reward.functions=[exact_answer]",
           f"train.seed={seed}", f"train.steps={args.steps}", f"train.eval_every={args.eval_every}",
           f"eval.n={args.eval_n}", f"eval.val_n={args.val_n}", f"eval.test_every={args.eval_every}",
           f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
           f"rollout.max_new_tokens={args.max_new_tokens}", "log.plots=false", "log.sample_groups=0",
           f"train.output_dir={run_dir}", *lr, *overrides, "--quiet", "--json"]
    proc, wall, cpu = _run(cmd, args, env)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"curve": library_curve(run_dir, summary["eval/accuracy_before"], args), "wall_s": wall, "cpu_s": cpu,
            "lr": _saved_lr(run_dir),
            "best_checkpoint": check_best(run_dir, test_file, args), "command": " ".join(map(str, cmd))}


def library_curve(run_dir: Path, before: float, args) -> list[tuple]:
    """(step, completions sampled, training wall s, training CPU s, held-out accuracy) at each evaluation of a
    library run, from its metrics.jsonl. Completions count every generation round (bench/sampled_completions,
    from timed_cli.py: dapo resamples); rows without it count steps x P x G."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train_s = train_cpu_s = completions = 0.0
    curve = [(0, 0, 0.0, 0.0, before)]
    for r in rows:
        if r["step"] == 0:  # the evaluation before training: curve[0]
            continue
        train_s += r.get("perf/step_s", 0.0)
        train_cpu_s += r.get("perf/step_cpu_s", 0.0)
        if "perf/step_s" in r:
            completions += r.get("bench/sampled_completions", args.prompts * args.group)
        if "eval/accuracy" in r:
            curve.append((r["step"], int(completions), train_s, train_cpu_s, r["eval/accuracy"]))
    return curve


def rescan(path: Path) -> None:
    """Rebuild the library rows' curves and figures of a results JSON from their run directories (e.g. after
    timed_cli.py began to count dapo's resampled completions)."""
    data = json.loads(path.read_text())
    ns = argparse.Namespace(**{k: int(data["args"][k]) for k in ("prompts", "group")})
    for row in data["results"]:
        if row["preset"] == "minimal":
            continue
        run_dir = Path(row["command"].split("train.output_dir=", 1)[1].split()[0])
        row["curve"] = library_curve(run_dir, row["curve"][0][-1], ns)
        row.update(figures(row["curve"]))
    path.write_text(json.dumps(data, indent=1))


def train_minimal(model: Path, train_file: Path, test_file: Path, run_dir: Path, overrides: list[str], seed: int,
                  args) -> dict:
    """examples/grpo_minimal.py on the same checkpoint, files, P, G, max_new_tokens, steps and evaluations.
    Its learning rate: --lr, else the library's default for full fine-tuning of a user model (equal settings)."""
    from grpo.train.defaults import USER_MODEL_DEFAULTS

    lr = args.lr or next(d.full for d in USER_MODEL_DEFAULTS if d.key == "optim.lr")
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "examples" / "grpo_minimal.py"), "--model", str(model), "--train",
           str(train_file), "--test", str(test_file), "--eval-n", str(args.eval_n), "--eval-every",
           str(args.eval_every), "--steps", str(args.steps), "--prompts", str(args.prompts), "--group",
           str(args.group), "--max-new-tokens", str(args.max_new_tokens), "--seed", str(seed), "--lr", f"{lr:g}",
           "--log", str(run_dir / "curve.jsonl")]
    for o in overrides:  # lr=5e-5 -> --lr 5e-5 (given last, so it wins over the one above)
        key, _, value = o.partition("=")
        cmd += [f"--{key.replace('_', '-')}", value]
    _, wall, cpu = _run(cmd, args)
    rows = [json.loads(x) for x in (run_dir / "curve.jsonl").read_text().splitlines() if x.strip()]
    curve = [(r["step"], r["completions"], r["train_s"], r["train_cpu_s"], r["accuracy"]) for r in rows]
    lr_used = next((float(o.split("=", 1)[1]) for o in overrides if o.startswith("lr=")), lr)
    return {"curve": curve, "wall_s": wall, "cpu_s": cpu, "lr": lr_used, "best_checkpoint": None,
            "command": " ".join(map(str, cmd))}


def _saved_lr(run_dir: Path) -> float:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())["optim"]["lr"]


def figures(curve) -> dict:
    """gain, gain per 1k completions, per minute of training (wall and CPU), the largest drop between consecutive
    evaluations. curve: (step, completions, train wall s, train CPU s, accuracy) rows, the first at step 0."""
    (*_, before), (_, completions, seconds, cpu_seconds, after) = curve[0], curve[-1]
    gain = after - before
    drops = [a[-1] - b[-1] for a, b in zip(curve, curve[1:])]
    return {"before": before, "after": after, "best": max(c[-1] for c in curve), "gain": gain,
            "per_1k": 1000 * gain / max(completions, 1), "per_min": 60 * gain / max(seconds, 1e-9),
            "per_cpu_min": 60 * gain / max(cpu_seconds, 1e-9), "max_drop": max([0.0, *drops]),
            "completions": completions, "train_s": seconds, "train_cpu_s": cpu_seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="medium", help="medium: 3.4M parameters (4 layers)")
    p.add_argument("--small", action="store_true", help="shorthand: --size small, 1 seed, 30 steps")
    p.add_argument("--configs", nargs="+",
                   default=["default:grpo:", "dapo:dapo:", "dr_grpo:dr_grpo:", "minimal:minimal:"],
                   help="NAME:PRESET:OVERRIDES; the preset 'minimal' runs examples/grpo_minimal.py (overrides "
                        "are its options without dashes, e.g. lr=5e-5); the override bench.no_bos=true feeds "
                        "prompts without BOS (the ablation in timed_cli.py)")
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--steps", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--val-n", type=int, default=50,
                   help="validation problems after the test problems of the held-out pool (555 in all): the library's "
                        "choice of checkpoints/best and the warm-up's stop; never the test problems")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--lr", type=float, help="optim.lr of every configuration that does not set its own "
                                            "(default: the library's default for a user model, 1e-6)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each run (OMP_NUM_THREADS)")
    p.add_argument("--warm-steps", type=int, help="at most this many warm-up steps (default 500)")
    p.add_argument("--warm-lr", type=float, default=1e-3)
    p.add_argument("--warm-batch", type=int, default=32)
    p.add_argument("--warm-worked-frac", type=float, default=0.8,
                   help="share of worked-style demonstrations in the warm-up (the task's own default is 0.35)")
    p.add_argument("--warm-until", type=float, default=0.2,
                   help="stop the warm-up once greedy accuracy on the validation problems reaches this (checked "
                        "every 50 steps)")
    p.add_argument("--work", type=Path, default=Path("/tmp/grpo-bench-learning"))
    p.add_argument("--output", type=Path)
    p.add_argument("--rescan", type=Path, help="rebuild a results JSON's library curves from its run directories")
    p.add_argument("--report", type=Path, nargs="+", help="print the tables of results JSONs written earlier (several: "
                                                          "their runs together, e.g. seeds run in parallel), and exit")
    p.add_argument("--merge", type=Path, help="with --report: also write the runs together to this results JSON")
    args = p.parse_args(argv)
    if args.rescan:
        rescan(args.rescan)
    if args.report or args.rescan:
        docs = [json.loads(f.read_text()) for f in (args.report or [args.rescan])]
        results = [r for d in docs for r in d["results"]]
        if args.merge:
            args.merge.write_text(json.dumps({**docs[0], "merged_from": [str(f) for f in args.report],
                                              "results": results}, indent=1))
        print(table(results) + "\n\n" + curve_table(results))
        return 0
    size = "small" if args.small else args.size
    args.seeds = args.seeds or ([0] if args.small else [0, 1, 2])
    args.steps = args.steps or (30 if args.small else 60)
    args.eval_every = args.eval_every or 10
    warm = args.warm_steps or 500
    work = args.work / (f"{size}-w{warm}-lr{args.warm_lr:g}-b{args.warm_batch}-wf{args.warm_worked_frac:g}"
                        f"-until{args.warm_until:g}")
    work.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(args.threads)
    train_file, test_file = write_data(work, 20000, args.eval_n + args.val_n)  # test rows, then validation rows
    val = [json.loads(x) for x in test_file.read_text().splitlines()][args.eval_n:]
    model = build_checkpoint(work / "model", size, warm, train_size=20000, lr=args.warm_lr, until=args.warm_until,
                             batch_size=args.warm_batch, worked_frac=args.warm_worked_frac,
                             probe=[(r["prompt"], r["answer"]) for r in val])
    results = []
    from grpo.bench.results import results_path

    out = results_path(f"learning/{size}.json", args.output)
    for seed in args.seeds:  # interleaved: every configuration of a seed before the next seed, so all see one load
        for spec in args.configs:
            name, preset, extra = (spec.split(":", 2) + ["", ""])[:3]
            overrides = [o for o in extra.split(",") if o]
            run_dir = work / "runs" / f"{name}-s{seed}-{int(time.time())}"
            if preset == "minimal":
                res = train_minimal(model, train_file, test_file, run_dir, overrides, seed, args)
            else:
                res = train(model, train_file, test_file, run_dir, preset, overrides, seed, args)
            row = {"config": name, "preset": preset, "overrides": extra, "seed": seed, **figures(res["curve"]),
                   **res}
            results.append(row)
            if row["best_checkpoint"]:
                b = row["best_checkpoint"]
                print(f"[bench] checkpoints/best (step {b['step']}) reloaded with from_pretrained: accuracy "
                      f"{b['reloaded']:.3f}, recorded {b['recorded']:.3f}", file=sys.stderr)
            print(f"[bench] {name} seed {seed}: lr {row['lr']:g}, {row['before']:.3f} -> {row['after']:.3f} "
                  f"(best {row['best']:.3f}), {row['per_1k']:+.4f}/1k completions, {row['per_min']:+.3f}/min, "
                  f"{row['per_cpu_min']:+.3f}/CPU min, max drop {row['max_drop']:.3f}, {row['wall_s']:.0f} s wall, "
                  f"{row['cpu_s']:.0f} s CPU", file=sys.stderr)
            _write(out, size, warm, work, args, results)  # after every run: a partial result survives a stop
    print(table(results) + "\n\n" + curve_table(results))
    print(f"wrote {out}" + ("" if COMMITTED_DIR in out.resolve().as_posix() else
                            f" (the committed results the docs quote are {COMMITTED_DIR}/*.json, each rewritten only "
                            "with --output naming it: bench/learning/README.md)"))
    return 0


def _write(out: Path, size: str, warm: int, work: Path, args, results) -> None:
    warm_log = work / "model" / "warmup_log.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"size": size, "warm_steps": warm,
                               "warm_up": json.loads(warm_log.read_text()) if warm_log.exists() else None,
                               "args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1))


def table(results) -> str:
    lines = ["| config | lr | seeds | before | after | gain | per 1k completions | per train minute | "
             "per train CPU minute | max drop |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["config"] for r in results):
        rows = [r for r in results if r["config"] == name]

        def m(key, fmt="+.3f"):
            vals = [r[key] for r in rows]
            digits = fmt.lstrip("+")  # the spread with the mean's precision
            return f"{statistics.mean(vals):{fmt}}" + (f" ± {statistics.stdev(vals):{digits}}" if len(vals) > 1 else "")

        lines.append(f"| {name} | {rows[0]['lr']:g} | {len(rows)} | {m('before', '.3f')} | {m('after', '.3f')} | "
                     f"{m('gain')} | {m('per_1k', '+.4f')} | {m('per_min')} | {m('per_cpu_min')} | "
                     f"{max(r['max_drop'] for r in rows):.3f} |")
    return "\n".join(lines)


def curve_table(results) -> str:
    """Held-out accuracy (mean ± sample std over seeds) at each evaluation, one pair of columns per configuration:
    the accuracy, and the completions sampled so far with the training time to reach them (wall / CPU seconds,
    means over seeds)."""
    names = list(dict.fromkeys(r["config"] for r in results))
    head = "| step | " + " | ".join(f"{n}: accuracy | {n}: completions, train s wall / CPU" for n in names) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(names))]
    for step in sorted({c[0] for r in results for c in r["curve"]}):
        cells = []
        for name in names:
            pts = [c for r in results if r["config"] == name for c in r["curve"] if c[0] == step]
            if not pts:
                cells += ["", ""]
                continue
            acc = [c[-1] for c in pts]
            spread = f" ± {statistics.stdev(acc):.3f}" if len(acc) > 1 else ""
            cells += [f"{statistics.mean(acc):.3f}{spread}",
                      f"{statistics.mean(c[1] for c in pts):.0f}, {statistics.mean(c[2] for c in pts):.0f} / "
                      f"{statistics.mean(c[3] for c in pts):.0f}"]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
