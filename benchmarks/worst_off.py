"""The worst-off hospital's goal, for every arm of a benchmark, judged on paired seeds with intervals that count the
test splits' noise (docs/benchmarks.md, "Intervals").

The goal, against FedAvg and Solo run with the same seeds on the same data:
- worst site: at least WORST_GAIN points above FedAvg's worst site, and at least Solo's worst site;
- no site below its FedAvg or Solo score by more than its test split's standard error (mean over seeds);
- spread (Std. across sites): at most SPREAD_GOAL times FedAvg's (the mean of the per-seed ratios), with the
  interval of the Std. difference below 0;
- mean (Avg.): the interval of the difference from FedAvg's not below MEAN_MARGIN;
- round cost: at most COST_GOAL times FedAvg's round. With `--cost` (benchmarks/cost.py's summary.json; once per
  dataset it was run on, `cost.py --dataset`), an arm it measured on the folder's dataset is judged there: runs of
  the arm and FedAvg alternated, wall and CPU seconds a round, and both ratios must be within the goal; otherwise
  the benchmark's own median rounds (runs made one after another: indicative).
A goal row is met when its whole interval satisfies it, missed when none does, inconclusive otherwise, and not judged
with fewer than MIN_JUDGED_SEEDS paired seeds or for an arm that did not train. The intervals count the test splits
where every run recorded its test patients' influences (fairfl.split_noise); otherwise the row says "seeds only".

    python benchmarks/worst_off.py benchmarks/results/worst_off/prostate [more folders] \\
        [--cost benchmarks/results/worst_off/cost/summary.json ...] [--table benchmarks/results/worst_off/GOAL.md]

Writes <folder>/goal.json for each folder, and the tables of all of them to --table. Needs the runs' results.json
files (the benchmark's runs/ folder: each run's results.json is committed beside the outputs) for the test-split
noise. A folder whose runs are not on this machine keeps the goal.json committed beside its SUMMARY when that was
judged from the runs its results.csv lists now (a digest of the file; said on stderr and in the table), its round
cost judged again, so one task's rerun updates its own section and leaves the others as they were judged."""

import argparse
import csv
import hashlib
import json
import os
import statistics
import sys
from pathlib import Path

from fairfl.benchmark.checks import untrained_methods
from fairfl.benchmark.claims import MIN_JUDGED_SEEDS, NOT_JUDGED, scored_runs
from fairfl.benchmark.run_statistics import test_split_errors
from fairfl.data.builtin import shared_test_set
from fairfl.methods import display_name
from fairfl.paired import FAILS, HOLDS, mean_interval, paired_differences, verdict
from fairfl.report.runs import load_runs
from fairfl.split_noise import split_noise, statistic_value

WORST_GAIN = 3.0  # points above FedAvg's worst site
SPREAD_GOAL = 0.6  # times FedAvg's Std.
MEAN_MARGIN = -0.5  # points: the mean at most half a point below FedAvg's
COST_GOAL = 2.0  # times FedAvg's round
BASELINES = ("fedavg", "solo")
KEPT_NOTE = (
    "Kept from the folder's goal.json (its runs were not on the machine that wrote this table; the runs its "
    "results.csv lists are the ones it was judged from); the round cost judged again."
)
VERDICT_TEXT = {HOLDS: "met", FAILS: "missed"}


class RunsNotHere(Exception):
    """Some of the run records its results.csv lists are not on this machine (a folder whose runs predate committed
    records, or a record missing)."""


def relocated(path: str, folder: str) -> str:
    """A run's results file as results.csv names it (the absolute path it was written at) or, where the benchmark
    folder has moved since (a fresh clone, the committed run records), the same file under this folder's runs/."""
    if os.path.exists(path) or "/runs/" not in path:
        return path
    return os.path.join(folder, "runs", path.rsplit("/runs/", 1)[1])


def results_digest(folder: str, metric: str) -> str:
    """The SHA-256 of the benchmark's <metric>/results.csv: which runs a goal.json was judged from."""
    return hashlib.sha256(Path(folder, metric, "results.csv").read_bytes()).hexdigest()


