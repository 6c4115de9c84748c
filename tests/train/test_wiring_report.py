"""What people read: the `grpo report` page (summary, metrics rows, sample groups with rewards and advantages),
samples.jsonl and metrics.jsonl of a real run, and the seed-style group print-out (log.print_group_every), checked
number by number against values computed here.

The run trains on a fixed batch (wiring_helpers.FixedSampler) with known rewards, so the group statistics and
advantages are known in advance: e.g. rewards [1, 0, 0.5, 0] have mean 0.375, population std 0.4146 and advantages
[+1.508, -0.905, +0.302, -0.905].
"""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser

import pytest
from wiring_helpers import one_thread  # noqa: F401  (an autouse fixture)
from wiring_helpers import GROUPS, REWARDS, TABLE, FixedSampler, Setting, naive_advantages, wiring_overrides

from grpo.cli import main
from grpo.tracking.metrics import read_jsonl
from grpo.tracking.report import KEYS


class Page(HTMLParser):
    """The tables of a page (rows of cell texts) and the text of its h3 and p elements, in order."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.blocks: list[tuple[str, str]] = []  # ("h3" | "p", text)
        self._cell: list[str] | None = None
        self._block: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag in ("h3", "p"):
            self._block = [tag]

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None
        elif tag in ("h3", "p") and self._block is not None:
            self.blocks.append((self._block[0], "".join(self._block[1:])))
            self._block = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._block is not None:
            self._block.append(data)


def same(cell: str, value) -> bool:
    """A cell shows `value` (to the 4 significant digits of the page), or is empty for a missing value."""
    if value is None or value == "":
        return cell == ""
    return math.isclose(float(cell), float(value), rel_tol=1e-3, abs_tol=1e-12)


def metrics_table(page: Page) -> list[list[str]]:
    return next(t for t in page.tables if t and t[0][:2] == ["step", KEYS[0]])


def sample_tables(page: Page) -> list[list[list[str]]]:
    return [t for t in page.tables if t and t[0] == ["completion", "reward", "advantage"]]


def write_run(run_dir, metrics: list[dict], samples: list[dict], summary: dict) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "config.yaml").write_text("algo:\n  advantage: grpo\n")


def test_report_shows_the_metrics_rows_and_the_last_sample_groups(tmp_path):
    """64 steps: the table shows every 2nd step (64 // 30) and every evaluation step, each value in its column;
    the last 4 sample groups with their prompt, answer, mean, std, and each completion's reward and advantage."""
    metrics = [{"step": s, "reward/mean": s / 100, "reward/std": 1 / s, "loss/policy": -s * 1e-3,
                "policy/entropy": 4.0 - s / 64, "perf/step_s": 0.5 + s} for s in range(1, 65)]
    for m in metrics:
        if m["step"] % 25 == 0:
            m["eval/accuracy"] = m["step"] / 64
    samples = [{"step": s, "prompt": f"What is {s} + 1?\n", "answer": str(s + 1),
                "completions": [f"c{s}a", f"c{s}b"], "rewards": [1.0, s / 7], "advantages": [0.25 * s, -0.125 * s],
                "reward_mean": (1 + s / 7) / 2, "reward_std": abs(1 - s / 7) / 2} for s in range(1, 7)]
    write_run(tmp_path / "run", metrics, samples, {"eval/accuracy_before": 0.125, "eval/accuracy_after": 0.75})
    assert main(["report", str(tmp_path / "run")]) == 0
    page = Page((tmp_path / "run" / "report.html").read_text())
    table = metrics_table(page)
    assert table[0] == ["step", *KEYS]
    shown = [int(r[0]) for r in table[1:]]
    assert shown == [s for s in range(1, 65) if s % 2 == 0 or s % 25 == 0]
    by_step = {m["step"]: m for m in metrics}
    for row in table[1:]:
        m = by_step[int(row[0])]
        for key, cell in zip(KEYS, row[1:]):
            assert same(cell, m.get(key)), (m["step"], key, cell, m.get(key))
    summary = {r[0]: r[1] for r in page.tables[0]}
    assert same(summary["eval/accuracy_before"], 0.125) and same(summary["eval/accuracy_after"], 0.75)
    groups = sample_tables(page)
    headings = [text for kind, text in page.blocks if kind == "h3"]
    stats = [text for kind, text in page.blocks if kind == "p"]
    assert len(groups) == len(headings) == len(stats) == 4
    for s, table, heading, stat in zip(samples[2:], groups, headings, stats):
        assert heading == f"step {s['step']}: {s['prompt'].strip()} (answer {s['answer']})"
        mean, std = re.fullmatch(r"mean (\S+), std (\S+)", stat).groups()
        assert same(mean, s["reward_mean"]) and same(std, s["reward_std"])
        assert [r[0] for r in table[1:]] == s["completions"]
        assert all(same(r[1], x) for r, x in zip(table[1:], s["rewards"]))
        assert all(same(r[2], x) for r, x in zip(table[1:], s["advantages"]))


def population_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


@pytest.fixture
def fixed_run(make_trainer, tmp_path, capsys):
    """A 2-step run on the fixed batch with every group logged and printed; returns (run_dir, console text)."""
    trainer = make_trainer(*wiring_overrides("train.steps=2", "log.sample_groups=2", "log.print_group_every=1"),
                           reward_functions=TABLE)
    trainer.sampler = FixedSampler(trainer.tokenizer, [GROUPS, GROUPS])
    capsys.readouterr()
    trainer.train()
    return trainer.run_dir, capsys.readouterr().out


def test_samples_and_metrics_of_a_run_hold_the_rewards_and_advantages(fixed_run):
    run_dir, _ = fixed_run
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert [s["step"] for s in samples] == [1, 1, 2, 2]
    for s, group in zip(samples, GROUPS + GROUPS):
        rewards = [REWARDS[text] for text, _ in group]
        assert s["completions"] == [text for text, _ in group]
        assert s["rewards"] == pytest.approx(rewards, abs=1e-6)
        assert s["advantages"] == pytest.approx(naive_advantages(rewards, 4, Setting()), abs=1e-5)
        assert s["reward_mean"] == pytest.approx(sum(rewards) / 4, abs=1e-6)
        assert s["reward_std"] == pytest.approx(population_std(rewards), abs=1e-6)
    every = [REWARDS[text] for g in GROUPS for text, _ in g]
    lengths = [len(text) + ended for g in GROUPS for text, ended in g]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2] and "eval/accuracy" in metrics[0]  # step 0: before training
    for m in metrics[1:]:
        assert m["reward/mean"] == pytest.approx(sum(every) / 8, abs=1e-6)
        assert m["reward/std"] == pytest.approx(population_std(every), abs=1e-6)
        assert m["adv/zero_std_frac"] == 0.0
        assert m["rollout/len_mean"] == pytest.approx(sum(lengths) / 8)
        assert m["rollout/truncated_frac"] == pytest.approx(2 / 8)


