"""`fairfl report`: the papers' results table and figures from one or more runs' results.json files.

As in the papers' tables (Fed-LWR Tables 1-2), values are percent, Avg. is the mean over sites and Std. the
population standard deviation across sites. With several runs (seeds) of a method, each cell is the mean over
seeds ± their sample sd (ddof=1), and Std. is the mean over seeds of each run's across-site std. A second table
gives the spread over sites: worst and best site, percentiles, best - worst and the Gini coefficient.

Runs of one method with other free riders or other left-out sites are reported as separate rows. The FedCE
paper's fairness tables are added where the inputs allow: performance fairness against Solo (Table 2),
per-region Dice, client contributions (with a per-round figure), and, given a leave-one-out file, the
agreement of each method's contribution estimate with the leave-one-out values (Table 3).
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import re
import sys
from pathlib import Path

import numpy as np

from fairfl.fairness import contribution_agreement, normalise_abs, performance_fairness, summarize
from fairfl.loo import load_loo, marginal_table
from fairfl.methods import display_name
from fairfl.results import GLOBAL_PREFIX, RESULTS_FILE, SIMULATOR_RESULTS, read_results, site_key
from fairfl.text import csv_text, markdown_text

METHOD_ORDER = ("solo", "fedavg")  # then the others alphabetically
METRIC_LABEL = {
    "dice": "Dice",
    "auc": "AUC",
    "acc": "Accuracy",
    "accuracy": "Accuracy",
    "balanced_accuracy": "Balanced accuracy",
    "corrupted_auc": "AUC (corrupted)",
    "corrupted_accuracy": "Accuracy (corrupted)",
    "corrupted_balanced_accuracy": "Balanced accuracy (corrupted)",
    "clean_auc": "AUC (clean)",
    "clean_accuracy": "Accuracy (clean)",
    "clean_balanced_accuracy": "Balanced accuracy (clean)",
}


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
        raise FileNotFoundError(
            f"{path}: no {RESULTS_FILE} in it or below it (expected a run directory or an NVFlare simulator workspace)"
        )
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
    return {**read_results(file), "file": str(file)}


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
    """{site: metric in percent} of an evaluated record (a round or "final"); {} when not evaluated. A value that is
    not a number (null: a NaN as the results file writes it; anything else a hostile file holds) is NaN, so a run
    with such a site counts as one without a finite result (left out of claims, refused by the tables), never as a
    crash or a smaller set of sites."""
    return {
        s: 100.0 * (v[metric] if _is_number(v[metric]) else math.nan)
        for s, v in ((record or {}).get("per_site") or {}).items()
        if isinstance(v, dict) and metric in v
    }


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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


def _sites(runs) -> list[str]:
    found = {s for r in runs for s in list(r["sites"]) + list((r["final"] or {}).get("per_site") or {})}
    return sorted(found, key=site_key)


def _variant(run) -> str:
    """What besides the method makes runs of it incomparable: a local optimiser other than Adam, a kept optimiser
    state, its free riders and left-out sites ("" if none)."""
    config = run.get("config") or {}
    parts = [
        label
        for label, applies in (
            (str(config.get("local_optimizer", "")).upper(), config.get("local_optimizer", "adam") != "adam"),
            ("optimiser state kept", bool(config.get("keep_optimizer_state"))),
        )
        if applies
    ]
    parts += [
        prefix + ", ".join(sites)
        for sites, prefix in ((free_riders(run), "free riders: "), (_left_out(run), "without "))
        if sites
    ]
    return f" ({'; '.join(parts)})" if parts else ""


def _group(run) -> str:
    """The row a run belongs to: its method, and its variant if any, e.g. "fedce_sum (free riders: site-6)"."""
    return run["method"] + _variant(run)


def _by_method(runs) -> dict[str, list[dict]]:
    """Runs grouped by method and variant: Solo, FedAvg, then the others alphabetically; seeds in order."""

    def key(run):
        m = run["method"]
        return (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m, _variant(run), run["seed"])

    groups = {}
    for run in sorted(runs, key=key):
        groups.setdefault(_group(run), []).append(run)
    return groups


def _display_name(group: str) -> str:
    """Display name of a method, or of a group "method (variant)", as text (figures)."""
    method, sep, variant = group.partition(" (")
    return display_name(method) + sep + variant


def _name(group: str) -> str:
    """`_display_name` as markdown (`markdown_text`)."""
    return markdown_text(_display_name(group))


def _metric_label(metric: str) -> str:
    """ "dice" -> "Dice", "dice_cup" -> "Dice (cup)", as text (figures)."""
    base, _, region = metric.partition("_")
    if metric not in METRIC_LABEL and region and base in METRIC_LABEL:
        return f"{METRIC_LABEL[base]} ({region})"
    return METRIC_LABEL.get(metric, metric)


def _label(metric: str) -> str:
    """`_metric_label` as markdown (`markdown_text`)."""
    return markdown_text(_metric_label(metric))


# ---------------------------------------------------------------- table and CSV


def _finished(runs, metric) -> list[dict]:
    """The runs whose final evaluation has the metric."""
    return [r for r in runs if _scores(r["final"], metric)]


def _notes(runs, metric) -> list[str]:
    notes = [
        f"Note: skipped {markdown_text(r['file'])} ({_name(_group(r))}, seed {r['seed']}): "
        + ("no final evaluation (the run did not finish)." if not r["final"] else f"no final {markdown_text(metric)}.")
        for r in runs
        if not _scores(r["final"], metric)
    ]
    for method, group in _by_method(_finished(runs, metric)).items():
        seeds = [r["seed"] for r in group]
        for seed in sorted({s for s in seeds if seeds.count(s) > 1}):
            notes.append(
                f"Note: {_name(method)} has {seeds.count(seed)} runs with seed {seed}; they are counted "
                f"as separate seeds (different settings?)."
            )
    return notes


def _cell(stat, bold=False, digits=2) -> str:
    if stat is None:
        return "–"
    mean, sd = stat
    text = f"{mean:.{digits}f}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"
    return f"**{text}**" if bold else text


def _markdown(header, rows) -> list[str]:
    """Lines of a markdown table: the first column left-aligned, the others right-aligned."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" + "---:|" * (len(header) - 1),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


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
        rows[method] = [_mean_sd(s[site] for s in per_run if site in s) for site in sites] + [
            _mean_sd(a for a, _ in summaries),
            _mean_sd(sd for _, sd in summaries),
        ]
    best_avg = max(round(row[-2][0], 2) for row in rows.values())
    best_std = min(round(row[-1][0], 2) for row in rows.values())
    with_seeds = any(len(g) > 1 for g in groups.values())
    header = ["Method", *map(markdown_text, sites), "Avg.", "Std."] + (["Seeds"] if with_seeds else [])
    lines = _markdown(
        header,
        (
            [
                _name(method),
                *map(_cell, site_cells),
                _cell(avg, round(avg[0], 2) == best_avg),
                _cell(std, round(std[0], 2) == best_std),
            ]
            + ([str(len(groups[method]))] if with_seeds else [])
            for method, (*site_cells, avg, std) in rows.items()
        ),
    )
    return "\n".join(lines + ([""] + notes if notes else []))


