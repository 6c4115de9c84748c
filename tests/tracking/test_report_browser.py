"""`grpo report` of a real (tiny, 3-step) run, opened in a real browser: headless Chromium (Debian's `chromium`,
installed by scripts/test.sh) loads the page, and a probe script appended to a copy of it reports what the browser
rendered: every image decoded (natural size > 0), the metrics table with its step-0 row, the sample groups. The
browser's console log must hold no error but the probe's own (which shows that errors are captured). The page also
carries the plots of the training dynamics, the per-reward curves among them, and the best accuracy."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from grpo.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TINY = ["warmup.steps=0", "train.preflight=warn", "train.steps=3", "train.eval_every=1", "eval.n=6", "rollout.prompts_per_step=2",
        "rollout.group_size=3", "rollout.max_new_tokens=6", "data.train_size=30", "log.progress=false"]

PROBE = """<script>
window.addEventListener('load', () => {
  const images = [...document.images].map(i => ({alt: i.alt, w: i.naturalWidth, h: i.naturalHeight}));
  const rows = [...document.querySelectorAll('#metrics tr')].map(tr => tr.cells[0].textContent);
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify({images, rows, groups: document.querySelectorAll('#samples h3').length,
                                    headers: [...document.querySelectorAll('#metrics th')].map(th => th.textContent)});
  document.body.appendChild(pre);
  console.error('grpo-probe-console-check');
});
</script></body>"""


def chromium(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-dev-shm-usage", "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/test.sh installs it: apt-get install "
                                              "chromium)")
def test_report_renders_in_headless_chromium(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--output-dir", str(run), "--quiet"]) == 0
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert (run / "plots" / "dynamics.png").is_file()
    assert "eval/best_step" in page and "eval/accuracy_best" in page and "eval/accuracy_before" in page

    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE))
    res = chromium("--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    assert res.returncode == 0, res.stderr[-3000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', res.stdout, re.S)
    assert found, res.stdout[-2000:]
    probe = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert [i["alt"] for i in probe["images"]] == ["training", "dynamics"]
    assert all(i["w"] > 300 and i["h"] > 200 for i in probe["images"]), probe["images"]  # decoded, not broken
    assert probe["rows"] == ["step", "0", "1", "2", "3"]  # header, then step 0 (before training) .. 3
    assert "reward/correct" in probe["headers"] and "policy/clip_frac" in probe["headers"]
    assert probe["groups"] == 4  # the last four sample groups
    console = [line for line in res.stderr.splitlines() if "CONSOLE" in line or "console" in line.lower()]
    assert any("grpo-probe-console-check" in line for line in console), res.stderr[-3000:]  # errors are captured
    errors = [line for line in res.stderr.splitlines()
              if ("CONSOLE" in line or "Failed to load" in line or "Uncaught" in line)
              and "grpo-probe-console-check" not in line]
    assert errors == [], errors

    shot = tmp_path / "report.png"
    res = chromium(f"--screenshot={shot}", "--window-size=1200,2400", "--hide-scrollbars", (run / "report.html").as_uri())
    assert res.returncode == 0 and shot.stat().st_size > 20_000, res.stderr[-2000:]
