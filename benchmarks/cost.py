"""What a round costs, method by method, side by side with FedAvg, NVFlare's own FedAvg and the physical limit.

Each method's job, FedAvg's job on the same dataset (jobs/fedavg with the method's `dataset`; every other argument is
the same) and NVFlare's own FedAvg on that dataset (`FedAvgRecipe` with a Client API script that trains as fairfl's
sites do: benchmarks/nvflare_fedavg_client.py) run one after the other, FedAvg, the method, NVFlare's (A B C), then
C B A in the next repeat, `--repeats` times, at the default six sites, with `--rounds` rounds (fairfl's evaluated at
the end only; NVFlare's not evaluated). A run's round time is the median of the rounds that neither start the sites
(round 0) nor evaluate (the last); a pair's ratio is the method's over FedAvg's. The phases come from what the server
records each round (`phases`: the train task, its own step, the evaluation; docs/results.md) and what the sites
report (`train_seconds`, and the method's own site work: `probe_seconds`, `prototype_seconds`,
`personal_train_seconds`). NVFlare's round runs from its ROUND_STARTED event to AFTER_AGGREGATION (recorded by
benchmarks/nvflare_fedce_client.py's FedCERoundRecorder), as fairfl's runs from sending the train task to writing
the round's record: neither counts saving the global model.

CPU seconds a round beside the wall time, so that a contended machine neither hides nor invents overhead: what every
process of the run spent between the end of the round before and the end of this one (benchmarks/cost_floor.py's
TreeCPU; in fairfl's runs a round ends when the results file first holds its record, in NVFlare's at its
AFTER_AGGREGATION).

The floors are the same local training without FLARE, after each repeat's runs, with a barrier per round, in two
layouts: the sites split evenly over `--cores` processes (`per_core_balanced`, the machine's limit) and one process per
site (`per_site_barrier`, a federation of one-machine sites sharing this machine's cores): benchmarks/cost_floor.py.

    python benchmarks/cost.py --repeats 2 --rounds 6 --out benchmarks/results/cost
    python benchmarks/cost.py --methods fedavg --repeats 3   # FedAvg, NVFlare's FedAvg and the floors only
    python benchmarks/cost.py --methods ditto fedfloor_minimax apfl --fedavg-only --out /tmp/cost  # arms vs FedAvg
    python benchmarks/cost.py --methods fedfloor --fedavg-only --dataset ich_imbalanced --sites 10 --out /tmp/ich

`--methods` takes any variant `fairfl benchmark` runs (its job with the variant's arguments, on the job's dataset, or
on `--dataset`: a built-in dataset of a family every method runs on, with its dataset defaults as `fairfl benchmark`
applies them; its --out folder must hold no run on another dataset). Before anything runs, a folder is refused that
keeps a run with other --sites, or a run this call would keep on another dataset (without --dataset the default
methods' jobs span several datasets, each kept pair on its own). Each run and summary row records its dataset and
sites, which benchmarks/worst_off.py matches against a benchmark's.

Resumable: finished runs are kept in OUT/runs.json and not run again; SUMMARY.md and summary.json are rewritten from
them after every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: inherited by every simulator and floor process
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import nvflare_fedavg_client as site_training  # noqa: E402  (benchmarks/nvflare_fedavg_client.py)
from cost_floor import (  # noqa: E402  (benchmarks/cost_floor.py)
    BALANCED,
    JOBS,
    PER_SITE,
    TreeCPU,
    cpu_per_round,
    floor,
    floor_layouts,
    median_of,
    round_ends,
    round_periods,
)

from fairfl.data.builtin import BUILTIN_DATASETS, builtin_dataset  # noqa: E402
from fairfl.methods import VARIANTS, variant_job  # noqa: E402

METHODS = ("fedprox", "ditto", "fedlwr", "fedce", "fedism_plus", "fednpr", "fedfloor")  # the default; any variant runs
FEDAVG, PEER = "fedavg", "nvflare_fedavg"  # fairfl's FedAvg job and NVFlare's own FedAvg (FedAvgRecipe, Client API)
# round time / FedAvg's: the cost issue's targets, and FedFloor's goal (at most twice FedAvg's round)
TARGETS = {"fedprox": 1.05, "ditto": 2.05, "fedlwr": 1.3, "fedce": 1.2, "fedfloor": 2.0}
FLOOR_TARGET = 1.05  # FedAvg's round / the balanced floor's, wall (idle machine) and CPU alike
SITE_EXTRA = ("probe_seconds", "prototype_seconds", "personal_train_seconds")  # a method's own work at a site
NVFLARE_CLIENT = os.path.join(HERE, "nvflare_fedavg_client.py")


def job_args(job: str) -> tuple[dict, dict]:
    """The server controller's and the site executor's arguments of jobs/<job>."""
    return site_training.job_args(JOBS, job)


PHASES = ("round", "train_task", "server_step", "slowest_site_training", "all_sites_training", "all_sites_method_work")


def counted(results: dict) -> list:
    """The round records that neither start the sites (round 0) nor evaluate (or stop the run)."""
    return [r for r in results["rounds"][1:] if not r.get("per_site") and not r.get("stopped")]


def round_costs(results: dict) -> dict:
    """Medians over the rounds that neither start the sites nor evaluate: the round, its phases, the sites'
    training (the slowest site and all sites together) and the method's own site work (all sites together)."""
    rounds = counted(results)

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


