"""What a benchmark's runs say before any method is compared: arms that did not train, and sites that FedAvg (the
default settings) leaves untrained. Both come from the final per-site values alone, so `--rejudge` rebuilds them from
results.csv; SUMMARY.md shows them under WARNINGS_HEADING, right after its header."""

from __future__ import annotations

import statistics

from fairfl.benchmark.run_statistics import final_stat, per_site_mean
from fairfl.labels import metric_label_markdown
from fairfl.report.runs import group_name_markdown

BASELINE = "fedavg"
# an arm whose Avg. (mean over seeds) is below this fraction of FedAvg's did not train: its small spread is that of a
# model that fits no site, so it is neither ranked nor credited with a claim
DID_NOT_TRAIN_FRACTION = 0.5
# FedAvg's final value at a site below this many percent on the clean metric: the defaults (rounds, local steps)
# leave the site untrained, and a method's gain there is a gain over an untrained model
SITE_FLOOR = 50.0
WARNINGS_HEADING = "## Warnings"


def mean_avg(runs: list, metric: str) -> float | None:
    """The final Avg. of `metric` (%) averaged over the runs (seeds) that have one."""
    values = [v for v in (final_stat(r, metric, "avg") for r in runs) if v is not None]
    return statistics.mean(values) if values else None


def untrained_methods(runs_by_method: dict, metric: str) -> dict:
    """{method: [its mean Avg., FedAvg's]} for each method whose mean final Avg. of `metric` is below
    DID_NOT_TRAIN_FRACTION of FedAvg's; {} without FedAvg runs."""
    baseline = mean_avg(runs_by_method.get(BASELINE) or [], metric)
    if not baseline:
        return {}
    flagged = {}
    for method, runs in runs_by_method.items():
        value = mean_avg(runs, metric)
        if method != BASELINE and value is not None and value < DID_NOT_TRAIN_FRACTION * baseline:
            flagged[method] = [value, baseline]
    return flagged


def clean_metrics(metrics: list) -> list:
    """The metrics measured on clean images (clean_auc, clean_accuracy, ...), or the headline metric where the
    task has no corrupted test set."""
    return [m for m in metrics if m.startswith("clean_")] or list(metrics[:1])


def low_fedavg_sites(runs_by_method: dict, metrics: list) -> dict:
    """{metric: {site: FedAvg's final value (%), mean over seeds}} of the sites below SITE_FLOOR on each clean
    metric (clean_metrics); metrics without such a site left out."""
    low = {}
    for metric in clean_metrics(metrics):
        sites = per_site_mean(runs_by_method.get(BASELINE) or [], metric)
        below = {site: value for site, value in sites.items() if value < SITE_FLOOR}
        if below:
            low[metric] = below
    return low


def training_checks(runs_by_method: dict, metrics: list) -> dict:
    """summary.json's `warnings`: the arms that did not train (on the headline metric) and FedAvg's low sites."""
    return {
        "did_not_train": untrained_methods(runs_by_method, metrics[0]),
        "low_fedavg_sites": low_fedavg_sites(runs_by_method, metrics),
    }


def warnings_section(checks: dict, metrics: list) -> list[str]:
    """SUMMARY.md's warnings, each a paragraph; [] when there is none."""
    lines = []
    untrained = checks.get("did_not_train") or {}
    if untrained:
        label = metric_label_markdown(metrics[0])
        arms = ", ".join(f"{group_name_markdown(m)} ({value:.2f})" for m, (value, _) in untrained.items())
        baseline = next(iter(untrained.values()))[1]
        lines += [
            f"**Did not train**: {arms}: mean Avg. {label} below {DID_NOT_TRAIN_FRACTION:g} times FedAvg's "
            f"({baseline:.2f}). A bold value of such an arm in the tables ranks nothing, and its claims are not "
            "judged.",
            "",
        ]
    for metric, sites in (checks.get("low_fedavg_sites") or {}).items():
        values = ", ".join(f"{site} {value:.2f}" for site, value in sites.items())
        lines += [
            f"**Sites FedAvg leaves untrained**: FedAvg's final {metric_label_markdown(metric)} is below "
            f"{SITE_FLOOR:g}% at {values} (mean over seeds). The settings (rounds, local steps, learning rate) may be "
            "too short for these sites; a method's gain there is a gain over an untrained model.",
            "",
        ]
    return [WARNINGS_HEADING, "", *lines] if lines else []


def with_warnings(markdown: str, section: list[str]) -> str:
    """SUMMARY.md text with its warnings replaced by `section` (removed when it is empty), placed before the first
    section, after the header."""
    start = markdown.find("\n" + WARNINGS_HEADING + "\n")
    if start >= 0:
        end = markdown.find("\n## ", start + 1)
        markdown = markdown[: start + 1] + (markdown[end + 1 :] if end >= 0 else "")
    first = markdown.find("\n## ")
    if not section or first < 0:
        return markdown
    return markdown[: first + 1] + "\n".join(section) + "\n" + markdown[first + 1 :]