def write_csv(runs, path, metric=None) -> Path:
    """One row per (method, seed, site) with the final metric in percent, plus rows for mean, std and worst."""
    metric = _metric(runs, metric)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "variant", "seed", "site", "metric", "percent", "file"])
        for run in (r for group in _by_method(_finished(runs, metric)).values() for r in group):
            scores = _scores(run["final"], metric)
            avg, std = _avg_std(scores)
            rows = [*scores.items(), ("mean", avg), ("std", std), ("worst", min(scores.values()))]
            names = [run["method"], _variant(run).strip(" ()"), run["seed"]]  # once a run, not once a site
            writer.writerows(
                [*map(csv_text, [*names, site, metric]), f"{value:.4f}", csv_text(run["file"])] for site, value in rows
            )
    return Path(path)


SPREAD_COLUMNS = (  # header, key of fairness.summarize, which value is best, digits
    ("Worst", "worst", max, 2),
    ("P10", "p10", max, 2),
    ("Median", "p50", max, 2),
    ("P90", "p90", max, 2),
    ("Best", "best", max, 2),
    ("Spread", "spread", min, 2),
    ("Gini", "gini", min, 3),
)
SPREAD_TEXT = (
    "How the final {label} (%) spreads over the sites (`fairfl.fairness.summarize`, the statistics results.json "
    "records): the worst and the best site's value, the 10th, 50th and 90th percentiles of the per-site values "
    "(linear interpolation), Spread = Best - Worst, and the Gini coefficient (mean absolute difference of all "
    "pairs of sites / (2 × mean); 0: every site equal). Mean ± sd over seeds; best in bold (the highest value, the "
    "lowest Spread and Gini); –: undefined (Gini of negative values) in a seed."
)


def spread_table(runs, metric=None) -> tuple[str, dict]:
    """The spread of each method's final metric (%) over sites: worst, percentiles, best, spread, Gini, each the mean
    ± sd over seeds of each run's `fairness.summarize`. ("", {}) without a finished run.

    Returns (markdown, {group: {"worst"|"p10"|...|"gini": (mean, sd or None) or None (undefined in a seed), "seeds"}}).
    """
    metric = _metric(runs, metric)
    groups = _by_method(_finished(runs, metric))
    if not groups:
        return "", {}
    stats = {}
    for key, group in groups.items():
        summaries = [_summarized(run, _scores(run["final"], metric)) for run in group]
        stats[key] = {
            k: None if any(s[k] is None for s in summaries) else _mean_sd(s[k] for s in summaries)
            for _, k, _, _ in SPREAD_COLUMNS
        }
        stats[key]["seeds"] = len(group)
    best = {k: _best((v[k][0] for v in stats.values() if v[k]), pick) for _, k, pick, _ in SPREAD_COLUMNS}
    rows = (
        [
            _name(key),
            *(
                _cell(v[k], v[k] is not None and f"{v[k][0]:.{digits}f}" == f"{best[k]:.{digits}f}", digits)
                for _, k, _, digits in SPREAD_COLUMNS
            ),
            str(v["seeds"]),
        ]
        for key, v in stats.items()
    )
    return "\n".join(_markdown(["Method", *(h for h, _, _, _ in SPREAD_COLUMNS), "seeds"], rows)), stats


def _summarized(run, scores: dict) -> dict:
    """`fairness.summarize` of a run's per-site scores; a value it refuses (not a finite number) names the file."""
    try:
        return summarize(scores)
    except ValueError as e:  # a hostile or broken file: name it
        raise ValueError(f"{run['file']}: {e}") from e


# ---------------------------------------------------------------- the global model and held-out sites

SUMMARY_COLUMNS = (("Avg.", "mean"), ("Std.", "std"), ("Worst", "worst"))


def _summary_stats(group, per_run) -> dict:
    """{"mean"|"std"|"worst": (mean, sd over seeds) or None} of each run's `summarize` of its {site: %} in `per_run`
    (runs with no site left out)."""
    summaries = [_summarized(run, scores) for run, scores in zip(group, per_run) if scores]
    return {k: _mean_sd(s[k] for s in summaries) for _, k in SUMMARY_COLUMNS}


def _federation_scores(run, metric) -> dict:
    """{site: final metric in %} of the sites that trained (not held out)."""
    held_out = set(_left_out(run))
    return {s: v for s, v in _scores(run["final"], metric).items() if s not in held_out}


def personal_global_table(runs, metric=None) -> tuple[str, dict]:
    """Personalised methods (final `global_<metric>` scores): each federation site's final metric (%) with the model
    it is scored with (its personal model, or the global model with its own head or normalisation layers) and with
    the global model as it is, and Avg., Std. and Worst over the sites that have both, mean ± sd over seeds.
    ("", {}) when no run has global-model scores. Returns (markdown, {group: {"personal"|"global": {site|"mean"|
    "std"|"worst": (mean, sd) or None}}})."""
    metric = _metric(runs, metric)
    global_metric = GLOBAL_PREFIX + metric
    groups = {
        key: group
        for key, group in _by_method(_finished(runs, metric)).items()
        if any(_federation_scores(r, global_metric) for r in group)
    }
    if not groups:
        return "", {}
    sites = sorted({s for g in groups.values() for r in g for s in _federation_scores(r, metric)}, key=site_key)
    stats, rows, notes = {}, [], []
    for key, group in groups.items():
        scores = {
            model: [_federation_scores(r, m) for r in group]
            for model, m in (("personal", metric), ("global", global_metric))
        }
        both = [set(p) & set(g) for p, g in zip(scores["personal"], scores["global"])]
        for run, own, shared in zip(group, scores["personal"], both):
            if set(own) - shared:
                missing = ", ".join(map(markdown_text, sorted(set(own) - shared, key=site_key)))
                notes.append(
                    f"Note: {markdown_text(run['file'])} has no global-model score for {missing}: left out of its Avg."
                )
        for model in ("personal", "global"):
            cells = {site: _mean_sd(p[site] for p in scores[model] if site in p) for site in sites}
            cells.update(_summary_stats(group, [{s: p[s] for s in b} for p, b in zip(scores[model], both)]))
            stats.setdefault(key, {})[model] = cells
            rows.append([_name(key), f"{model} model", *(_cell(cells[c]) for c in [*sites, "mean", "std", "worst"])])
    header = ["Method", "Scored with", *map(markdown_text, sites), *(h for h, _ in SUMMARY_COLUMNS)]
    return "\n".join(_markdown(header, rows) + ([""] + notes if notes else [])), stats


