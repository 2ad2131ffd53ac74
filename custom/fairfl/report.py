"""`fairfl report`: the papers' results table and figures from one or more runs' results.json files.

As in the papers' tables (Fed-LWR Tables 1-2), values are percent, Avg. is the mean over sites and Std. the
population standard deviation across sites. With several runs (seeds) of a method, each cell is the mean over
seeds ± their sample sd (ddof=1), and Std. is the mean over seeds of each run's across-site std.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

from fairfl.results import RESULTS_FILE, SCHEMA_VERSION, SIMULATOR_RESULTS

METHOD_ORDER = ("solo", "fedavg")  # then the others alphabetically
DISPLAY = {"solo": "Solo", "fedavg": "FedAvg", "fedlwr": "Fed-LWR", "fedce": "FedCE", "qfedavg": "q-FedAvg",
           "ditto": "Ditto", "fedism": "FedISM", "fedismplus": "FedISM+", "fednpr": "FedNPR"}
METRIC_LABEL = {"dice": "Dice", "auc": "AUC", "acc": "Accuracy", "accuracy": "Accuracy"}


# ---------------------------------------------------------------- loading

def find_results(path) -> list[Path]:
    """The results.json files of a file, a run directory, an NVFlare simulator workspace, or any folder (recursive)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory")
    for candidate in (path / RESULTS_FILE, path / SIMULATOR_RESULTS):
        if candidate.is_file():
            return [candidate]
    found = sorted(path.rglob(RESULTS_FILE))
    if not found:
        raise FileNotFoundError(f"{path}: no {RESULTS_FILE} in it or below it "
                                f"(expected a run directory or an NVFlare simulator workspace)")
    return found


def load_runs(paths) -> list[dict]:
    """Load each results.json found under the given paths (once each); a run's file is kept under "file"."""
    files = [f for p in ([paths] if isinstance(paths, (str, Path)) else paths) for f in find_results(p)]
    runs, seen = [], set()
    for file in files:
        if file.resolve() not in seen:
            seen.add(file.resolve())
            runs.append(_load(file))
    return runs


