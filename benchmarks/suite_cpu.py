"""Where the test suite's CPU goes, test by test: a pytest plugin that records each test's wall time and CPU seconds
(its worker's own, and that of the processes the worker started and waited for: the simulator, the sites), and a
summary by file.

    PYTHONPATH=benchmarks FAIRFL_TEST_CPU=/tmp/cpu python -m pytest -q -n 3 --dist loadgroup -p suite_cpu
    python benchmarks/suite_cpu.py /tmp/cpu [--top 20]

Two cores run the suite in no less than its total CPU over two (docs/testing.md), so the files at the top of the
summary are where a shorter CI comes from. Processes a test starts but does not wait for (a provisioned federation's
server and sites, which their own start scripts detach) are not counted: their tests' wall time shows them. A test's
setup is counted in the first test that needs a fixture (a shared run: the test that set it up).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

FOLDER_ENV = "FAIRFL_TEST_CPU"


def _cpu() -> tuple[float, float]:
    """(this process's CPU seconds, its waited-for children's)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    folder = os.environ.get(FOLDER_ENV)
    own, children = _cpu()
    started = time.time()
    yield
    if not folder:
        return
    own_after, children_after = _cpu()
    record = {
        "test": item.nodeid,
        "wall": round(time.time() - started, 3),
        "own": round(own_after - own, 3),
        "children": round(children_after - children, 3),
    }
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"cpu-{os.getpid()}.jsonl"), "a") as f:  # one file a worker: no interleaving
        f.write(json.dumps(record) + "\n")


def load(folder: str) -> list[dict]:
    """Every test's record in `folder` (all workers)."""
    records = []
    for path in sorted(Path(folder).glob("cpu-*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"{folder}: no records (run pytest with -p suite_cpu and {FOLDER_ENV}={folder})")
    tests = collections.Counter(r["test"] for r in records)
    twice = [test for test, n in tests.items() if n > 1]
    if twice:  # two sessions into one folder would add up
        raise SystemExit(f"{folder}: {len(twice)} tests recorded more than once ({twice[0]}...): one session a folder")
    return records


def summary(records: list[dict], top: int = 20) -> str:
    """The total, the process-starting tests' share and the `top` files by CPU, as text."""
    cpu = [r["own"] + r["children"] for r in records]
    total = sum(cpu)
    # tests whose waited-for processes used a CPU second or more (the simulator's); detached ones are not counted
    starting = [c for r, c in zip(records, cpu, strict=True) if r["children"] >= 1.0]
    by_file: collections.Counter = collections.Counter()
    for r, c in zip(records, cpu, strict=True):
        by_file[r["test"].split("::")[0]] += c
    lines = [
        f"{len(records)} tests, {total:.0f} CPU seconds; {len(starting)} waited for processes that used a CPU second "
        f"or more, and used {sum(starting):.0f} ({100 * sum(starting) / max(total, 1e-9):.0f}%); "
        f"{total / 2 / 60:.1f} min of two cores' CPU",
        "",
        "CPU s  file",
    ]
    lines += [f"{c:6.0f}  {name}" for name, c in by_file.most_common(top)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    print(summary(load(args.folder), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
