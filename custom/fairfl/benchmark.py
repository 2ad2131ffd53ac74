"""`fairfl benchmark TASK`: every method the papers compare, side by side on one task's data, through the real
NVFlare simulator; several seeds; resumable; the papers' tables, figures and a check of their claims.

TASK is a built-in dataset (prostate, fundus: segmentation, the Fed-LWR and FedCE tables; skin, ich and their
_blur forms: classification under a quality shift, the FedISM+ tables; skin_imbalanced, ich_imbalanced: class
imbalance, the FedNPR table). With --data-root the sites read that folder instead (name the built-in dataset of
the same task). Runs go to <out>/runs/<dataset>-<method>-seed<seed>; a finished run with the same settings is
kept, so an interrupted benchmark continues where it stopped. Outputs in <out>: SUMMARY.md (every table, the
claims, the command and versions), summary.json, and per metric a folder with report.md, results.csv and the
convergence figures (`fairfl report`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

from fairfl.data.builtin import BUILTIN_DATASETS, builtin_dataset
from fairfl.jobconfig import JOBS, parse_assignments
from fairfl.methods import FAMILY_METRICS, VARIANTS, family_claims, family_methods, variant_job
from fairfl.paired import FAILS, HOLDS, INCONCLUSIVE, Interval, mean_interval, paired_differences
from fairfl.report import _avg_std, _label, _mean_sd, _name, _scores, make_report
from fairfl.results import SIMULATOR_RESULTS, site_key
from fairfl.simulate import run_unless_finished
from fairfl.text import markdown_text

REPO = JOBS.parent

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


# ---------------------------------------------------------------- statistics of finished runs


def final_stat(run: dict, metric: str, statistic: str) -> float | None:
    """A run's final Avg. or Std. across sites of `metric`, in percent; None when it has no final metric."""
    scores = _scores(run.get("final"), metric)
    if not scores:
        return None
    avg, std = _avg_std(scores)
    return avg if statistic == "avg" else std


def per_site_mean(runs: list, metric: str) -> dict:
    """{site: final metric (%) averaged over the runs (seeds)}."""
    sites = sorted({s for r in runs for s in _scores(r.get("final"), metric)}, key=site_key)
    return {
        s: statistics.mean(_scores(r["final"], metric)[s] for r in runs if s in _scores(r["final"], metric))
        for s in sites
    }


def stat_by_seed(runs: list, metric: str, statistic: str) -> dict:
    """{seed: final Avg. or Std. of `metric` (%)} of the runs with a finite one; a seed run twice is an error."""
    values = {}
    for run in runs:
        value = final_stat(run, metric, statistic)
        if value is None or not math.isfinite(value):
            continue
        if run.get("seed") in values:
            raise ValueError(f"two runs of {run.get('method')} with seed {run.get('seed')}")
        values[run.get("seed")] = value
    return values


def check_claims(claims: list, runs_by_method: dict) -> list[dict]:
    """Each claim whose two methods have finished runs: both values (mean ± sd over seeds), the paired per-seed
    differences method - baseline with the 95% interval of their mean, the verdict, and the per-site difference
    (mean over seeds) that shows where it did or did not hold."""
    checked = []
    for claim in claims:
        a, b = runs_by_method.get(claim.method), runs_by_method.get(claim.baseline)
        if not a or not b:
            continue
        values = [stat_by_seed(runs, claim.metric, claim.statistic) for runs in (a, b)]
        if not values[0] or not values[1]:
            continue
        # rounded to 1e-9 points: float noise (equal results summed in another order) decides nothing
        differences = {seed: round(d, 9) for seed, d in paired_differences(*values).items()}
        interval = mean_interval(differences.values())
        sites_a, sites_b = per_site_mean(a, claim.metric), per_site_mean(b, claim.metric)
        checked.append(
            {
                "paper": claim.paper,
                "claim": claim.text(),
                "method": claim.method,
                "baseline": claim.baseline,
                "metric": claim.metric,
                "statistic": claim.statistic,
                "margin": claim.margin,
                "value": list(_mean_sd(values[0].values())),
                "baseline_value": list(_mean_sd(values[1].values())),
                "difference": interval.as_json()["mean"],
                "differences": differences,
                "interval": interval.as_json(),
                "verdict": claim.judge(interval),
                "seeds": [len(values[0]), len(values[1])],
                "per_site_difference": {s: sites_a[s] - sites_b[s] for s in sites_a if s in sites_b},
            }
        )
    return checked