def _load(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{file}: not a readable results file ({e})") from e
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != SCHEMA_VERSION:
        raise ValueError(f"{file}: results schema {schema!r}; this fairfl reads schema {SCHEMA_VERSION}")
    missing = [k for k in ("method", "metric", "seed", "sites", "rounds", "final") if k not in data]
    if missing:
        raise ValueError(f"{file}: results file lacks {', '.join(missing)}")
    return {**data, "file": str(file)}


# ---------------------------------------------------------------- statistics

def _metric(runs, metric=None) -> str:
    """The metric to report: the one asked for, else the one all runs use."""
    if not runs:
        raise ValueError("no runs to report")
    if metric:
        return metric
    names = {r["metric"] for r in runs}
    if len(names) != 1:
        raise ValueError(f"the runs use different metrics {sorted(names)}; choose one (--metric)")
    return names.pop()


def _scores(record, metric) -> dict:
    """{site: metric in percent} of an evaluated record (a round or "final"); {} when not evaluated."""
    return {s: 100.0 * v[metric] for s, v in ((record or {}).get("per_site") or {}).items() if metric in v}


def _avg_std(scores: dict) -> tuple[float, float]:
    """Mean and population std (ddof=0, as in the papers) across sites."""
    values = np.fromiter(scores.values(), float)
    return float(values.mean()), float(values.std())


def _mean_sd(values) -> tuple[float, float | None] | None:
    """Mean and sample sd (ddof=1) over seeds; sd None for one value; None for no values."""
    values = np.asarray(list(values), float)
    if values.size == 0:
        return None
    return float(values.mean()), float(values.std(ddof=1)) if values.size > 1 else None


def _site_key(site: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", site)]


def _sites(runs) -> list[str]:
    found = {s for r in runs for s in list(r["sites"]) + list((r["final"] or {}).get("per_site") or {})}
    return sorted(found, key=_site_key)


def _by_method(runs) -> dict[str, list[dict]]:
    """Runs grouped by method: Solo, FedAvg, then the others alphabetically; seeds in order within a method."""
    def key(run):
        m = run["method"]
        return (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m, run["seed"])
    groups = {}
    for run in sorted(runs, key=key):
        groups.setdefault(run["method"], []).append(run)
    return groups


def _name(method: str) -> str:
    return DISPLAY.get(method, method)


def _label(metric: str) -> str:
    return METRIC_LABEL.get(metric, metric)


# ---------------------------------------------------------------- table and CSV

def _finished(runs, metric) -> list[dict]:
    """The runs whose final evaluation has the metric."""
    return [r for r in runs if _scores(r["final"], metric)]


def _notes(runs, metric) -> list[str]:
    notes = [f"Note: skipped {r['file']} ({_name(r['method'])}, seed {r['seed']}): "
             + ("no final evaluation (the run did not finish)." if not r["final"] else f"no final {metric}.")
             for r in runs if not _scores(r["final"], metric)]
    for method, group in _by_method(_finished(runs, metric)).items():
        seeds = [r["seed"] for r in group]
        for seed in sorted({s for s in seeds if seeds.count(s) > 1}):
            notes.append(f"Note: {_name(method)} has {seeds.count(seed)} runs with seed {seed}; they are counted "
                         f"as separate seeds (different settings?).")
    return notes


def _cell(stat, bold=False) -> str:
    if stat is None:
        return "–"
    mean, sd = stat
    text = f"{mean:.2f}" if sd is None else f"{mean:.2f} ± {sd:.2f}"
    return f"**{text}**" if bold else text


def paper_table(runs, metric=None) -> str:
    """Markdown table in the papers' format (rows methods, columns sites, Avg., Std.) from each run's "final"."""
    metric = _metric(runs, metric)
    finished, notes = _finished(runs, metric), _notes(runs, metric)
    if not finished:
        return "\n".join(["No finished runs to tabulate.", *notes])
    sites, groups = _sites(finished), _by_method(finished)
    rows = {}
    for method, group in groups.items():
        per_run = [_scores(r["final"], metric) for r in group]
        summaries = [_avg_std(s) for s in per_run]
        rows[method] = ([_mean_sd(s[site] for s in per_run if site in s) for site in sites]
                        + [_mean_sd(a for a, _ in summaries), _mean_sd(sd for _, sd in summaries)])
    best_avg = max(round(row[-2][0], 2) for row in rows.values())
    best_std = min(round(row[-1][0], 2) for row in rows.values())
    with_seeds = any(len(g) > 1 for g in groups.values())
    header = ["Method", *sites, "Avg.", "Std."] + (["Seeds"] if with_seeds else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
    for method, (*site_cells, avg, std) in rows.items():
        cells = [_name(method), *map(_cell, site_cells),
                 _cell(avg, round(avg[0], 2) == best_avg), _cell(std, round(std[0], 2) == best_std)]
        lines.append("| " + " | ".join(cells + ([str(len(groups[method]))] if with_seeds else [])) + " |")
    return "\n".join(lines + ([""] + notes if notes else []))


def write_csv(runs, path, metric=None) -> Path:
    """One row per (method, seed, site) with the final metric in percent, plus rows for mean, std and worst."""
    metric = _metric(runs, metric)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "seed", "site", "metric", "percent", "file"])
        for run in (r for group in _by_method(_finished(runs, metric)).values() for r in group):
            scores = _scores(run["final"], metric)
            avg, std = _avg_std(scores)
            rows = [*scores.items(), ("mean", avg), ("std", std), ("worst", min(scores.values()))]
            writer.writerows([run["method"], run["seed"], site, metric, f"{value:.4f}", run["file"]]
                             for site, value in rows)
    return Path(path)


# ---------------------------------------------------------------- figures

def _figure(**kwargs):
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    return Figure(layout="constrained", **kwargs)


def _colors(runs) -> dict[str, str]:
    """One colour per method, the same in every figure of a report."""
    return {m: f"C{i % 10}" for i, m in enumerate(_by_method(runs))}


def plot_convergence(runs, path, metric=None) -> Path | None:
    """Fig. 2 of Fed-LWR: (a) Avg. and (b) Std. across sites versus round, one line per method (± sd over seeds)."""
    metric = _metric(runs, metric)
    fig = _figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    colors, evaluated = _colors(runs), set()
    for method, group in _by_method(runs).items():
        per_round = {}  # round -> [(avg, std) of each run]
        for run in group:
            for record in run["rounds"]:
                if scores := _scores(record, metric):
                    per_round.setdefault(record["round"], []).append(_avg_std(scores))
        if not per_round:
            continue
        x = sorted(per_round)
        evaluated.update(x)
        for i, ax in enumerate(axes):
            stats = [_mean_sd(v[i] for v in per_round[t]) for t in x]
            mean = np.array([m for m, _ in stats])
            sd = np.array([s or 0.0 for _, s in stats])
            label = _name(method) + (f" ({len(group)} seeds)" if len(group) > 1 else "")
            ax.plot(x, mean, color=colors[method], label=label, marker="o" if len(x) <= 25 else None, ms=3)
            if len(group) > 1:
                ax.fill_between(x, mean - sd, mean + sd, color=colors[method], alpha=0.2, lw=0)
    if not evaluated:
        return None
    label = _label(metric)
    for ax, title, ylabel in zip(axes, ("(a) Avg.", "(b) Std."),
                                 (f"mean {label} over sites (%)", f"std of {label} across sites (%)")):
        ax.set(title=title, xlabel="communication round", ylabel=ylabel)
        if len(evaluated) <= 12:  # a short run: a tick at each evaluated round
            ax.set_xticks(sorted(evaluated))
        else:
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=120)
    return Path(path)


