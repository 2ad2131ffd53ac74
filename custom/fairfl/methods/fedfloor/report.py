"""FedFloor's section of `fairfl report`: the mix of the global and its personal model each site chose and was scored
with at the end (final `mix_alpha`: 0 the global model, 1 the personal one), mean ± sd over seeds."""

from __future__ import annotations

from fairfl.report.markdown import cell, table_lines
from fairfl.report.parts import Section
from fairfl.report.runs import group_name_markdown, group_of
from fairfl.report.statistics import mean_sd
from fairfl.results import site_key

MIX_TEXT = (
    "The weight of its personal model in the model each site was scored with at the end (`mix_alpha`: 0 the global "
    "model, 1 the personal model, between a mix; chosen on the site's validation split), mean ± sd over seeds; in "
    "brackets, in how many seeds the site was scored with the global model, a mix, and the personal model."
)


def mix_table(runs) -> tuple[str, dict]:
    """The final mix of each site per group of runs that report one; ("", {}) when none does."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        mixes = {
            site: values["mix_alpha"]
            for site, values in ((run.get("final") or {}).get("per_site") or {}).items()
            if isinstance(values, dict) and isinstance(values.get("mix_alpha"), (int, float))
        }
        if mixes:
            groups.setdefault(group_of(run), []).append(mixes)
    if not groups:
        return "", {}
    sites = sorted({s for rows in groups.values() for row in rows for s in row}, key=site_key)
    stats = {g: {s: [row[s] for row in rows if s in row] for s in sites} for g, rows in groups.items()}

    def text(values: list) -> str:
        if not values:
            return "–"
        kinds = (sum(v == 0 for v in values), sum(0 < v < 1 for v in values), sum(v == 1 for v in values))
        return f"{cell(mean_sd(values))} ({'/'.join(map(str, kinds))})"

    lines = table_lines(
        ["Method", *sites], ([group_name_markdown(g), *(text(v[s]) for s in sites)] for g, v in stats.items())
    )
    return "\n".join(lines), {g: {s: v for s, v in row.items()} for g, row in stats.items()}


PARTS = (
    Section(
        "site_mix",
        "Each site's mix of the global and its personal model",
        lambda inputs: MIX_TEXT,
        lambda inputs: mix_table(inputs.runs),
        after="performance_fairness",
        summarized=True,
    ),
)
