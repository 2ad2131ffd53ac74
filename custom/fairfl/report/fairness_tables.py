"""The FedCE paper's fairness tables, for every method: performance fairness against Solo (Table 2) and the
agreement of each method's contribution estimate with the leave-one-out values (Table 3)."""

from __future__ import annotations

import numpy as np

from fairfl.fairness import contribution_agreement, normalise_abs, performance_fairness
from fairfl.loo import marginal_table
from fairfl.report.markdown import best_of, number_cell, pearson_cell, table_lines
from fairfl.report.runs import by_method, chosen_metric, finished, group_name_markdown, left_out, variant_of
from fairfl.report.statistics import mean_per_site, site_scores
from fairfl.results import site_key
from fairfl.text import markdown_text

PERFORMANCE_FAIRNESS_TEXT = (
    "As the FedCE paper's Table 2: Pearson correlation (higher: fairer) and Euclidean distance (lower: fairer) "
    "between each method's per-site final {label} (%) and Solo's. Per-site values are averaged over a method's "
    "seeds, and over Solo's, before the one comparison; p: two-sided p-value of the correlation (the paper "
    "prints r x 100). A method that helps only the sites Solo serves worst moves away from Solo and scores as "
    "less fair by this measure."
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


def performance_fairness_table(runs, metric=None) -> tuple[str, dict]:
    """FedCE Table 2: each method's per-site final metric (%) against Solo's: Pearson r (p), Euclidean distance.

    Per-site values are averaged over a method's seeds, and over Solo's, before the one comparison. A method is
    compared with the Solo runs of its own variant (the same free riders) if there are any, else with plain
    Solo; one whose sites differ from Solo's is skipped with a note. Returns ("", {}) without a Solo run, else
    (markdown, {group: {"pearson", "p_value", "euclidean", "note", "reference", "seeds", "reference_seeds"}})."""
    metric = chosen_metric(runs, metric)
    groups = by_method(finished(runs, metric))
    if not any(group[0]["method"] == "solo" for group in groups.values()):
        return "", {}
    stats, notes = {}, []
    for key, group in groups.items():
        if group[0]["method"] == "solo":
            continue
        reference = next((k for k in ("solo" + variant_of(group[0]), "solo") if k in groups), None)
        if reference is None:
            notes.append(f"Note: {group_name_markdown(key)} is not compared: no plain Solo run.")
            continue
        scores, solo = (mean_per_site([site_scores(r["final"], metric) for r in g]) for g in (group, groups[reference]))
        if set(scores) != set(solo):
            notes.append(
                f"Note: {group_name_markdown(key)} is not compared: its sites differ from "
                f"{group_name_markdown(reference)}'s."
            )
            continue
        stats[key] = {
            **performance_fairness(scores, solo),
            "reference": reference,
            "seeds": len(group),
            "reference_seeds": len(groups[reference]),
        }
        if stats[key]["note"]:
            notes.append(f"Note: {group_name_markdown(key)}: {stats[key]['note']}.")
    if not stats:
        return "\n".join(["No method to compare with Solo.", *notes]), {}
    best_r = best_of((v["pearson"] for v in stats.values()), max)
    best_d = best_of((v["euclidean"] for v in stats.values()), min)
    rows = (
        [
            group_name_markdown(key),
            pearson_cell(v, best_r),
            number_cell(v["euclidean"], ".2f", best_d),
            group_name_markdown(v["reference"]),
            f"{v['seeds']} / {v['reference_seeds']}",
        ]
        for key, v in stats.items()
    )
    header = ["Method", "Pearson r (p)", "Euclidean distance", "compared with", "seeds (method / Solo)"]
    return "\n".join(table_lines(header, rows) + ([""] + notes if notes else [])), stats


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
    for key, group in by_method([r for r in runs if r["final"] and not left_out(r)]).items():
        per_what = {}
        for run in group:
            for what, estimate in contribution_estimates(run).items():
                per_what.setdefault(what, []).append(estimate)
        for what, estimates in per_what.items():
            mean = mean_per_site(estimates)
            if not set(sites) <= set(mean):
                notes.append(
                    f"Note: {group_name_markdown(key)} is not compared: it has no {what} for "
                    f"{', '.join(map(markdown_text, sorted(set(sites) - set(mean), key=site_key)))}."
                )
                continue
            values = {s: mean[s] for s in sites}
            stats.setdefault(key, {})[what] = {**contribution_agreement(values, marginal), "seeds": len(estimates)}
            shares[f"{group_name_markdown(key)}: {what}"] = normalise_abs(np.array([values[s] for s in sites]))
            if stats[key][what]["note"]:
                notes.append(f"Note: {group_name_markdown(key)}, {what}: {stats[key][what]['note']}.")
    if not stats:
        return "\n".join(["No run with a contribution estimate for these sites.", *notes]), {}
    flat = [v for per_what in stats.values() for v in per_what.values()]
    best_r, best_d, best_c = (
        best_of((v[k] for v in flat), pick) for k, pick in (("pearson", max), ("euclidean", min), ("cosine", max))
    )
    rows = (
        [
            group_name_markdown(key),
            what,
            pearson_cell(v, best_r),
            number_cell(v["euclidean"], ".3f", best_d),
            number_cell(v["cosine"], ".3f", best_c),
            str(v["seeds"]),
        ]
        for key, per_what in stats.items()
        for what, v in per_what.items()
    )
    header = ["Method", "estimate", "Pearson r (p)", "Euclidean distance", "cosine similarity", "seeds"]
    lines = table_lines(header, rows)
    if sum(np.abs(list(marginal.values()))) > 0:
        loo_shares = normalise_abs(np.array([marginal[s] for s in sites]))
        lines += [
            "",
            "Per site, each vector divided by the sum of its absolute values (what the distance compares):",
            "",
            *table_lines(
                ["", *map(markdown_text, sites)],
                [
                    [label, *(f"{v:+.3f}" for v in values)]
                    for label, values in {"leave-one-out": loo_shares, **shares}.items()
                ],
            ),
        ]
    return "\n".join(lines + ([""] + notes if notes else [])), stats


def agreement_text(loo: dict) -> str:
    """What precedes the agreement table: the leave-one-out values it compares with, and how it compares them."""
    return "\n\n".join(
        [
            f"Leave-one-out marginal values (job {markdown_text(loo.get('job', '?'))}): the drop of the federation's "
            f"mean {markdown_text(loo['metric'])} over all sites when the site is left out of training (it is still "
            "evaluated).",
            marginal_table(loo),
            AGREEMENT_TEXT.format(file=markdown_text(loo["file"])),
        ]
    )
