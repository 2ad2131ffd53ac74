"""Fairness statistics across sites, as reported in the papers' tables: the spread of one metric over sites
(Fed-LWR), and the agreement of two per-site vectors (FedCE: performance and collaboration fairness)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

__all__ = ["summarize", "performance_fairness", "contribution_agreement", "normalise_abs"]


def summarize(per_site: Mapping[str, float], higher_is_better: bool = True) -> dict:
    """Spread of one metric over sites: mean, population std, worst and best site, percentiles, Gini coefficient.

    std = sqrt(sum_k (x_k - mean)^2 / K), i.e. ddof=0, the population std used in the papers' tables. The worst
    site is the one with the lowest value, the best the one with the highest (the other way round if
    `higher_is_better` is False, e.g. for a loss); ties go to the first such site in the given order, the only
    result that depends on that order. spread = |best - worst| >= 0, the gap between the best and the worst site
    whichever the metric's direction. p10, p50 (median), p90: percentiles of the per-site values with numpy's
    default linear interpolation between the sorted values (`np.percentile`, method "linear"); they rank the values
    themselves, not their goodness: for a loss, p90 lies near the worst site.

    gini = sum_i sum_j |x_i - x_j| / (2 K^2 mean): the mean absolute difference over all ordered pairs of sites
    divided by twice the mean; 0 when every site scores the same, at most 1 - 1/K when one site holds everything.
    It measures the inequality of the values themselves, whichever the direction. It is None (null in JSON) when
    a value is negative or the mean is not positive: the ratio then has no meaning as a share of a total (a
    negative mean flips its sign, a zero mean divides by zero).

    A non-finite value raises ValueError naming the site: a NaN would silently poison every statistic; so does a
    value so large that the statistics overflow (naming the largest).

    Returns:
        {"mean", "std", "worst", "worst_site", "best", "best_site", "spread", "p10", "p50", "p90", "gini"}, plain
        Python floats (gini possibly None) and the site names.
    """
    if not per_site:
        raise ValueError("summarize: no sites")
    values = {}
    for site, value in per_site.items():
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"summarize: value of {site} is {v}")
        values[site] = v
    try:
        mean = math.fsum(values.values()) / len(values)  # fsum: exact, so the same whatever the order of the sites
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values.values()) / len(values))
    except OverflowError:
        site = max(values, key=lambda s: abs(values[s]))
        raise ValueError(f"summarize: value of {site} is too large to summarise ({values[site]})") from None
    low, high = (min, max) if higher_is_better else (max, min)
    worst_site = low(values, key=values.__getitem__)
    best_site = high(values, key=values.__getitem__)
    ordered = sorted(values.values())
    p10, p50, p90 = (float(p) for p in np.percentile(ordered, [10, 50, 90]))
    return {
        "mean": mean,
        "std": std,
        "worst": values[worst_site],
        "worst_site": worst_site,
        "best": values[best_site],
        "best_site": best_site,
        "spread": ordered[-1] - ordered[0],
        "p10": p10,
        "p50": p50,
        "p90": p90,
        "gini": _gini(ordered, mean),
    }


def _gini(ordered: list[float], mean: float) -> float | None:
    """Gini coefficient of values sorted ascending with their mean (see `summarize`); None if a value is negative
    or the mean not positive. sum_i sum_j |x_i - x_j| = 2 sum_i (2i - K - 1) x_(i) (i = 1..K) over sorted values,
    each divided by the mean first so that no product overflows."""
    if ordered[0] < 0 or mean <= 0:
        return None
    k = len(ordered)
    return math.fsum((2 * i - k - 1) * (x / mean) for i, x in enumerate(ordered, start=1)) / (k * k)


# ---------------------------------------------------------------- comparing two per-site vectors (FedCE paper)


def performance_fairness(method_scores: Mapping[str, float], solo_scores: Mapping[str, float]) -> dict:
    """How closely a method's per-site performance follows Solo's (FedCE paper, Table 2).

    Pearson correlation (higher: the federation keeps the sites' order of difficulty) and Euclidean distance
    (lower: no site is moved far from what it achieves alone) between the two vectors, site by site. Pass Dice
    in points (x100) to get the distance on the paper's scale; the correlation does not depend on the scale.

    Returns:
        {"pearson", "p_value", "euclidean", "note"}: pearson and p_value are NaN, with a note saying why, for
        fewer than 3 sites or a constant vector (a correlation is then undefined or meaningless); note is
        None otherwise.
    """
    method, solo = _paired(method_scores, solo_scores, "performance_fairness")
    pearson, p_value, note = _pearson(method, solo)
    return {"pearson": pearson, "p_value": p_value, "euclidean": float(np.linalg.norm(method - solo)), "note": note}


def contribution_agreement(estimates: Mapping[str, float], loo_values: Mapping[str, float]) -> dict:
    """How well estimated client contributions match leave-one-out marginal values (FedCE paper, Table 3).

    Pearson correlation and cosine similarity are scale-free. For the Euclidean distance both vectors are put
    on one scale first: each is divided by the sum of its absolute values, so the estimates (contributions or
    aggregation weights, which already sum to 1) are unchanged and the marginal values (drops of the mean
    Dice, which may be negative) become shares with sum |v| = 1.

    Returns:
        {"pearson", "p_value", "euclidean", "cosine", "note"}; NaN with a note where a value is undefined
        (fewer than 3 sites or a constant vector: pearson; an all-zero vector: euclidean and cosine).
    """
    estimate, loo = _paired(estimates, loo_values, "contribution_agreement")
    pearson, p_value, note = _pearson(estimate, loo)
    notes = [note] if note else []
    if not (np.any(estimate) and np.any(loo)):
        notes.append("an all-zero vector has no direction: Euclidean distance and cosine are undefined")
        euclidean = cosine = math.nan
    else:
        euclidean = float(np.linalg.norm(normalise_abs(estimate) - normalise_abs(loo)))
        cosine = float(estimate @ loo / (np.linalg.norm(estimate) * np.linalg.norm(loo)))
    return {
        "pearson": pearson,
        "p_value": p_value,
        "euclidean": euclidean,
        "cosine": cosine,
        "note": "; ".join(notes) or None,
    }


def normalise_abs(values: np.ndarray) -> np.ndarray:
    """values / sum(|values|): shares that keep their signs (a site whose removal helped stays negative)."""
    return values / np.abs(values).sum()


def _paired(a: Mapping[str, float], b: Mapping[str, float], who: str) -> tuple[np.ndarray, np.ndarray]:
    """The two vectors in one site order; the sites must be the same and every value finite."""
    if set(a) != set(b):
        raise ValueError(f"{who}: the sites differ: {sorted(set(a) ^ set(b))} are in only one of the two")
    if not a:
        raise ValueError(f"{who}: no sites")
    sites = sorted(a)
    x, y = (np.array([float(v[s]) for s in sites]) for v in (a, b))
    for site, u, v in zip(sites, x, y, strict=True):
        if not (math.isfinite(u) and math.isfinite(v)):
            raise ValueError(f"{who}: value of {site} is not finite ({u}, {v})")
    return x, y


def _pearson(x: np.ndarray, y: np.ndarray) -> tuple[float, float, str | None]:
    """Pearson r and its two-sided p-value, or NaNs and the reason when it is undefined or meaningless."""
    if len(x) < 3:  # two points always lie on a line: r = +-1 with p = 1 says nothing
        return math.nan, math.nan, f"Pearson correlation needs at least 3 sites, got {len(x)}"
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan, "Pearson correlation is undefined for a constant vector"
    from scipy.stats import pearsonr  # here: results.py (imported by every server) needs only summarize

    result = pearsonr(x, y)
    return float(result.statistic), float(result.pvalue), None
