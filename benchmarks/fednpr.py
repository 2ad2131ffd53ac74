"""FedNPR benchmark: Solo, FedAvg, FedProx, FedNPR, FedNPR-Per and FedProx + NPR on the built-in class-imbalanced
benchmarks with missing classes (FedNPR's Table I-like six-site skin split and Table II-like ten-site ICH split),
several seeds, through the real NVFlare simulator. Writes FedNPR's Table III (per-site balanced accuracy and
balanced AUC, their mean over sites, mean +/- sd over seeds; Std. across sites too) and the cost of the prototype
step (features + Sinkhorn clustering) as a share of the site's train task.

K per dataset follows the paper: 4 on skin lesions, 2 on ICH. lambda is the job's (1, the NPR weight the authors'
code trained with: it adds the paper's 0.1 / 0.05 instead of multiplying).
Order: every method on every dataset for seed 0, then seed 1, ... Resumable: complete runs are kept.

    python benchmarks/fednpr.py --rounds 30 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fairness import (
    REPO,
    per_seed_final,
    run_job,
    step_shares,
    target_cell,
    variant_summary,  # noqa: E402
    versions,
    write_summary,
)

from fairfl.fairness import summarize  # noqa: E402
from fairfl.methods import display_name, variant_job  # noqa: E402
from fairfl.report.document import make_report  # noqa: E402

METHODS = ("solo", "fedavg", "fedprox", "fednpr", "fednpr_per", "fedprox_npr")  # fairfl.methods
DATASETS = {"skin_imbalanced": 6, "ich_imbalanced": 10}  # dataset -> sites (FedNPR's K per dataset: fairfl.methods)
METRICS = {"balanced_accuracy": "bACC", "auc": "bAUC"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "fednpr"))
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)

    paths = {}
    for seed in args.seeds:
        for dataset in args.datasets:
            sites = DATASETS[dataset]
            for method in args.methods:
                job, extra = variant_job(method, dataset)
                print(f"seed {seed}: {display_name(method)} on {dataset}", flush=True)
                job_args = {"seed": seed, "dataset": dataset, **extra}
                paths[dataset, method, seed] = run_job(
                    job, f"{dataset}-{method}-seed{seed}", job_args, args, n_clients=sites
                )

    summary = {
        "command": " ".join(["python", "benchmarks/fednpr.py"] + (argv if argv is not None else sys.argv[1:])),
        "versions": versions(),
        "rounds": args.rounds,
        "seeds": args.seeds,
        "datasets": {},
    }
    tables = {}
    for dataset in args.datasets:
        runs = {m: [paths[dataset, m, s] for s in args.seeds] for m in args.methods}
        tables[dataset] = {
            metric: make_report(sum(runs.values(), []), os.path.join(args.out, dataset, metric), metric=metric)["table"]
            for metric in METRICS
        }
        summary["datasets"][dataset] = {
            "sites": DATASETS[dataset],
            "methods": {m: method_summary(p) for m, p in runs.items()},
        }
    write_summary(args.out, summary, summary_markdown(summary, tables))


def final_stats(results_path, metric) -> dict:
    """Mean, population std and worst of `metric` across sites at the end of one run."""
    per_site = json.loads(Path(results_path).read_text())["final"]["per_site"]
    return summarize({s: v[metric] for s, v in per_site.items() if metric in v})


def method_summary(results_paths) -> dict:
    """Per metric (bACC, bAUC): mean and sd over seeds of the mean and of the std across sites; the median round
    time and, for FedNPR, the median share of the prototype step in the train task and the median NPR/BSM gradient
    ratio (per site and round: does the regulariser act?)."""
    summary = {
        "round_seconds_median": variant_summary(results_paths)["round_seconds_median"],
        "per_seed": {f"{metric}_avg": per_seed_final(results_paths, metric, "avg") for metric in METRICS},
    }
    for metric in METRICS:
        stats = [final_stats(p, metric) for p in results_paths]
        for key in ("mean", "std"):
            values = [s[key] for s in stats]
            summary[f"{metric}_{key}"] = statistics.mean(values)
            summary[f"{metric}_{key}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
    shares = sum((step_shares(p, "prototype_seconds") for p in results_paths), [])
    if shares:
        summary["prototype_share_median"] = statistics.median(shares)
    ratios = [
        m["npr_grad_ratio"]
        for p in results_paths
        for r in json.loads(Path(p).read_text())["rounds"]
        for m in (r.get("train") or {}).values()
        if "npr_grad_ratio" in m
    ]
    if ratios:
        summary["npr_grad_ratio_median"] = statistics.median(ratios)
    return summary


def summary_markdown(summary, tables) -> str:
    lines = [
        "# FedNPR benchmark: Solo, FedAvg, FedProx, FedNPR, FedNPR-Per, FedProx + NPR",
        "",
        f"`{summary['command']}` — {summary['rounds']} rounds, seeds {summary['seeds']}; {summary['versions']}.",
        "",
    ]
    for dataset, entry in summary["datasets"].items():
        methods = entry["methods"]
        lines += [f"## {dataset} ({entry['sites']} sites)", ""]
        for metric, short in METRICS.items():
            lines += [
                f"### {short} per site (%)",
                "",
                tables[dataset][metric],
                "",
                f"Figures: [{dataset}/{metric}/report.md]({dataset}/{metric}/report.md)",
                "",
            ]
        lines += [
            "Mean over sites (%), mean ± sd over seeds, and the cost of the prototype step:",
            "",
            "| method | bACC | bAUC | Std. bACC | round time (s) | prototype share of the train task | "
            "NPR/BSM gradient |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for method, v in methods.items():
            share = f"{100 * v['prototype_share_median']:.1f}%" if "prototype_share_median" in v else "–"
            ratio = f"{v['npr_grad_ratio_median']:.3g}" if "npr_grad_ratio_median" in v else "–"
            lines.append(
                f"| {display_name(method)} | {100 * v['balanced_accuracy_mean']:.2f} ± "
                f"{100 * v['balanced_accuracy_mean_sd']:.2f} | {100 * v['auc_mean']:.2f} ± "
                f"{100 * v['auc_mean_sd']:.2f} | {100 * v['balanced_accuracy_std']:.2f} | "
                f"{v['round_seconds_median']:.2f} | {share} | {ratio} |"
            )
        if {"fedavg", "fednpr", "fednpr_per"} <= set(methods):
            cell = lambda a, b, methods=methods: target_cell(methods[a], methods[b], "balanced_accuracy_avg")  # noqa: E731
            lines += [
                "",
                f"Targets (paired by seed, points, 95% interval): FedNPR − FedAvg bACC "
                f"{cell('fednpr', 'fedavg')} (target ≥ +2); FedNPR-Per − FedNPR "
                f"{cell('fednpr_per', 'fednpr')} (target > 0).",
            ]
        lines.append("")
    lines += [
        "Round time: median over the rounds without evaluation (round 0 excluded), all seeds. Prototype share: "
        "per site and round, the prototype step's seconds over those of the step plus local training, median "
        "(target ≤ 15%). NPR/BSM gradient: ||d(lambda NPR)/dz|| / ||d BSM/dz|| at the head's input z, median over "
        "sites and rounds (near 0: the regulariser does nothing)."
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
