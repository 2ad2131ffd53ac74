"""The numbers the report's tables are made of: a run's scores per site in percent, their mean and spread across
sites, and means over seeds."""

from __future__ import annotations

import math

import numpy as np

from fairfl.fairness import summarize
from fairfl.results import site_key


def site_scores(record, metric) -> dict:
    """{site: metric in percent} of an evaluated record (a round or "final"); {} when not evaluated. A value that is
    not a number (null: a NaN as the results file writes it; anything else a hostile file holds) is NaN, so a run
    with such a site counts as one without a finite result (left out of claims, refused by the tables), never as a
    crash or a smaller set of sites."""
    return {
        s: 100.0 * (v[metric] if is_number(v[metric]) else math.nan)
        for s, v in ((record or {}).get("per_site") or {}).items()
        if isinstance(v, dict) and metric in v
    }


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def avg_std(scores: dict) -> tuple[float, float]:
    """Mean and population std (ddof=0, as in the papers) across sites."""
    values = np.fromiter(scores.values(), float)
    return float(values.mean()), float(values.std())


def mean_sd(values) -> tuple[float, float | None] | None:
    """Mean and sample sd (ddof=1) over seeds; sd None for one value; None for no values."""
    values = np.asarray(list(values), float)
    if values.size == 0:
        return None
    return float(values.mean()), float(values.std(ddof=1)) if values.size > 1 else None


def mean_per_site(dicts) -> dict:
    """{site: mean over the dicts that have it} of per-site values, e.g. one dict per seed."""
    sites = sorted({s for d in dicts for s in d}, key=site_key)
    return {s: float(np.mean([d[s] for d in dicts if s in d])) for s in sites}


def summarized(run, scores: dict) -> dict:
    """`fairness.summarize` of a run's per-site scores; a value it refuses (not a finite number) names the file."""
    try:
        return summarize(scores)
    except ValueError as e:  # a hostile or broken file: name it
        raise ValueError(f"{run['file']}: {e}") from e