def test_split_errors(runs_by_method: dict, metric: str) -> dict:
    """{site: mean over every run of the standard error of the site's final `metric` on its own test split}, in
    points (`fairfl.uncertainty`; runs that recorded none are left out): how precisely the test split measures
    the site, whatever the method."""
    errors = {}
    for runs in runs_by_method.values():
        for run in runs:
            for site, values in ((run.get("final") or {}).get("per_site") or {}).items():
                if isinstance(values.get(f"{metric}_se"), (int, float)):
                    errors.setdefault(site, []).append(100 * values[f"{metric}_se"])
    return {site: statistics.mean(v) for site, v in sorted(errors.items(), key=lambda item: site_key(item[0]))}


def mean_weights(runs: list) -> dict:
    """{site: its aggregation weight averaged over the rounds of each run, then over the runs} for a method whose
    rounds record one: Fed-LWR's layer weights (first averaged over the layers), else `weights` (FedAvg's sample
    shares, FedCE's contributions, SAGA's weights, ...); {} when none is recorded."""
    per_run = []
    for run in runs:
        sums = {}
        for record in run.get("rounds") or []:
            layers = record.get("layer_weights")
            shares = (
                {
                    s: statistics.mean(w[s] for w in layers.values() if s in w)
                    for s in {s for w in layers.values() for s in w}
                }
                if layers
                else record.get("weights") or {}
            )
            for site, share in shares.items():
                if isinstance(share, (int, float)):
                    sums.setdefault(site, []).append(share)
        if sums:
            per_run.append({site: statistics.mean(v) for site, v in sums.items()})
    sites = sorted({s for r in per_run for s in r}, key=site_key)
    return {site: statistics.mean(r[site] for r in per_run if site in r) for site in sites}


# what a method's sites report while training that says whether the method acts: train-record key -> label
DIAGNOSTICS = {"npr_grad_ratio": "NPR/BSM gradient ratio (FedNPR: ||d(lambda NPR)/dz|| / ||d BSM/dz||)"}


def train_diagnostics(runs: list) -> dict:
    """{key: median over sites, rounds and runs} of the DIAGNOSTICS keys the runs' train records hold."""
    values = {}
    for run in runs:
        for record in run.get("rounds") or []:
            for metrics in (record.get("train") or {}).values():
                for key in DIAGNOSTICS:
                    if isinstance((metrics or {}).get(key), (int, float)):
                        values.setdefault(key, []).append(metrics[key])
    return {key: statistics.median(v) for key, v in values.items()}


def round_seconds_median(runs: list) -> float | None:
    """Median seconds of the rounds that were not evaluated (of all rounds if every one was), round 0 (process
    start-up) left out."""
    rounds = [r for run in runs for r in run["rounds"][1:]]
    seconds = [r["seconds"] for r in rounds if "per_site" not in r] or [r["seconds"] for r in rounds]
    return statistics.median(seconds) if seconds else None


# ---------------------------------------------------------------- markdown


def _value(stat) -> str:
    mean, sd = stat
    return f"{mean:.2f}" if sd is None else f"{mean:.2f} ± {sd:.2f}"


CLAIMS_RULE = (
    "Each claim as the paper states it for its method, judged on the paired per-seed differences "
    "(method − baseline, same seed) of the final value: their mean and its 95% interval (Student t, "
    "n − 1 degrees of freedom over the n paired seeds). A claim **holds** when the whole interval "
    "satisfies it, **fails** when none of it does, and is **inconclusive** otherwise (always with one "
    "seed); measured and baseline are mean ± sd over seeds."
)


