"""What a round costs, method by method, side by side with FedAvg and against the physical limit.

Each method's job and FedAvg's job on the same dataset (jobs/fedavg with the method's `dataset`; every other
argument is the same in both) run one after the other (A B A B ...), `--repeats` times, at the default six sites,
with `--rounds` rounds evaluated at the end only. A pair's ratio is the method's median round time over FedAvg's,
from the rounds that neither start the sites (round 0) nor evaluate (the last). The phases come from what the
server records each round (`phases`: the train task, its own step, the evaluation; docs/results.md) and what the
sites report (`train_seconds`, and the method's own site work: `probe_seconds`, `prototype_seconds`,
`personal_train_seconds`).

The floor is the same local training without FLARE: the executor's own train step (same data, model, optimiser,
loss and seeds as in a run) called for every site in a plain loop, after each repeat's runs, in two layouts: the
sites spread over `--cores` processes of one thread each (the machine's physical limit), and one one-thread process
per site, as the simulator runs them (what six processes sharing two cores cost by themselves). FedAvg's round time
over a floor's is what orchestration adds.

    python benchmarks/cost.py --repeats 2 --rounds 6 --out benchmarks/results/cost

Resumable: finished runs are kept in OUT/runs.json and not run again; SUMMARY.md and summary.json are rewritten from
them after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fairfl.benchmark.runner import versions
from fairfl.jobconfig import CLIENT_CONFIG, SERVER_CONFIG, customize_job
from fairfl.simulate import run_simulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("fedprox", "ditto", "fedlwr", "fedce", "fedism_plus", "fednpr", "fedfloor")
# round time / FedAvg's: the cost issue's targets, and FedFloor's goal (at most twice FedAvg's round)
TARGETS = {"fedprox": 1.1, "ditto": 2.1, "fedlwr": 1.3, "fedce": 1.2, "fedfloor": 2.0}
SITE_EXTRA = ("probe_seconds", "prototype_seconds", "personal_train_seconds")  # a method's own work at a site


def job_args(job: str) -> tuple[dict, dict]:
    """The server controller's and the site executor's arguments of jobs/<job>."""
    server = json.loads(Path(REPO, "jobs", job, SERVER_CONFIG).read_text())["workflows"][0]["args"]
    client = json.loads(Path(REPO, "jobs", job, CLIENT_CONFIG).read_text())["executors"][0]["executor"]["args"]
    return server, client


PHASES = ("round", "train_task", "server_step", "slowest_site_training", "all_sites_training", "all_sites_method_work")


def median_of(values) -> float | None:
    """The median of the values that are numbers (a run recorded before phases were: None)."""
    values = [v for v in values if isinstance(v, (int, float))]
    return round(statistics.median(values), 3) if values else None


def round_costs(results: dict) -> dict:
    """Medians over the rounds that neither start the sites nor evaluate: the round, its phases, the sites'
    training (the slowest site and all sites together) and the method's own site work (all sites together)."""
    rounds = [r for r in results["rounds"][1:] if not r.get("per_site") and not r.get("stopped")]

    def site_seconds(record, keys):
        return [sum(m.get(k, 0.0) for k in keys) for m in record.get("train", {}).values()]

    return {
        "rounds": len(rounds),
        "round": median_of(r["seconds"] for r in rounds),
        "train_task": median_of(r.get("phases", {}).get("train_task") for r in rounds),
        "server_step": median_of(r.get("phases", {}).get("server_step") for r in rounds),
        "slowest_site_training": median_of(max(site_seconds(r, ["train_seconds"]), default=None) for r in rounds),
        "all_sites_training": median_of(sum(site_seconds(r, ["train_seconds"])) for r in rounds),
        "all_sites_method_work": median_of(sum(site_seconds(r, SITE_EXTRA)) for r in rounds),
    }


