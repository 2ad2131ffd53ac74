"""Aggregation of model state dicts: the weighted average, robust statistics instead of it, and the cap on any one
site's share. A method's own aggregation (a layer-wise one, a step from losses) is its unit's, built on these.

Plain functions on `{key: torch.Tensor}` state dicts; the FLARE components call them.

Integer and bool tensors (BatchNorm's `num_batches_tracked`, masks, indices) are never averaged:
a mean of counters or indices is not a valid counter or index. `weighted_average` and `robust_average` take
their coordinate-wise lower median over the sites (`integer_median`: no single site, the first one included,
sets them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

__all__ = [
    "weighted_average",
    "weighted_sum",
    "normalised",
    "is_averaged",
    "robust_average",
    "cap_shares",
    "integer_median",
    "trim_count",
    "ROBUST_MODES",
]


def is_averaged(t: torch.Tensor) -> bool:
    """Whether a tensor is averaged (floating or complex); integer and bool tensors never are."""
    return t.is_floating_point() or t.is_complex()


def normalise(values: dict) -> dict:
    """{site: share}, the shares summing to 1; all zero -> equal shares (no site is distinguishable). FedCE's
    contribution terms, SAGA's and the reward methods' weights."""
    bad = {s: v for s, v in values.items() if not (math.isfinite(v) and v >= 0)}
    if bad:
        raise ValueError(f"shares must come from finite, non-negative values, got {bad}")
    total = sum(values.values())
    if total <= 0:
        return {s: 1.0 / len(values) for s in values}
    return {s: v / total for s, v in values.items()}


def normalised(weights: Sequence[float], what: str) -> list[float]:
    """Weights as floats summing to 1; they must be finite, >= 0 and not all 0."""
    w = [float(v) for v in weights]
    if not w:
        raise ValueError(f"{what}: no weights")
    if not all(math.isfinite(v) and v >= 0.0 for v in w):
        raise ValueError(f"{what}: weights must be finite and non-negative, got {w}")
    total = math.fsum(w)
    if total <= 0.0:
        raise ValueError(f"{what}: weights sum to 0")
    return [v / total for v in w]


def weighted_sum(tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str) -> torch.Tensor:
    """sum_k w_k t_k, accumulated in float64 (complex128) and cast back to the tensors' dtype."""
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape:
            raise ValueError(f"{key}: shapes differ, {tuple(first.shape)} vs {tuple(t.shape)}")
    acc_dtype = torch.complex128 if first.is_complex() else torch.float64
    acc = torch.zeros(first.shape, dtype=acc_dtype, device=first.device)
    for t, w in zip(tensors, weights, strict=True):
        if w != 0.0:
            acc.add_(t.to(device=first.device, dtype=acc_dtype), alpha=w)
    return acc.to(first.dtype)


def integer_median(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The coordinate-wise lower median of integer or bool tensors of one shape: a value one of the sites sent, which
    no single site can set against the others (with two sites, the smaller)."""
    stacked = torch.stack([t.to(tensors[0].dtype) for t in tensors])
    if stacked.dtype == torch.bool:
        return stacked.to(torch.uint8).sort(dim=0).values[(len(tensors) - 1) // 2].bool()
    return stacked.sort(dim=0).values[(len(tensors) - 1) // 2].clone()


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> dict:
    """FedAvg: w = sum_k (n_k / sum_i n_i) w_k, over state dicts with equal keys.

    Weights are normalised to sum to 1. Floating tensors are averaged in float64 and cast back;
    integer/bool tensors are the sites' lower median (`integer_median`, see the module docstring).
    """
    if not states:
        raise ValueError("weighted_average: no states")
    if len(weights) != len(states):
        raise ValueError(f"weighted_average: {len(states)} states but {len(weights)} weights")
    w = normalised(weights, "weighted_average")
    keys = list(states[0])
    for i, state in enumerate(states[1:], start=1):
        if set(state) != set(keys):
            odd = sorted(set(state) ^ set(keys))
            raise ValueError(f"weighted_average: state {i} keys differ from state 0's: {odd[:5]}")
    out = {}
    for key in keys:
        tensors = [s[key] for s in states]
        out[key] = weighted_sum(tensors, w, key) if is_averaged(tensors[0]) else integer_median(tensors)
    return out


ROBUST_MODES = ("none", "median", "trimmed_mean")


def robust_average(states: Sequence[Mapping[str, torch.Tensor]], mode: str, trim_fraction: float = 0.2) -> dict:
    """A coordinate-wise robust statistic of state dicts with equal keys, instead of a weighted average:
    "median" (the mean of the two middle values for an even count) or "trimmed_mean" (the mean after dropping
    the `trim_count(K, trim_fraction)` largest and smallest values of every coordinate, K states: at least one of
    each with 3 or more states). Unweighted: one site moving one coordinate to any value moves the result at most to
    the next site's value. Integer and bool tensors are the sites' lower median, as in `weighted_average`."""
    if mode not in ROBUST_MODES[1:]:
        raise ValueError(f"robust_average: mode must be one of {ROBUST_MODES[1:]}, got {mode!r}")
    if not 0.0 <= trim_fraction < 0.5:
        raise ValueError(f"robust_average: trim_fraction must be in [0, 0.5), got {trim_fraction}")
    if not states:
        raise ValueError("robust_average: no states")
    count = len(states)
    trim = trim_count(count, trim_fraction)
    out = {}
    for key, first in states[0].items():
        if not first.is_floating_point():
            out[key] = integer_median([s[key] for s in states])
            continue
        ordered = torch.stack([s[key].to(first.dtype) for s in states]).sort(dim=0).values
        middle = ordered[(count - 1) // 2 : count // 2 + 1] if mode == "median" else ordered[trim : count - trim]
        out[key] = middle.double().mean(dim=0).to(first.dtype)
    return out


def trim_count(count: int, trim_fraction: float) -> int:
    """How many values a trimmed mean of `count` drops at each end: floor(trim_fraction * count), but at least one
    from 3 values on (floor(0.2 K) is 0 up to K = 4, which would trim nothing while claiming to); 0 below 3, where
    there is nothing to trim to (the round's results say so: `robust`)."""
    if count < 3:
        return 0
    return max(1, min(int(math.floor(trim_fraction * count)), (count - 1) // 2))


def cap_shares(weights: Mapping[str, float], max_share: float, min_sites: int = 3) -> dict:
    """The weights with no site above `max_share` of their total: a larger weight is cut to max_share and what it
    loses goes to the others in proportion to their weights, repeated until none is above (the total is kept).
    Unchanged when no site is above the cap, or with fewer than `min_sites` sites (with two, any cap below 1 would
    just make them equal: there is no majority to protect). A cap below 1/K gives equal shares."""
    sites = list(weights)
    total = math.fsum(float(weights[s]) for s in sites)
    if len(sites) < min_sites or max_share >= 1.0 or total <= 0.0:
        return dict(weights)
    shares = {s: float(weights[s]) / total for s in sites}
    if max(shares.values()) <= max_share:
        return dict(weights)
    if max_share * len(sites) <= 1.0:
        return {s: total / len(sites) for s in sites}
    capped: set = set()
    while True:
        free = [s for s in sites if s not in capped]
        left = 1.0 - max_share * len(capped)
        mass = math.fsum(float(weights[s]) for s in free)
        out = {
            s: (max_share if s in capped else (float(weights[s]) / mass * left if mass > 0.0 else left / len(free)))
            for s in sites
        }
        over = {s for s in free if out[s] > max_share * (1.0 + 1e-12)}
        if not over:
            return {s: v * total for s, v in out.items()}
        capped |= over