# ------------------------------------------------------------------------------------------------------ the runs
def run_job(method: str, dataset: str, rounds: int, sites: int, tmp: str) -> dict:
    """fairfl's `method` (a variant: its job with its arguments) on `dataset` through `nvflare simulator`: its round
    costs, CPU seconds a round and whole time."""
    from fairfl.jobconfig import customize_job

    job, arguments = job_of(method, dataset)
    folder = os.path.join(tmp, f"{method}-{dataset}")
    args = {
        **arguments,
        "num_rounds": rounds,
        "eval_every": rounds,
        "dataset": dataset,  # FedAvg on the method's dataset
    }
    customize_job(os.path.join(JOBS, job), folder + "-job", args)
    return measure_job(folder + "-job", folder + "-ws", sites, f"{method} on {dataset}")


def job_of(method: str, dataset: str = "") -> tuple[str, dict]:
    """(job, arguments) of `method`: a variant's (fairfl.methods.variant_job), else the job of that name as it is
    (jobs/fedce, jobs/fedism_plus: the default methods)."""
    return variant_job(method, dataset) if method in VARIANTS else (method, {})


def method_dataset(method: str) -> str:
    """The dataset the method's job runs by default."""
    return job_args(job_of(method)[0])[0]["dataset"]


def dataset_problem(dataset: str, methods: list[str], sites: int) -> str | None:
    """Why `methods` cannot all run on built-in `dataset` with `sites` sites (None: they can). Only variants name the
    families they run on (fairfl.methods.VARIANTS): a plain job keeps its own dataset."""
    from fairfl.benchmark.runner import family

    kind = family(dataset)
    for method in methods:
        if method not in VARIANTS:
            return f"--dataset {dataset}: {method} is a job, not a variant: it runs on its own dataset"
        if kind not in VARIANTS[method].families:
            return f"--dataset {dataset}: {method} does not run on the {kind} family's datasets"
    least = builtin_dataset(dataset).min_sites
    return f"--dataset {dataset} needs --sites {least} or more" if sites < least else None


def paired_jobs(method: str, fedavg_only: bool) -> list[str]:
    """The runs a repeat of `method` makes, in their first order: FedAvg, the method, NVFlare's FedAvg."""
    return [FEDAVG, *([method] if method != FEDAVG else []), *([] if fedavg_only else [PEER])]


def planned_datasets(args) -> dict:
    """{run key: the dataset it runs on} of every run this call would make (kept ones included)."""
    planned = {}
    for repeat in range(args.repeats):
        for method in args.methods:
            for job in paired_jobs(method, args.fedavg_only):
                planned[f"{job}@{method}#{repeat}"] = args.dataset or method_dataset(method)
    return planned


