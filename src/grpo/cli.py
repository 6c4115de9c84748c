"""The `grpo` command line: train, eval, warmup, import-gguf, compare, bench, report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

EPILOG = """examples:
  grpo train                                   the built-in default: arithmetic task, built-in model, offline
  grpo train deepseekmath train.steps=100      a preset plus dotted overrides
  grpo train my.yaml --output-dir runs/x       a YAML file (may say `extends: dapo`)
  grpo train runs/x/config.yaml --output-dir runs/x --resume
  grpo eval runs/x/final --json
  grpo warmup --task code --output /tmp/warm   rebuild a built-in warm model (the shipped ones need no warm-up)
"""

OWN_DATA = """your own model and data:
  grpo import-gguf model.gguf models/mine      a GGUF file as a model directory (or model.name=model.gguf)
  grpo train model.name=models/mine data.path=qa.jsonl data.prompt_column=question data.answer_column=solution \\
      reward.functions=[exact_answer]          a JSONL file whose rows have a `question` and a `solution`
  grpo train model.name=models/mine data.path=qa.jsonl reward.functions=[my_rewards.py:accuracy]
                                               a reward function of your own: FILE.py:FUNCTION, TRL's signature
                                               fn(prompts, completions, **columns) -> list[float | None]
"""


def _presets_line() -> str:
    """'grpo (default), cispo, code, ...': every packaged preset (grpo/presets/*.yaml), for the help texts."""
    from grpo.config.load import list_presets

    return ", ".join(["grpo (default)"] + [p for p in list_presets() if p != "grpo"])


def _train(args) -> int:
    from grpo.config import ConfigError, list_presets, load_config, preset_summary

    if args.list_keys:
        from grpo.config import describe_keys

        for key, kind, default, text in describe_keys():
            print(f"{key:<32} {default:<16} {kind}" + (f"\n{'':<33}{text}" if text else ""))
        return 0
    if args.list_presets:
        import textwrap

        for name in list_presets():
            print(name)
            print(textwrap.fill(preset_summary(name), 100, initial_indent="    ", subsequent_indent="    "))
        return 0
    overrides = list(args.overrides)
    source = args.preset
    if source is not None and "=" in source:  # `grpo train algo.std=sample` without a preset
        overrides.insert(0, source)
        source = None
    cfg = load_config(source, overrides)
    if args.output_dir is not None:
        cfg.train.output_dir = args.output_dir
    if cfg.train.output_dir is not None and not str(cfg.train.output_dir).strip():
        raise ConfigError("train.output_dir (--output-dir) is empty: pass the run directory, e.g. runs/my-run")
    if args.resume and cfg.train.output_dir is None:
        raise ConfigError("--resume continues the run in --output-dir (or train.output_dir): pass that directory")
    if not args.preflight and cfg.train.output_dir is not None:  # before any model loads: never over another run
        from grpo.tracking.rundir import check_output_dir
        from grpo.train.checkpoint.resume import claim_run_dir

        claim_run_dir(check_output_dir(cfg.train.output_dir), args.resume, args.overwrite)
    if args.quiet:
        cfg.log.progress = False
    from grpo.train.trainer import Trainer

    from rich.console import Console

    try:
        trainer = Trainer(cfg, console=None if args.quiet else Console(highlight=False, markup=False))
    except KeyboardInterrupt:  # Ctrl-C while the data and the model load: no run has started, nothing is saved
        raise InterruptedBeforeTraining from None
    if args.preflight:  # the check alone: exit 3 (EXIT_HEALTH) when the run cannot learn
        from grpo.tracking.progress import Phase
        from grpo.train.preflight import preflight_batches, run_preflight

        try:
            with Phase("preflight", preflight_batches(trainer), "batches (at most)", console=trainer.console) as ph:
                report = run_preflight(trainer, progress=ph.update)
        finally:
            trainer.close()
        print("\n".join(report.lines()))
        if args.json:
            print(json.dumps({"stats": report.stats, "verdicts": [v.__dict__ for v in report.verdicts]}))
        from grpo.errors import EXIT_HEALTH, EXIT_OK

        return EXIT_HEALTH if report.fatal else EXIT_OK
    try:
        summary = trainer.train(resume=args.resume, overwrite=args.overwrite)
    finally:
        trainer.close()
    if args.json:
        print(json.dumps(summary))
    return 0


def _eval(args) -> int:
    from grpo.config import ConfigError, load_config
    from grpo.data import task_from_config
    from grpo.models.loading import load_causal_lm, load_tokenizer, resolve_device
    from grpo.train.episodes import env_limits
    from grpo.train.evaluate import evaluate_problems, test_problems

    from grpo.models.checks import check_model_dir

    from grpo.tracking.console import SMALL_N, standard_error
    from grpo.tracking.rundir import check_output_file, write_text_atomic

    path = check_model_dir(args.model_dir, field="model_dir")  # missing, no config, weights cut short, no tokenizer
    if args.output is not None:
        check_output_file(args.output, "--output")  # before the evaluation: a wrong path must not cost its results
    if args.n is not None and args.n < 1:
        raise ConfigError(f"--n must be at least 1 (the number of held-out problems), got {args.n}")
    if args.k is not None and not 1 <= args.k <= (args.samples or args.k):
        raise ConfigError(f"--k must be between 1 and the number of samples per problem ({args.samples}), got {args.k}")
    run_cfg = next((d / "config.yaml" for d in (path.parent, path.parent.parent) if (d / "config.yaml").exists()),
                   path.parent / "config.yaml")  # RUN/final or RUN/checkpoints/best: the run's config
    if args.data is not None:  # a data set file; its correctness is the first reward's maximum (default exact_answer)
        args.overrides = [f"data.path={args.data}", *args.overrides]
        if not any(o.startswith("reward.functions=") for o in args.overrides):
            args.overrides.append("reward.functions=[exact_answer]")
    cfg = load_config(run_cfg if run_cfg.exists() else None, args.overrides)
    if not run_cfg.exists():  # a bare model directory: a user model's defaults (eval.batch_size), as in training
        from grpo.train.defaults import model_defaults

        cfg.model.name = str(path)
        cfg, _ = model_defaults(cfg)
    model = load_causal_lm(path).to(resolve_device("auto"))  # a damaged directory: ModelDirError, exit 2
    from grpo.models.compute import resolve_compute  # as a run of this config evaluates: bf16 where it is native

    compute = resolve_compute(cfg, next(model.parameters()).device, next(model.parameters()).dtype)
    tokenizer = load_tokenizer(path)
    if args.task is not None:  # a built-in task instead of the run's own (its data set file, if it had one)
        cfg.data.task, cfg.data.path = args.task, None
    if args.difficulty is not None:
        cfg.data.difficulty = args.difficulty
    task = task_from_config(cfg, tokenizer=tokenizer)
    n = args.n if args.n is not None else cfg.eval.n
    temperature = cfg.rollout.temperature if args.temperature is None else args.temperature
    problems = test_problems(task, n, cfg.eval.val_n)
    from rich.console import Console

    from grpo.tracking.progress import Phase

    with Phase("evaluating", len(problems), "problems", console=Console(stderr=True, highlight=False)) as ph:
        res, rows = evaluate_problems(model, tokenizer, task, problems, batch_size=cfg.eval.batch_size,
                                      max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                                      max_prompt_tokens=cfg.data.max_prompt_tokens, k=args.k, samples=args.samples,
                                      temperature=temperature, top_p=cfg.rollout.top_p, seed=cfg.train.seed,
                                      progress=ph.update, compute=compute, stop=tuple(cfg.rollout.stop),
                                      **env_limits(cfg))  # progress on stderr: --json stays clean
    unjudged = task.unjudged() if hasattr(task, "unjudged") else None  # a data file's reward judged nothing
    if unjudged is not None:
        from grpo.train.guards import RewardsMissing

        raise RewardsMissing(unjudged)  # exit 3, as the preflight and training on a reward that never gives a value
    out = {**res, "task": task.name, "model": str(path)} | ({"data": cfg.data.path} if cfg.data.path else {})
    if args.output:  # one JSON line per problem, written whole or not at all (its path was checked before the work)
        write_text_atomic(args.output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        out["output"] = args.output
    passes = "".join(f", {k} {v:.4f}" for k, v in res.items() if k.startswith("pass@"))
    se = (f" ± {standard_error(res['accuracy'], res['n']):.4f} (one standard error)" if res["n"] < SMALL_N else "")
    print(json.dumps(out) if args.json else f"accuracy {res['accuracy']:.4f}{se} (greedy){passes} on {res['n']} "
                                            "held-out problems")
    return 0


def _import_gguf(args) -> int:
    """`grpo import-gguf FILE DIR`: a GGUF file as a model directory (grpo.models.gguf)."""
    from grpo.models.gguf import import_gguf

    out = import_gguf(args.gguf, args.out_dir)
    print(f"[grpo] wrote {out}: use it as model.name={out}")
    return 0


def _warmup(args) -> int:
    """`grpo warmup`: build the built-in model (grpo.warmup), measure it on held-out problems, write its recipe."""
    from rich.console import Console

    from grpo.config import ConfigError, load_config
    from grpo.models.builtin import sha256_file, shipped_model_dir
    from grpo.train.evaluate import heldout_accuracy
    from grpo.warmup.recipe import build_with_recipe

    preset = args.preset or (args.task if args.task in ("code", "tools") else "grpo")
    overrides = list(args.overrides) + ([f"data.task={args.task}"] if args.task else [])
    cfg = load_config(preset, overrides)
    console = Console(highlight=False, markup=False)
    out = Path(args.output or f"warm-{cfg.data.task}")
    if out.exists() and not out.is_dir():  # before the warm-up's minutes
        raise ConfigError(f"--output={str(out)!r} is a file; pass a directory for the warm model "
                          "(created when missing)")
    recipe = build_with_recipe(cfg, out, console=console, heldout=None if args.no_eval else heldout_accuracy)
    console.print(f"[grpo] wrote {out} (sha256 {recipe['sha256'][:16]}..., warm-up "
                  f"{recipe['built_on']['warmup_s']:.0f} s on {recipe['built_on']['cpu']})", soft_wrap=True)
    if "heldout" in recipe:
        h = recipe["heldout"]
        from grpo.tracking.console import accuracy_text  # ± one standard error on fewer than 100 problems

        console.print(f"[grpo] held-out accuracy {accuracy_text(h['accuracy'], h['n'])} on {h['n']} problems "
                      f"({h['metric']})")
    shipped = shipped_model_dir(recipe["spec"])
    if shipped is not None and shipped.resolve() != out.resolve():
        weights = shipped / "model.safetensors"
        same = weights.exists() and sha256_file(weights) == recipe["sha256"]
        console.print(f"[grpo] the shipped model of these settings ({shipped}) is "
                      + ("bitwise the same" if same else "different: the warm-up's float kernels differ across CPUs; "
                         "`grpo train` uses the shipped one"), soft_wrap=True)
    return 0


def _compare(args) -> int:
    from grpo.compare import main as compare_main

    return compare_main(args)


def _bench(args) -> int:
    from grpo.bench import main as bench_main

    return bench_main(args)


def _report(args) -> int:
    from grpo.tracking.report import write_report

    print(write_report(Path(args.run_dir)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    presets = _presets_line()
    parser = argparse.ArgumentParser(prog="grpo", description="GRPO (and PPO) for causal language models.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"{EPILOG}\npresets (grpo train PRESET; grpo train --list-presets says "
                                            f"what each changes):\n  {presets}\n")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help=f"train with GRPO, or a preset: {presets}",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=f"{EPILOG}\n{OWN_DATA}")
    t.add_argument("preset", nargs="?", help=f"preset name or config.yaml; presets: {presets}")
    t.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. rollout.group_size=16")
    t.add_argument("--output-dir", help="run directory (default runs/<preset>-<time>)")
    t.add_argument("--resume", action="store_true", help="continue from the newest committed checkpoint in "
                   "--output-dir (exit 2 when there is none: never a new run in its place)")
    t.add_argument("--overwrite", action="store_true", help="a non-empty --output-dir: move its contents aside to "
                   "<dir>.old-<time> first (nothing is deleted); without it a new run refuses a non-empty directory")
    t.add_argument("--json", action="store_true", help="print summary.json's content at the end")
    t.add_argument("--quiet", action="store_true", help="no progress output")
    t.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    t.add_argument("--list-keys", action="store_true", help="list every config key with its default and meaning")
    t.add_argument("--preflight", action="store_true", help="only sample a few groups with the starting model and "
                   "say whether the run can learn (truncation, zero-spread groups, rewards); exit 3 if not")
    t.set_defaults(func=_train)
    e = sub.add_parser("eval", help="held-out greedy accuracy (and pass@k) of a local model directory")
    e.add_argument("model_dir")
    e.add_argument("--task", help="built-in task name (default: the run's task or data set file, else arithmetic)")
    e.add_argument("--difficulty", help="task difficulty (default: the run's)")
    e.add_argument("--n", type=int, help="number of held-out problems (default: the run's eval.n)")
    e.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. rollout.max_new_tokens=64")
    e.add_argument("--data", help="a data set file (JSONL/Parquet/CSV) instead of a built-in task; correct = the first "
                   "of reward.functions gives its maximum (default reward.functions=[exact_answer])")
    e.add_argument("--k", type=int, help="also pass@k (and pass@1, pass@2, ... up to k) from sampled completions, "
                   "with the Codex paper's unbiased estimator")
    e.add_argument("--samples", type=int, help="completions sampled per problem for pass@k (default: k)")
    e.add_argument("--temperature", type=float, help="sampling temperature for pass@k (default rollout.temperature)")
    e.add_argument("--output", help="write one JSON line per problem (completions and verdicts) to this file")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_eval)
    w = sub.add_parser("warmup", help="build the built-in model with the supervised warm-up, measure it, write its "
                       "recipe (the default ones ship with grpo)")
    w.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, e.g. warmup.seed=1")
    w.add_argument("--task", choices=["arithmetic", "code", "tools"], help="built-in task (default arithmetic)")
    w.add_argument("--preset", help="preset whose settings apply (default: grpo, or code for --task code)")
    w.add_argument("--output", help="directory to write (default ./warm-<task>)")
    w.add_argument("--no-eval", action="store_true", help="skip the held-out accuracy in the recipe")
    w.set_defaults(func=_warmup)
    g = sub.add_parser("import-gguf", help="a GGUF file (llama.cpp) as a model directory, dequantized to float32")
    g.add_argument("gguf", help="the .gguf file")
    g.add_argument("out_dir", help="the model directory to write (new or empty)")
    g.set_defaults(func=_import_gguf)
    c = sub.add_parser("compare", help="PPO vs GRPO on the same work, measured")
    c.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="dotted config overrides applied to every run, e.g. rollout.group_size=16")
    c.add_argument("--steps", type=int, default=60)
    c.add_argument("--seeds", type=int, default=1)
    c.add_argument("--output-dir", default=None)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_compare)
    b = sub.add_parser("bench", help="performance figures and their ratios to the naive floor")
    b.add_argument("--json", action="store_true")
    b.add_argument("--quick", action="store_true", help="tiny shapes, one repeat (a smoke run)")
    b.add_argument("--output", default=None, help="where to write the JSON (default bench-results/latest.json in "
                   "$GRPO_CACHE or ~/.cache/grpo, or versus_trl.json, learning_vs_trl.json, async_rollouts.json, "
                   "memory.json there; "
                   "the committed bench/results/*.json the docs quote are rewritten only when --output names one)")
    b.add_argument("--versus-trl", action="store_true", help="seconds per step against TRL's GRPOTrainer on the same "
                   "model and batch (needs trl; grpo/bench/versus_trl.py)")
    b.add_argument("--learn", action="store_true", help="with --versus-trl: held-out accuracy gained per CPU-minute "
                   "instead of seconds per step (grpo/bench/learning_vs_trl.py)")
    b.add_argument("--async-rollouts", action="store_true", help="rollout.mode=async (max_staleness 1) against sync: "
                   "steps per minute and test accuracy gain per minute, whole grpo train runs per seed "
                   "(grpo/bench/async_rollouts.py)")
    b.add_argument("--model", default=None, help="with --versus-trl or --async-rollouts: a model directory (default: "
                   "the built-in model)")
    b.add_argument("--memory", action="store_true", help="peak memory of whole grpo train runs (the process tree) "
                   "against the floor and the run's plan, for 135M, 0.5B and 1.5B shapes (grpo/bench/memory.py)")
    b.add_argument("--memory-model", action="append", default=None, metavar="NAME=DIR", help="with --memory: the "
                   "model directory of a shape (smollm2, qwen2.5-0.5b, qwen2.5-1.5b); repeat for each")
    b.add_argument("--entries", default=None, help="with --memory: comma-separated runs to measure (default all)")
    b.add_argument("--trl", action="store_true", help="with --memory: also TRL's peak on the same full fine-tuning "
                   "runs")
    b.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="with --async-rollouts: config overrides for "
                   "every run, e.g. kl.coef=0.04")
    b.add_argument("--steps", type=int, default=None, help="with --versus-trl: timed steps per process (default 3); "
                   "with --async-rollouts: training steps per run (default 40)")
    b.add_argument("--repeats", type=int, default=None, help="with --versus-trl: processes per method (default 3); "
                   "with --async-rollouts: seeds (default 3)")
    b.add_argument("--prompts", type=int, default=None, help="with --versus-trl: P, prompts per step (default 4)")
    b.add_argument("--group", type=int, default=None, help="with --versus-trl: G, completions per prompt (default 8)")
    b.add_argument("--max-new-tokens", type=int, default=None, help="with --versus-trl: T (default 32)")
    b.add_argument("--before", default=None, metavar="REV", help="with --versus-trl: also this project's code at git "
                   "revision REV (e.g. 581fde8), the same worker, as 'before'")
    b.set_defaults(func=_bench)
    r = sub.add_parser("report", help="a self-contained HTML page of a run")
    r.add_argument("run_dir")
    r.set_defaults(func=_report)
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error (also GRPO_DEBUG=1)")
    for p in sub.choices.values():  # every command takes it after its name too: `grpo train ... --debug`
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the traceback of an error (also GRPO_DEBUG=1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(levelname)s: %(message)s")
    # torchao (grpo[torchao]), which transformers imports whenever it is installed, warns on a CPU that its CUDA
    # kernels do not load, and torch that torchao registers enums in a deprecated way: nothing a user can act on
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    try:  # transformers' own progress bars (weight loading/saving) would interleave with ours
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("GRPO_DEBUG", "") not in ("", "0")
    try:
        return args.func(args)
    except KeyboardInterrupt as e:  # a second Ctrl-C while a run stops, or one where no guard turns it into a stop
        if debug:
            traceback.print_exc()
        print(_interrupt_message(e), file=sys.stderr)
        return 130
    except Exception as e:  # bad input and the run's own stops get one clear message and their exit code
        code, message = _error_exit(e)
        if code is None:
            raise  # a bug: the traceback is the message
        if debug:
            traceback.print_exc()
        print(message, file=sys.stderr)
        return code


class InterruptedBeforeTraining(KeyboardInterrupt):
    """Ctrl-C while `grpo train` reads its data and loads its model, before the run's signal guard is up."""


def _interrupt_message(e: KeyboardInterrupt) -> str:
    """The one line for a KeyboardInterrupt. A run's first Ctrl-C is a stop after the step (grpo.errors.Preempted);
    grpo.train.checkpoint.preemption raises "second interrupt ..." for the next one. Any other came before a run
    started or outside one (a checkpoint is committed whole or not at all, so the committed ones are intact)."""
    if isinstance(e, InterruptedBeforeTraining):
        return "grpo: interrupted before training started; nothing was saved"
    if str(e).startswith("second interrupt"):
        return ("grpo: aborted by a second interrupt; the step in progress is not saved, checkpoints committed before "
                "it are intact")
    return "grpo: interrupted; any checkpoint committed before it is intact"


def _error_exit(e: Exception) -> tuple[int | None, str]:
    """(exit code, one-line message) of an error grpo raises on purpose; (None, "") for anything else.
    The codes are grpo.errors' (docs/cli.md "Exit codes"): 2 bad input, 3 a health guard, 130/143 a signal, 1 else."""
    from grpo.errors import GrpoError, Preempted, UserError
    from grpo.rewards import RewardFunctionError
    from grpo.train.checkpoint import CheckpointError

    if isinstance(e, UserError):
        return e.exit_code, f"grpo: {e}"
    if isinstance(e, Preempted):
        return e.exit_code, f"grpo: {e} (exit code {e.exit_code}: the run is not finished)"
    if isinstance(e, (GrpoError, CheckpointError, RewardFunctionError)):
        return getattr(e, "exit_code", 1), f"grpo: {type(e).__name__}: {e}"
    return None, ""


if __name__ == "__main__":
    sys.exit(main())
