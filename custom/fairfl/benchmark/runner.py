"""A benchmark run: every (seed, method) run of a task through the NVIDIA FLARE simulator (a finished one kept), the
reports of each metric, summary.json and SUMMARY.md."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from fairfl.benchmark.claims import check_claims
from fairfl.benchmark.run_statistics import (
    final_stat,
    mean_weights,
    round_seconds_median,
    test_split_errors,
    train_diagnostics,
)
from fairfl.benchmark.summary import summary_markdown
from fairfl.data.builtin import builtin_dataset
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
        workspace = out / "runs" / f"{dataset}-{method}-seed{seed}"
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
    metrics = list(FAMILY_METRICS[kind])
    all_paths = [paths[s, m] for m in methods for s in seeds]
    reports = {metric: make_report(all_paths, out / metric, metric=metric, loo=loo_file) for metric in metrics}
    runs_by_method = {m: [json.loads(paths[s, m].read_text()) for s in seeds] for m in methods}
    summary = {
        "command": command,
        "versions": versions(),
        "dataset": dataset,
        "family": kind,
        "papers": FAMILIES[kind]["papers"],
        "methods": methods,
        "seeds": list(seeds),
        "rounds": rounds,
        "eval_every": eval_every,
        "sites": sites,
        "data_root": extra.get("data_root", ""),
        "extra": extra,
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
        "claims": check_claims(family_claims(kind), runs_by_method),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "SUMMARY.md").write_text(summary_markdown(summary, reports))
    log(f"summary: {out / 'SUMMARY.md'}", flush=True)
    return summary