def kept_elsewhere(kept: dict, planned: dict, dataset: str | None, sites: int) -> str | None:
    """Why the runs kept in an --out folder may not be joined by this call's (None: they may): any kept run with other
    sites (the summary pairs every kept run of a method), a kept run this call would keep on another dataset, or,
    with --dataset, any kept run on another dataset (a pair's FedAvg on one dataset and its method on another would
    be compared)."""
    for key, run in kept.items():
        if run.get("sites", sites) != sites:  # runs before `sites` was recorded: not known
            return f"{key} ran with {run['sites']} sites, not {sites}"
        if dataset and run.get("dataset") != dataset:
            return f"{key} ran on {run.get('dataset')}, not {dataset}"
        if key in planned and run.get("dataset") != planned[key]:
            return f"{key} ran on {run.get('dataset')}, not {planned[key]}"
    return None


def measure_job(job_folder: str, workspace: str, sites: int, name: str) -> dict:
    """A prepared job folder through `nvflare simulator`: its round costs, CPU seconds a round and whole time, and
    the final per-site scores (`final`)."""
    from fairfl.results import SIMULATOR_RESULTS
    from fairfl.simulate import run_simulator

    # a workspace used before still holds that run's results file, whose rounds the sampler would take for this
    # run's (every round ending at once: no CPU a round)
    shutil.rmtree(workspace, ignore_errors=True)
    started = time.time()
    with TreeCPU(watch=os.path.join(workspace, SIMULATOR_RESULTS)) as tree:
        run = run_simulator(job_folder, workspace, n_clients=sites, timeout=3600)
    if not run.ok:
        raise RuntimeError(f"{name}: {run.describe_failure()}")
    results = json.loads(Path(run.results_path).read_text())
    ends = round_ends(tree.changes, len(results["rounds"]))
    cpu = cpu_per_round(tree.samples, ends)
    periods = round_periods(ends)
    rounds_counted = [r["round"] for r in counted(results)]
    return {
        **round_costs(results),
        **cpu_costs(cpu, periods, rounds_counted, tree),
        "wall": round(time.time() - started, 1),
        "final": results.get("final", {}).get("per_site"),
    }


def cpu_costs(cpu: list, periods: list, rounds_counted: list[int], tree: TreeCPU) -> dict:
    """A run's CPU seconds a round (the median over the counted rounds, each listed) and the wall time between the
    ends of successive rounds (the median; what the CPU was measured over)."""
    return {
        "cpu": median_of(cpu[k] for k in rounds_counted),
        "cpu_rounds": [cpu[k] for k in rounds_counted],
        "period": median_of(periods[k] for k in rounds_counted),
        "sampler_cpu": round(tree.own_cpu, 3),
    }


