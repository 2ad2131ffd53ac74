"""The tables of what a site gets from the federation besides its own result: personalised methods' sites scored
with the global model as well, and the sites held out of training scored with the final global model."""

from __future__ import annotations

from fairfl.report.markdown import cell, table_lines
from fairfl.report.runs import by_method, chosen_metric, finished, group_name_markdown, left_out
from fairfl.report.statistics import mean_sd, site_scores, summarized
from fairfl.results import GLOBAL_PREFIX, site_key
from fairfl.text import markdown_text

SUMMARY_COLUMNS = (("Avg.", "mean"), ("Std.", "std"), ("Worst", "worst"))


def _summary_stats(group, per_run) -> dict:
    """{"mean"|"std"|"worst": (mean, sd over seeds) or None} of each run's `summarize` of its {site: %} in `per_run`
    (runs with no site left out)."""
    summaries = [summarized(run, scores) for run, scores in zip(group, per_run, strict=True) if scores]
    return {k: mean_sd(s[k] for s in summaries) for _, k in SUMMARY_COLUMNS}


def _federation_scores(run, metric) -> dict:
    """{site: final metric in %} of the sites that trained (not held out)."""
    held_out = set(left_out(run))
    return {s: v for s, v in site_scores(run["final"], metric).items() if s not in held_out}


def personal_global_table(runs, metric=None) -> tuple[str, dict]:
    """Personalised methods (final `global_<metric>` scores): each federation site's final metric (%) with the model
    it is scored with (its personal model, or the global model with its own head or normalisation layers) and with
    the global model as it is, and Avg., Std. and Worst over the sites that have both, mean ± sd over seeds.
    ("", {}) when no run has global-model scores. Returns (markdown, {group: {"personal"|"global": {site|"mean"|
    "std"|"worst": (mean, sd) or None}}})."""
    metric = chosen_metric(runs, metric)
    global_metric = GLOBAL_PREFIX + metric
    groups = {
        key: group
        for key, group in by_method(finished(runs, metric)).items()
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
        both = [set(p) & set(g) for p, g in zip(scores["personal"], scores["global"], strict=True)]
        for run, own, shared in zip(group, scores["personal"], both, strict=True):
            if set(own) - shared:
                missing = ", ".join(map(markdown_text, sorted(set(own) - shared, key=site_key)))
                notes.append(
                    f"Note: {markdown_text(run['file'])} has no global-model score for {missing}: left out of its Avg."
                )
        for model in ("personal", "global"):
            cells = {site: mean_sd(p[site] for p in scores[model] if site in p) for site in sites}
            cells.update(
                _summary_stats(group, [{s: p[s] for s in b} for p, b in zip(scores[model], both, strict=True)])
            )
            stats.setdefault(key, {})[model] = cells
            columns = [*sites, "mean", "std", "worst"]
            rows.append([group_name_markdown(key), f"{model} model", *(cell(cells[c]) for c in columns)])
    header = ["Method", "Scored with", *map(markdown_text, sites), *(h for h, _ in SUMMARY_COLUMNS)]
    return "\n".join(table_lines(header, rows) + ([""] + notes if notes else [])), stats


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
    metric = chosen_metric(runs, metric)
    groups = {k: g for k, g in by_method(finished(runs, metric)).items() if left_out(g[0])}
    if not groups:
        return "", {}
    stats, rows = {}, []
    for key, group in groups.items():
        held_out = left_out(group[0])  # a group's runs hold out the same sites (`variant_of`)
        held_set = set(held_out)
        federation = _summary_stats(group, [_federation_scores(r, metric) for r in group])
        scores = [{s: v for s, v in site_scores(r["final"], metric).items() if s in held_set} for r in group]
        outside = _summary_stats(group, scores)
        stats[key] = {"held_out": held_out, "federation": federation, "held_out_scores": outside}
        rows.append(
            [
                group_name_markdown(key),
                ", ".join(map(markdown_text, held_out)),
                *(cell(part[k]) for part in (federation, outside) for _, k in SUMMARY_COLUMNS),
            ]
        )
    header = ["Method", "Held out", *(f"{who} {h}" for who in ("Federation", "Held-out") for h, _ in SUMMARY_COLUMNS)]
    return "\n".join(table_lines(header, rows)), stats


HELD_OUT_TEXT = (
    "Sites held out of training (server argument `exclude_sites`): they never train nor enter aggregation and are "
    "scored with the final global model as it is, as a hospital joining later would receive it. Final {label} (%): "
    "Avg., Std. (population) and Worst over the federation's sites and over the held-out sites apart, mean ± sd over "
    "seeds; –: no held-out site scored."
)
