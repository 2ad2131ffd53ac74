"""The floors and the CPU accounting of the cost benchmark (`benchmarks/cost.py`).

CPU seconds a round: `TreeCPU`, a thread of the benchmark's process, reads the CPU time (user + system) of every
process below it (the simulator, its server and its sites) every 50 ms; a round's CPU is what they spent between the
end of the round before and the end of this one (`cpu_per_round`, linear between samples; in fairfl's runs a round
ends when the results file first holds its record, watched at the same rate; in NVFlare's at its AFTER_AGGREGATION).

The floors are the same local training without FLARE: the executor's own train step (same data, model, optimiser,
loss and seeds as in a run: benchmarks/nvflare_fedavg_client.py's `FedAvgSites`) called for every site in a plain
loop, in processes of one thread that wait for each other at the end of every round (a barrier: the parent starts a
round when every process has finished the one before), so a round is the time from its common start to the last
process finishing it and its CPU the sum over the processes (`barrier_rounds`). Two layouts: `per_core_balanced`,
the sites split over `--cores` processes so that each has as many optimiser steps a round as the split allows
(`balanced_groups`: longest first, then moves and swaps that even them out; never worse than giving site k to
process k % cores), the machine's limit; and `per_site_barrier`, one process per site, what a federation of
one-machine sites costs when they share this machine's cores. The first round (it loads the data) is not counted.

A floor's worker is this file run as `python cost_floor.py --floor-worker DATASET NUM_SITES ROUNDS SITE...`.
Only the standard library is imported at the top.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(os.path.dirname(HERE), "jobs")
sys.path.insert(0, HERE)
import nvflare_fedavg_client as site_training  # noqa: E402  (benchmarks/nvflare_fedavg_client.py)

BALANCED, PER_SITE = "per_core_balanced", "per_site_barrier"  # the floors' layouts (keys of runs.json's floors)
SAMPLE_INTERVAL = 0.05  # seconds between CPU samples
RESCAN_INTERVALS = (0.25, 4.0)  # seconds between looks for new processes: after one found one, at most
FLOOR_TAG = "FLOOR "  # a floor worker's report line on its stdout (other output there is passed over)


def median_of(values) -> float | None:
    """The median of the values that are numbers (a run recorded before phases were: None)."""
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return round(statistics.median(values), 3) if values else None


# ------------------------------------------------------------------------------------ CPU seconds of a process tree
def clean_series(samples) -> list[tuple[float, float]]:
    """(time, cumulative CPU) samples in time order, without samples that are not finite numbers, one per time (the
    last), and never falling (a fall is a process whose CPU left the sum: the running maximum holds it)."""
    pairs = []
    for sample in samples:
        try:
            t, cpu = float(sample[0]), float(sample[1])
        except (TypeError, ValueError, IndexError):
            continue
        if math.isfinite(t) and math.isfinite(cpu):
            pairs.append((t, cpu))
    by_time: dict[float, float] = {}
    for t, cpu in sorted(pairs, key=lambda p: p[0]):
        by_time[t] = cpu
    series, high = [], -math.inf
    for t, cpu in sorted(by_time.items()):
        high = max(high, cpu)
        series.append((t, high))
    return series


def cpu_at(series: list[tuple[float, float]], t: float) -> float | None:
    """The cumulative CPU at time `t`, linear between the samples around it (`clean_series`); None outside them."""
    if not series or not math.isfinite(t) or t < series[0][0] or t > series[-1][0]:
        return None
    lo, hi = 0, len(series) - 1
    while hi - lo > 1:  # series[lo][0] <= t <= series[hi][0]
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if series[mid][0] <= t else (lo, mid)
    (t0, c0), (t1, c1) = series[lo], series[hi]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def cpu_per_round(samples, ends) -> list[float | None]:
    """CPU spent in each round: `ends[k]` is when round k ended (None: unknown); round k's CPU is the CPU between the
    end of round k - 1 and its own end, None for round 0, for a round with an unknown boundary and for one outside
    the samples."""
    series = clean_series(samples)
    per_round: list[float | None] = [None] * len(ends)
    for k in range(1, len(ends)):
        if ends[k] is None or ends[k - 1] is None or ends[k] < ends[k - 1]:
            continue
        start, end = cpu_at(series, ends[k - 1]), cpu_at(series, ends[k])
        if start is not None and end is not None:
            per_round[k] = round(end - start, 3)
    return per_round


def round_ends(changes, count: int) -> list[float | None]:
    """When each of rounds 0..count-1 ended: the first time (`changes`: (time, round numbers the results file held
    then)) the results file held its record; None for a round it never held."""
    ends: list[float | None] = [None] * count
    for t, rounds in sorted(changes, key=lambda c: c[0]):
        for k in rounds:
            if isinstance(k, int) and 0 <= k < count and ends[k] is None:
                ends[k] = t
    return ends


def round_periods(ends) -> list[float | None]:
    """The wall time of each round from the end of the round before to its own (None for round 0 and where a
    boundary is unknown): what `cpu_per_round` measures over."""
    if not ends:
        return []
    periods: list[float | None] = [None]
    for a, b in zip(ends[:-1], ends[1:], strict=True):
        periods.append(round(b - a, 3) if a is not None and b is not None else None)
    return periods


class Sampler:
    """A daemon thread running the subclass's `_run` while a `with` block lasts; `_run` ends when `_stop` is set."""

    def __init__(self, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self):
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class TreeCPU(Sampler):
    """A thread sampling (time, CPU seconds) of every process below this one while a run goes: user + system time of
    each process it has seen, a process's last value kept after it ends (its parent's count of its reaped children
    is not read: that would count it twice). It looks for new processes every RESCAN_INTERVALS[0] seconds, twice as
    long each time it finds none, up to RESCAN_INTERVALS[1] (a look reads every process of the machine); a process
    that starts and ends between two looks is missed. With `watch` (a results file), also (its modification time, the
    rounds it holds) each time it changes. `own_cpu`: what the sampling cost this process, in CPU seconds."""

    def __init__(self, watch: str | None = None, interval: float = SAMPLE_INTERVAL, rescan=RESCAN_INTERVALS):
        import psutil  # here, so that the thread's CPU time is the sampling's alone

        from fairfl.progress import finished_rounds, read_results

        self._psutil, self._rounds_in = psutil, lambda path: [r["round"] for r in finished_rounds(read_results(path))]
        self.watch, self.interval, self.rescan = watch, interval, tuple(rescan)
        self.samples: list[tuple[float, float]] = []
        self.changes: list[tuple[float, list[int]]] = []
        self.own_cpu = 0.0
        super().__init__("tree-cpu")

    def _run(self):
        psutil = self._psutil
        me, seen, last = psutil.Process(), {}, {}
        next_scan, wait, modified = 0.0, self.rescan[0], None
        while True:
            now = time.time()
            if now >= next_scan:
                found = False
                for process in me.children(recursive=True):
                    try:
                        key = (process.pid, process.create_time())
                    except psutil.Error:
                        continue
                    if key not in last:  # new (a process that ended stays in `last`, out of `seen`)
                        seen[key], last[key], found = process, 0.0, True
                wait = self.rescan[0] if found else min(2 * wait, self.rescan[1])
                next_scan = now + wait
            for key, process in list(seen.items()):
                try:
                    times = process.cpu_times()
                    last[key] = times.user + times.system
                except psutil.Error:
                    del seen[key]  # gone: its last value stays in the sum
            self.samples.append((time.time(), sum(last.values())))
            if self.watch:
                try:
                    stat = os.stat(self.watch)
                    version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # rewritten by a rename: a new inode
                except OSError:
                    version = None
                if version is not None and version != modified:
                    modified = version
                    self.changes.append((stat.st_mtime, self._rounds_in(self.watch)))
            if self._stop.wait(self.interval):
                break
        self.own_cpu = time.thread_time()