def run_nvflare_fedavg(dataset: str, rounds: int, sites: int, tmp: str) -> dict:
    """NVFlare's own FedAvg (`FedAvgRecipe`, SimEnv, one process per site, in-process Client API) with
    benchmarks/nvflare_fedavg_client.py training each site as fairfl's executor does, from the same seeded initial
    model, with jobs/fedavg's task intervals; its rounds' times, CPU seconds and whole time."""
    import torch
    from fedce_peer import run_recipe  # benchmarks/fedce_peer.py
    from nvflare.app_opt.pt.recipes import FedAvgRecipe
    from nvflare_fedce_client import FedCERoundRecorder  # records every round's start and aggregation

    from fairfl.models import build_model

    intervals = site_training.job_intervals(JOBS)

    class Recipe(FedAvgRecipe):
        """FedAvgRecipe whose controller checks for answers as often as jobs/fedavg's (NVFlare's FedProxRecipe passes
        its own controller argument the same way)."""

        def _get_controller_kwargs(self):
            return {**super()._get_controller_kwargs(), "task_check_period": intervals["task_check_period"]}

    run_dir = os.path.join(tmp, f"{PEER}-{dataset}")
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    os.makedirs(run_dir)
    trainer = site_training.FedAvgSites(JOBS, dataset, sites, [])
    model = build_model(trainer.model_spec())
    model.load_state_dict({k: torch.as_tensor(v) for k, v in trainer.initial_params().items()})
    checkpoint = os.path.join(run_dir, "initial_model.pt")
    torch.save(model.state_dict(), checkpoint)
    recipe = Recipe(
        name=PEER,
        model=site_training.model_config(trainer.model_spec()),
        initial_ckpt=os.path.relpath(checkpoint),  # relative: bundled into the server app (fedce_peer.py says why)
        min_clients=sites,
        num_rounds=rounds,
        train_script=NVFLARE_CLIENT,
        train_args=site_training.train_args(JOBS, dataset, sites, os.path.join(run_dir, "sites")),
    )
    recipe.add_server_config({"server": {"task_request_interval": intervals["task_request_interval"]}})
    # the recipe has no public hook for a server component; NVFlare's recipe utilities use _job the same way
    recipe._job.to_server(FedCERoundRecorder(), id="round_recorder")
    with TreeCPU() as tree:
        run, rounds_file = run_recipe(recipe, sites, run_dir, f"NVFlare's FedAvg on {dataset}")
    wall = run.seconds
    records = sorted(json.loads(Path(rounds_file).read_text()), key=lambda r: r["round"])
    if [r["round"] for r in records] != list(range(rounds)):
        raise RuntimeError(f"NVFlare's FedAvg on {dataset}: rounds {[r['round'] for r in records]} of {rounds}")
    ends = [r["aggregated"] for r in records]
    cpu = cpu_per_round(tree.samples, ends)
    periods = round_periods(ends)
    training = nvflare_site_training(os.path.join(run_dir, "sites"), rounds)
    rounds_counted = list(range(1, rounds - 1))  # as fairfl's: not round 0, not the last
    return {
        "rounds": len(rounds_counted),
        "round": median_of(records[k]["seconds"] for k in rounds_counted),
        **{k: None for k in ("train_task", "server_step", "all_sites_method_work")},
        "slowest_site_training": median_of(max(training[k], default=None) for k in rounds_counted),
        "all_sites_training": median_of(sum(training[k]) if training[k] else None for k in rounds_counted),
        **cpu_costs(cpu, periods, rounds_counted, tree),
        "wall": round(wall, 1),
    }


def nvflare_site_training(sites_dir: str, rounds: int) -> list[list[float]]:
    """Each round's `train_seconds` at every site of an NVFlare FedAvg run (the sites' logs)."""
    training: list[list[float]] = [[] for _ in range(rounds)]
    for site in sorted(os.listdir(sites_dir)):
        log = json.loads(Path(sites_dir, site, site_training.SITE_LOG).read_text())
        for record in log["rounds"]:
            if 0 <= record["round"] < rounds and "train_seconds" in record:
                training[record["round"]].append(record["train_seconds"])
    return training


