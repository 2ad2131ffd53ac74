"""FedCE benchmark: Solo, FedAvg, Fed-LWR, FedCE (Sum.) and FedCE (Multi.) on the built-in prostate-like and
fundus-like data, several seeds, through the real NVFlare simulator; the papers' tables (Table 1 Dice,
Table 2 performance fairness against Solo, Table 3 contribution estimates against leave-one-out), a
leave-one-out ground truth and a free-rider run (the paper's Fig. 4).

Order (so an interrupted run still has comparable results): for each seed, every method on every dataset;
the leave-one-out runs and the free-rider run after the first seed. Resumable: complete runs are kept.

    python benchmarks/fedce.py --datasets prostate fundus --rounds 20 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fairness import REPO, run_job, target_cell, variant_summary, versions, write_summary  # noqa: E402

from fairfl.methods import variant_job  # noqa: E402
from fairfl.report.document import make_report  # noqa: E402
from fairfl.report.runs import free_riders  # noqa: E402
from fairfl.site_settings import FREE_RIDERS_ENV  # noqa: E402

METHODS = ("solo", "fedavg", "fedlwr", "fedce_sum", "fedce_product")  # fairfl.methods
FAIR_METHODS = ("fedlwr", "fedce_sum", "fedce_product")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["prostate", "fundus"], choices=["prostate", "fundus"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--no-loo", action="store_true", help="skip the leave-one-out runs")
    parser.add_argument("--no-free-rider", action="store_true", help="skip the free-rider run")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "fedce"))
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)

    paths, loo, free_rider = {}, {}, {}
    for seed in args.seeds:
        for dataset in args.datasets:
            for method in args.methods:
                job, extra = variant_job(method)
                paths[dataset, method, seed] = run_job(
                    job, f"{dataset}-{method}-seed{seed}", {"seed": seed, "dataset": dataset, **extra}, args
                )
        if seed != args.seeds[0]:
            continue
        for dataset in args.datasets:
            if not args.no_loo:
                from fairfl.loo import run_leave_one_out

                print(f"  {dataset}: leave-one-out (FedAvg, seed {seed})", flush=True)
                loo[dataset] = run_leave_one_out(
                    os.path.join(REPO, "jobs", "fedavg"),
                    os.path.join(args.out, "loo", dataset),
                    args.sites,
                    {"num_rounds": args.rounds, "eval_every": args.eval_every, "seed": seed, "dataset": dataset},
                )
            if not args.no_free_rider:
                free_rider[dataset] = run_job(
                    "fedce",
                    f"{dataset}-fedce_sum-free_rider-seed{seed}",
                    {"seed": seed, "dataset": dataset, "combine": "sum"},
                    args,
                    n_clients=args.sites + 1,
                    env={FREE_RIDERS_ENV: f"site-{args.sites + 1}"},
                )  # its own switch

    summary = {
        "command": " ".join(["python", "benchmarks/fedce.py"] + (argv if argv is not None else sys.argv[1:])),
        "versions": versions(),
        "rounds": args.rounds,
        "seeds": args.seeds,
        "sites": args.sites,
        "datasets": {},
    }
    sections = []
    for dataset in args.datasets:
        runs = [paths[dataset, m, s] for m in args.methods for s in args.seeds]
        report = make_report(runs, os.path.join(args.out, dataset), loo=loo.get(dataset))
        entry = {"methods": {m: method_summary([paths[dataset, m, s] for s in args.seeds]) for m in args.methods}}
        if dataset in loo:
            entry["loo"] = json.loads(Path(loo[dataset]).read_text())["marginal"]
        if dataset in free_rider:
            entry["free_rider"] = free_rider_summary(free_rider[dataset])
        summary["datasets"][dataset] = entry
        sections.append((dataset, report))
    write_summary(args.out, summary, summary_markdown(summary, sections))


def method_summary(results_paths) -> dict:
    """fairness.variant_summary (mean over seeds of the final mean, std and worst Dice, final Dice per site, median
    round time), plus the final contributions per site averaged over seeds."""
    summary = variant_summary(results_paths)
    runs = [json.loads(Path(p).read_text()) for p in results_paths]
    if all("contributions" in r["final"] for r in runs):
        summary["contributions"] = {
            s: statistics.mean(r["final"]["contributions"].get(s, 0.0) for r in runs) for s in runs[0]["sites"]
        }
    return summary


def free_rider_summary(results_path) -> dict:
    run = json.loads(Path(results_path).read_text())
    contributions = run["final"]["contributions"]
    riders = free_riders(run)
    ranked = sorted(contributions, key=contributions.get)
    return {
        "free_riders": riders,
        "contributions": contributions,
        "rank_from_smallest": {s: ranked.index(s) + 1 for s in riders},
        "sites": len(contributions),
    }


def summary_markdown(summary, sections) -> str:
    names = {
        "solo": "Solo",
        "fedavg": "FedAvg",
        "fedlwr": "Fed-LWR",
        "fedce_sum": "FedCE (Sum.)",
        "fedce_product": "FedCE (Multi.)",
    }
    lines = [
        "# FedCE benchmark: Solo, FedAvg, Fed-LWR, FedCE (Sum.), FedCE (Multi.)",
        "",
        f"`{summary['command']}` — {summary['sites']} sites, {summary['rounds']} rounds, seeds "
        f"{summary['seeds']}; {summary['versions']}.",
        "",
    ]
    for dataset, report in sections:
        entry = summary["datasets"][dataset]
        methods = entry["methods"]
        lines += [
            f"## {dataset}",
            "",
            report["table"],
            "",
            f"Figures, Table 2 (performance fairness against Solo), Table 3 (contributions against "
            f"leave-one-out) and contribution plots: [{dataset}/report.md]({dataset}/report.md)",
            "",
        ]
        if "fedavg" in methods:
            avg = methods["fedavg"]
            lines += [
                "Against the targets (target: std below FedAvg's with mean at least FedAvg's; differences paired by "
                "seed, in points, with the 95% interval of their mean):",
                "",
                "| method | std / FedAvg std | − FedAvg Std. | − FedAvg Avg. | round time / FedAvg's |",
                "|---|---:|---:|---:|---:|",
            ]
            for m in FAIR_METHODS:
                if m in methods:
                    v = methods[m]
                    lines.append(
                        f"| {names[m]} | {v['std'] / avg['std']:.2f} | {target_cell(v, avg, 'dice_std')} | "
                        f"{target_cell(v, avg, 'dice_avg')} | "
                        f"{v['round_seconds_median'] / avg['round_seconds_median']:.2f} |"
                    )
            lines.append("")
        if "loo" in entry:
            lines += [
                "Leave-one-out marginal value of each site (drop of the mean test Dice, points, when FedAvg "
                "runs without it):",
                "",
                "| " + " | ".join(entry["loo"]) + " |",
                "|" + "---:|" * len(entry["loo"]),
                "| " + " | ".join(f"{100 * v:+.2f}" for v in entry["loo"].values()) + " |",
                "",
            ]
        if "free_rider" in entry:
            fr = entry["free_rider"]
            rider = fr["free_riders"][0]
            lines += [
                f"Free rider ({rider} trains on one image of site-1 repeated; FedCE (Sum.), first seed): its "
                f"final contribution is {fr['contributions'][rider]:.3f}, rank {fr['rank_from_smallest'][rider]} "
                f"from the smallest of {fr['sites']} (target: 1).",
                "",
            ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
