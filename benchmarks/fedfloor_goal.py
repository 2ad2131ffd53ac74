"""FedFloor's goal, task by task, from the benchmarks' outputs (docs/methods/fedfloor.md).

For each benchmark folder: every method's Avg., Std. and worst site on the family's headline metric, side by side,
with the paired per-seed difference from FedAvg and its 95% t interval; FedFloor's spread as a multiple of FedAvg's
(per seed, and the mean's interval); its worst site against FedAvg's and Solo's seed by seed; the largest
difference between its global model's scores and FedAvg's (0: the same model, so a new site gets FedAvg's); its
round time over FedAvg's in that benchmark. With fewer paired seeds than the claims need (MIN_JUDGED_SEEDS, 3) both
goals read "not judged" (null in goal.json).

    python benchmarks/fedfloor_goal.py benchmarks/results/fedfloor/prostate [more folders] \
        [--table benchmarks/results/fedfloor/GOAL.md]

Writes <folder>/goal.json for each folder, and the tables of all of them to --table."""

import argparse
import csv
import json
import os
from pathlib import Path

from fairfl.benchmark.claims import MIN_JUDGED_SEEDS, NOT_JUDGED
from fairfl.methods import display_name
from fairfl.paired import mean_interval, paired_interval
from fairfl.report.statistics import mean_sd

SPREAD_GOAL = 0.6  # at most 0.6 times FedAvg's spread, with the interval below 1
MEAN_MARGIN = -0.5  # the mean at most half a point below FedAvg's
ORDER = ("fedfloor", "fedfloor_pick", "ditto", "fedbn", "solo", "fedavg")  # the arms first, the baselines last


def per_seed(folder: str, metric: str) -> tuple[dict, dict]:
    """({method: {seed: {site or "mean"/"std"/"worst": percent}}}, {(method, seed): its results.json path})."""
    values, files = {}, {}
    with open(os.path.join(folder, metric, "results.csv")) as f:
        for row in csv.DictReader(f):
            values.setdefault(row["method"], {}).setdefault(int(row["seed"]), {})[row["site"]] = float(row["percent"])
            files[row["method"], int(row["seed"])] = row["file"]
    return values, files


def interval(values: dict, method: str, statistic: str) -> dict:
    found = paired_interval(
        {s: v[statistic] for s, v in values[method].items()}, {s: v[statistic] for s, v in values["fedavg"].items()}
    )
    return {"mean": round(found.mean, 2), "low": round(found.low, 2), "high": round(found.high, 2)}


def goal(folder: str) -> dict:
    summary = json.loads(Path(folder, "summary.json").read_text())
    metric = summary["metrics"][0]  # the family's headline metric (balanced accuracy on the imbalanced sets)
    values, files = per_seed(folder, metric)
    floor, fedavg = values["fedfloor"], values["fedavg"]
    seeds = sorted(set(floor) & set(fedavg))
    ratios = [floor[s]["std"] / fedavg[s]["std"] for s in seeds]
    ratio = mean_interval(ratios)
    judged = len(seeds) >= MIN_JUDGED_SEEDS
    avg = interval(values, "fedfloor", "mean")
    seconds = summary["round_seconds"]
    methods = [m for m in ORDER if m in values] + sorted(set(values) - set(ORDER))
    return {
        "dataset": summary["dataset"],
        "metric": metric,
        "seeds": seeds,
        "methods": {
            m: {
                **{
                    statistic: _rounded(mean_sd(v[statistic] for v in values[m].values()))
                    for statistic in ("mean", "std", "worst")
                },
                **(
                    {"mean_vs_fedavg": interval(values, m, "mean"), "std_vs_fedavg": interval(values, m, "std")}
                    if m != "fedavg"
                    else {}
                ),
            }
            for m in methods
        },
        "std_over_fedavg": [round(r, 3) for r in ratios],
        "std_over_fedavg_mean_interval": [round(ratio.mean, 3), round(ratio.low, 3), round(ratio.high, 3)],
        # None: not judged, too few paired seeds (fairfl.benchmark.claims)
        "spread_goal_met": ratio.mean <= SPREAD_GOAL and ratio.high < 1.0 if judged else None,
        "mean_goal_met": avg["low"] >= MEAN_MARGIN if judged else None,
        "worst": {m: [round(values[m][s]["worst"], 2) for s in seeds] for m in methods},
        "worst_at_least": {
            m: [floor[s]["worst"] >= values[m][s]["worst"] for s in seeds] for m in ("fedavg", "solo") if m in values
        },
        "global_model_vs_fedavg": global_model_vs_fedavg(files, seeds, metric),
        # the benchmark's own median round times: its runs did not alternate with FedAvg's (benchmarks/cost.py does)
        "round_seconds_over_fedavg": round(seconds["fedfloor"] / seconds["fedavg"], 2),
    }