def run_job(job: str, dataset: str, rounds: int, sites: int, tmp: str) -> dict:
    folder = os.path.join(tmp, f"{job}-{dataset}")
    args = {"num_rounds": rounds, "eval_every": rounds, "dataset": dataset}  # FedAvg on the method's dataset
    customize_job(os.path.join(REPO, "jobs", job), folder + "-job", args)
    started = time.time()
    run = run_simulator(folder + "-job", folder + "-ws", n_clients=sites, timeout=3600)
    if not run.ok:
        raise RuntimeError(f"{job} on {dataset}: {run.describe_failure()}")
    return {**round_costs(json.load(open(run.results_path))), "wall": round(time.time() - started, 1)}


# ---------------------------------------------------------------------------------------------------- the floor
def floor_worker(dataset: str, sites: list[str], num_sites: int, rounds: int) -> None:
    """Train `sites` for `rounds` rounds with the executor's own train step, no FLARE; print each round's seconds
    (JSON) after a first round that loads the data (not counted, as in the runs)."""
    import torch
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    from fairfl.flare import protocol
    from fairfl.flare.executor import FairflExecutor
    from fairfl.flare.site_task import SiteTask
    from fairfl.methods.fedavg.controller import FedAvgController
    from fairfl.models import initial_state
    from fairfl.presets import apply_preset
    from fairfl.training import configure_threads

    server, client = job_args("fedavg")
    controller = FedAvgController(**{**server, "dataset": dataset})
    controller.settings = controller.settings.with_preset()
    meta = {**controller.common_task_meta([f"site-{k + 1}" for k in range(num_sites)])}
    meta[protocol.START_FROM] = protocol.FROM_GLOBAL
    params = {
        k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in initial_state(controller.model_spec(), 0).items()
    }
    executors = {site: FairflExecutor(**client) for site in sites}
    for executor in executors.values():  # what the executor does on every task before its handler
        apply_preset(executor, executor.preset, controller.task)
    configure_threads(client["num_threads"])
    seconds = []
    with tempfile.TemporaryDirectory() as state:
        for round_num in range(rounds):
            started = time.time()
            for site, executor in executors.items():
                task = FLModel(params_type=ParamsType.FULL, params=params, current_round=round_num, meta=meta)
                executor._train(SiteTask.of(site, task), os.path.join(state, site))
            seconds.append(time.time() - started)
    print(json.dumps(seconds[1:]))


def floor(dataset: str, num_sites: int, rounds: int, cores: int) -> dict:
    """Median seconds of a round of every site's local training without FLARE, over `cores` one-thread processes."""
    groups = [[f"site-{k + 1}" for k in range(num_sites) if k % cores == c] for c in range(cores)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--floor-worker", dataset, str(num_sites), str(rounds), *group],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for group in groups
        if group
    ]
    per_worker = [json.loads(w.communicate()[0].strip().splitlines()[-1]) for w in workers]
    if any(w.returncode for w in workers):
        raise RuntimeError("a floor worker failed")
    # a round ends when the slowest process is done
    per_round = [max(values) for values in zip(*per_worker, strict=True)]
    return {"round": round(statistics.median(per_round), 3), "rounds": per_round, "processes": cores}