def _interval_cell(c: dict) -> str:
    if c.get("interval") is None:  # the outputs it was judged from had no per-seed values of its metric
        return f"{c['difference']:+.2f} (no per-seed values)"
    return Interval.from_json(c["interval"]).text()


def claims_markdown(checked: list) -> list[str]:
    if not checked:
        return []
    verdicts = {FAILS: "**fails**"}
    lines = [
        CLAIMS_RULE,
        "",
        "| paper | claim | measured | baseline | difference, 95% interval (points) | paired seeds | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for c in checked:
        seeds = c["interval"]["n"] if c.get("interval") else "–"
        lines.append(
            f"| {c['paper']} | {c['claim']} | {_value(c['value'])} | {_value(c['baseline_value'])} | "
            f"{_interval_cell(c)} | {seeds} | {verdicts.get(c['verdict'], c['verdict'])} |"
        )
    missed = [c for c in checked if c["verdict"] != HOLDS]
    if missed and any(c["per_site_difference"] for c in missed):
        lines += [
            "",
            "Where a claim did not hold, per site (final value of the method minus the baseline's, "
            "points, mean over seeds; for a Std. claim the site's own metric):",
            "",
        ]
        sites = sorted({s for c in missed for s in c["per_site_difference"]}, key=site_key)
        lines += ["| claim | " + " | ".join(map(markdown_text, sites)) + " |", "|---|" + "---:|" * len(sites)]
        for c in missed:
            lines.append(
                f"| {c['claim']} | "
                + " | ".join(
                    f"{c['per_site_difference'][s]:+.2f}" if s in c["per_site_difference"] else "–" for s in sites
                )
                + " |"
            )
    return lines


def summary_markdown(summary: dict, reports: dict) -> str:
    lines = [
        f"# Benchmark: {summary['dataset']} ({summary['family'].replace('_', ' ')}; {summary['papers']})",
        "",
        f"`{summary['command']}`",
        "",
        f"{summary['sites']} sites, {summary['rounds']} rounds (evaluated every {summary['eval_every']}), seeds "
        f"{summary['seeds']}{'; data root ' + summary['data_root'] if summary['data_root'] else ''}; "
        f"{summary['versions']}. Final results in %, mean ± sd over seeds; Avg.: mean over sites; Std.: "
        f"population std across sites.",
        "",
    ]
    for metric, report in reports.items():
        lines += [
            f"## {_label(metric)} per site",
            "",
            report["table"],
            "",
            f"Convergence, per-site figures and the CSV: [{metric}/report.md]({metric}/report.md)",
            "",
        ]
    for metric, errors in (summary.get("test_split_errors") or {}).items():
        if errors:
            lines += [
                f"Standard error of each site's final {_label(metric)} on its own test split (points, "
                f"`fairfl.uncertainty`: patients as clusters for Dice; mean over all runs). A per-site "
                f"difference of a few times this is still not evidence, and with few patients the error is "
                f"itself rough (a 95% interval from G patients takes t(G − 1) errors: 12.7 with 2, 4.3 "
                f"with 3).",
                "",
                "| " + " | ".join(errors) + " |",
                "|" + "---:|" * len(errors),
                "| " + " | ".join(f"{v:.2f}" for v in errors.values()) + " |",
                "",
            ]
    first = reports[summary["metrics"][0]]
    for key, title in (
        ("quality_shift", "Clean and corrupted test sets"),
        ("performance_fairness", "Performance fairness against Solo"),
        ("contributions", "Client contributions"),
        ("contribution_agreement", "Contribution estimates against leave-one-out"),
    ):
        if first["tables"][key]:
            lines += [f"## {title}", "", first["tables"][key], ""]
    weights = {m: w for m, w in (summary.get("mean_weights") or {}).items() if w}
    if weights:
        sites = sorted({s for w in weights.values() for s in w}, key=site_key)
        lines += [
            "## Aggregation weight per site",
            "",
            "Each site's weight in the aggregation, averaged over the "
            "rounds and then the seeds (Fed-LWR: its layer weights, first averaged over the layers; FedAvg: "
            "its share of the training samples).",
            "",
            "| method | " + " | ".join(map(markdown_text, sites)) + " |",
            "|---|" + "---:|" * len(sites),
        ]
        lines += [
            f"| {_name(m)} | " + " | ".join(f"{w[s]:.3f}" if s in w else "–" for s in sites) + " |"
            for m, w in weights.items()
        ]
        lines.append("")
    diagnostics = {m: d for m, d in (summary.get("diagnostics") or {}).items() if d}
    if diagnostics:
        lines += [
            "## What the methods' sites reported",
            "",
            "Medians over sites, rounds and seeds of the training records.",
            "",
            "| method | quantity | median |",
            "|---|---|---:|",
        ]
        lines += [
            f"| {_name(m)} | {DIAGNOSTICS[key]} | {value:.3g} |"
            for m, d in diagnostics.items()
            for key, value in d.items()
        ]
        lines.append("")
    lines += [
        "## Round time",
        "",
        "Median seconds of the rounds without evaluation (round 0 left out), all seeds, as "
        "each run recorded them; ratio to FedAvg's. The runs go one after another, so the ratios hold when "
        "nothing else shared the machine meanwhile (kept runs keep the times of when they ran).",
        "",
        "| method | seconds | / FedAvg |",
        "|---|---:|---:|",
    ]
    base = summary["round_seconds"].get("fedavg")
    for method, seconds in summary["round_seconds"].items():
        if seconds is not None:
            lines.append(
                f"| {_name(method)} | {seconds:.2f} | {seconds / base:.2f} |"
                if base
                else f"| {_name(method)} | {seconds:.2f} | – |"
            )
    return "\n".join(lines + claims_section(summary["claims"])) + "\n"


CLAIMS_HEADING = "## The papers' claims on this data"


def claims_section(checked: list) -> list[str]:
    claims = claims_markdown(checked)
    return ["", CLAIMS_HEADING, "", *claims] if claims else []


# ---------------------------------------------------------------- judging the claims again from the outputs


def runs_from_csv(files) -> dict:
    """{method: [run records with their final per-site values]} rebuilt from `fairfl report` results.csv files
    (one row per method, seed and site; one file per metric), to judge runs again without their workspaces."""
    records = {}
    for file in map(Path, files):
        try:
            rows = list(csv.DictReader(file.open(newline="")))
        except OSError as e:
            raise ValueError(f"{file}: {e}") from e
        for number, row in enumerate(rows, 2):
            if row.get("variant") or row.get("site") in ("mean", "std", "worst"):
                continue  # a variant's runs are not the method's; the summary rows are recomputed
            try:
                method, seed, site, value = row["method"], int(row["seed"]), row["site"], float(row["percent"]) / 100
                metric = row["metric"]
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{file}, line {number}: not a results row ({e})") from e
            record = records.setdefault((method, seed), {"method": method, "seed": seed, "final": {"per_site": {}}})
            record["final"]["per_site"].setdefault(site, {})[metric] = value
    by_method = {}
    for (method, _), record in sorted(records.items()):
        by_method.setdefault(method, []).append(record)
    return by_method


def rejudge(out) -> dict:
    """Judge the claims of the benchmark outputs in `out` again from its results.csv files and rewrite the claims
    of summary.json and SUMMARY.md, in the order they had; a claim on a metric without per-seed values there is kept,
    inconclusive."""
    out = Path(out)
    try:
        summary = json.loads((out / "summary.json").read_text())
        text = (out / "SUMMARY.md").read_text()
    except (OSError, ValueError) as e:
        raise ValueError(f"{out}: no benchmark outputs to judge ({e})") from e
    runs = runs_from_csv(out / metric / "results.csv" for metric in summary["metrics"])
    claims = check_claims(family_claims(summary["family"]), runs)
    key = lambda c: (c["method"], c["baseline"], c["metric"], c["statistic"])  # noqa: E731
    judged = {key(c) for c in claims}
    claims += [
        {**c, "differences": {}, "interval": None, "verdict": INCONCLUSIVE}
        for c in summary.get("claims", [])
        if key(c) not in judged
    ]
    # the outputs' own order first (a rejudge changes verdicts, not the layout), then the registry's
    order = list(
        dict.fromkeys(
            [
                *(key(c) for c in summary.get("claims", [])),
                *((c.method, c.baseline, c.metric, c.statistic) for c in family_claims(summary["family"])),
            ]
        )
    )
    summary["claims"] = sorted(claims, key=lambda c: order.index(key(c)) if key(c) in order else len(order))
    for c in summary["claims"]:
        c.pop("holds", None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    head = text.split("\n" + CLAIMS_HEADING + "\n")[0].rstrip("\n")
    (out / "SUMMARY.md").write_text("\n".join([head, *claims_section(summary["claims"])]) + "\n")
    return summary


# ---------------------------------------------------------------- running


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
        log(f"[{number}/{len(plan)}] {_name(method)}, seed {seed}{eta}", flush=True)
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
                    stat: _mean_sd(v for v in (final_stat(r, metric, stat) for r in runs) if v is not None)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dataset",
        metavar="TASK",
        choices=sorted(BUILTIN_DATASETS),
        help=f"built-in dataset of the task: {', '.join(sorted(BUILTIN_DATASETS))}",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(VARIANTS),
        metavar="METHOD",
        help="default: the methods the task's papers compare (segmentation: "
        f"{' '.join(family_methods('segmentation'))}; quality shift: "
        f"{' '.join(family_methods('quality_shift'))}; imbalanced: "
        f"{' '.join(family_methods('imbalanced'))})",
    )
    from fairfl.cli import at_least

    parser.add_argument("--seeds", type=at_least(0), nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=at_least(1), default=20)
    parser.add_argument("--eval-every", type=at_least(0), default=5)
    parser.add_argument(
        "--sites",
        type=at_least(2),
        help="number of sites (default: the papers' for the task: 6, ich_imbalanced 10, quality shift 20)",
    )
    parser.add_argument("--data-root", default="", help="sites read this folder (datalists <site>.json) instead")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="job arguments for every run (JSON values), e.g. image_size=32 model_channels=[8,16]",
    )
    parser.add_argument(
        "--loo",
        action="store_true",
        help="also run FedAvg leaving each site out (sites + 1 runs) for the contribution table",
    )
    parser.add_argument("--out", help="output folder (default: benchmarks/results/compare/<TASK>)")
    parser.add_argument(
        "--rejudge",
        action="store_true",
        help="run nothing: judge the claims again from the outputs already in the output folder "
        "(summary.json, <metric>/results.csv) and rewrite their claims",
    )