# ---------------------------------------------------------------------------------------------------- the floors
def round_robin_groups(sites: list[str], cores: int) -> list[list[str]]:
    """Site k to process k % cores (the floor before the balanced one)."""
    return [g for g in ([s for k, s in enumerate(sites) if k % cores == c] for c in range(cores)) if g]


def loads(groups: list[list[str]], work: dict) -> list[float]:
    return [sum(work[s] for s in group) for group in groups]


def balanced_groups(work: dict, cores: int) -> list[list[str]]:
    """`work` ({site: a round's work}, in site order) split over at most `cores` processes, as evenly as it goes:
    longest first (each site to the least loaded process, the first of equals), then single moves and swaps between
    two processes while one makes their loads closer (so the largest load never grows), and where giving site k to
    process k % cores still has the smaller largest load, that. Deterministic; processes with no site are left out;
    each process's sites in site order."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    sites = list(work)
    if not sites:
        return []
    order = {s: k for k, s in enumerate(sites)}
    groups: list[list[str]] = [[] for _ in range(min(cores, len(sites)))]
    load = [0.0] * len(groups)
    for site in sorted(sites, key=lambda s: (-work[s], order[s])):
        target = min(range(len(groups)), key=lambda c: (load[c], c))
        groups[target].append(site)
        load[target] += work[site]
    improved, passes = True, 0
    while improved and passes < 1000:  # every change lowers the sum of squared loads: it ends (the cap: float noise)
        improved, passes = False, passes + 1
        for a in range(len(groups)):
            for b in range(len(groups)):
                if load[a] <= load[b]:
                    continue
                gap = load[a] - load[b]
                move = next((s for s in groups[a] if 0 < work[s] < gap), None)
                if move is not None:
                    groups[a].remove(move)
                    groups[b].append(move)
                    load[a], load[b] = load[a] - work[move], load[b] + work[move]
                    improved = True
                    continue
                swap = next(((x, y) for x in groups[a] for y in groups[b] if 0 < work[x] - work[y] < gap), None)
                if swap is not None:
                    x, y = swap
                    groups[a][groups[a].index(x)], groups[b][groups[b].index(y)] = y, x
                    load[a], load[b] = load[a] - work[x] + work[y], load[b] + work[x] - work[y]
                    improved = True
    groups = [sorted(g, key=order.__getitem__) for g in groups if g]
    robin = round_robin_groups(sites, cores)
    return robin if max(loads(robin, work)) < max(loads(groups, work)) else groups


def barrier_rounds(per_worker: list[list[dict]]) -> list[dict]:
    """Each round of processes that wait for each other at its end: `per_worker[w][k]` is process w's round k
    ({"start", "end", "cpu"}: its times and CPU seconds in the round); a round lasts from the first start (the
    common start) to the last end, and its CPU is the sum over the processes."""
    if not per_worker:
        return []
    rounds = []
    for records in zip(*per_worker, strict=True):
        rounds.append(
            {
                "seconds": round(max(r["end"] for r in records) - min(r["start"] for r in records), 3),
                "cpu": round(sum(r["cpu"] for r in records), 3),
            }
        )
    return rounds


def floor_worker(dataset: str, sites: list[str], num_sites: int, rounds: int) -> None:
    """Train `sites` with the executor's own train step, no FLARE, one round each time the parent writes "go" on
    stdin; after each round, a FLOOR_TAG line on stdout: its start and end (time.time()), its CPU seconds
    (process_time) and each site's seconds."""
    trainer = site_training.FedAvgSites(JOBS, dataset, num_sites, sites)
    params = trainer.initial_params()

    def report(record: dict) -> None:
        print(FLOOR_TAG + json.dumps(record), flush=True)

    report({"ready": sites})
    with tempfile.TemporaryDirectory() as state:
        for round_num in range(rounds):
            if sys.stdin.readline().strip() != "go":
                return  # the parent ended the floor
            started, cpu, seconds = time.time(), time.process_time(), {}
            for site in sites:
                site_started = time.time()
                trainer.train(site, params, round_num, os.path.join(state, site))
                seconds[site] = round(time.time() - site_started, 3)
            end = time.time()
            report(
                {"round": round_num, "start": started, "end": end, "cpu": time.process_time() - cpu, "sites": seconds}
            )