def kept_goal(folder: str, interleaved: list[dict]) -> dict:
    """The committed goal.json of a folder whose runs are not on this machine, if it was judged from the runs its
    results.csv lists now (else a SystemExit); its cost rows judged again (they need only summary.json)."""
    path = Path(folder, "goal.json")
    if not path.exists():
        raise SystemExit(f"{folder}: its runs are not here and no goal.json was kept: rerun the benchmark")
    kept = json.loads(path.read_text())
    if kept.get("results_csv_sha256") != results_digest(folder, kept["metric"]):
        raise SystemExit(f"{path} was not judged from the runs {folder}/{kept['metric']}/results.csv lists now")
    summary = json.loads(Path(folder, "summary.json").read_text())
    seconds = summary.get("round_seconds") or {}
    for arm, rows in kept["arms"].items():
        rows["cost"] = cost_row(arm, kept["dataset"], summary.get("sites"), seconds, interleaved)
    return {**kept, "kept": True}


def runs_by_method(folder: str, metric: str) -> dict:
    """{method: [the runs' results, as fairfl report loads them]} from the benchmark's <metric>/results.csv."""
    files: dict = {}
    with open(os.path.join(folder, metric, "results.csv")) as f:
        for row in csv.DictReader(f):
            files.setdefault(row["method"], {})[relocated(row["file"], folder)] = None
    missing = [p for paths in files.values() for p in paths if not os.path.exists(p)]
    if missing:
        raise RunsNotHere(f"{folder}: the runs' results files are not here (first: {missing[0]})")
    return {method: load_runs(list(paths)) for method, paths in files.items()}


def compared(arm: dict, baseline: dict, statistic: str) -> tuple:
    """(the interval of mean over paired seeds of statistic(arm) - statistic(baseline), whether it counts the test
    splits)."""
    values = [{seed: statistic_value(run.scores, statistic) for seed, run in runs.items()} for runs in (arm, baseline)]
    differences = paired_differences(*values)
    split = split_noise(arm, baseline, statistic, differences)
    return mean_interval(differences.values(), split=split), split is not None


def row(interval, counted: bool, bound: float, above: bool, judged: bool) -> dict:
    found = verdict(interval, bound, above)
    return {
        "interval": interval.as_json(),
        "text": interval.text(),
        "noise": "seeds and test splits" if counted else "seeds only",
        "verdict": VERDICT_TEXT.get(found, found) if judged else NOT_JUDGED,
    }


def site_rows(arm: dict, baseline: dict, errors: dict) -> dict:
    """{site: {"difference": mean over paired seeds of the site's score minus the baseline's, "se": its test split's
    standard error, "within": difference >= -se}}."""
    sites = sorted({s for run in arm.values() for s in run.scores})
    found = {}
    for site in sites:
        differences = paired_differences(
            {seed: run.scores.get(site) for seed, run in arm.items()},
            {seed: run.scores.get(site) for seed, run in baseline.items()},
        )
        if not differences or site not in errors:
            continue
        mean = statistics.mean(differences.values())
        found[site] = {"difference": round(mean, 2), "se": round(errors[site], 2), "within": mean >= -errors[site]}
    return found


def cost_row(arm: str, dataset: str, sites: int | None, seconds: dict, interleaved: list[dict]) -> dict:
    """The arm's round cost against FedAvg's: from benchmarks/cost.py's alternated runs on this dataset and number of
    sites where they measured it (wall and CPU ratios, the larger judged; a row from before cost.py recorded its
    sites is taken as it is), else from the benchmark's own median rounds."""
    measured = next(
        (
            t[arm]
            for t in interleaved
            if t.get(arm, {}).get("dataset") == dataset and t[arm].get("sites", sites) in (sites, None)
        ),
        None,
    )
    if measured and measured.get("ratio") is not None:
        wall, cpu = measured["ratio"], measured.get("cpu_ratio")
        return {
            "ratio": round(wall, 2),
            "cpu_ratio": None if cpu is None else round(cpu, 2),
            "source": "interleaved",
            # both within the goal; without the CPU the wall time of a shared machine alone does not judge it
            "verdict": NOT_JUDGED if cpu is None else "met" if max(wall, cpu) <= COST_GOAL else "missed",
        }
    cost = seconds[arm] / seconds["fedavg"] if arm in seconds and seconds.get("fedavg") else None
    return {
        "ratio": None if cost is None else round(cost, 2),
        "source": "one after another",
        "verdict": NOT_JUDGED if cost is None else "met" if cost <= COST_GOAL else "missed",
    }


