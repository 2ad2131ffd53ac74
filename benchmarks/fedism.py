"""FedISM+ benchmark: FedAvg, q-FedAvg, FedISM, FedISM+ (S) and FedISM+ (L) on the built-in quality-shift
classification data (20 sites, Dirichlet(1.0) label skew, the last 20% of the sites with corrupted images),
several seeds, through the real NVFlare simulator. Writes the FedISM+ paper's Tables II-III (clean, corrupted and
average ACC/AUC) and IV (std of AUC across sites), and the cost: FedISM+ round time / FedAvg round time measured
in the same benchmark, and the SAGA measurement (sharpness probe) time as a share of each site's train task.

Order (so an interrupted run still has comparable results): every method for seed 0, then seed 1, ...
Resumable: complete runs are kept.

    python benchmarks/fedism.py --rounds 40 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

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

from fairfl.methods import display_name, variant_job  # noqa: E402
from fairfl.report.document import make_report  # noqa: E402

METHODS = ("fedavg", "qfedavg", "qfedavg_lossweighted", "fedism", "fedismplus_s", "fedismplus_l")  # fairfl.methods
COST_METHOD = "fedismplus_s"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="skin", choices=["skin", "skin_blur", "ich", "ich_blur"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sites", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "fedism"))
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)

    paths = {}
    for seed in args.seeds:
        for method in args.methods:
            job, extra = variant_job(method)
            print(f"seed {seed}: {display_name(method)}", flush=True)
            paths[method, seed] = run_job(
                job, f"{args.dataset}-{method}-seed{seed}", {"seed": seed, "dataset": args.dataset, **extra}, args
            )

    runs = [paths[m, s] for m in args.methods for s in args.seeds]
    report = make_report(runs, os.path.join(args.out, args.dataset))
    methods = {m: method_summary([paths[m, s] for s in args.seeds]) for m in args.methods}
    summary = {
        "command": " ".join(["python", "benchmarks/fedism.py"] + (argv if argv is not None else sys.argv[1:])),
        "versions": versions(),
        "dataset": args.dataset,
        "rounds": args.rounds,
        "seeds": args.seeds,
        "sites": args.sites,
        "methods": methods,
        "quality_shift": report["quality_shift"],
    }
    write_summary(args.out, summary, summary_markdown(summary, report))


def method_summary(results_paths) -> dict:
    """fairness.variant_summary plus the median probe share (methods that measure sharpness or loss)."""
    summary = variant_summary(results_paths)
    summary["per_seed"].update(
        {f"{metric}_avg": per_seed_final(results_paths, metric, "avg") for metric in ("corrupted_auc", "clean_auc")}
    )
    shares = sum((step_shares(p, "probe_seconds") for p in results_paths), [])
    if shares:
        summary["probe_share_median"] = statistics.median(shares)
    return summary


def summary_markdown(summary, report) -> str:
    methods, shift = summary["methods"], summary["quality_shift"]
    lines = [
        "# FedISM+ benchmark: FedAvg, q-FedAvg, FedISM, FedISM+ (S), FedISM+ (L)",
        "",
        f"`{summary['command']}` — {summary['dataset']}, {summary['sites']} sites, {summary['rounds']} rounds, "
        f"seeds {summary['seeds']}; {summary['versions']}.",
        "",
        "## Tables II-IV: clean and corrupted test sets",
        "",
        report["tables"]["quality_shift"],
        "",
        f"Per-site AUC on each site's own-quality test set, figures: [{summary['dataset']}/report.md]"
        f"({summary['dataset']}/report.md)",
        "",
    ]
    if "fedavg" in shift:
        lines += [
            "Against the targets (target for FedISM+: corrupted AUC at least +3 over FedAvg, clean AUC no more "
            "than 1 lower, Std. AUC lower; differences paired by seed, in points, with the 95% interval of "
            "their mean):",
            "",
            "| method | corrupted AUC - FedAvg | clean AUC - FedAvg | Std. AUC - FedAvg |",
            "|---|---:|---:|---:|",
        ]
        for method in shift:
            if method != "fedavg" and method in methods and "fedavg" in methods:
                lines.append(
                    f"| {display_name(method)} | "
                    + " | ".join(
                        target_cell(methods[method], methods["fedavg"], key)
                        for key in ("corrupted_auc_avg", "clean_auc_avg", "auc_std")
                    )
                    + " |"
                )
        lines.append("")
    lines += [
        "## Cost",
        "",
        "| method | median round time (s) | / FedAvg's | probe share of the train task |",
        "|---|---:|---:|---:|",
    ]
    base = methods.get("fedavg", {}).get("round_seconds_median")
    for method, v in methods.items():
        ratio = f"{v['round_seconds_median'] / base:.2f}" if base else "–"
        share = f"{100 * v['probe_share_median']:.1f}%" if "probe_share_median" in v else "–"
        lines.append(f"| {display_name(method)} | {v['round_seconds_median']:.2f} | {ratio} | {share} |")
    lines += [
        "",
        "Round time: median over the rounds without evaluation (round 0, process start-up, excluded), "
        "all seeds. Probe share: per site and round, the sharpness (or loss) measurement's seconds over those "
        "of the measurement plus local training, median.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