def test_report_of_a_run_matches_its_files(fixed_run):
    run_dir, _ = fixed_run
    assert main(["report", str(run_dir)]) == 0
    page = Page((run_dir / "report.html").read_text())
    header, *rows = metrics_table(page)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert set(KEYS) <= set(header) and "reward/table" in header  # the fixed columns and one per reward function
    assert [int(r[0]) for r in rows] == [m["step"] for m in metrics]
    for row, m in zip(rows, metrics):
        assert all(same(cell, m.get(key)) for key, cell in zip(header[1:], row[1:])), (row, m)
    samples = read_jsonl(run_dir / "samples.jsonl")
    for table, s in zip(sample_tables(page), samples):
        assert [r[0] for r in table[1:]] == s["completions"]
        assert all(same(r[1], x) and same(r[2], a) for r, x, a in zip(table[1:], s["rewards"], s["advantages"]))


def test_the_seed_style_print_out_shows_each_groups_numbers(fixed_run):
    """log.print_group_every=1: each step prints its first group, one line per completion with r_i (2 decimals) and
    A_i (3 decimals, signed), and the group's mean and population std."""
    run_dir, out = fixed_run
    rewards = [REWARDS[text] for text, _ in GROUPS[0]]
    adv = naive_advantages(rewards, 4, Setting())
    lines = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") == 5]
    want = [[str(i + 1), repr(text), f"{r:.2f}", f"{a:+.3f}"] for i, ((text, _), r, a) in
            enumerate(zip(GROUPS[0], rewards, adv))]
    assert lines == want + want  # steps 1 and 2 print the same first group
    captions = re.findall(r"mean\(r\) = (\S+)\s+std\(r\) = (\S+)", out)
    assert captions == [(f"{sum(rewards) / 4:.3f}", f"{population_std(rewards):.3f}")] * 2
    prompts = [s["prompt"].strip() for s in read_jsonl(run_dir / "samples.jsonl")][::2]
    assert re.findall(r"step (\d): '([^']*)'", out) == [("1", prompts[0]), ("2", prompts[1])]
