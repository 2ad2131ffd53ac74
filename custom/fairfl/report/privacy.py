"""The report's "Differential privacy" section: for each run that trained with DP-SGD (dp_epsilon), each site's own
statement of the budget it spent (fairfl.privacy: computed at the site, recorded as it sent it), with the run's delta
and clip norm."""

from __future__ import annotations

from fairfl.report.markdown import number_cell, table_lines
from fairfl.results import site_key
from fairfl.text import markdown_text

PRIVACY_TEXT = (
    "Runs trained with DP-SGD at the sites (`dp_epsilon`): each site's model updates are (epsilon, delta)-DP for one "
    "training item against everyone outside the site. Epsilon spent: the site's own statement after its last "
    "training round (its accountant, at its sampling rate q = batch size / training items), against the run's budget; "
    "the noise multiplier is the Gaussian noise's std per unit of the clip norm. A patient with k training items is "
    "protected at about k times epsilon."
)


def _stated(run) -> dict:
    """{site: the training metrics of the last round it stated its privacy in}."""
    found = {}
    for record in run["rounds"]:
        for site, metrics in (record.get("train") or {}).items():
            if "dp_epsilon" in metrics:
                found[site] = metrics
    return found


def privacy_table(runs) -> tuple[str, dict]:
    """(markdown, {run file: {site: {"epsilon", "noise_multiplier", "sample_rate"}}}) of the runs whose config has a
    dp_epsilon; ("", {}) when none has."""
    rows, stats = [], {}
    for run in runs:
        config = run.get("config") or {}
        if config.get("dp_epsilon") is None:
            continue
        stated = _stated(run)
        stats[run["file"]] = {
            site: {
                "epsilon": m["dp_epsilon"],
                "noise_multiplier": m.get("dp_noise_multiplier"),
                "sample_rate": m.get("dp_sample_rate"),
            }
            for site, m in stated.items()
        }
        for site in sorted(stated, key=site_key):
            entry = stats[run["file"]][site]
            rows.append(
                [
                    markdown_text(run["file"]),
                    markdown_text(site),
                    f"{number_cell(entry['epsilon'], '.3g')} of {config['dp_epsilon']:g}",
                    f"{config.get('dp_delta', float('nan')):g}",
                    f"{config.get('dp_clip', float('nan')):g}",
                    number_cell(entry["noise_multiplier"], ".3g"),
                    number_cell(entry["sample_rate"], ".3g"),
                ]
            )
    if not stats:
        return "", {}
    header = ["run", "site", "epsilon spent", "delta", "clip", "noise multiplier", "q"]
    return "\n".join(table_lines(header, rows)), stats