PERSONAL_GLOBAL_TEXT = (
    "Personalised methods score each site with a model of its own (Ditto: its personal model; FedNPR-Per, FedBN: the "
    "global model with the site's own classifier head or normalisation layers) and, in the same evaluation, with the "
    "global model as the server holds it (`global_model.pt`; for FedNPR-Per and FedBN with the head or normalisation "
    "layers it started with, never trained: what a site gets that has not trained its own). Final {label} (%) per "
    "site of the federation; Avg., Std. (population) and Worst over the sites scored with both; mean ± sd over seeds."
)


def held_out_table(runs, metric=None) -> tuple[str, dict]:
    """Runs with sites held out of training (`exclude_sites`, scored with the global model): Avg., Std. and Worst of
    the final metric (%) over the federation's sites and over the held-out ones, mean ± sd over seeds. ("", {})
    without such a run. Returns (markdown, {group: {"held_out": [sites], "federation"|"held_out_scores": {"mean"|
    "std"|"worst": (mean, sd) or None}}})."""
    metric = _metric(runs, metric)
    groups = {k: g for k, g in _by_method(_finished(runs, metric)).items() if _left_out(g[0])}
    if not groups:
        return "", {}
    stats, rows = {}, []
    for key, group in groups.items():
        held_out = _left_out(group[0])  # a group's runs hold out the same sites (`_variant`)
        held_set = set(held_out)
        federation = _summary_stats(group, [_federation_scores(r, metric) for r in group])
        scores = [{s: v for s, v in _scores(r["final"], metric).items() if s in held_set} for r in group]
        outside = _summary_stats(group, scores)
        stats[key] = {"held_out": held_out, "federation": federation, "held_out_scores": outside}
        rows.append(
            [
                _name(key),
                ", ".join(map(markdown_text, held_out)),
                *(_cell(part[k]) for part in (federation, outside) for _, k in SUMMARY_COLUMNS),
            ]
        )
    header = ["Method", "Held out", *(f"{who} {h}" for who in ("Federation", "Held-out") for h, _ in SUMMARY_COLUMNS)]
    return "\n".join(_markdown(header, rows)), stats


HELD_OUT_TEXT = (
    "Sites held out of training (server argument `exclude_sites`): they never train nor enter aggregation and are "
    "scored with the final global model as it is, as a hospital joining later would receive it. Final {label} (%): "
    "Avg., Std. (population) and Worst over the federation's sites and over the held-out sites apart, mean ± sd over "
    "seeds; –: no held-out site scored."
)


# ---------------------------------------------------------------- FedCE paper: fairness and contribution tables


def _mean_per_site(dicts) -> dict:
    """{site: mean over the dicts that have it} of per-site values, e.g. one dict per seed."""
    sites = sorted({s for d in dicts for s in d}, key=site_key)
    return {s: float(np.mean([d[s] for d in dicts if s in d])) for s in sites}


def _number(value, spec, best=None) -> str:
    """A value formatted with `spec`; bold if it equals `best` as printed; "–" if undefined (NaN)."""
    if value is None or not np.isfinite(value):
        return "–"
    text = format(value, spec)
    return f"**{text}**" if best is not None and text == format(best, spec) else text


def _best(values, pick):
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return pick(finite) if finite else None


def _pearson_cell(stat, best=None) -> str:
    """ "r (p)" as in the papers' tables, e.g. "0.982 (4.6e-04)"."""
    if not np.isfinite(stat["pearson"]):
        return "–"
    return f"{_number(stat['pearson'], '.3f', best)} ({stat['p_value']:.1e})"


QUALITY_COLUMNS = (("Clean", "clean"), ("Corrupted", "corrupted"), ("Average", None))


def _quality_row(run) -> dict | None:
    """One run's FedISM+ Tables II-III and IV values in percent: {"Clean ACC", "Clean AUC", "Corrupted ACC",
    "Corrupted AUC", "Average ACC", "Average AUC" (of clean and corrupted), "Std. AUC" (population std across
    sites of the AUC on each site's own-quality test set)}; None if its final evaluation has no corrupted AUC."""
    final = run.get("final") or {}
    if not _scores(final, "corrupted_auc"):
        return None
    row = {}
    for short, metric in (("ACC", "accuracy"), ("AUC", "auc")):
        clean, corrupted = (_avg_std(_scores(final, f"{q}_{metric}"))[0] for q in ("clean", "corrupted"))
        row.update(
            {f"Clean {short}": clean, f"Corrupted {short}": corrupted, f"Average {short}": (clean + corrupted) / 2}
        )
    row["Std. AUC"] = _avg_std(_scores(final, "auc"))[1]
    return row


def quality_shift_table(runs) -> tuple[str, dict]:
    """FedISM+'s Tables II-III (clean, corrupted and average ACC and AUC, %) and Table IV (std of AUC across sites)
    from the classification runs' final evaluations, mean ± sd over seeds; ("", {}) when no run has them."""
    groups = {}
    for run in runs:
        row = _quality_row(run)
        if row:
            groups.setdefault(_group(run), []).append(row)
    if not groups:
        return "", {}
    columns = [f"{q} {m}" for q, _ in QUALITY_COLUMNS for m in ("ACC", "AUC")] + ["Std. AUC"]
    stats = {g: {c: _mean_sd(r[c] for r in rows) for c in columns} for g, rows in groups.items()}
    best = {c: (min if c == "Std. AUC" else max)(round(v[c][0], 2) for v in stats.values()) for c in columns}
    lines = _markdown(
        ["Method", *columns],
        ([_name(g), *(_cell(v[c], round(v[c][0], 2) == best[c]) for c in columns)] for g, v in stats.items()),
    )
    return "\n".join(lines), stats