# -------------------------------------------------------------------------------------------------- the summary
def summarize(runs: dict, floors: dict) -> tuple[dict, str]:
    table = {}
    for method in METHODS:
        partners = {k: k.replace(f"{method}@", "fedavg@", 1) for k in runs if k.startswith(f"{method}@")}
        pairs = [(runs[k], runs[p]) for k, p in partners.items() if p in runs]  # a repeat may be half done
        pairs = [(m, f) for m, f in pairs if m["round"] and f["round"]]
        if not pairs:
            continue
        ratios = [m["round"] / f["round"] for m, f in pairs]
        table[method] = {
            "pairs": len(pairs),
            "ratio": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios],
            "target": TARGETS.get(method),
            **{k: median_of(m[k] for m, _ in pairs) for k in PHASES},
            "fedavg_round": statistics.median(f["round"] for _, f in pairs),
            "fedavg_all_sites_training": median_of(f["all_sites_training"] for _, f in pairs),
        }
    lines = [
        "# Round cost, side by side",
        "",
        f"`{' '.join(['python', 'benchmarks/cost.py', *sys.argv[1:]])}` ({versions()})",
        "",
        "## Round time against FedAvg's",
        "",
        "Seconds, medians over the rounds that neither start the sites nor evaluate, then over the repeats; ratio: "
        "the median of the per-repeat ratios (each listed).",
        "",
        "| method | round (s) | FedAvg's (s) | ratio [pairs] | target | train task | server step | slowest site "
        "training | all sites' training | all sites' method work | FedAvg's all sites' training |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, row in table.items():
        cells = [f"{row[k]:.2f}" if row[k] is not None else "–" for k in PHASES]
        ratio = f"{row['ratio']:.2f} {row['ratios']}"
        lines.append(f"| {method} | {cells[0]} | {row['fedavg_round']:.2f} | {ratio} | {row['target'] or '–'} | ")
        fedavg_training = row["fedavg_all_sites_training"]
        lines[-1] += " | ".join([*cells[1:], f"{fedavg_training:.2f}" if fedavg_training is not None else "–"]) + " |"
    lines += [
        "",
        "## FedAvg against the same training without FLARE",
        "",
        "| dataset | FedAvg round (s) | floor, a process per core (s) | FedAvg / floor | floor, a process per site (s) "
        "| FedAvg / floor |",
        "|---|---|---|---|---|---|",
    ]
    for dataset in sorted({r["dataset"] for r in runs.values()}):
        fedavg = median_of(r["round"] for k, r in runs.items() if k.startswith("fedavg@") and r["dataset"] == dataset)
        cells = [dataset, f"{fedavg:.2f}"]
        for layout in ("per_core", "per_site"):
            measured = median_of(f["round"] for k, f in floors.items() if k.startswith(f"{dataset}#{layout}#"))
            cells += [f"{measured:.2f}", f"{fedavg / measured:.2f}"] if measured else ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return {"methods": table, "floors": floors}, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--floor-worker"]:
        dataset, num_sites, rounds, *sites = argv[1:]
        floor_worker(dataset, sites, int(num_sites), int(rounds))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "cost"))
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: round 0 starts the sites and the last one evaluates")
    os.makedirs(args.out, exist_ok=True)
    saved = os.path.join(args.out, "runs.json")
    state = json.loads(Path(saved).read_text()) if os.path.exists(saved) else {"runs": {}, "floors": {}}

    def save():
        with open(saved + ".tmp", "w") as f:
            json.dump(state, f, indent=1)
        os.replace(saved + ".tmp", saved)
        summary, text = summarize(state["runs"], state["floors"])
        Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
        Path(args.out, "SUMMARY.md").write_text(text)

    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for method in args.methods:
                dataset = job_args(method)[0]["dataset"]
                for job in (method, "fedavg") if repeat % 2 else ("fedavg", method):  # A B, then B A
                    key = f"{job}@{method}#{repeat}"
                    if key in state["runs"]:
                        continue
                    print(f"{key}: running ...", flush=True)
                    state["runs"][key] = {**run_job(job, dataset, args.rounds, args.sites, tmp), "dataset": dataset}
                    save()
            for dataset in sorted({job_args(m)[0]["dataset"] for m in args.methods}):  # beside this repeat's runs
                for layout, processes in (("per_core", args.cores), ("per_site", args.sites)):
                    key = f"{dataset}#{layout}#{repeat}"
                    if key not in state["floors"]:
                        print(f"floor {key} ...", flush=True)
                        state["floors"][key] = floor(dataset, args.sites, args.rounds, processes)
                        save()
    save()  # also rewrites the summary of runs that were all kept
    print(Path(args.out, "SUMMARY.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