def plot_per_site(runs, path, metric=None) -> Path | None:
    """Grouped bars of the final metric per site (and Avg.) for each method, ± sd over seeds."""
    metric = _metric(runs, metric)
    finished = _finished(runs, metric)
    if not finished:
        return None
    colors, groups, sites = _colors(runs), _by_method(finished), _sites(finished)
    columns = [*sites, "Avg."]
    fig = _figure(figsize=(max(6.0, 0.35 * len(columns) * len(groups) + 2.5), 4))
    ax = fig.subplots()
    x, width = np.arange(len(columns)), 0.8 / len(groups)
    low = 100.0
    for i, (method, group) in enumerate(groups.items()):
        per_run = [_scores(r["final"], metric) for r in group]
        per_run = [{**s, "Avg.": _avg_std(s)[0]} for s in per_run]
        stats = [_mean_sd(s[c] for s in per_run if c in s) or (np.nan, None) for c in columns]
        mean = np.array([m for m, _ in stats])
        sd = np.array([s or 0.0 for _, s in stats]) if len(group) > 1 else None
        ax.bar(x + (i - (len(groups) - 1) / 2) * width, mean, width, yerr=sd, capsize=2, color=colors[method],
               label=_name(method) + (f" ({len(group)} seeds)" if len(group) > 1 else ""))
        low = min(low, np.nanmin(mean - (sd if sd is not None else 0)))
    ax.axvline(len(sites) - 0.5, color="grey", lw=0.8, ls=":")
    ax.set_xticks(x, columns, rotation=30 if len(columns) > 8 else 0)
    bottom = max(0.0, 5 * np.floor((low - 5) / 5))  # differences of a few points must be visible
    ax.set_ylim(bottom, None)
    title = f"Final {_label(metric)} per site" + (" (the axis does not start at 0)" if bottom > 0 else "")
    ax.set(ylabel=f"final {_label(metric)} (%)", title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=120)
    return Path(path)


def _short_names(names: list[str]) -> list[str]:
    """Unique readable labels: the leading parts common to all dropped, and words of more than 4 letters
    shortened to their initial except in the last part, e.g. "model.1.submodule.0.conv.unit0.conv" ->
    "1.s.0.conv.unit0.conv" (MONAI's nested U-Net names share their last three parts)."""
    parts = [n.split(".") for n in names]
    common = 0
    while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
        common += 1
    parts = [p[common:] for p in parts]
    labels = [".".join([t[0] if t.isalpha() and len(t) > 4 else t for t in p[:-1]] + p[-1:]) for p in parts]
    return labels if len(set(labels)) == len(labels) else [".".join(p) for p in parts]