QUALITY_SHIFT_TEXT = (
    "As FedISM+'s Tables II-III and IV, in %: accuracy (ACC) and macro one-vs-rest AUC on the clean test set and on "
    "the same images corrupted as the corrupted sites' are, and their average; Std. AUC: population std across "
    "sites of the AUC each site measures on the test set of its own image quality (the papers' client-level "
    "testing). Mean ± sd over seeds; best in bold."
)


def _left_out(run) -> list:
    return list((run.get("config") or {}).get("exclude_sites") or [])


def free_riders(run) -> list:
    """The sites that reported themselves free riders (training metric `free_rider`; their own test switch), or
    that an older results file lists under config `free_riders`."""
    reported = {
        site
        for record in run.get("rounds") or []
        for site, metrics in (record.get("train") or {}).items()
        if (metrics or {}).get("free_rider")
    }
    return sorted(reported | set((run.get("config") or {}).get("free_riders") or []), key=site_key)


def region_metrics(runs, metric) -> list[str]:
    """The per-region variants of `metric` in the runs' final evaluations, e.g. dice_disc and dice_cup."""
    found = (key for r in runs for values in ((r["final"] or {}).get("per_site") or {}).values() for key in values)
    return [key for key in dict.fromkeys(found) if key.startswith(metric + "_") and not key.endswith("_se")]


def performance_fairness_table(runs, metric=None) -> tuple[str, dict]:
    """FedCE Table 2: each method's per-site final metric (%) against Solo's: Pearson r (p), Euclidean distance.

    Per-site values are averaged over a method's seeds, and over Solo's, before the one comparison. A method is
    compared with the Solo runs of its own variant (the same free riders) if there are any, else with plain
    Solo; one whose sites differ from Solo's is skipped with a note. Returns ("", {}) without a Solo run, else
    (markdown, {group: {"pearson", "p_value", "euclidean", "note", "reference", "seeds", "reference_seeds"}})."""
    metric = _metric(runs, metric)
    groups = _by_method(_finished(runs, metric))
    if not any(group[0]["method"] == "solo" for group in groups.values()):
        return "", {}
    stats, notes = {}, []
    for key, group in groups.items():
        if group[0]["method"] == "solo":
            continue
        reference = next((k for k in ("solo" + _variant(group[0]), "solo") if k in groups), None)
        if reference is None:
            notes.append(f"Note: {_name(key)} is not compared: no plain Solo run.")
            continue
        scores, solo = (_mean_per_site([_scores(r["final"], metric) for r in g]) for g in (group, groups[reference]))
        if set(scores) != set(solo):
            notes.append(f"Note: {_name(key)} is not compared: its sites differ from {_name(reference)}'s.")
            continue
        stats[key] = {
            **performance_fairness(scores, solo),
            "reference": reference,
            "seeds": len(group),
            "reference_seeds": len(groups[reference]),
        }
        if stats[key]["note"]:
            notes.append(f"Note: {_name(key)}: {stats[key]['note']}.")
    if not stats:
        return "\n".join(["No method to compare with Solo.", *notes]), {}
    best_r = _best((v["pearson"] for v in stats.values()), max)
    best_d = _best((v["euclidean"] for v in stats.values()), min)
    rows = (
        [
            _name(key),
            _pearson_cell(v, best_r),
            _number(v["euclidean"], ".2f", best_d),
            _name(v["reference"]),
            f"{v['seeds']} / {v['reference_seeds']}",
        ]
        for key, v in stats.items()
    )
    lines = _markdown(["Method", "Pearson r (p)", "Euclidean distance", "compared with", "seeds (method / Solo)"], rows)
    return "\n".join(lines + ([""] + notes if notes else [])), stats


def contribution_table(runs) -> tuple[str, dict]:
    """Final client contributions per site (mean ± sd over seeds) of the runs that record them (FedCE; CFFL and CGSV:
    their reputations), and the
    accumulated gradient and data terms where recorded; free riders marked †. ("", {}) if no run has them.

    Returns (markdown, {group: {"contributions"|"gradient"|"data": {site: (mean, sd or None)}}})."""
    groups = _by_method([r for r in runs if (r["final"] or {}).get("contributions")])
    if not groups:
        return "", {}
    sites = _sites([r for group in groups.values() for r in group])
    stats, rows = {}, []
    for key, group in groups.items():
        finals = [r["final"] for r in group]
        per_run = {"contributions": [f["contributions"] for f in finals]}
        for term in ("gradient", "data"):
            if all(f.get("contribution_terms") for f in finals):
                per_run[term] = [{s: t[term] for s, t in f["contribution_terms"].items() if term in t} for f in finals]
        free = set(free_riders(group[0]))
        stats[key] = {
            what: {s: _mean_sd(v[s] for v in values if s in v) for s in sites} for what, values in per_run.items()
        }
        for what, per_site in stats[key].items():
            label = "contribution" if what == "contributions" else f"{what} term"
            rows.append(
                [
                    _name(key),
                    label,
                    *(_cell(per_site[s], digits=3) + (" †" if s in free else "") for s in sites),
                    str(len(group)),
                ]
            )
    lines = _markdown(["Method", "estimate", *map(markdown_text, sites), "seeds"], rows)
    if any(free_riders(group[0]) for group in groups.values()):
        lines += ["", "† free rider (trains on one image repeated; should earn almost nothing)."]
    return "\n".join(lines), stats


def _mean_over_rounds(records: list[dict], sites) -> dict:
    """Mean of per-round weights; a site missing from a round (its update was rejected) counts as weight 0."""
    return {s: float(np.mean([record.get(s, 0.0) for record in records])) for s in sites}


def contribution_estimates(run) -> dict[str, dict]:
    """{what: {site: value}}: the client contributions a run implies, as the FedCE paper compares them.

    FedCE: its final accumulated contributions; CFFL, CGSV: their final reputations. Methods without them: their
    aggregation weights averaged over
    rounds ("we take the aggregation weights as client contributions"); Fed-LWR: the layer weights it aggregates
    with, averaged over layers and rounds (its anchor weights are uniform, or FedAvg's with weighting "samples")."""
    contributions = (run["final"] or {}).get("contributions")
    if contributions:
        return {"final contributions": dict(contributions)}
    estimates = {}
    records = [r["weights"] for r in run["rounds"] if r.get("weights")]
    if records:
        estimates["aggregation weights"] = _mean_over_rounds(records, run["sites"])
    per_layer = [w for r in run["rounds"] for w in (r.get("layer_weights") or {}).values()]
    if per_layer:
        estimates["layer weights, mean over layers"] = _mean_over_rounds(per_layer, run["sites"])
    return estimates