def read_report(worker) -> dict:
    while True:
        line = worker.stdout.readline()
        if not line:
            raise RuntimeError(f"a floor worker ended early (exit code {worker.wait()})")
        if line.startswith(FLOOR_TAG):
            return json.loads(line[len(FLOOR_TAG) :])


def tell(worker, line: str | None) -> None:
    """Write `line` to a floor worker, or close its stdin (None: it ends after the round it is in)."""
    stdin = worker.stdin
    assert stdin is not None
    try:
        if line is None:
            stdin.close()
        else:
            stdin.write(line + "\n")
            stdin.flush()
    except OSError as e:  # BrokenPipeError: it ended
        if line is not None:
            raise RuntimeError(f"a floor worker ended early (exit code {worker.wait()})") from e


def floor(dataset: str, num_sites: int, rounds: int, groups: list[list[str]]) -> dict:
    """Every site's local training without FLARE, `groups` of sites in one one-thread process each, a barrier at the
    end of every round; medians over the rounds after the first."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    workers = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--floor-worker", dataset, str(num_sites), str(rounds), *group],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for group in groups
    ]
    per_worker: list[list[dict]] = [[] for _ in workers]
    try:
        for worker in workers:
            read_report(worker)  # built, before the first round starts
        for _ in range(rounds):
            for worker in workers:  # the barrier: a round starts when every process has finished the one before
                tell(worker, "go")
            for w, worker in enumerate(workers):
                per_worker[w].append(read_report(worker))
    finally:
        for worker in workers:
            tell(worker, None)
        for worker in workers:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    if any(w.returncode for w in workers):
        raise RuntimeError("a floor worker failed")
    measured = barrier_rounds(per_worker)[1:]  # the first round loads the data
    return {
        "round": median_of(r["seconds"] for r in measured),
        "cpu": median_of(r["cpu"] for r in measured),
        "rounds": [r["seconds"] for r in measured],
        "cpu_rounds": [r["cpu"] for r in measured],
        "processes": len(groups),
        "groups": groups,
        "site_seconds": {
            s: median_of(r["sites"][s] for r in records[1:]) for records in per_worker for s in records[0]["sites"]
        },
    }


def floor_layouts(dataset: str, num_sites: int, cores: int) -> dict:
    """The floors' process layouts on `dataset`: {layout: (groups, record of the split)}; the balanced split by
    optimiser steps a round (images to break ties), with k % cores's for comparison."""
    sites = [f"site-{k + 1}" for k in range(num_sites)]
    trainer = site_training.FedAvgSites(JOBS, dataset, num_sites, sites)
    work = {s: trainer.work(s) for s in sites}
    # optimiser steps, images only among equal steps (whole numbers: exact sums)
    balanced = balanced_groups({s: work[s]["steps"] * 10**9 + work[s]["images"] for s in sites}, cores)

    def split(groups):
        return [{"sites": g, **{k: sum(work[s][k] for s in g) for k in ("steps", "images")}} for g in groups]

    record = {"work": work, "split": split(balanced), "round_robin_split": split(round_robin_groups(sites, cores))}
    return {BALANCED: (balanced, record), PER_SITE: ([[s] for s in sites], {"work": work})}


if __name__ == "__main__":
    if sys.argv[1:2] != ["--floor-worker"]:
        sys.exit(f"usage: python {os.path.basename(__file__)} --floor-worker DATASET NUM_SITES ROUNDS SITE...")
    dataset, num_sites, rounds, *sites = sys.argv[2:]
    floor_worker(dataset, sites, int(num_sites), int(rounds))
