#!/usr/bin/env bash
# Install the package with its test extras (CPU torch unless a GPU is present) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev,math,lora,data
# Test-only: Debian's chromium for tests/tracking/test_report_browser.py (`grpo report` in a headless browser); as
# root with apt-get where we can, else that test is skipped with its reason.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -q chromium >/dev/null 2>&1 \
    || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1)) \
    || echo "chromium not installed: the headless-browser report test is skipped"
fi
python3 -m pytest -p no:cacheprovider "$@"
