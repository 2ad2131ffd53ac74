"""Where a FedAvg round's CPU goes, thread by thread, against the per-site floor measured beside it.

`python benchmarks/round_threads.py --repeats 2 --rounds 8 --out benchmarks/results/cost/round_threads.json`

Each repeat runs, in alternating order (A B, then B A), the per-site floor of `benchmarks/cost_floor.py` (the
executor's own `_train`, one process per site, a barrier each round, no FLARE) and jobs/fedavg in `nvflare simulator`
with one process per site. During the FedAvg run a thread of this process reads, every SAMPLE_INTERVAL seconds, the
CPU time (user and system) of every thread of every process below it (psutil), and the simulator's processes load
benchmarks/task_cpu_hook/sitecustomize.py, which records the calling thread's CPU seconds of every task the executor
runs (`execute`) and of its training step inside it (`_train`, the same call the floor makes). Over the rounds that
neither start the sites nor evaluate (from the end of round 1 to the end of the one before the last), a round's CPU
splits into:
- train: the sites' `_train` calls (the floor's unit of work);
- task handling: the rest of the executor's `execute` (reading and checking the task, building the answer);
- site main threads outside tasks: NVFlare's client loop on the thread that runs the tasks (fetching tasks, the
  worker's messages to the simulator, the waits between them);
- site other threads: NVFlare's messaging, streaming and monitoring threads (and any of torch's);
- server and simulator: every thread of the processes that are not sites.
Absolute figures move with the machine's load; the two runs of a repeat are back to back so that their ratio does not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cost_floor import JOBS, PER_SITE, Sampler, floor, floor_layouts, median_of  # noqa: E402  (benchmarks/cost_floor.py)

HOOK = os.path.join(HERE, "task_cpu_hook")
SAMPLE_INTERVAL = 0.1  # seconds between per-thread CPU readings
PARTS = ("train", "task_handling", "site_main_outside_tasks", "site_other_threads", "server_and_simulator")


class ThreadCPU(Sampler):
    """A thread reading (time, rounds the results file holds, {(pid, tid): (site or "", user, system)}) for every
    thread of every process below this one until stopped."""

    def __init__(self, results_path: str):
        import psutil

        from fairfl.progress import finished_rounds, read_results

        self._psutil, self.results_path = psutil, results_path
        self._finished = lambda: len(finished_rounds(read_results(results_path)))
        self.samples: list[tuple[float, int, dict]] = []
        super().__init__("thread-cpu")

    def _run(self):
        psutil, me = self._psutil, self._psutil.Process()
        threads: dict = {}  # a thread that ends keeps its last reading (its CPU is not lost from the window)
        while not self._stop.is_set():
            now, threads = time.time(), dict(threads)
            for process in me.children(recursive=True):
                try:
                    site = re.search(r"--client (\S+)", " ".join(process.cmdline()))
                    for thread in process.threads():
                        threads[(process.pid, thread.id)] = (site.group(1) if site else "", *thread[1:3])
                except psutil.Error:
                    continue  # ended between the listing and the reading
            try:
                finished = self._finished()
            except (OSError, ValueError):
                finished = 0  # not written yet, or caught mid-write
            self.samples.append((now, finished, threads))
            self._stop.wait(SAMPLE_INTERVAL)


def split_round_cpu(samples: list, task_records: list[dict], first: int, last: int) -> dict:
    """CPU seconds a round in PARTS (and user/system in all) between the first samples that saw `first` and `last`
    rounds finished; task records are counted by the share of their time inside that window. A ValueError when the
    samples never saw `last` rounds finished, or a task ran on another thread than its process's main thread (the
    parts would then be misattributed)."""
    start = next((s for s in samples if s[1] >= first), None)
    end = next((s for s in samples if s[1] >= last), None)
    if start is None or end is None:
        raise ValueError(f"the samples never saw rounds {first} and {last} finished")
    off_main = sorted({(r["pid"], r["tid"]) for r in task_records if r["pid"] != r["tid"]})
    if off_main:
        raise ValueError(f"tasks ran off their process's main thread: {off_main[:3]}")
    rounds, (t0, _, before), (t1, _, after) = last - first, start, end

    def spent(key):
        _, user, system = after[key]
        _, user0, system0 = before.get(key, ("", 0.0, 0.0))
        return user - user0, system - system0

    def in_window(what):
        total = 0.0
        for r in task_records:
            if r["what"] == what and r["end"] > t0 and r["start"] < t1:
                total += r["cpu"] * (min(r["end"], t1) - max(r["start"], t0)) / max(r["end"] - r["start"], 1e-9)
        return total

    site_main = site_other = server = user = system = 0.0
    for key, (site, *_) in after.items():
        u, s = spent(key)
        user, system = user + u, system + s
        if not site:
            server += u + s
        elif key[0] == key[1]:  # the process's main thread: the one that runs the tasks
            site_main += u + s
        else:
            site_other += u + s
    train, execute = in_window("_train"), in_window("execute")
    parts = {
        "train": train,
        "task_handling": execute - train,
        "site_main_outside_tasks": site_main - execute,
        "site_other_threads": site_other,
        "server_and_simulator": server,
    }
    result = {k: round(v / rounds, 3) for k, v in parts.items()}
    return {
        **result,
        "all": round((user + system) / rounds, 3),
        "user": round(user / rounds, 3),
        "system": round(system / rounds, 3),
        "rounds": rounds,
        "window_seconds": round(t1 - t0, 2),
    }


def fedavg_run(dataset: str, rounds: int, sites: int, tmp: str) -> dict:
    """jobs/fedavg in the simulator with the task hook and the thread sampler: split_round_cpu's figures."""
    from fairfl.jobconfig import customize_job
    from fairfl.results import SIMULATOR_RESULTS
    from fairfl.simulate import run_simulator

    job, workspace, log_dir = (os.path.join(tmp, name) for name in ("job", "workspace", "task_cpu"))
    os.makedirs(log_dir)
    customize_job(os.path.join(JOBS, "fedavg"), job, {"num_rounds": rounds, "eval_every": rounds, "dataset": dataset})
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (HOOK, os.environ.get("PYTHONPATH", "")) if p),
        "FAIRFL_TASK_CPU_LOG": log_dir,
    }
    with ThreadCPU(os.path.join(workspace, SIMULATOR_RESULTS)) as sampler:
        run = run_simulator(job, workspace, n_clients=sites, timeout=3600, env=env)
    if not run.ok:
        raise RuntimeError(f"jobs/fedavg: {run.describe_failure()}")
    records = [
        json.loads(line) for name in os.listdir(log_dir) for line in Path(log_dir, name).read_text().splitlines()
    ]
    if not records:
        raise RuntimeError("the task hook recorded nothing: was benchmarks/task_cpu_hook on the sites' PYTHONPATH?")
    # counted: the rounds after round 1 up to the one before the last (round 0 loads the data, the last evaluates)
    return split_round_cpu(sampler.samples, records, first=2, last=rounds - 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="prostate")
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=8, help="at least 5: rounds 2 to the one before the last count")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", required=True, help="a JSON file")
    args = parser.parse_args(argv)
    if args.rounds < 5 or args.sites < 1 or args.repeats < 1:
        parser.error("--rounds must be at least 5, --sites and --repeats at least 1")
    groups, _ = floor_layouts(args.dataset, args.sites, 1)[PER_SITE]
    repeats = []
    for repeat in range(args.repeats):
        order = ("floor", "fedavg") if repeat % 2 == 0 else ("fedavg", "floor")
        measured: dict = {"order": list(order)}
        for arm in order:
            with tempfile.TemporaryDirectory() as tmp:
                if arm == "floor":
                    measured["floor_cpu"] = floor(args.dataset, args.sites, args.rounds, groups)["cpu"]
                else:
                    measured["fedavg"] = fedavg_run(args.dataset, args.rounds, args.sites, tmp)
        measured["train_over_floor"] = round(measured["fedavg"]["train"] / measured["floor_cpu"], 3)
        measured["all_over_floor"] = round(measured["fedavg"]["all"] / measured["floor_cpu"], 3)
        measured["load_average_after"] = [round(load, 2) for load in os.getloadavg()]  # 1, 5, 15 minutes
        repeats.append(measured)
        print(json.dumps(measured), flush=True)
    summary = {
        "command": "python benchmarks/round_threads.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "dataset": args.dataset,
        "sites": args.sites,
        "rounds": args.rounds,
        "repeats": repeats,
        "median": {
            **{k: median_of(r["fedavg"][k] for r in repeats) for k in (*PARTS, "all", "user", "system")},
            "floor_cpu": median_of(r["floor_cpu"] for r in repeats),
            "train_over_floor": median_of(r["train_over_floor"] for r in repeats),
            "all_over_floor": median_of(r["all_over_floor"] for r in repeats),
        },
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(summary, out, indent=1)
    print(json.dumps(summary["median"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
