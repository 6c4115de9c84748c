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

import statistics
from pathlib import Path

import pytest
from helpers.figures import ROOT, F, closest, load, names_source, normalized, resolve, sections

# results file (or a glob of them) -> (the script that writes it, a string the script contains that says so)
SOURCES = {
    "bench/results/readme_figures.json": ("bench/readme_figures.py", "bench/results/readme_figures.json"),
    "bench/results/tools_figures.json": ("bench/readme_figures.py", "--preset"),
    "bench/results/latest.json": ("src/grpo/bench/run.py", "bench/results/latest.json"),
    "bench/results/vocab.json": ("src/grpo/bench/vocab.py", "bench/results/vocab.json"),
    "bench/results/vocab_train.json": ("scripts/vocab_train_memory.py", "bench/results/vocab_train.json"),
    "bench/results/engines.json": ("src/grpo/bench/engines.py", "bench/results/engines.json"),
    "bench/results/compare.json": ("src/grpo/compare/run.py", "compare.json"),
    "bench/results/versus_trl_builtin.json": ("src/grpo/bench/versus_trl.py", "bench/results/versus_trl"),
    "bench/results/versus_trl_smollm2.json": ("src/grpo/bench/versus_trl.py", "bench/results/versus_trl"),
    "bench/learning/results/*.json": ("bench/learning/run.py", "bench/learning/results/"),
    "src/grpo/models/weights/*/recipe.json": ("src/grpo/warmup/recipe.py", "recipe.json"),
}

README = "README.md"
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
SEEDS = "runs[0:3]"  # readme_figures.json: train.seed=0, 1, 2 (then the own-data run)


def _seed_wins(d, key: str, a: str, b: str) -> int:
    """In how many seeds config `a` beat config `b` on `key` (seeds both ran)."""
    by_seed = {(r["config"], r["seed"]): r[key] for r in d["results"]}
    return sum(by_seed[(a, s)] > by_seed[(b, s)] for (c, s) in by_seed if c == a and (b, s) in by_seed)


def _block_mb(chunk: int, vocab: int = 151_936) -> float:
    """One (chunk, V) float32 block in MiB: computed, to split a measured peak into its parts."""
    return chunk * vocab * 4 / 2**20


def _learning_row(label: str, config: str, source: str = LEARNING, note: str = "", **derived) -> F:
    """A row of the README's table of the learning benchmark: mean ± sample std over the seeds of one config."""
    sel = f"results[config={config}]"
    return F(README, source, f"| {label} | {{pm({sel}.after):.3f}} | {{pm({sel}.per_1k):+.4f}}{note} | "
                             f"{{pm({sel}.per_cpu_min):+.4f}} | {{max({sel}.max_drop):.3f}} |", **derived)


def _mean_of(d, key: str, config: str | None = None) -> float:
    return statistics.mean(r[key] for r in d["results"] if config is None or r["config"] == config)


