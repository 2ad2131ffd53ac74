"""A benchmark run: every (seed, method) run of a task through the NVIDIA FLARE simulator (a finished one kept), the
reports of each metric, summary.json and SUMMARY.md."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from fairfl.benchmark.checks import training_checks
from fairfl.benchmark.claims import check_claims
from fairfl.benchmark.run_statistics import (
    final_stat,
    mean_weights,
    round_seconds_median,
    shared_settings,
    site_settings,
    test_split_errors,
    train_diagnostics,
)
from fairfl.benchmark.summary import summary_markdown
from fairfl.data.builtin import builtin_dataset, shared_test_set
from fairfl.jobconfig import JOBS
from fairfl.methods import FAMILY_METRICS, VARIANTS, family_claims, variant_job
from fairfl.report.document import make_report
from fairfl.report.runs import group_name_markdown
from fairfl.report.statistics import mean_sd
from fairfl.results import SIMULATOR_RESULTS
from fairfl.simulate import run_unless_finished

# the papers' comparisons: which papers, how many sites; the metrics (the first is the run's own), methods and
# claims of each come from the method registry (fairfl.methods)
FAMILIES = {
    "segmentation": {"papers": "Fed-LWR Tables 1-2, FedCE Tables 1-3"},
    "quality_shift": {"papers": "FedISM+ Tables II-IV", "sites": 20},  # the paper's 20 clients, the last 20% corrupted
    "imbalanced": {"papers": "FedNPR Table III"},
}


def family(dataset: str) -> str:
    data = builtin_dataset(dataset)
    if data.task == "segmentation":
        return "segmentation"
    return "imbalanced" if dataset.endswith("_imbalanced") else "quality_shift"


def job_arguments(dataset: str, method: str, seed: int, rounds: int, eval_every: int, extra: dict) -> dict:
    return {
        "num_rounds": rounds,
        "eval_every": eval_every,
        "seed": seed,
        "dataset": dataset,
        **variant_job(method, dataset)[1],
        **extra,
    }


def versions() -> str:
    import monai
    import nvflare
    import torch

    return (
        f"nvflare {nvflare.__version__}, torch {torch.__version__}, monai {monai.__version__}, "
        f"{os.cpu_count()} CPU cores" + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "")
    )


def run_name(dataset: str, method: str, seed: int) -> str:
    return f"{dataset}-{method}-seed{seed}"


def earlier_runs(out: Path, dataset: str, methods: list, seeds: list, rounds, eval_every, sites, extra) -> tuple:
    """The finished runs in out/runs of methods other than `methods`, from earlier calls into the folder: ({(seed,
    method): results path} of those with this call's settings (the seeds asked, the job arguments checked as a
    resumed run's are, the number of sites), [names of those with other settings])."""
    found, other = {}, []
    for method in (m for m in VARIANTS if m not in methods):
        for seed in seeds:
            workspace = out / "runs" / run_name(dataset, method, seed)
            try:
                results = json.loads((workspace / SIMULATOR_RESULTS).read_text())
            except (OSError, ValueError):
                continue
            if not results.get("final"):
                continue
            try:  # a finished run is only read here, never run again
                arguments = job_arguments(dataset, method, seed, rounds, eval_every, extra)
                run_unless_finished(JOBS / variant_job(method)[0], workspace, sites, arguments)
                ran_sites = len(results.get("sites") or []) + len(results.get("held_out_sites") or [])
                if ran_sites != sites:
                    raise ValueError(f"{ran_sites} sites")
            except ValueError:
                other.append(workspace.name)
                continue
            found[seed, method] = workspace / SIMULATOR_RESULTS
    return found, other


def run_benchmark(
    dataset: str,
    methods: list,
    seeds: list,
    rounds: int,
    eval_every: int,
    sites: int,
    out,
    extra: dict | None = None,
    loo: bool = False,
    command: str = "",
    log=print,
) -> dict:
    """Run (or keep) every (seed, method) run, then write the outputs; returns the summary dict."""
    unknown = sorted(set(methods) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; known: {', '.join(VARIANTS)}")
    out, extra = Path(out).resolve(), dict(extra or {})
    kind = family(dataset)
    plan = [(seed, method) for seed in seeds for method in methods]  # seeds outermost: a partial run stays comparable
    paths, took = {}, []
    for number, (seed, method) in enumerate(plan, 1):
        workspace = out / "runs" / run_name(dataset, method, seed)
        left = len(plan) - number + 1
        eta = f", about {statistics.median(took) * left / 60:.0f} min left" if took else ""
        log(f"[{number}/{len(plan)}] {group_name_markdown(method)}, seed {seed}{eta}", flush=True)
        started = time.time()
        finished_before = (workspace / SIMULATOR_RESULTS).is_file()
        results = run_unless_finished(
            JOBS / variant_job(method)[0],
            workspace,
            sites,
            job_arguments(dataset, method, seed, rounds, eval_every, extra),
        )
        if not (finished_before and results.get("final")):
            took.append(time.time() - started)
        paths[seed, method] = workspace / SIMULATOR_RESULTS
    loo_file = None
    if loo:
        from fairfl.loo import run_leave_one_out

        log(f"leave-one-out values (FedAvg, seed {seeds[0]}): {sites + 1} runs", flush=True)
        loo_file = run_leave_one_out(
            JOBS / "fedavg", out / "loo", sites, job_arguments(dataset, "fedavg", seeds[0], rounds, eval_every, extra)
        )
    earlier, other_settings = earlier_runs(out, dataset, methods, seeds, rounds, eval_every, sites, extra)
    paths.update(earlier)
    covered = [*methods, *dict.fromkeys(m for _, m in earlier)]
    metrics = list(FAMILY_METRICS[kind])
    all_paths = [paths[s, m] for m in covered for s in seeds if (s, m) in paths]
    reports = {metric: make_report(all_paths, out / metric, metric=metric, loo=loo_file) for metric in metrics}
    runs = {key: json.loads(path.read_text()) for key, path in paths.items()}
    runs_by_method = {m: [runs[s, m] for s in seeds if (s, m) in runs] for m in covered}
    # SIMULATOR_RESULTS lies three levels under the run's workspace
    settings = [site_settings(paths[key].parents[2], run) for key, run in runs.items()]
    summary = {
        "command": command,
        "versions": versions(),
        "dataset": dataset,
        "family": kind,
        "papers": FAMILIES[kind]["papers"],
        "methods": covered,
        # the methods this call did not name, whose runs with its settings the folder held from earlier calls
        "earlier_methods": covered[len(methods) :],
        "other_settings_runs": other_settings,
        "seeds": list(seeds),
        "rounds": rounds,
        "eval_every": eval_every,
        "sites": sites,
        "data_root": extra.get("data_root", ""),
        "extra": extra,
        "site_settings": shared_settings(settings),
        "metrics": metrics,
        "results": {
            m: {
                metric: {
                    stat: mean_sd(v for v in (final_stat(r, metric, stat) for r in runs) if v is not None)
                    for stat in ("avg", "std")
                }
                for metric in metrics
            }
            for m, runs in runs_by_method.items()
        },
        "round_seconds": {m: round_seconds_median(runs) for m, runs in runs_by_method.items()},
        "test_split_errors": {metric: test_split_errors(runs_by_method, metric) for metric in metrics},
        "mean_weights": {m: mean_weights(runs) for m, runs in runs_by_method.items()},
        "diagnostics": {m: train_diagnostics(runs) for m, runs in runs_by_method.items()},
        "warnings": training_checks(runs_by_method, metrics),
        "claims": check_claims(family_claims(kind), runs_by_method, shared_test_set(dataset, extra.get("data_root"))),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "SUMMARY.md").write_text(summary_markdown(summary, reports))
    log(f"summary: {out / 'SUMMARY.md'}", flush=True)
    return summary