def cost_tables(files: list[str]) -> list[dict]:
    """The per-method tables of benchmarks/cost.py's summary.json files (its "methods"), one per file: an arm measured
    on the same dataset in two of them is refused (which would judge it?)."""
    tables, seen = [], {}
    for file in files:
        try:
            table = json.loads(Path(file).read_text())["methods"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"--cost {file}: not a benchmarks/cost.py summary.json ({e!r})") from e
        if not isinstance(table, dict) or not all(isinstance(row, dict) for row in table.values()):
            raise SystemExit(f'--cost {file}: its "methods" is not a table of rows')
        for arm, row in table.items():
            key = (arm, row.get("dataset"), row.get("sites"))
            if key in seen:
                raise SystemExit(f"{arm} on {key[1]}: its round cost is in both {seen[key]} and {file}: pass one")
            seen[key] = file
        tables.append(table)
    return tables


def goal(folder: str, interleaved: list[dict] | None = None) -> dict:
    """The goal's rows for every arm of the benchmark in `folder`; `interleaved`: benchmarks/cost.py's per-method
    tables (cost_tables), each arm's row on this folder's dataset used."""
    summary = json.loads(Path(folder, "summary.json").read_text())
    metric = summary["metrics"][0]
    written_from = results_digest(folder, metric)
    runs = runs_by_method(folder, metric)
    shared = shared_test_set(summary["dataset"], summary.get("data_root"))
    scored = {method: scored_runs(method_runs, metric, shared) for method, method_runs in runs.items()}
    untrained = untrained_methods(runs, metric)
    errors = test_split_errors(runs, metric)
    seconds = summary.get("round_seconds") or {}
    arms = [m for m in summary["methods"] if m not in BASELINES and m in scored]
    found = {"dataset": summary["dataset"], "metric": metric, "results_csv_sha256": written_from, "arms": {}}
    for arm in arms:
        seeds = sorted(set(scored[arm]) & set(scored["fedavg"]))
        judged = len(seeds) >= MIN_JUDGED_SEEDS and arm not in untrained
        rows = {}
        worst, counted = compared(scored[arm], scored["fedavg"], "worst")
        rows["worst_vs_fedavg"] = row(worst, counted, WORST_GAIN, True, judged)
        if "solo" in scored:
            worst, counted = compared(scored[arm], scored["solo"], "worst")
            rows["worst_vs_solo"] = row(worst, counted, 0.0, True, judged)
        spread, counted = compared(scored[arm], scored["fedavg"], "std")
        ratios = [
            statistic_value(scored[arm][s].scores, "std") / statistic_value(scored["fedavg"][s].scores, "std")
            for s in seeds
        ]
        rows["spread"] = row(spread, counted, 0.0, False, judged)
        ratio = statistics.mean(ratios) if ratios else float("nan")
        rows["spread"]["ratio"] = round(ratio, 3)
        if judged and rows["spread"]["verdict"] == "met" and ratio > SPREAD_GOAL:
            rows["spread"]["verdict"] = "missed"  # narrower, but not by enough
        mean, counted = compared(scored[arm], scored["fedavg"], "avg")
        rows["mean"] = row(mean, counted, MEAN_MARGIN, True, judged)
        sites = {base: site_rows(scored[arm], scored[base], errors) for base in BASELINES if base in scored}
        rows["sites_within_se"] = {}
        for base, per_site in sites.items():
            within = all(r["within"] for r in per_site.values())
            rows["sites_within_se"][base] = {
                "sites": per_site,
                "verdict": ("met" if within else "missed") if judged else NOT_JUDGED,
            }
        rows["cost"] = cost_row(arm, summary["dataset"], summary.get("sites"), seconds, interleaved or [])
        found["arms"][arm] = {"seeds": seeds, **rows}
    return found