def contribution_agreement_table(runs, loo: dict) -> tuple[str, dict]:
    """FedCE Table 3: each method's contribution estimate against the leave-one-out marginal values.

    A method's estimate is averaged per site over its seeds, then compared once (Pearson r (p), Euclidean
    distance after dividing both vectors by the sum of their absolute values, cosine similarity) on the sites
    the leave-one-out file valued. Runs that left sites out themselves are not compared.
    Returns (markdown: the agreement table and the per-site shares, {group: {what: statistics + "seeds"}})."""
    marginal = loo["marginal"]
    sites = sorted(marginal, key=site_key)
    stats, shares, notes = {}, {}, []
    for key, group in _by_method([r for r in runs if r["final"] and not _left_out(r)]).items():
        per_what = {}
        for run in group:
            for what, estimate in contribution_estimates(run).items():
                per_what.setdefault(what, []).append(estimate)
        for what, estimates in per_what.items():
            mean = _mean_per_site(estimates)
            if not set(sites) <= set(mean):
                notes.append(
                    f"Note: {_name(key)} is not compared: it has no {what} for "
                    f"{', '.join(map(markdown_text, sorted(set(sites) - set(mean), key=site_key)))}."
                )
                continue
            values = {s: mean[s] for s in sites}
            stats.setdefault(key, {})[what] = {**contribution_agreement(values, marginal), "seeds": len(estimates)}
            shares[f"{_name(key)}: {what}"] = normalise_abs(np.array([values[s] for s in sites]))
            if stats[key][what]["note"]:
                notes.append(f"Note: {_name(key)}, {what}: {stats[key][what]['note']}.")
    if not stats:
        return "\n".join(["No run with a contribution estimate for these sites.", *notes]), {}
    flat = [v for per_what in stats.values() for v in per_what.values()]
    best_r, best_d, best_c = (
        _best((v[k] for v in flat), pick) for k, pick in (("pearson", max), ("euclidean", min), ("cosine", max))
    )
    rows = (
        [
            _name(key),
            what,
            _pearson_cell(v, best_r),
            _number(v["euclidean"], ".3f", best_d),
            _number(v["cosine"], ".3f", best_c),
            str(v["seeds"]),
        ]
        for key, per_what in stats.items()
        for what, v in per_what.items()
    )
    lines = _markdown(["Method", "estimate", "Pearson r (p)", "Euclidean distance", "cosine similarity", "seeds"], rows)
    if sum(np.abs(list(marginal.values()))) > 0:
        loo_shares = normalise_abs(np.array([marginal[s] for s in sites]))
        lines += [
            "",
            "Per site, each vector divided by the sum of its absolute values (what the distance compares):",
            "",
            *_markdown(
                ["", *map(markdown_text, sites)],
                [
                    [label, *(f"{v:+.3f}" for v in values)]
                    for label, values in {"leave-one-out": loo_shares, **shares}.items()
                ],
            ),
        ]
    return "\n".join(lines + ([""] + notes if notes else [])), stats


# ---------------------------------------------------------------- figures


def _figure(**kwargs):
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    return Figure(layout="constrained", **kwargs)


def _literal_text(plot):
    """`plot` drawing every text as it is: names from a results file go into labels, titles and legends, and
    matplotlib would read what lies between two `$` as a formula (refusing an invalid one, `x$^$`, with an error)."""

    @functools.wraps(plot)
    def drawn_literally(*args, **kwargs):
        from matplotlib import rc_context

        with rc_context({"text.parse_math": False}):  # texts read it when made, tick labels when drawn
            return plot(*args, **kwargs)

    return drawn_literally


def _colors(runs) -> dict[str, str]:
    """One colour per method, the same in every figure of a report."""
    return {m: f"C{i % 10}" for i, m in enumerate(_by_method(runs))}


MAX_NAMED = 40  # more sites (or layers) than this are not named one by one in a figure: unreadable, and slow to draw


def _extent(count: int, per_item: float, base: float) -> float:
    """A figure's width or height in inches for `count` named items (at most MAX_NAMED counted)."""
    return base + per_item * min(count, MAX_NAMED)


def _name_ticks(set_ticks, names, **style) -> None:
    """Ticks naming `names` (an axis' `set_xticks` or `set_yticks`), none where there are more than MAX_NAMED."""
    if len(names) <= MAX_NAMED:
        set_ticks(range(len(names)), names, **style)
    else:
        set_ticks([])


def _legend_label(method: str, group: list) -> str:
    return _display_name(method) + (f" ({len(group)} seeds)" if len(group) > 1 else "")


def _line_with_band(ax, x, samples, band: bool, color, **style) -> None:
    """The mean of each x's samples (e.g. one per seed) as a line, with a ±sd band over them if `band`."""
    stats = [_mean_sd(values) for values in samples]
    mean = np.array([m for m, _ in stats])
    ax.plot(x, mean, color=color, **style)
    if band:
        sd = np.array([s or 0.0 for _, s in stats])
        ax.fill_between(x, mean - sd, mean + sd, color=color, alpha=0.2, lw=0)


@_literal_text
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
            _line_with_band(
                ax,
                x,
                [[v[i] for v in per_round[t]] for t in x],
                len(group) > 1,
                color=colors[method],
                label=_legend_label(method, group),
                marker="o" if len(x) <= 25 else None,
                ms=3,
            )
    if not evaluated:
        return None
    label = _metric_label(metric)
    for ax, title, ylabel in zip(
        axes, ("(a) Avg.", "(b) Std."), (f"mean {label} over sites (%)", f"std of {label} across sites (%)")
    ):
        ax.set(title=title, xlabel="communication round", ylabel=ylabel)
        if len(evaluated) <= 12:  # a short run: a tick at each evaluated round
            ax.set_xticks(sorted(evaluated))
        else:
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=120)
    return Path(path)


