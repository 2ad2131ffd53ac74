"""How long a round takes with NVFlare's default task intervals against the jobs' own, side by side.

NVFlare tells a site to wait `task_request_interval` seconds (server setting, default 2) after it answered a task
before it asks for the next one, and a controller checks for answers every `task_check_period` seconds (default
0.5 in NVFlare's ModelController). The jobs set 0.2 and 0.1 (fairfl.methods.make_jobs, FairRoundController). This
runs jobs/fedavg both ways, interleaved (A B A B ...), and reports the median time of the rounds after the first
(the first also starts the sites' processes and caches their data) and whether both gave the same numbers.

    python benchmarks/task_intervals.py --repeats 3 --rounds 6 --out benchmarks/results/task_intervals.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from fairfl.benchmark.runner import versions
from fairfl.jobconfig import SERVER_CONFIG, customize_job
from fairfl.simulate import run_simulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVFLARE_DEFAULTS = {"task_request_interval": 2.0, "task_check_period": 0.5}


def job_with(intervals: dict | None, rounds: int, folder: str) -> str:
    """jobs/fedavg with `rounds` rounds, evaluated at the end only, and NVFlare's intervals when asked."""
    job = customize_job(os.path.join(REPO, "jobs", "fedavg"), folder, {"num_rounds": rounds, "eval_every": rounds})
    if intervals:
        path = os.path.join(job, SERVER_CONFIG)
        config = json.loads(Path(path).read_text())
        config["server"] = {"task_request_interval": intervals["task_request_interval"]}
        config["workflows"][0]["args"]["task_check_period"] = intervals["task_check_period"]
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
    return job


def job_intervals() -> dict:
    """The intervals jobs/fedavg is written with."""
    config = json.loads(Path(REPO, "jobs", "fedavg", SERVER_CONFIG).read_text())
    return {
        "task_request_interval": config["server"]["task_request_interval"],
        "task_check_period": config["workflows"][0]["args"]["task_check_period"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "task_intervals.json"))
    args = parser.parse_args(argv)
    arms = {"nvflare_defaults": NVFLARE_DEFAULTS, "jobs": None}
    rounds, finals = {arm: [] for arm in arms}, {arm: set() for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {arm: job_with(value, args.rounds, os.path.join(tmp, f"{arm}_job")) for arm, value in arms.items()}
        for repeat in range(args.repeats):
            for arm in arms:
                run = run_simulator(jobs[arm], os.path.join(tmp, arm), args.sites, args.sites, timeout=1800)
                if not run.ok:
                    print(run.describe_failure(), file=sys.stderr)
                    return 1
                results = json.loads(Path(run.results_path).read_text())
                later = [r["seconds"] for r in results["rounds"] if r["round"] > 0]
                rounds[arm].extend(later)
                finals[arm].add(json.dumps(results["final"]["per_site"], sort_keys=True))
                print(f"  {arm} #{repeat}: {run.seconds:.0f} s, rounds after the first {later}", flush=True)
    medians = {arm: statistics.median(values) for arm, values in rounds.items()}
    summary = {
        "command": " ".join(["python", "benchmarks/task_intervals.py"] + (argv if argv is not None else sys.argv[1:])),
        "versions": versions(),
        "sites": args.sites,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "intervals": {"nvflare_defaults": NVFLARE_DEFAULTS, "jobs": job_intervals()},
        "median_round_seconds": medians,
        "ratio_jobs_to_defaults": medians["jobs"] / medians["nvflare_defaults"],
        "same_final_scores": len(finals["jobs"] | finals["nvflare_defaults"]) == 1,
        "round_seconds": rounds,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps({k: summary[k] for k in ("median_round_seconds", "ratio_jobs_to_defaults", "same_final_scores")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