FIGURES = [
    # README.md: the default run (bench/readme_figures.py), the shipped models' recipes, the learning benchmark
    F(README, README_RUNS, "Measured on an {machine.cpu} ({machine.cores} cores, `lscpu`'s model name) on {date:.10}, "
                           "each run alone (load average {machine.load_before[0]:.1f} before and "
                           "{machine.load_after[0]:.1f} after"),
    F(README, README_RUNS, f"test accuracy {{mean({SEEDS}.eval/accuracy_before):.3f}} -> "
                           f"{{ppm({SEEDS}.eval/accuracy_after):.3f}} (mean ± population std) on {{runs[0].eval/n}} "
                           f"problems, a first launch in {{min({SEEDS}.wall_s)!d}} to {{max({SEEDS}.wall_s)!d}}; the "
                           f"model kept in `checkpoints/best/` (chosen on the {{runs[0].eval/val_n}} validation "
                           f"problems) scored {{ppm({SEEDS}.eval/accuracy_best):.3f}} on the test problems"),
    F(README, ARITHMETIC_RECIPE, "records how long it took here: {built_on.warmup_s:,.0f} s, {built_on.warmup_s!d}, "
                                 "on a shared 2-core machine"),
    F(README, LEARNING, "warmed up to {results[0].before:.3f} greedy accuracy on {args.eval_n} held-out problems"),
    _learning_row("default (`grpo`)", "default"),
    _learning_row("`dapo`", "dapo", note=" ({completions:.1f}x the completions, resampling)",
                  completions=lambda d: _mean_of(d, "completions", "dapo") / _mean_of(d, "completions", "default")),
    _learning_row("`dr_grpo`", "dr_grpo"),
    _learning_row("`examples/grpo_minimal.py`", "minimal"),
    _learning_row("default at `optim.lr=1e-5`", "default_lr1e-5", LEARNING_1E5),
    F(README, LEARNING, "the largest drop of any seed is {max(results[config=default].max_drop):.3f}, "
                        "{drop_problems} problems in {args.eval_n}). Per 1,000 completions it is ahead of both presets "
                        "in every seed; per minute it is ahead on the means and ties `dapo` seed by seed (ahead in "
                        "{ahead} of {len(results[config=dapo])})",
      drop_problems=lambda d: round(max(r["max_drop"] for r in d["results"] if r["config"] == "default") * 500),
      ahead=lambda d: _seed_wins(d, "per_cpu_min", "default", "dapo")),
    F(README, LEARNING_1E5, "1e-5 learned {ratio:.1f}x as much per completion, with drops up to "
                            "{max(results.max_drop):.3f}",
      ratio=lambda d: _mean_of(d, "per_1k") / _mean_of(load(LEARNING), "per_1k", "default")),
    F(README, CODE_RECIPE, "records its test accuracy, {heldout.accuracy:.3f} on {heldout.n} held-out problems, and "
                           "its warm-up time here, {built_on.warmup_s:,.0f} s"),
    F(README, TOOLS_RECIPE, "records greedy test accuracy {heldout.accuracy:.3f} on {heldout.n} problems, "
                            "{heldout.tool_use_frac:.0%} of them calling the tool"),
    F(README, TOOLS_RECIPE, "machine, {built_on.warmup_s!d}. GRPO has to find out"),
    F(README, TOOLS_RUN, "on the 2-core {machine.cpu} with other work starting beside it (load average "
                         "{machine.load_before[0]:.1f} before, {machine.load_after[0]:.1f} after"),
    F(README, TOOLS_RUN, "| test accuracy (greedy, {runs[0].eval/n} problems) | {runs[0].eval/accuracy_before:.3f} | "
                         "{runs[0].eval/accuracy_after:.3f} |"),
    F(README, TOOLS_RUN, "| training episodes that call the tool (first and last step) | "
                         "{runs[0].env/tool_use_frac_first:.0%} | {runs[0].env/tool_use_frac_last:.0%} |"),
    F(README, TOOLS_RUN, "| wall time | | {runs[0].wall_s!d} (RL steps {runs[0].time/rl_steps_s!d}, evaluations "
                         "{runs[0].time/eval_s!d}, model {runs[0].time/model_s!d}) |"),
    F(README, "bench/results/versus_trl_smollm2.json", "{ours_over_trl.step_s:.2f}x TRL's seconds per step on this "
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
    F(BENCH, VOCAB, "started {started}: CPU fp32"),
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
    """The check itself, on a copy of the README: the load average after the runs, 2.3 in the file's rounding (2.30),
    written as 2.4 is reported with the file's value; written as the file's 2.3 it passes."""
    (figure,) = [f for f in FIGURES if f.source == README_RUNS and "load average" in f.text]
    doc = (ROOT / README).read_text()
    after = f"{load(README_RUNS)['machine']['load_after'][0]:.1f}"
    quoted = f"{after} after"
    assert doc.count(quoted) == 1 and misquoted(figure, doc) == []
    (report,) = misquoted(figure, doc.replace(quoted, "2.4 after" if after != "2.4" else "2.5 after"))
    assert f"and {after} after" in report.splitlines()[0]