@_literal_text
def plot_per_site(runs, path, metric=None) -> Path | None:
    """Grouped bars of the final metric per site (and Avg.) for each method, ± sd over seeds."""
    metric = _metric(runs, metric)
    finished = _finished(runs, metric)
    if not finished:
        return None
    colors, groups, sites = _colors(runs), _by_method(finished), _sites(finished)
    if len(sites) > MAX_NAMED:
        return _plot_sorted_sites(groups, colors, path, metric)
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
        ax.bar(
            x + (i - (len(groups) - 1) / 2) * width,
            mean,
            width,
            yerr=sd,
            capsize=2,
            color=colors[method],
            label=_legend_label(method, group),
        )
        low = min(low, np.nanmin(mean - (sd if sd is not None else 0)))
    ax.axvline(len(sites) - 0.5, color="grey", lw=0.8, ls=":")
    ax.set_xticks(x, columns, rotation=30 if len(columns) > 8 else 0)
    bottom = max(0.0, 5 * np.floor((low - 5) / 5))  # differences of a few points must be visible
    ax.set_ylim(bottom, None)
    title = f"Final {_metric_label(metric)} per site" + (" (the axis does not start at 0)" if bottom > 0 else "")
    ax.set(ylabel=f"final {_metric_label(metric)} (%)", title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=120)
    return Path(path)


def _plot_sorted_sites(groups: dict, colors: dict, path, metric: str) -> Path:
    """`plot_per_site` for more than MAX_NAMED sites: each method's final metric per site (mean over seeds) from its
    worst site to its best, its Avg. dashed."""
    fig = _figure(figsize=(8, 4))
    ax = fig.subplots()
    count = 0
    for method, group in groups.items():
        per_site = _mean_per_site([_scores(r["final"], metric) for r in group])
        values, count = np.sort(np.fromiter(per_site.values(), float)), max(count, len(per_site))
        ax.plot(np.arange(1, len(values) + 1), values, color=colors[method], label=_legend_label(method, group))
        ax.axhline(float(np.mean(values)), color=colors[method], ls="--", lw=0.8)
    label = _metric_label(metric)
    ax.set(xlabel="site, from the worst to the best", ylabel=f"final {label} (%)")
    ax.set_title(f"Final {label} per site ({count} sites, too many to name: sorted; dashed: Avg.)", fontsize=10)
    ax.grid(alpha=0.3)
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


