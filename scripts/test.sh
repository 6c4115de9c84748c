#!/usr/bin/env bash
# Install the package with its test extras (CPU torch unless a GPU is present) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev,math,lora,data
python3 -m pytest -p no:cacheprovider "$@"
