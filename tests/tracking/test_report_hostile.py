"""Issue #40, row 7: every field of a run directory written into `grpo report`'s HTML is escaped. A metrics row whose
step is text holding `<script>` was written into the page as is (a step of plain "<script>" raised TypeError from
`step % every` instead); a sample's step likewise. The page of a hostile run directory holds no element, attribute
or script of the run's making; in a real browser (headless Chromium, where installed) no script of it runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from grpo.tracking.report import write_report

# each one, if it ran, would mark the page (an attribute on <body>) or its title
SCRIPT = "<script>document.body.setAttribute('data-pwned', 'step %d'); document.title = 'pwned'</script>"
IMG = "<img src=x onerror=\"document.body.setAttribute('data-pwned', 'img')\">"


def hostile_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "reward/mean": 0.5, "eval/accuracy": 0.1},
            {"step": SCRIPT, "reward/mean": IMG, f"reward/{IMG}": 1.0},
            {"step": "<script>", "reward/mean": 0.25}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sample = {"step": SCRIPT, "prompt": SCRIPT, "answer": IMG, "reward_mean": IMG, "reward_std": 0.0,
              "completions": [SCRIPT, 7], "rewards": [IMG, 1.0], "advantages": [0.0, "<b>x</b>"],
              "episodes": [None, {"turns": [{"role": IMG, "text": SCRIPT}], "end": IMG}]}
    (run / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    (run / "summary.json").write_text(json.dumps({SCRIPT: IMG, "eval/accuracy_best": 0.1}))
    (run / "config.yaml").write_text(f"note: {SCRIPT}\n")
    return run


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


def test_a_hostile_run_directory_is_written_as_text(tmp_path):
    page = write_report(hostile_run(tmp_path)).read_text()  # before: TypeError, or the script in the page
    parsed = Tags()
    parsed.feed(page)
    assert [t for t, _ in parsed.tags if t in ("script", "iframe", "object", "embed")] == []
    assert all(not name.startswith("on") for _, attrs in parsed.tags for name, _ in attrs)
    assert sorted(a["alt"] for t, a in ((t, dict(a)) for t, a in parsed.tags) if t == "img") == ["dynamics",
                                                                                                 "training"]
    text = "".join(parsed.text)
    assert text.count(SCRIPT) >= 4 and IMG in text and "<script>" in text  # shown, as text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/test.sh installs it: apt-get install "
                                              "chromium)")
def test_no_script_of_a_hostile_run_directory_runs_in_a_browser(tmp_path):
    page = write_report(hostile_run(tmp_path)).read_text()
    probe = ("<script>window.addEventListener('load', () => { const p = document.createElement('pre'); p.id = "
             "'probe'; p.textContent = JSON.stringify({pwned: document.body.getAttribute('data-pwned'), title: "
             "document.title}); document.body.appendChild(p); });</script></body>")
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", probe))
    res = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-dev-shm-usage", "--virtual-time-budget=5000", "--dump-dom", probed.as_uri()],
                         capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="probe">(.*?)</pre>', res.stdout, re.S)
    assert found, (res.stdout[-2000:], res.stderr[-2000:])
    got = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert got["pwned"] is None and got["title"] == "grpo run run"
