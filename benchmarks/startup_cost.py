"""What a new site process costs before its first task: the CPU seconds of a fresh Python that imports what an
NVFlare site process of fairfl imports, step by step, and builds its first optimiser.

    python benchmarks/startup_cost.py --repeats 5 --out benchmarks/results/startup_cost.json

Every simulator run starts one process per site (and one more for every task a site runs when `-t` is below `-n`),
so this is the fixed price of every process-starting test and of every run; the test suite's floor on two cores is
its total CPU over two (docs/testing.md). The steps run in order in one fresh interpreter, which reports its own
CPU (user + system, from its start) and wall-clock seconds (from its script's start) after each, so the figures rise
step by step; a last row is the whole process as its parent sees it, exit included. `--repeats` interpreters, and
the medians of each row over them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from fairfl.benchmark.runner import versions

# each step's code runs after the previous steps' (cumulative), as a site process runs them
STEPS = {
    "python": "pass",
    "torch": "import torch",
    "monai": "import monai",  # MONAI imports all its submodules, and with them scikit-learn, scipy, matplotlib, mlflow
    "nvflare": "import nvflare.apis.executor",
    "fairfl executor": "import fairfl.flare.executor",
    # the first optimiser imports torch._dynamo (Optimizer.add_param_group is wrapped in torch._disable_dynamo)
    "first optimiser": "torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)",
}


def step_seconds() -> list[tuple[float, float]]:
    """[(CPU seconds since the interpreter started, wall-clock seconds since its script started) after each step] of
    one fresh interpreter with one intra-op thread, as at a site."""
    lines = ["import json, os, time", "START = time.perf_counter()", "out = []"]
    for code in STEPS.values():
        lines += [code, "t = os.times()", "out.append((t.user + t.system, time.perf_counter() - START))"]
    script = "\n".join([*lines, "print(json.dumps(out))"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    whole = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # the last row: the whole process, its start and its exit (unloading torch and MONAI) included
    return [tuple(step) for step in json.loads(proc.stdout)] + [(whole, wall)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    runs = [step_seconds() for _ in range(args.repeats)]
    rows = []
    for k, name in enumerate([*STEPS, "whole process, to its exit"]):
        cpu, wall = statistics.median(r[k][0] for r in runs), statistics.median(r[k][1] for r in runs)
        rows.append({"step": name, "cpu_seconds": round(cpu, 2), "wall_seconds": round(wall, 2)})
        print(f"{name:>26}: {cpu:5.2f} s CPU, {wall:5.2f} s wall (cumulative)", flush=True)
    command = " ".join(["python", "benchmarks/startup_cost.py", *(sys.argv[1:] if argv is None else argv)])
    result = {"command": command, "versions": versions(), "steps": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
