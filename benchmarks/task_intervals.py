"""How long a round takes with NVFlare's default task intervals against the jobs' own, side by side.

NVFlare tells a site to wait `task_request_interval` seconds (server setting, default 2) after it answered a task
before it asks for the next one, and a controller checks for answers every `task_check_period` seconds (default
0.5 in NVFlare's ModelController). The jobs set 0.2 and 0.1 (fairfl.methods.make_jobs, FairRoundController). This
runs jobs/fedavg both ways, interleaved (A B A B ...), and reports the median time and CPU seconds of the rounds
that neither start the sites nor evaluate, and whether every arm gave the same numbers. `--request-intervals` adds
arms with other `task_request_interval` values (the jobs' check period): the wait after each answer lands on the
round's critical path at the site that finished last, while a shorter one makes idle sites ask more often.

    python benchmarks/task_intervals.py --repeats 3 --rounds 6 --out benchmarks/results/task_intervals.json
    python benchmarks/task_intervals.py --request-intervals 0.05 --repeats 3 --out /tmp/intervals.json
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from cost import measure_job  # noqa: E402  (benchmarks/cost.py)

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
    parser.add_argument("--request-intervals", type=float, nargs="*", default=[], help="extra arms (seconds, > 0)")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "task_intervals.json"))
    args = parser.parse_args(argv)
    if any(not 0 < value <= 60 for value in args.request_intervals):
        parser.error("--request-intervals: each value must be above 0 and at most 60 seconds")
    jobs_intervals = job_intervals()
    arms: dict[str, dict | None] = {"nvflare_defaults": NVFLARE_DEFAULTS, "jobs": None}
    for value in args.request_intervals:
        arms[f"request_{value:g}"] = {**jobs_intervals, "task_request_interval": value}
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {arm: job_with(value, args.rounds, os.path.join(tmp, f"{arm}_job")) for arm, value in arms.items()}
        for repeat in range(args.repeats):
            order = list(arms) if repeat % 2 == 0 else list(reversed(arms))  # A B C, then C B A
            for arm in order:
                try:
                    run = measure_job(jobs[arm], os.path.join(tmp, f"{arm}-{repeat}"), args.sites, arm)
                except RuntimeError as error:
                    print(error, file=sys.stderr)
                    return 1
                runs[arm].append(run)
                print(f"  {arm} #{repeat}: round {run['round']} s, CPU {run['cpu']} s a round", flush=True)
    medians = {arm: statistics.median(r["round"] for r in values) for arm, values in runs.items()}
    cpu = {arm: statistics.median(r["cpu"] for r in values if r["cpu"] is not None) for arm, values in runs.items()}
    finals = {json.dumps(r["final"], sort_keys=True) for values in runs.values() for r in values}
    summary = {
        "command": " ".join(["python", "benchmarks/task_intervals.py"] + (argv if argv is not None else sys.argv[1:])),
        "versions": versions(),
        "sites": args.sites,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "intervals": {arm: value or jobs_intervals for arm, value in arms.items()},
        "median_round_seconds": medians,
        "median_round_cpu_seconds": cpu,
        "ratio_jobs_to_defaults": medians["jobs"] / medians["nvflare_defaults"],
        "same_final_scores": len(finals) == 1,
        "runs": runs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)
    keys = ("median_round_seconds", "median_round_cpu_seconds", "same_final_scores")
    print(json.dumps({k: summary[k] for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