def _cell(r: dict, key: str, extra: str = "") -> str:
    if key not in r:
        return "–"
    return f"{r[key]['text']}{extra}: {r[key]['verdict']} ({r[key]['noise']})"


def cost_cell(cost: dict) -> str:
    if cost["ratio"] is None:
        return f"–: {cost['verdict']}"
    if cost.get("source") == "interleaved":
        cpu = "" if cost["cpu_ratio"] is None else f", CPU {cost['cpu_ratio']:.2f}"
        return f"{cost['ratio']:.2f}{cpu}: {cost['verdict']} (interleaved)"
    return f"{cost['ratio']:.2f}: {cost['verdict']}"


def tables(goals: list[dict], cost_files: list[str] | None = None) -> str:
    lines = [
        "# The worst-off hospital's goal, task by task",
        "",
        f"`python benchmarks/worst_off.py {' '.join(g['folder'] for g in goals)}"
        f"{''.join(f' --cost {f}' for f in cost_files or [])} --table ...`. Each row: the arm's "
        "final score minus the baseline's, paired per seed, mean and 95% interval in points; 'seeds and test "
        "splits' where the interval counts the test patients' redraw too (docs/benchmarks.md). Goals: worst site "
        f"≥ FedAvg's + {WORST_GAIN:g} and ≥ Solo's; no site below FedAvg's or Solo's by more than its test "
        f"standard error; Std. at most {SPREAD_GOAL} × FedAvg's with the Std. difference below 0; Avg. − FedAvg's not "
        f"below {MEAN_MARGIN}; round time at most {COST_GOAL:g} × FedAvg's: '(interleaved)' where benchmarks/cost.py "
        "alternated the arm's runs with FedAvg's (wall and CPU ratios, both within the goal), otherwise the "
        "benchmark's runs one after another (indicative).",
    ]
    for g in goals:
        lines += [
            "",
            f"## {g['dataset']}: {g['metric']}",
            *(["", KEPT_NOTE] if g.get("kept") else []),
            "",
            "| arm | seeds | worst − FedAvg's worst | worst − Solo's worst | Std. − FedAvg's (ratio) | Avg. − FedAvg's "
            "| sites within their se of FedAvg / Solo | round / FedAvg's |",
            "|---|---:|---|---|---|---|---|---:|",
        ]
        for arm, r in g["arms"].items():
            within = r["sites_within_se"]

            site_cells = " / ".join(
                f"{sum(s['within'] for s in within[b]['sites'].values())} of {len(within[b]['sites'])}: "
                f"{within[b]['verdict']}"
                for b in BASELINES
                if b in within
            )
            lines.append(
                f"| {display_name(arm)} | {len(r['seeds'])} | {_cell(r, 'worst_vs_fedavg')} | "
                f"{_cell(r, 'worst_vs_solo')} | "
                f"{_cell(r, 'spread', ' (' + format(r['spread']['ratio'], '.2f') + 'x)')} | {_cell(r, 'mean')} | "
                f"{site_cells} | "
                f"{cost_cell(r['cost'])} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--table", help="write every folder's tables to this Markdown file")
    parser.add_argument(
        "--cost",
        action="append",
        default=[],
        help="benchmarks/cost.py's summary.json: the arms' round cost, runs alternated (repeat for other datasets)",
    )
    args = parser.parse_args()
    interleaved = cost_tables(args.cost)
    goals = []
    for folder in args.folders:
        try:
            result = goal(folder, interleaved)
        except RunsNotHere as e:
            print(f"{e}: keeping its goal.json", file=sys.stderr)
            result = kept_goal(folder, interleaved)
        else:
            Path(folder, "goal.json").write_text(json.dumps(result, indent=2) + "\n")
        goals.append({**result, "folder": folder})
    text = tables(goals, args.cost)
    if args.table:
        Path(args.table).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