def plot_layer_weights(run, path) -> Path | None:
    """Fed-LWR's layer-by-site aggregation weights: the final round's and the mean over rounds; None without any."""
    from matplotlib.colors import TwoSlopeNorm

    records = [(r["round"], r["layer_weights"]) for r in run["rounds"] if r.get("layer_weights")]
    if not records:
        return None
    layers = list(dict.fromkeys(layer for _, lw in records for layer in lw))  # network order
    sites = sorted({s for _, lw in records for w in lw.values() for s in w}, key=_site_key)
    grids = [np.array([[lw.get(layer, {}).get(s, np.nan) for s in sites] for layer in layers]) for _, lw in records]
    final, mean = grids[-1], np.nanmean(grids, axis=0)
    uniform = 1.0 / len(sites)
    # white = uniform 1/K; weights live in [0, 1], so the two sides of the scale differ in length
    top = max(float(np.nanmax(np.stack([final, mean]))), uniform + 1e-3)
    norm = TwoSlopeNorm(vcenter=uniform, vmin=0.0, vmax=top)
    fig = _figure(figsize=(3.5 + 1.3 * len(sites), 1.6 + 0.24 * len(layers)))
    axes = fig.subplots(1, 2, sharey=True)
    annotate = len(layers) * len(sites) <= 400
    for ax, grid, title in zip(axes, (final, mean),
                               (f"round {records[-1][0]} (final)", f"mean over {len(records)} rounds")):
        image = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(sites)), sites, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if annotate:
            for (i, j), value in np.ndenumerate(grid):
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=6,
                        color="white" if abs(norm(value) - 0.5) > 0.3 else "black")
    axes[0].set_yticks(range(len(layers)), _short_names(layers), fontsize=7)
    axes[0].set_ylabel("layer (network order)")
    fig.colorbar(image, ax=list(axes), label="aggregation weight", shrink=0.8)
    fig.suptitle(f"{_name(run['method'])} layer weights, seed {run['seed']}: "
                 f"uniform 1/K = 1/{len(sites)} = {uniform:.3f} (white)", fontsize=11)
    fig.savefig(path, dpi=120)
    return Path(path)


# ---------------------------------------------------------------- report and command line

def _describe(run) -> str:
    rounds = run["rounds"]
    seconds = sum(r.get("seconds", 0.0) for r in rounds)
    evaluated = sum(1 for r in rounds if r.get("per_site"))
    rejected = sum(len(r.get("rejected") or {}) for r in rounds)
    return (f"- `{run['file']}`: {_name(run['method'])}, seed {run['seed']}, {len(rounds)} rounds "
            f"({evaluated} evaluated), {seconds:.1f} s, {rejected} rejected site update(s)"
            + ("" if run["final"] else ", **not finished**"))


def make_report(paths, out_dir, metric=None) -> dict:
    """Write report.md, results.csv and the figures into out_dir; returns {"report", "figures", "table"}."""
    runs = load_runs(paths)
    metric = _metric(runs, metric)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = paper_table(runs, metric)
    write_csv(runs, out / "results.csv", metric)
    captions = {plot_convergence(runs, out / "convergence.png", metric):
                f"(a) Avg. and (b) Std. of {_label(metric)} across sites versus communication round",
                plot_per_site(runs, out / "per_site.png", metric): f"Final {_label(metric)} per site"}
    for run in runs:
        name = f"layer_weights_{run['method']}_seed{run['seed']}"
        while (out / f"{name}.png") in captions:
            name += "_"
        captions[plot_layer_weights(run, out / f"{name}.png")] = (
            f"{_name(run['method'])} layer weights by site, seed {run['seed']} ({run['file']})")
    captions.pop(None, None)
    tasks = sorted({r.get("task", "?") for r in runs})
    lines = [f"# fairfl report: {', '.join(tasks)}, {_label(metric)}", "",
             f"{_label(metric)} (%) on each site's test set at the end of training. Avg.: mean over sites; "
             f"Std.: population standard deviation across sites; mean ± sd over seeds where a method has several "
             f"runs. Best Avg. and Std. in bold.", "", table, "", "## Runs", "",
             *(_describe(r) for group in _by_method(runs).values() for r in group), "",
             "## Figures", ""]
    for figure, caption in captions.items():
        lines += [f"{caption}:", "", f"![{figure.stem}]({figure.name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return {"report": report, "figures": list(captions), "table": table}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="WS",
                        help="results.json file, run directory, simulator workspace, or folder searched recursively")
    parser.add_argument("--out", help="output folder (default: <first input>/report, or beside its results file)")
    parser.add_argument("--metric", help="metric to report (default: the one the runs record)")


def run(args) -> int:
    first = Path(args.inputs[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "report"
    try:
        result = make_report(args.inputs, out, args.metric)
    except (OSError, ValueError) as e:
        print(f"fairfl report: {e}", file=sys.stderr)
        return 1
    print(result["table"])
    print(f"\nreport: {result['report']}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fairfl report", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
