"""The tables of each method's final result per site: the papers' table (sites, Avg., Std.), its CSV, and the spread
over sites (worst, percentiles, best, spread, Gini)."""

from __future__ import annotations

import csv
from pathlib import Path

from fairfl.report.markdown import best_of, cell, table_lines
from fairfl.report.runs import by_method, chosen_metric, finished, group_name_markdown, group_of, sites_of, variant_of
from fairfl.report.statistics import avg_std, mean_sd, site_scores, summarized
from fairfl.text import csv_text, markdown_text


def _notes(runs, metric) -> list[str]:
    """Notes under the papers' table: the runs left out (unfinished), the seeds a method ran twice."""
    notes = [
        f"Note: skipped {markdown_text(r['file'])} ({group_name_markdown(group_of(r))}, seed {r['seed']}): "
        + ("no final evaluation (the run did not finish)." if not r["final"] else f"no final {markdown_text(metric)}.")
        for r in runs
        if not site_scores(r["final"], metric)
    ]
    for method, group in by_method(finished(runs, metric)).items():
        seeds = [r["seed"] for r in group]
        for seed in sorted({s for s in seeds if seeds.count(s) > 1}):
            notes.append(
                f"Note: {group_name_markdown(method)} has {seeds.count(seed)} runs with seed {seed}; they are counted "
                f"as separate seeds (different settings?)."
            )
    return notes


def paper_table(runs, metric=None) -> str:
    """Markdown table in the papers' format (rows methods, columns sites, Avg., Std.) from each run's "final"."""
    metric = chosen_metric(runs, metric)
    done, notes = finished(runs, metric), _notes(runs, metric)
    if not done:
        return "\n".join(["No finished runs to tabulate.", *notes])
    sites, groups = sites_of(done), by_method(done)
    rows = {}
    for method, group in groups.items():
        per_run = [site_scores(r["final"], metric) for r in group]
        summaries = [avg_std(s) for s in per_run]
        rows[method] = [mean_sd(s[site] for s in per_run if site in s) for site in sites] + [
            mean_sd(a for a, _ in summaries),
            mean_sd(sd for _, sd in summaries),
        ]
    best_avg = max(round(row[-2][0], 2) for row in rows.values())
    best_std = min(round(row[-1][0], 2) for row in rows.values())
    with_seeds = any(len(g) > 1 for g in groups.values())
    header = ["Method", *map(markdown_text, sites), "Avg.", "Std."] + (["Seeds"] if with_seeds else [])
    lines = table_lines(
        header,
        (
            [
                group_name_markdown(method),
                *map(cell, site_cells),
                cell(avg, round(avg[0], 2) == best_avg),
                cell(std, round(std[0], 2) == best_std),
            ]
            + ([str(len(groups[method]))] if with_seeds else [])
            for method, (*site_cells, avg, std) in rows.items()
        ),
    )
    return "\n".join(lines + ([""] + notes if notes else []))


def write_csv(runs, path, metric=None) -> Path:
    """One row per (method, seed, site) with the final metric in percent, plus rows for mean, std and worst."""
    metric = chosen_metric(runs, metric)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "variant", "seed", "site", "metric", "percent", "file"])
        for run in (r for group in by_method(finished(runs, metric)).values() for r in group):
            scores = site_scores(run["final"], metric)
            avg, std = avg_std(scores)
            rows = [*scores.items(), ("mean", avg), ("std", std), ("worst", min(scores.values()))]
            names = [run["method"], variant_of(run).strip(" ()"), run["seed"]]  # once a run, not once a site
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
    metric = chosen_metric(runs, metric)
    groups = by_method(finished(runs, metric))
    if not groups:
        return "", {}
    stats = {}
    for key, group in groups.items():
        summaries = [summarized(run, site_scores(run["final"], metric)) for run in group]
        stats[key] = {
            k: None if any(s[k] is None for s in summaries) else mean_sd(s[k] for s in summaries)
            for _, k, _, _ in SPREAD_COLUMNS
        }
        stats[key]["seeds"] = len(group)
    best = {k: best_of((v[k][0] for v in stats.values() if v[k]), pick) for _, k, pick, _ in SPREAD_COLUMNS}
    rows = (
        [
            group_name_markdown(key),
            *(
                cell(v[k], v[k] is not None and f"{v[k][0]:.{digits}f}" == f"{best[k]:.{digits}f}", digits)
                for _, k, _, digits in SPREAD_COLUMNS
            ),
            str(v["seeds"]),
        ]
        for key, v in stats.items()
    )
    return "\n".join(table_lines(["Method", *(h for h, _, _, _ in SPREAD_COLUMNS), "seeds"], rows)), stats


SURFACE_TEXT = (
    "The final global (or each site's own) model's surfaces on each site's whole test volumes, in mm: HD95, the 95th "
    "percentile of the distances between the predicted and the true boundary (lower is better; a structure predicted "
    "empty scores the volume's diagonal), and surface Dice (%), the share of both boundaries within 2 mm of the "
    "other (MONAI's metrics; `fairfl.training.evaluate_dice`). Mean ± sd over seeds."
)


def surface_table(runs) -> tuple[str, dict]:
    """Per method and site, the final HD95 (mm) and surface Dice (%) of volume runs (their per-site `hd95` and
    `surface_dice`); ("", {}) when no run has them (2-D runs)."""
    done = [r for r in runs if r.get("final") and site_scores(r["final"], "hd95")]
    if not done:
        return "", {}
    sites, rows, stats = sites_of(done), [], {}
    for method, group in by_method(done).items():
        hd95 = [{s: v / 100.0 for s, v in site_scores(r["final"], "hd95").items()} for r in group]
        nsd = [site_scores(r["final"], "surface_dice") for r in group]
        cells = []
        for site in sites:
            hd, sd = mean_sd(h[site] for h in hd95 if site in h), mean_sd(n[site] for n in nsd if site in n)
            cells.append(f"{cell(hd)} / {cell(sd)}")
            stats.setdefault(method, {})[site] = {"hd95": hd, "surface_dice": sd}
        rows.append([group_name_markdown(method), *cells])
    header = ["Method", *(f"{markdown_text(site)} HD95 / surface Dice" for site in sites)]
    return "\n".join(table_lines(header, rows)), stats
