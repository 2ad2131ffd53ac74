"""What a new site process costs before its first task: the CPU seconds of a fresh Python that imports what an
NVFlare site process of fairfl imports, step by step, and builds its first optimiser.

    python benchmarks/startup_cost.py --repeats 5 --out benchmarks/results/startup_cost.json

Every simulator run starts one process per site (and one more for every task a site runs when `-t` is below `-n`),
so this is the fixed price of every process-starting test and of every run; the test suite's floor on two cores is
its total CPU over two (docs/testing.md). Each step runs in its own fresh interpreter, `--repeats` times; reported
are the medians of the child's CPU (user + system) and wall-clock seconds, each step including the ones before it.
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

from fairfl.benchmark import versions

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


def child_seconds(code: str) -> tuple[float, float]:
    """(CPU, wall) seconds of a fresh interpreter running `code`, one intra-op thread as at a site."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    rows, code = [], []
    for name, line in STEPS.items():
        code.append(line)
        runs = [child_seconds("\n".join(code)) for _ in range(args.repeats)]
        cpu, wall = statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs)
        rows.append({"step": name, "cpu_seconds": round(cpu, 2), "wall_seconds": round(wall, 2)})
        print(f"{name:>16}: {cpu:5.2f} s CPU, {wall:5.2f} s wall (cumulative)", flush=True)
    command = " ".join(["python", "benchmarks/startup_cost.py", *(sys.argv[1:] if argv is None else argv)])
    result = {"command": command, "versions": versions(), "steps": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
