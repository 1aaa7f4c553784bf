#!/usr/bin/env bash
# Create .venv-phoenix with Arize Phoenix, the trace viewer `libra up --observe` starts.
# Usage: scripts/setup_phoenix_venv.sh [VENV_DIR]   (default .venv-phoenix; idempotent via a
# stamp file). Its own virtualenv: Phoenix pins its own OpenTelemetry, SQLAlchemy and web
# stack, which must not move the runtime's pins (requirements.txt). Elsewhere: point
# `libra up --observe --phoenix-venv DIR` or LIBRA_PHOENIX_VENV at it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${1:-.venv-phoenix}"
STAMP="$VENV/.installed"
if [[ -f "$STAMP" && "$STAMP" -nt requirements-phoenix.txt ]]; then
  echo "setup_phoenix_venv: $VENV is up to date"
  exit 0
fi
t0=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" --disable-pip-version-check install --quiet -r requirements-phoenix.txt
"$VENV/bin/phoenix" serve --help > /dev/null   # the entry point `libra up --observe` runs
"$VENV/bin/python" -c "import phoenix; print('arize-phoenix', phoenix.__version__)"
touch "$STAMP"
echo "setup_phoenix_venv: $VENV ready in $(( $(date +%s) - t0 )) s"
