#!/usr/bin/env bash
# Set up if needed, check lint and formatting, then run the whole test suite (what .ci/run calls). Extra arguments
# go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
# the simulator tests run several processes on few cores: OpenMP threads that busy-wait slow them all down, and
# more than one thread per process only contends with the other workers' processes
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# lint and format first (ruff.toml), then types (mypy; its files and settings: setup.cfg's [mypy]; about 20 s on a
# fresh clone, under a second with its .mypy_cache): a failure names the file and line
ruff check custom tests benchmarks
ruff format --check custom tests benchmarks
mypy
# three pytest-xdist workers (FAIRFL_TEST_WORKERS; `-n 0` runs in one process): a process-starting test waits part of
# its time (NVFlare's task round trips, timeouts, shutdowns), so three keep 2 cores busier than two; a fourth only
# adds contention (docs/testing.md has the measurements)
exec python -m pytest -q -n "${FAIRFL_TEST_WORKERS:-3}" --dist loadgroup "$@"
