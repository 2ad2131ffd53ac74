"""The report's comparison with FedAvg, when the runs include FedAvg's: each other method minus FedAvg with the same
seed, per site and in the mean, the worst site and the std across sites, over the paired seeds (fairfl.paired)."""

from __future__ import annotations

from fairfl.paired import paired_interval
from fairfl.report.markdown import table_lines
from fairfl.report.runs import by_method, chosen_metric, finished, group_name_markdown, sites_of
from fairfl.report.statistics import site_scores, summarized
from fairfl.text import markdown_text

BASELINE = "fedavg"  # the group every other method is compared with
SUMMARY_COLUMNS = (("Avg.", "mean"), ("Worst", "worst"), ("Std.", "std"))  # header, key of fairness.summarize
BASELINE_TEXT = (
    "Each method minus FedAvg in {label} (percentage points), run against FedAvg's run of the same seed: per site, "
    "and in the mean over sites (Avg.), the worst site's value (Worst, whichever site it is in each run) and the "
    "population std across sites (Std.), each run's `fairfl.fairness.summarize`. A cell is the mean difference over "
    "the paired seeds with its 95% Student t interval [low, high] (`fairfl.paired`), one seed alone without one. "
    "Above 0 is better, except for Std.: below 0 means the sites lie closer together than with FedAvg."
)


def baseline_table(runs, metric=None) -> tuple[str, dict]:
    """Markdown table of every other group against FedAvg (`BASELINE_TEXT`) and {group: {"sites": {site: paired
    Interval}, "mean"|"worst"|"std": paired Interval}}; ("", {}) without a finished FedAvg run or another group."""
    metric = chosen_metric(runs, metric)
    groups = by_method(finished(runs, metric))
    if BASELINE not in groups or len(groups) < 2:
        return "", {}
    sites = sites_of(finished(runs, metric))
    columns = [("site", s) for s in sites] + [("summary", k) for _, k in SUMMARY_COLUMNS]
    values = {key: _by_seed(group, metric) for key, group in groups.items()}
    baseline, stats = values.pop(BASELINE), {}
    for key, by_seed in values.items():
        paired = {
            column: paired_interval(
                {seed: v[column] for seed, v in by_seed.items() if column in v},
                {seed: v[column] for seed, v in baseline.items() if column in v},
            )
            for column in columns
        }
        stats[key] = {
            "sites": {s: paired[("site", s)] for s in sites},
            **{k: paired[("summary", k)] for _, k in SUMMARY_COLUMNS},
        }
    header = ["Method", *map(markdown_text, sites), *(h for h, _ in SUMMARY_COLUMNS), "paired seeds"]
    rows = (
        [
            group_name_markdown(key),
            *(v["sites"][s].text() for s in sites),
            *(v[k].text() for _, k in SUMMARY_COLUMNS),
            str(v["mean"].n),
        ]
        for key, v in stats.items()
    )
    return "\n".join(table_lines(header, rows)), stats


def _by_seed(group: list[dict], metric: str) -> dict:
    """{seed: {("site", site): final metric (%), ("summary", "mean"|"worst"|"std"): across the sites}} of a group's
    runs (a site's name never meets a statistic's)."""
    found = {}
    for run in group:
        scores = site_scores(run["final"], metric)
        summary = summarized(run, scores)
        found[run["seed"]] = {
            **{("site", s): v for s, v in scores.items()},
            **{("summary", k): summary[k] for _, k in SUMMARY_COLUMNS},
        }
    return found