def canonical_command(dataset, methods, seeds, rounds, eval_every, sites, data_root, assignments, loo, out) -> str:
    """The command that reruns this benchmark, every setting spelled out."""
    parts = [
        "fairfl",
        "benchmark",
        dataset,
        "--methods",
        *methods,
        "--seeds",
        *map(str, seeds),
        "--rounds",
        str(rounds),
        "--eval-every",
        str(eval_every),
        "--sites",
        str(sites),
    ]
    parts += ["--data-root", data_root] if data_root else []
    parts += ["--set", *assignments] if assignments else []
    parts += ["--loo"] if loo else []
    parts += ["--out", str(out)] if out else []
    return " ".join(shlex.quote(p) for p in parts)


def run(args) -> int:
    extra = parse_assignments(args.set)
    if args.data_root:
        extra["data_root"] = os.path.abspath(args.data_root)
    kind = family(args.dataset)
    sites = args.sites or FAMILIES[kind].get("sites", max(6, builtin_dataset(args.dataset).min_sites))
    methods = args.methods or family_methods(kind)
    out = args.out or REPO / "benchmarks" / "results" / "compare" / args.dataset
    if args.rejudge:
        try:
            claims = rejudge(out)["claims"]
        except (ValueError, KeyError) as e:
            print(f"fairfl benchmark --rejudge: {e}", file=sys.stderr)
            return 1
        print("\n".join(claims_markdown(claims)))
        return 0
    command = canonical_command(
        args.dataset,
        methods,
        args.seeds,
        args.rounds,
        args.eval_every,
        sites,
        args.data_root,
        args.set,
        args.loo,
        args.out,
    )
    try:
        run_benchmark(
            args.dataset, methods, args.seeds, args.rounds, args.eval_every, sites, out, extra, args.loo, command
        )
    except (RuntimeError, ValueError, OSError) as e:
        print(f"fairfl benchmark: {e}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- the results in README.md and docs/, generated

GENERATED = re.compile(
    r"^(<!-- generated from (?P<source>[^\n]+?) -->\n)(?P<body>.*?)^(<!-- end generated -->)$", re.S | re.M
)
LINK = re.compile(r"(!?\[[^\]]*\]\()(?!https?:|/|#)([^)]+)\)")


def section(markdown: str, title: str | None) -> str:
    """The part of `markdown` under the heading `title` (up to the next heading of the same or a higher level),
    or all of it for None."""
    if not title:
        return markdown
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        level = len(line) - len(line.lstrip("#"))
        if level and line[level:].strip() == title:
            end = next(
                (
                    j
                    for j in range(i + 1, len(lines))
                    if lines[j].startswith("#") and len(lines[j]) - len(lines[j].lstrip("#")) <= level
                ),
                len(lines),
            )
            return "\n".join(lines[i + 1 : end]).strip("\n") + "\n"
    raise ValueError(f"no section {title!r}")


def generated_block(source: str, base: Path) -> str:
    """The text of one generated block: the section of a benchmark output (`path#Section title`, path relative to
    `base`, the folder of the file holding the block), headings moved two levels down, relative links rewritten
    to be relative to `base`."""
    path, _, title = source.partition("#")
    file = base / path
    try:
        text = section(file.read_text(), title.replace("%20", " ") or None)
    except (OSError, ValueError) as e:
        raise ValueError(f"block {source} (its path is relative to the file holding it): {e}") from e
    folder = os.path.relpath(file.parent, base)
    text = LINK.sub(lambda m: f"{m.group(1)}{os.path.normpath(os.path.join(folder, m.group(2)))})", text)
    return re.sub(r"^(#+) ", lambda m: "#" * min(6, len(m.group(1)) + 2) + " ", text, flags=re.M)


def documentation_files(root=REPO) -> list[Path]:
    """README.md and every docs/**/*.md under `root`: the files whose generated blocks `fairfl update-readme` keeps
    and whose links the tests check."""
    root = Path(root)
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def update_generated_blocks(markdown, check: bool = False) -> list[str]:
    """Rewrite every `<!-- generated from PATH[#Section] -->` ... `<!-- end generated -->` block of a Markdown file
    from its source; returns the sources whose text changed (with check=True the file is left as it is)."""
    markdown = Path(markdown)
    text = markdown.read_text()
    stale = []

    def replace(match):
        try:
            body = generated_block(match.group("source"), markdown.parent)
        except ValueError as e:
            raise ValueError(f"{markdown}: {e}") from e
        if body != match.group("body"):
            stale.append(match.group("source"))
        return match.group(1) + body + match.group(4)

    new = GENERATED.sub(replace, text)
    if stale and not check:
        markdown.write_text(new)
    return stale


def update_readme_command(args) -> int:
    files = args.files or documentation_files()
    try:
        stale = {str(file): update_generated_blocks(file, check=args.check) for file in files}
    except (ValueError, OSError) as e:
        print(f"fairfl update-readme: {e}", file=sys.stderr)
        return 1
    for file, sources in stale.items():
        if args.check and sources:
            print(f"{file}: out of date with {', '.join(sources)}; run `fairfl update-readme`", file=sys.stderr)
        else:
            print(f"{file}: {'updated ' + ', '.join(sources) if sources else 'up to date'}")
    return 1 if args.check and any(stale.values()) else 0
