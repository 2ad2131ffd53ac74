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
# lint and format first (ruff.toml): seconds, and a failure names the file and line
ruff check custom tests benchmarks
ruff format --check custom tests benchmarks
# two pytest-xdist workers (FAIRFL_TEST_WORKERS; `-n 0` runs in one process): the process-starting tests spend much
# of their time waiting on NVFlare's task round trips and process starts, so two of them share 2 cores well; more
# workers on a small machine only add memory (a simulator site process holds about 0.6 GB)
exec python -m pytest -q -n "${FAIRFL_TEST_WORKERS:-2}" --dist loadgroup "$@"