def _rounded(mean_sd: tuple) -> list:
    """[mean, sd] over seeds to two decimals; sd None with one seed."""
    return [round(v, 2) if v is not None else None for v in mean_sd]


def global_model_vs_fedavg(files: dict, seeds: list, metric: str) -> float | None:
    """The largest difference, over sites and seeds, between FedFloor's global model's final score at a site
    (global_<metric>) and FedAvg's: 0 when the global model, and so what a new site receives, is FedAvg's. None
    without the runs' results files (they are not committed)."""
    paths = [files[method, s] for s in seeds for method in ("fedfloor", "fedavg")]
    if not all(os.path.exists(p) for p in paths):
        return None
    largest = 0.0
    for s in seeds:
        floor, fedavg = (json.loads(Path(files[m, s]).read_text())["final"]["per_site"] for m in ("fedfloor", "fedavg"))
        largest = max(largest, *(abs(floor[site][f"global_{metric}"] - fedavg[site][metric]) for site in fedavg))
    return largest


def _signed(value: float) -> str:
    return f"{value:+.2f}".replace("-", "\u2212")  # the minus sign of the other summaries


def _interval(found: dict) -> str:
    return f"{_signed(found['mean'])} [{_signed(found['low'])}, {_signed(found['high'])}]"


def goal_text(met: bool | None) -> str:
    return NOT_JUDGED if met is None else "met" if met else "missed"


def _seeds(flags: list) -> str:
    return f"{sum(flags)} of {len(flags)}"


def tables(goals: list[dict]) -> str:
    lines = [
        "# FedFloor's goal, task by task",
        "",
        f"`python benchmarks/fedfloor_goal.py {' '.join(g['folder'] for g in goals)} --table ...`: from each "
        "benchmark's results.csv (final scores in %, mean ± sd over seeds; Std. is the population std across "
        "sites); differences are paired per seed against FedAvg, with the 95% t interval.",
        "",
        "## The goal",
        "",
        f"Spread goal: FedFloor's Std. at most {SPREAD_GOAL} times FedAvg's (mean of the per-seed ratios) with the "
        f"interval below 1. Mean goal: the interval of Avg. − FedAvg's not below {_signed(MEAN_MARGIN)}. Worst site: "
        "in how many seeds FedFloor's worst site is at least FedAvg's and Solo's. Global model: the largest difference "
        "between FedFloor's global model's score at a site and FedAvg's (0: the same model). Round time: the "
        "benchmark's median round over FedAvg's (not alternated with FedAvg's runs).",
        "",
        "| task | metric | Std. / FedAvg's per seed | mean [95%] | spread goal | Avg. − FedAvg | mean goal | worst ≥ "
        "FedAvg's | worst ≥ Solo's | global model − FedAvg's | round time / FedAvg's |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in goals:
        ratio = g["std_over_fedavg_mean_interval"]
        at_least = g["worst_at_least"]
        lines.append(
            f"| {g['dataset']} | {g['metric']} | {', '.join(f'{r:.3f}' for r in g['std_over_fedavg'])} | "
            f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] | {goal_text(g['spread_goal_met'])} | "
            f"{_interval(g['methods']['fedfloor']['mean_vs_fedavg'])} | {goal_text(g['mean_goal_met'])} | "
            f"{_seeds(at_least['fedavg'])} | {_seeds(at_least['solo']) if 'solo' in at_least else '–'} | "
            f"{'–' if g['global_model_vs_fedavg'] is None else g['global_model_vs_fedavg']} | "
            f"{g['round_seconds_over_fedavg']:.2f} |"
        )
    for g in goals:
        lines += [
            "",
            f"## {g['dataset']}: {g['metric']}, seeds {g['seeds']}",
            "",
            "| method | Avg. | Std. | worst site | Avg. − FedAvg | Std. − FedAvg |",
            "|---|---|---|---|---|---|",
        ]
        for m, row in g["methods"].items():
            cells = [
                f"{row[s][0]:.2f} ± {row[s][1]:.2f}" if row[s][1] is not None else f"{row[s][0]:.2f}"
                for s in ("mean", "std", "worst")
            ]
            differences = [_interval(row[k]) if k in row else "–" for k in ("mean_vs_fedavg", "std_vs_fedavg")]
            lines.append(f"| {display_name(m)} | " + " | ".join(cells + differences) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--table", help="write every folder's tables to this Markdown file")
    args = parser.parse_args()
    goals = []
    for folder in args.folders:
        result = goal(folder)
        with open(os.path.join(folder, "goal.json"), "w") as f:
            json.dump(result, f, indent=2)
        goals.append({**result, "folder": folder})
        print(folder, json.dumps(result["std_over_fedavg_mean_interval"]), result["methods"]["fedfloor"])
    if args.table:
        with open(args.table, "w") as f:
            f.write(tables(goals))


if __name__ == "__main__":
    main()
