#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (what .ci/run calls). Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec python -m pytest -q "$@"
