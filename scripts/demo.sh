#!/usr/bin/env bash
# Set up if needed, then run Fed-LWR on the built-in six-site data in the NVFlare simulator and report.
# Extra arguments go to `fairfl run` (e.g. -w /tmp/ws). A re-run replaces the previous demo workspace.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/setup.sh"
cd "$ROOT"
# the built-in data, made here where its progress shows (inside the simulator the sites would make it silently,
# into their logs); a cached copy is reused with one line. With --set the job may need other data: it makes its own.
case " $* " in
  *" --set"*) ;;
  *) fairfl prepare-data --dataset prostate --num-sites 6 >/dev/null ;;
esac
exec fairfl run jobs/fedlwr -n 6 -t 6 --force "$@"  # --force: a re-run replaces the demo's own workspace
