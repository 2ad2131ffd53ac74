"""SUMMARY.md of a benchmark: the tables of `fairfl report` for each metric, the sections of it the benchmark repeats,
the statistics of the runs (fairfl.benchmark.run_statistics) and the papers' claims."""

from __future__ import annotations

from fairfl.benchmark.checks import warnings_section
from fairfl.benchmark.claims import claims_section
from fairfl.benchmark.run_statistics import DIAGNOSTICS
from fairfl.labels import metric_label_markdown
from fairfl.report.document import report_sections
from fairfl.report.runs import group_name_markdown
from fairfl.results import site_key
from fairfl.text import markdown_text


def settings_text(settings: dict) -> str:
    """e.g. "image_size 64, data_root (built-in data), synthetic_size_scale 2.0, test_scale 1.0"."""

    def shown(key, value):
        if isinstance(value, list):
            return " or ".join(shown(key, v) for v in value) + " (the runs differ)"
        return "(built-in data)" if key == "data_root" and not value else markdown_text(str(value))

    return ", ".join(f"{key} {shown(key, value)}" for key, value in settings.items())


def covered_text(summary: dict) -> list[str]:
    """What the summary covers besides the methods its command named (fairfl.benchmark.runner.earlier_runs)."""
    lines = []
    if summary.get("earlier_methods"):
        names = ", ".join(map(group_name_markdown, summary["earlier_methods"]))
        lines.append(f"Also covers the finished runs of {names} from earlier calls into this folder (same settings).")
    if summary.get("other_settings_runs"):
        names = ", ".join(f"runs/{markdown_text(name)}" for name in summary["other_settings_runs"])
        lines.append(f"Left out, run with other settings: {names}.")
    return [" ".join(lines), ""] if lines else []


def summary_markdown(summary: dict, reports: dict) -> str:
    settings = summary.get("site_settings")
    lines = [
        f"# Benchmark: {summary['dataset']} ({summary['family'].replace('_', ' ')}; {summary['papers']})",
        "",
        f"`{summary['command']}`",
        "",
        f"{summary['sites']} sites, {summary['rounds']} rounds (evaluated every {summary['eval_every']}), seeds "
        f"{summary['seeds']}; {summary['versions']}. "
        + (f"The sites used {settings_text(settings)}. " if settings else "")
        + "Final results in %, mean ± sd over seeds; Avg.: mean over sites; Std.: population std across sites.",
        "",
        *covered_text(summary),
        *warnings_section(summary.get("warnings") or {}, summary["metrics"]),
    ]
    for metric, report in reports.items():
        lines += [
            f"## {metric_label_markdown(metric)} per site",
            "",
            report["table"],
            "",
            f"Convergence, per-site figures and the CSV: [{metric}/report.md]({metric}/report.md)",
            "",
        ]
    for metric, errors in (summary.get("test_split_errors") or {}).items():
        if errors:
            lines += [
                f"Standard error of each site's final {metric_label_markdown(metric)} on its own test split (points, "
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
    for section in report_sections():
        if section.summarized and first["tables"][section.key]:
            lines += [f"## {section.name}", "", first["tables"][section.key], ""]
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
            f"| {group_name_markdown(m)} | " + " | ".join(f"{w[s]:.3f}" if s in w else "–" for s in sites) + " |"
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
            f"| {group_name_markdown(m)} | {DIAGNOSTICS[key]} | {value:.3g} |"
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
                f"| {group_name_markdown(method)} | {seconds:.2f} | {seconds / base:.2f} |"
                if base
                else f"| {group_name_markdown(method)} | {seconds:.2f} | – |"
            )
    return "\n".join(lines + claims_section(summary["claims"])) + "\n"