@_literal_text
def plot_layer_weights(run, path) -> Path | None:
    """Fed-LWR's layer-by-site aggregation weights: the final round's and the mean over rounds; None without any."""
    from matplotlib.colors import TwoSlopeNorm

    records = [(r["round"], r["layer_weights"]) for r in run["rounds"] if r.get("layer_weights")]
    if not records:
        return None
    layers = list(dict.fromkeys(layer for _, lw in records for layer in lw))  # network order
    sites = sorted({s for _, lw in records for w in lw.values() for s in w}, key=site_key)
    grids = [np.array([[lw.get(layer, {}).get(s, np.nan) for s in sites] for layer in layers]) for _, lw in records]
    final, mean = grids[-1], np.nanmean(grids, axis=0)
    uniform = 1.0 / len(sites)
    # white = uniform 1/K; weights live in [0, 1], so the two sides of the scale differ in length
    top = max(float(np.nanmax(np.stack([final, mean]))), uniform + 1e-3)
    norm = TwoSlopeNorm(vcenter=uniform, vmin=0.0, vmax=top)
    fig = _figure(figsize=(_extent(len(sites), 1.3, 3.5), _extent(len(layers), 0.24, 1.6)))
    axes = fig.subplots(1, 2, sharey=True)
    annotate = len(layers) * len(sites) <= 400
    for ax, grid, title in zip(
        axes, (final, mean), (f"round {records[-1][0]} (final)", f"mean over {len(records)} rounds")
    ):
        image = ax.imshow(grid, cmap="RdBu_r", norm=norm, aspect="auto", interpolation="nearest")
        _name_ticks(ax.set_xticks, sites, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        if annotate:
            for (i, j), value in np.ndenumerate(grid):
                ax.text(
                    j,
                    i,
                    f"{value:.3f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if abs(norm(value) - 0.5) > 0.3 else "black",
                )
    _name_ticks(axes[0].set_yticks, _short_names(layers), fontsize=7)
    axes[0].set_ylabel("layer (network order)")
    fig.colorbar(image, ax=list(axes), label="aggregation weight", shrink=0.8)
    fig.suptitle(
        f"{_display_name(_group(run))} layer weights, seed {run['seed']}: uniform 1/K = 1/{len(sites)} = "
        f"{uniform:.3f} (white)",
        fontsize=11,
    )
    fig.savefig(path, dpi=120)
    return Path(path)


@_literal_text
def plot_cross_site(run, path) -> Path | None:
    """The cross-site evaluation's matrix (`cross_site_eval`) as a heatmap, in %: rows the sites whose model is
    scored, columns the sites whose test split scores it, the diagonal (each model on its own site) outlined; None
    without one. A cell that is not a number (a hostile file) is left blank."""
    from matplotlib.patches import Rectangle

    cross = run.get("cross_site")
    matrix = cross.get("matrix") if isinstance(cross, dict) else None
    if not isinstance(matrix, dict) or not matrix or not all(isinstance(row, dict) for row in matrix.values()):
        return None
    models = sorted(matrix, key=site_key)
    sites = sorted({s for row in matrix.values() for s in row}, key=site_key)
    grid = np.array([[100.0 * v if _is_number(v := matrix[m].get(s)) else np.nan for s in sites] for m in models])
    fig = _figure(figsize=(_extent(len(sites), 0.8, 2.5), _extent(len(models), 0.5, 1.5)))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", aspect="auto", interpolation="nearest")
    _name_ticks(ax.set_xticks, sites, rotation=45, ha="right", fontsize=8)
    _name_ticks(ax.set_yticks, models, fontsize=8)
    ax.set_xlabel("test data of")
    ax.set_ylabel("model of")
    if len(models) * len(sites) <= 400:
        middle = np.nanmean(grid) if np.isfinite(grid).any() else 0.0
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                ax.text(
                    j,
                    i,
                    f"{value:.1f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if value > middle else "white",
                )
    column = {site: j for j, site in enumerate(sites)}
    for i, model in enumerate(models):
        if model in column:
            j = column[model]
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    fig.colorbar(image, ax=ax, label=f"{_metric_label(str(cross.get('metric', run['metric'])))} (%)", shrink=0.8)
    fig.suptitle(f"{_display_name(_group(run))}, seed {run['seed']}: cross-site evaluation", fontsize=10)
    fig.savefig(path, dpi=120)
    return Path(path)


@_literal_text
def plot_contributions(group: list[dict], path, title: str) -> Path | None:
    """A method's contribution estimate per site versus round (mean ± sd over seeds); free riders drawn as thick
    black dashed lines; the uniform share 1/K dotted. None if no round records contributions."""
    per_site = {}  # site -> {round: [value of each run]}
    for run in group:
        for record in run["rounds"]:
            for site, value in (record.get("contributions") or {}).items():
                per_site.setdefault(site, {}).setdefault(record["round"], []).append(value)
    if not per_site:
        return None
    free = set(free_riders(group[0]))
    fig = _figure(figsize=(7.5, 4))
    ax = fig.subplots()
    for i, site in enumerate(sorted(per_site, key=site_key)):
        x = sorted(per_site[site])
        style = (
            dict(color="black", ls="--", lw=2.4, label=f"{site} (free rider)")
            if site in free
            else dict(color=f"C{i % 10}", lw=1.4, label=site)
        )
        _line_with_band(ax, x, [per_site[site][t] for t in x], len(group) > 1, **style)
    ax.axhline(1 / len(per_site), color="grey", ls=":", lw=1, label=f"uniform 1/{len(per_site)}")
    ax.set(xlabel="communication round", ylabel="contribution (sums to 1 over sites)", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if len(per_site) <= MAX_NAMED:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=120)
    return Path(path)


# ---------------------------------------------------------------- report and command line


def _describe(run) -> str:
    rounds = run["rounds"]
    seconds = sum(r.get("seconds", 0.0) for r in rounds)
    evaluated = sum(1 for r in rounds if r.get("per_site"))
    rejected = sum(len(r.get("rejected") or {}) for r in rounds)
    return (
        f"- {markdown_text(run['file'])}: {_name(_group(run))}, seed {run['seed']}, {len(rounds)} rounds "
        f"({evaluated} evaluated), {seconds:.1f} s, {rejected} rejected site update(s)"
        + ("" if run["final"] else ", **not finished**")
    )


def _dataset(runs) -> str | None:
    """The built-in dataset the runs name (config "dataset"), None if none names one; mixing two is an error."""
    names = {(r.get("config") or {}).get("dataset") for r in runs} - {None}
    if len(names) > 1:
        raise ValueError(f"the runs are on different datasets {sorted(names)}: report each separately")
    return names.pop() if names else None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


PERFORMANCE_FAIRNESS_TEXT = (
    "As the FedCE paper's Table 2: Pearson correlation (higher: fairer) and Euclidean distance (lower: fairer) "
    "between each method's per-site final {label} (%) and Solo's. Per-site values are averaged over a method's "
    "seeds, and over Solo's, before the one comparison; p: two-sided p-value of the correlation (the paper "
    "prints r x 100). A method that helps only the sites Solo serves worst moves away from Solo and scores as "
    "less fair by this measure."
)
CONTRIBUTION_TEXT = (
    "Final contribution estimate per site (FedCE's accumulated estimate, Eq. 5; CFFL's and CGSV's final reputations; "
    "sums to 1 over sites), mean ± sd "
    "over seeds; the gradient and data terms are each accumulated over rounds and normalised to sum 1."
)
AGREEMENT_TEXT = (
    "As the FedCE paper's Table 3: each method's contribution estimate against the leave-one-out marginal values "
    "above ({file}). FedCE: its final contributions; other methods: their aggregation weights averaged over "
    "rounds, as the paper does; Fed-LWR: the layer weights it aggregates with, averaged over layers and "
    "rounds. A method's "
    "estimate is averaged per site over its seeds, then compared once. Pearson r and cosine similarity do not "
    "depend on scale; for the Euclidean distance both vectors are divided by the sum of their absolute values "
    "(the estimates already sum to 1). Best values in bold."
)


FINALS = ("last", "mean_of_last")


def with_final(runs: list, final: str) -> list:
    """The runs with "final" as `final` says: "last" (the last round's evaluation) or "mean_of_last" (each site's
    metrics averaged over the last rounds, a run's `average_last` > 1); a run without it is a ValueError."""
    if final not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    if final == "last":
        return runs
    missing = [r["file"] for r in runs if not (r["final"] or {}).get("mean_of_last")]
    if missing:
        raise ValueError(f"no mean over the last rounds in {', '.join(missing)} (run them with average_last > 1)")
    short = [r["file"] for r in runs if len(r["final"]["mean_of_last"]["rounds"]) < r["final"]["mean_of_last"]["asked"]]
    if short:
        raise ValueError(
            f"fewer rounds evaluated than average_last asks in {', '.join(short)} (a resumed run changed its length)"
        )
    # the final record's other fields (FedCE's contributions) stay; its scores become the mean's
    return [
        {
            **r,
            "final": {
                **r["final"],
                **{k: v for k, v in r["final"]["mean_of_last"].items() if k not in ("rounds", "asked")},
            },
        }
        for r in runs
    ]


def _run_figure(out: Path, kind: str, run, taken) -> Path:
    """out/<kind>_<method>_seed<seed>.png, one file per run however many runs share a method and seed (`taken`)."""
    name = f"{kind}_{_slug(run['method'])}_seed{run['seed']}"  # the method's name from the file: never a path
    while (out / f"{name}.png") in taken:
        name += "_"
    return out / f"{name}.png"


def make_report(paths, out_dir, metric=None, loo=None, final: str = "last") -> dict:
    """Write report.md, results.csv and the figures into out_dir; `loo`: a leave-one-out file (or its folder);
    `final`: which evaluation the tables report (`with_final`).

    Returns {"report", "figures", "table", "region_tables": {metric: table}, "spread": {group: stats} (`spread_table`),
    "performance_fairness": {group: stats}, "contributions": {group: stats}, "contribution_agreement": {group:
    {estimate: stats}}, "quality_shift": {group: {column: stats}} (classification runs with a corrupted test set),
    "loo", "tables": {name: markdown}}."""
    runs = with_final(load_runs(paths), final)
    metric = _metric(runs, metric)
    dataset = _dataset(runs)
    loo = load_loo(loo) if loo else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = paper_table(runs, metric)
    region_tables = {region: paper_table(runs, region) for region in region_metrics(runs, metric)}
    spread, spread_stats = spread_table(runs, metric)
    fairness_table, fairness = performance_fairness_table(runs, metric)
    contributions_table, contributions = contribution_table(runs)
    agreement_table, agreement = contribution_agreement_table(runs, loo) if loo else ("", {})
    shift_table, shift = quality_shift_table(runs)
    personal_table, personal = personal_global_table(runs, metric)
    held_table, held_out = held_out_table(runs, metric)
    write_csv(runs, out / "results.csv", metric)
    captions = {
        plot_convergence(
            runs, out / "convergence.png", metric
        ): f"(a) Avg. and (b) Std. of {_label(metric)} across sites versus communication round",
        plot_per_site(runs, out / "per_site.png", metric): f"Final {_label(metric)} per site",
    }
    for key, group in _by_method(runs).items():
        title = f"{_display_name(key)}: contributions"
        captions[plot_contributions(group, out / f"contributions_{_slug(key)}.png", title)] = (
            f"{_name(key)}: contribution estimate per site versus round"
            + (f", mean ± sd over {len(group)} seeds" if len(group) > 1 else "")
        )
    for run in runs:
        captions[plot_layer_weights(run, _run_figure(out, "layer_weights", run, captions))] = (
            f"{_name(_group(run))} layer weights by site, seed {run['seed']} ({markdown_text(run['file'])})"
        )
        captions[plot_cross_site(run, _run_figure(out, "cross_site", run, captions))] = (
            f"{_name(_group(run))}, seed {run['seed']}: cross-site evaluation, each site's own model (rows) scored "
            f"on every site's test split (columns), in %; outlined: the model's own site ({markdown_text(run['file'])})"
        )
    captions.pop(None, None)
    subject = markdown_text(dataset or ", ".join(sorted({r.get("task", "?") for r in runs})))
    lines = [
        f"# fairfl report: {subject}, {_label(metric)}",
        "",
        f"{_label(metric)} (%) on each site's test set at the end of training. Avg.: mean over sites; "
        f"Std.: population standard deviation across sites; mean ± sd over seeds where a method has several "
        f"runs. Best Avg. and Std. in bold.",
        "",
        table,
        "",
    ]
    for region, region_table in region_tables.items():
        lines += [f"### {_label(region)}", "", region_table, ""]
    if spread:
        lines += ["## Spread across sites", "", SPREAD_TEXT.format(label=_label(metric)), "", spread, ""]
    if shift_table:
        lines += ["## Clean and corrupted test sets", "", QUALITY_SHIFT_TEXT, "", shift_table, ""]
    if personal_table:
        lines += ["## Personal and global models", "", PERSONAL_GLOBAL_TEXT.format(label=_label(metric)), ""]
        lines += [personal_table, ""]
    if held_table:
        lines += ["## Held-out sites", "", HELD_OUT_TEXT.format(label=_label(metric)), "", held_table, ""]
    if fairness_table:
        lines += [
            "## Performance fairness",
            "",
            PERFORMANCE_FAIRNESS_TEXT.format(label=_label(metric)),
            "",
            fairness_table,
            "",
        ]
    if contributions_table:
        lines += ["## Client contributions", "", CONTRIBUTION_TEXT, "", contributions_table, ""]
    if loo:
        lines += [
            "## Contribution estimates against leave-one-out",
            "",
            f"Leave-one-out marginal values (job {markdown_text(loo.get('job', '?'))}): the drop of the federation's "
            f"mean {markdown_text(loo['metric'])} over all sites when the site is left out of training (it is still "
            "evaluated).",
            "",
            marginal_table(loo),
            "",
            AGREEMENT_TEXT.format(file=markdown_text(loo["file"])),
            "",
            agreement_table,
            "",
        ]
    lines += [
        "## Runs",
        "",
        *(_describe(r) for group in _by_method(runs).values() for r in group),
        "",
        "## Figures",
        "",
    ]
    for figure, caption in captions.items():
        lines += [f"{caption}:", "", f"![{figure.stem}]({figure.name})", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return {
        "report": report,
        "figures": list(captions),
        "table": table,
        "region_tables": region_tables,
        "spread": spread_stats,
        "performance_fairness": fairness,
        "contributions": contributions,
        "contribution_agreement": agreement,
        "quality_shift": shift,
        "personal_global": personal,
        "held_out": held_out,
        "loo": loo,
        "tables": {
            "spread": spread,
            "performance_fairness": fairness_table,
            "contributions": contributions_table,
            "contribution_agreement": agreement_table,
            "quality_shift": shift_table,
            "personal_global": personal_table,
            "held_out": held_table,
        },
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="WS",
        help="results.json file, run directory, simulator workspace, or folder searched recursively",
    )
    parser.add_argument(
        "--out",
        help="output folder (default: <first input>/report, or beside its results file); "
        "not a non-empty one without --force",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into a non-empty --out folder (same names replaced)"
    )
    parser.add_argument("--metric", help="metric to report (default: the one the runs record)")
    parser.add_argument(
        "--loo",
        metavar="PATH",
        help="leave-one-out file (loo.json of `fairfl leave-one-out`) to compare the methods' "
        "contribution estimates with (the FedCE paper's Table 3)",
    )
    parser.add_argument(
        "--final",
        choices=FINALS,
        default="last",
        help="the tables' final result: the last round's evaluation (default) or, for runs with "
        "average_last > 1, each site's mean over the last rounds (FedISM+'s reporting)",
    )


def run(args) -> int:
    from fairfl.cli import refuse_to_overwrite

    problem = args.out and refuse_to_overwrite(args.out, args.force, "output folder")
    if problem:
        print(f"fairfl report: {problem}", file=sys.stderr)
        return 1
    first = Path(args.inputs[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "report"
    try:
        result = make_report(args.inputs, out, args.metric, args.loo, args.final)
    except (OSError, ValueError) as e:
        print(f"fairfl report: {e}", file=sys.stderr)
        return 1
    print(result["table"])
    for title, key in (
        ("Spread across sites", "spread"),
        ("Personal and global models", "personal_global"),
        ("Held-out sites", "held_out"),
        ("Performance fairness against Solo", "performance_fairness"),
        ("Client contributions", "contributions"),
        ("Contribution estimates against leave-one-out", "contribution_agreement"),
    ):
        if result["tables"][key]:
            print(f"\n{title}:\n{result['tables'][key]}")
    print(f"\nreport: {result['report']}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fairfl report", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
