#!/usr/bin/env bash
# Install the CPU build of torch (never a multi-GB CUDA build), the package with its test extras, and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
python3 -m pip install -q -e ".[dev,math,lora,data]"
python3 -m pytest -q -p no:cacheprovider "$@"
