"""FedCE's part of `fairfl report`: the client contributions table (its accumulated estimate, Eq. 5, with the
gradient and data terms) and, for each group of runs, the contributions per round. CFFL's and CGSV's reputations
(fairfl.methods.rewards) are recorded in the same fields and reported here as well."""

from __future__ import annotations

from pathlib import Path

from fairfl.progress import shown_round
from fairfl.report.figures import MAX_NAMED, figure, line_with_band, literal_text
from fairfl.report.markdown import cell, table_lines
from fairfl.report.parts import GroupFigure, Section
from fairfl.report.runs import by_method, free_riders, group_name, group_name_markdown, sites_of
from fairfl.report.statistics import mean_sd
from fairfl.results import site_key
from fairfl.text import markdown_text

CONTRIBUTION_TEXT = (
    "Final contribution estimate per site (FedCE's accumulated estimate, Eq. 5; CFFL's and CGSV's final reputations; "
    "sums to 1 over sites), mean ± sd "
    "over seeds; the gradient and data terms are each accumulated over rounds and normalised to sum 1."
)


def contribution_table(runs) -> tuple[str, dict]:
    """Final client contributions per site (mean ± sd over seeds) of the runs that record them (FedCE; CFFL and CGSV:
    their reputations), and the
    accumulated gradient and data terms where recorded; free riders marked †. ("", {}) if no run has them.

    Returns (markdown, {group: {"contributions"|"gradient"|"data": {site: (mean, sd or None)}}})."""
    groups = by_method([r for r in runs if (r["final"] or {}).get("contributions")])
    if not groups:
        return "", {}
    sites = sites_of([r for group in groups.values() for r in group])
    stats, rows = {}, []
    for key, group in groups.items():
        finals = [r["final"] for r in group]
        per_run = {"contributions": [f["contributions"] for f in finals]}
        for term in ("gradient", "data"):
            if all(f.get("contribution_terms") for f in finals):
                per_run[term] = [{s: t[term] for s, t in f["contribution_terms"].items() if term in t} for f in finals]
        free = set(free_riders(group[0]))
        stats[key] = {
            what: {s: mean_sd(v[s] for v in values if s in v) for s in sites} for what, values in per_run.items()
        }
        for what, per_site in stats[key].items():
            label = "contribution" if what == "contributions" else f"{what} term"
            rows.append(
                [
                    group_name_markdown(key),
                    label,
                    *(cell(per_site[s], digits=3) + (" †" if s in free else "") for s in sites),
                    str(len(group)),
                ]
            )
    lines = table_lines(["Method", "estimate", *map(markdown_text, sites), "seeds"], rows)
    if any(free_riders(group[0]) for group in groups.values()):
        lines += ["", "† free rider (trains on one image repeated; should earn almost nothing)."]
    return "\n".join(lines), stats


@literal_text
def plot_contributions(group: list[dict], path, title: str) -> Path | None:
    """A method's contribution estimate per site versus round (mean ± sd over seeds); free riders drawn as thick
    black dashed lines; the uniform share 1/K dotted. None if no round records contributions."""
    per_site: dict[str, dict[int, list[float]]] = {}  # site -> {round: [value of each run]}
    for run in group:
        for record in run["rounds"]:
            for site, value in (record.get("contributions") or {}).items():
                per_site.setdefault(site, {}).setdefault(shown_round(record["round"]), []).append(value)
    if not per_site:
        return None
    free = set(free_riders(group[0]))
    fig = figure(figsize=(7.5, 4))
    ax = fig.subplots()
    for i, site in enumerate(sorted(per_site, key=site_key)):
        x = sorted(per_site[site])
        style = (
            dict(color="black", ls="--", lw=2.4, label=f"{site} (free rider)")
            if site in free
            else dict(color=f"C{i % 10}", lw=1.4, label=site)
        )
        line_with_band(ax, x, [per_site[site][t] for t in x], len(group) > 1, **style)
    ax.axhline(1 / len(per_site), color="grey", ls=":", lw=1, label=f"uniform 1/{len(per_site)}")
    ax.set(xlabel="communication round", ylabel="contribution (sums to 1 over sites)", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if len(per_site) <= MAX_NAMED:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=120)
    return Path(path)


PARTS = (
    Section(
        "contributions",
        "Client contributions",
        lambda inputs: CONTRIBUTION_TEXT,
        lambda inputs: contribution_table(inputs.runs),
        after="performance_fairness",
        summarized=True,
    ),
    GroupFigure(
        "contributions",
        lambda key, group, path: plot_contributions(group, path, f"{group_name(key)}: contributions"),
        lambda key, group: (
            f"{group_name_markdown(key)}: contribution estimate per site versus round"
            + (f", mean ± sd over {len(group)} seeds" if len(group) > 1 else "")
        ),
    ),
)
