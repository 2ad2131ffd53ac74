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
if ! python -c "import fairfl, torch, nvflare, monai, pydicom, opacus, mlflow, alembic, xdist, zxcvbn, nbclient, nbformat, ipykernel" 2>/dev/null || ! command -v ruff >/dev/null || ! command -v mypy >/dev/null; then
  # pip's own progress bars on: a first install downloads for minutes and should not look stuck
  echo "[1/2] installing torch==2.13.0 into $VENV (the largest download; minutes on a first install) ..."
  python -m pip install --progress-bar on torch==2.13.0
  echo "[2/2] installing fairfl with nvflare, MONAI, MLflow and the test tools (minutes on a first install) ..."
  python -m pip install --progress-bar on -e "$ROOT[test]"
  echo "installed into $VENV"
fi
