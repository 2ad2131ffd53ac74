"""Round time and memory against the number of sites: jobs/fedavg (built-in prostate data) at each size, all sites'
processes at once (-t = -n) or, with --threads T, at most T site processes at a time (the simulator's -t: a site
process serves one site's task and the next site takes its place), evaluated at the end only.

    python benchmarks/scale.py --sites 6 20 --rounds 4 --out benchmarks/results/scale.json
    python benchmarks/scale.py --sites 50 --threads 4 --rounds 3 --out benchmarks/results/scale.json

For each size: the median round after round 0 that does not evaluate, the sites' training seconds summed over the
sites and their ratio (wall-clock seconds of each site: with more processes than cores they include the time a
site waits for a core, so the round per site is the measure of work), and the peak resident memory (RSS, sampled
every 0.5 s) of each site process and of every process of the run together."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import psutil

from fairfl.benchmark.runner import versions
from fairfl.jobconfig import customize_job
from fairfl.simulate import run_simulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2**20


class MemoryWatch:
    """Peak RSS of each process whose command line names `workspace` (the simulator's server and site processes)."""

    def __init__(self, workspace: str):
        self.workspace, self.peaks, self.total_peak = workspace, {}, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.done.wait(0.5):
            total = 0
            for proc in psutil.process_iter(["pid", "cmdline", "memory_info"]):
                cmdline = " ".join(proc.info["cmdline"] or [])
                if self.workspace not in cmdline or proc.info["memory_info"] is None:
                    continue
                rss = proc.info["memory_info"].rss
                total += rss
                role = next((part for part in cmdline.split() if part.startswith("site-")), "server and others")
                self.peaks[role] = max(self.peaks.get(role, 0), rss)
            self.total_peak = max(self.total_peak, total)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def measure(sites: int, rounds: int, tmp: str, threads: int | None = None) -> dict:
    job = customize_job(
        os.path.join(REPO, "jobs", "fedavg"),
        os.path.join(tmp, f"job{sites}"),
        {"num_rounds": rounds, "eval_every": rounds},
    )
    workspace = os.path.join(tmp, f"ws{sites}")
    with MemoryWatch(workspace) as memory:
        run = run_simulator(job, workspace, n_clients=sites, threads=threads, timeout=7200)
    if not run.ok:
        raise RuntimeError(f"{sites} sites: {run.describe_failure()}")
    records = [r for r in json.loads(Path(run.results_path).read_text())["rounds"][1:] if not r.get("per_site")]
    round_seconds = statistics.median(r["seconds"] for r in records)
    training = statistics.median(sum(m.get("train_seconds", 0.0) for m in r["train"].values()) for r in records)
    site_peaks = [v for k, v in memory.peaks.items() if k.startswith("site-")] or [0]
    return {
        "sites": sites,
        "site_processes_at_once": threads or sites,
        "round_seconds": round(round_seconds, 3),
        "all_sites_training_seconds": round(training, 3),
        "round_per_training_second": round(round_seconds / training, 4),
        "site_process_peak_mib": {
            "median": round(statistics.median(site_peaks) / MIB),
            "max": round(max(site_peaks) / MIB),
        },
        "all_processes_peak_mib": round(memory.total_peak / MIB),
        "wall_seconds": round(run.seconds, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", type=int, nargs="+", default=[6, 20])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="site processes at once (default: every site)")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "scale.json"))
    args = parser.parse_args(argv)
    saved = json.loads(Path(args.out).read_text()) if os.path.exists(args.out) else {"sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for sites in args.sites:
            threads = args.threads if args.threads and args.threads < sites else None
            key = str(sites) if threads is None else f"{sites} (-t {threads})"
            if key in saved["sizes"]:
                continue  # resumable: one size at a time
            print(f"{key} sites ...", flush=True)
            command = " ".join(["python", "benchmarks/scale.py", *sys.argv[1:]])
            saved["sizes"][key] = {**measure(sites, args.rounds, tmp, threads), "command": command}
            saved.update(command=" ".join(["python", "benchmarks/scale.py", *sys.argv[1:]]), versions=versions())
            with open(args.out, "w") as f:
                json.dump(saved, f, indent=2)
            print(json.dumps(saved["sizes"][key]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
