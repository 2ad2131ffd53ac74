#!/usr/bin/env bash
# Create (or reuse) .venv and install fairfl into it, with its test extra (pytest, ruff, mypy). Sourced by demo.sh and
# test.sh.
# torch is pinned and installed first: an unpinned torch pulls several GB of CUDA packages on a CPU machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FAIRFL_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
if ! python -c "import fairfl, torch, nvflare, monai, pydicom, mlflow, alembic, xdist, zxcvbn" 2>/dev/null || ! command -v ruff >/dev/null || ! command -v mypy >/dev/null; then
  echo "installing torch==2.13.0, then fairfl and its dependencies into $VENV ..."
  python -m pip install -q torch==2.13.0
  python -m pip install -q -e "$ROOT[test]"
fi
