"""Fairness statistics across sites, as reported in the papers' tables."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["summarize"]


def summarize(per_site: Mapping[str, float], higher_is_better: bool = True) -> dict:
    """Mean, population standard deviation and worst site of one metric over sites.

    std = sqrt(sum_k (x_k - mean)^2 / K), i.e. ddof=0, the population std used in the papers'
    tables (DESIGN.md). The worst site is the one with the lowest value (the highest if
    `higher_is_better` is False, e.g. for a loss); ties go to the first such site. A non-finite
    value raises ValueError naming the site: a NaN would silently poison mean, std and worst.

    Returns:
        {"mean", "std", "worst", "worst_site"}, plain Python floats and the site name.
    """
    if not per_site:
        raise ValueError("summarize: no sites")
    values = {}
    for site, value in per_site.items():
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"summarize: value of {site} is {v}")
        values[site] = v
    mean = math.fsum(values.values()) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values.values()) / len(values))
    pick = min if higher_is_better else max
    worst_site = pick(values, key=values.__getitem__)
    return {"mean": mean, "std": std, "worst": values[worst_site], "worst_site": worst_site}
