#!/usr/bin/env bash
# Rewrite constraints.txt from the environment the suite just passed in (run after a green `bash scripts/test.sh`):
# every installed distribution's version, minus torch and its CUDA companions (scripts/install.sh installs torch
# apart, a CPU or CUDA build) and tools the project does not install.
set -euo pipefail
cd "$(dirname "$0")/.."
{
  sed -n '1,4p' constraints.txt
  python3 -m pip freeze --exclude-editable 2>/dev/null \
    | grep -viE '^(torch|torchvision|torchaudio|torchcodec|triton|nvidia-|ruff|grpo|pytest-benchmark)[=_-]' \
    | grep -v '^-e\|@ file'
} > constraints.txt.tmp
mv constraints.txt.tmp constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) pins"