# -------------------------------------------------------------------------------------------------- the summary
def fmt(value, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and math.isfinite(value) else "–"


def ratio(a, b) -> float | None:
    return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def floor_table(runs: dict, floors: dict) -> dict:
    """Per dataset: FedAvg's, NVFlare's FedAvg's and both floors' round and CPU (medians over the runs), each over
    each floor's."""
    table = {}
    datasets = {r.get("dataset") for r in runs.values() if r.get("dataset")}
    datasets |= {k.split("#")[0] for k in floors if k.split("#")[1:2] in ([BALANCED], [PER_SITE])}
    for dataset in sorted(datasets):
        rows = {}
        for kind in (FEDAVG, PEER):
            mine = [r for k, r in runs.items() if k.startswith(f"{kind}@") and r.get("dataset") == dataset]
            if mine:
                rows[kind] = {"runs": len(mine), "round": median_of(r.get("round") for r in mine)}
                rows[kind]["cpu"] = median_of(r.get("cpu") for r in mine)
        for layout in (BALANCED, PER_SITE):
            mine = [f for k, f in floors.items() if k.startswith(f"{dataset}#{layout}#")]
            if mine:
                rows[layout] = {
                    "runs": len(mine),
                    "round": median_of(f.get("round") for f in mine),
                    "cpu": median_of(f.get("cpu") for f in mine),
                    "processes": mine[-1].get("processes"),
                    "split": mine[-1].get("split"),
                    "round_robin_split": mine[-1].get("round_robin_split"),
                }
        for row in rows.values():
            for layout in (BALANCED, PER_SITE):
                base = rows.get(layout, {})
                row[f"round_over_{layout}"] = ratio(row["round"], base.get("round")) if row is not base else None
                row[f"cpu_over_{layout}"] = ratio(row["cpu"], base.get("cpu")) if row is not base else None
        table[dataset] = rows
    return table


ROW_NAMES = {
    FEDAVG: "FedAvg (jobs/fedavg)",
    PEER: "NVFlare FedAvg (Client API)",
    BALANCED: "floor: per core, balanced",
    PER_SITE: "floor: a process per site, barrier",
}


def summarize(runs: dict, floors: dict, command: str = "", versions_text: str = "") -> tuple[dict, str]:
    table = {}
    ran = dict.fromkeys(k.split("@")[1].split("#")[0] for k in runs)  # the default methods first, then any variant
    for method in [m for m in METHODS if m in ran] + [m for m in ran if m not in METHODS and m != FEDAVG]:
        partners = {k: k.replace(f"{method}@", f"{FEDAVG}@", 1) for k in runs if k.startswith(f"{method}@")}
        pairs = [(runs[k], runs[p]) for k, p in partners.items() if p in runs]  # a repeat may be half done
        pairs = [(m, f) for m, f in pairs if m.get("round") and f.get("round")]
        if not pairs:
            continue
        ratios = [m["round"] / f["round"] for m, f in pairs]
        cpu_ratios = [r for r in (ratio(m.get("cpu"), f.get("cpu")) for m, f in pairs) if r is not None]
        table[method] = {
            "dataset": pairs[0][0].get("dataset"),
            "sites": pairs[0][0].get("sites"),
            "pairs": len(pairs),
            "ratio": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios],
            "target": TARGETS.get(method),
            **{k: median_of(m.get(k) for m, _ in pairs) for k in PHASES},
            "fedavg_round": median_of(f["round"] for _, f in pairs),
            "fedavg_all_sites_training": median_of(f.get("all_sites_training") for _, f in pairs),
            "cpu": median_of(m.get("cpu") for m, _ in pairs),
            "fedavg_cpu": median_of(f.get("cpu") for _, f in pairs),
            "cpu_ratio": round(statistics.median(cpu_ratios), 3) if cpu_ratios else None,
        }
    lines = [
        "# Round cost, side by side",
        "",
        f"`{command}` ({versions_text})",
        "",
        "## Round time against FedAvg's",
        "",
        "Seconds, medians over the rounds that neither start the sites nor evaluate, then over the repeats; ratio: "
        "the median of the per-repeat ratios (each listed); CPU: CPU seconds of all the run's processes a round, "
        "and the median of the per-repeat ratios.",
        "",
        "| method | round (s) | FedAvg's (s) | ratio [pairs] | target | CPU (s) | FedAvg's CPU (s) | CPU ratio | train "
        "task | server step | slowest site training | all sites' training | all sites' method work | FedAvg's all "
        "sites' training |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, row in table.items():
        cells = [
            method,
            fmt(row["round"]),
            fmt(row["fedavg_round"]),
            f"{row['ratio']:.2f} {row['ratios']}",
            str(row["target"] or "–"),
            fmt(row["cpu"]),
            fmt(row["fedavg_cpu"]),
            fmt(row["cpu_ratio"]),
            *[fmt(row[k]) for k in PHASES[1:]],
            fmt(row["fedavg_all_sites_training"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    floors_by_dataset = floor_table(runs, floors)
    lines += [
        "",
        "## FedAvg against the same training without FLARE",
        "",
        "Seconds a round and CPU seconds a round (all the run's processes), medians over the counted rounds, then "
        f"over the runs (each row's count). Targets: FedAvg's round at most {FLOOR_TARGET} times the balanced "
        "floor's, wall (idle machine) and CPU alike.",
        "",
        "| dataset | run | runs | round (s) | CPU (s) | round / balanced floor's | CPU / balanced floor's | round / "
        "per-site floor's | CPU / per-site floor's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset, rows in floors_by_dataset.items():
        for kind, row in rows.items():
            cells = [dataset, ROW_NAMES[kind], str(row["runs"]), fmt(row["round"]), fmt(row["cpu"])]
            cells += [fmt(row[f"{m}_over_{layout}"]) for layout in (BALANCED, PER_SITE) for m in ("round", "cpu")]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "- round / balanced floor's, CPU / balanced floor's: the row's round (CPU) over that of the balanced floor, "
        "the sites' training split over one one-thread process per core by optimiser steps, the processes waiting "
        "for each other at the end of every round: the machine's limit.",
        "- round / per-site floor's, CPU / per-site floor's: the row's over that of the floor with one one-thread "
        "process per site and the same barrier: a federation of one-machine sites, sharing this machine's cores.",
    ]
    for dataset, rows in floors_by_dataset.items():
        split = rows.get(BALANCED, {}).get("split")
        robin = rows.get(BALANCED, {}).get("round_robin_split")
        if split:
            described = " | ".join(f"{'+'.join(g['sites'])} ({g['steps']} steps)" for g in split)
            lines.append(
                f"- balanced floor on {dataset}: {described}"
                + (
                    f"; site k to process k % cores: {' | '.join(str(g['steps']) for g in robin)} steps"
                    if robin
                    else ""
                )
            )
    return {"methods": table, "floor_table": floors_by_dataset, "floors": floors}, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=[FEDAVG, *sorted({*METHODS, *VARIANTS} - {FEDAVG})],
        help="variants (fairfl benchmark's names, e.g. fedfloor_minimax); fedavg: no method besides",
    )
    parser.add_argument(
        "--fedavg-only",
        action="store_true",
        help="pair each method with fairfl's FedAvg only: no NVFlare FedAvg, no floors (an arm's cost against FedAvg)",
    )
    parser.add_argument(
        "--dataset",
        choices=sorted(BUILTIN_DATASETS),
        help="run every method on this built-in dataset (default: each method's job's own)",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "cost"))
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: round 0 starts the sites and the last one evaluates")
    if args.dataset:
        problem = dataset_problem(args.dataset, args.methods, args.sites)
        if problem:
            parser.error(problem)
    from fairfl.benchmark.runner import versions

    command = " ".join(["python", "benchmarks/cost.py", *argv])
    os.makedirs(args.out, exist_ok=True)
    saved = os.path.join(args.out, "runs.json")
    state = json.loads(Path(saved).read_text()) if os.path.exists(saved) else {"runs": {}, "floors": {}}

    problem = kept_elsewhere(state["runs"], planned_datasets(args), args.dataset, args.sites)
    if problem:
        raise SystemExit(f"{saved}: {problem}: give these runs their own --out")
    versions_text = versions()

    def save():
        with open(saved + ".tmp", "w") as f:
            json.dump(state, f, indent=1)
        os.replace(saved + ".tmp", saved)
        summary, text = summarize(state["runs"], state["floors"], command, versions_text)
        Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
        Path(args.out, "SUMMARY.md").write_text(text)

    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for method in args.methods:
                dataset = args.dataset or method_dataset(method)
                jobs = paired_jobs(method, args.fedavg_only)
                for job in jobs if repeat % 2 == 0 else reversed(jobs):  # A B C, then C B A
                    key = f"{job}@{method}#{repeat}"
                    if key in state["runs"]:
                        continue
                    print(f"{key}: running ...", flush=True)
                    if job == PEER:
                        record = run_nvflare_fedavg(dataset, args.rounds, args.sites, tmp)
                    else:
                        record = run_job(job, dataset, args.rounds, args.sites, tmp)
                    state["runs"][key] = {**record, "dataset": dataset, "sites": args.sites}
                    save()
            floor_datasets = set() if args.fedavg_only else {args.dataset or method_dataset(m) for m in args.methods}
            for dataset in sorted(floor_datasets):  # beside this repeat's runs
                layouts = None
                for layout in (BALANCED, PER_SITE):
                    key = f"{dataset}#{layout}#{repeat}"
                    if key not in state["floors"]:
                        layouts = layouts or floor_layouts(dataset, args.sites, args.cores)
                        groups, record = layouts[layout]
                        print(f"floor {key} ...", flush=True)
                        state["floors"][key] = {**floor(dataset, args.sites, args.rounds, groups), **record}
                        save()
    save()  # also rewrites the summary of runs that were all kept
    print(Path(args.out, "SUMMARY.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
