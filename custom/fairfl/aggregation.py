"""Aggregation of model state dicts: FedAvg's weighted average and Fed-LWR's layer-wise version.

Plain functions on `{key: torch.Tensor}` state dicts; the FLARE components call them.

Integer and bool tensors (BatchNorm's `num_batches_tracked`, masks, indices) are never averaged:
a mean of counters or indices is not a valid counter or index. `weighted_average` and `robust_average` take
their coordinate-wise lower median over the sites (`integer_median`: no single site, the first one included,
sets them); `layerwise_average` takes them from the anchor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch

__all__ = [
    "weighted_average",
    "lwr_layer_weights",
    "layerwise_average",
    "robust_average",
    "cap_shares",
    "integer_median",
    "trim_count",
    "ROBUST_MODES",
]


def _is_averaged(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _normalised(weights: Sequence[float], what: str) -> list[float]:
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


def _mix(tensors: Sequence[torch.Tensor], weights: Sequence[float], key: str) -> torch.Tensor:
    """sum_k w_k t_k, accumulated in float64 (complex128) and cast back to the tensors' dtype."""
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape:
            raise ValueError(f"{key}: shapes differ, {tuple(first.shape)} vs {tuple(t.shape)}")
    acc_dtype = torch.complex128 if first.is_complex() else torch.float64
    acc = torch.zeros(first.shape, dtype=acc_dtype, device=first.device)
    for t, w in zip(tensors, weights):
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
    """FedAvg (Fed-LWR Eq. 1): w = sum_k (n_k / sum_i n_i) w_k, over state dicts with equal keys.

    Weights are normalised to sum to 1. Floating tensors are averaged in float64 and cast back;
    integer/bool tensors are the sites' lower median (`integer_median`, see the module docstring).
    """
    if not states:
        raise ValueError("weighted_average: no states")
    if len(weights) != len(states):
        raise ValueError(f"weighted_average: {len(states)} states but {len(weights)} weights")
    w = _normalised(weights, "weighted_average")
    keys = list(states[0])
    for i, state in enumerate(states[1:], start=1):
        if set(state) != set(keys):
            odd = sorted(set(state) ^ set(keys))
            raise ValueError(f"weighted_average: state {i} keys differ from state 0's: {odd[:5]}")
    out = {}
    for key in keys:
        tensors = [s[key] for s in states]
        out[key] = _mix(tensors, w, key) if _is_averaged(tensors[0]) else integer_median(tensors)
    return out


def lwr_layer_weights(
    cka: Mapping[str, Mapping[str, float]],
    clip: tuple[float, float] | None = None,
) -> dict[str, dict[str, float]]:
    """Fed-LWR's layer weights, Eq. 5: rho_k^m = (1 - delta_k^m) / sum_i (1 - delta_i^m).

    Args:
        cka: {site: {layer: delta}}, the CKA of each site's local layer to the anchor's.
            Every site must report the same layers.
        clip: optional (lo, hi); each delta is clipped to [lo, hi] first. The paper has no clip;
            the authors' code uses (1e-4, 0.99), which makes the weights exactly uniform when
            every CKA is above 0.99. Without a clip, deltas are still clamped to
            [0, 1] so that every weight is >= 0.

    Returns:
        {layer: {site: rho}}, each layer's weights summing to 1. When every site has delta = 1
        for a layer (all identical to the anchor), Eq. 5 is 0/0 and the weights are uniform.
    """
    sites = list(cka)
    if not sites:
        raise ValueError("lwr_layer_weights: no sites")
    lo, hi = (0.0, 1.0) if clip is None else (float(clip[0]), float(clip[1]))
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"lwr_layer_weights: clip must satisfy 0 <= lo <= hi <= 1, got {clip}")
    layers = list(cka[sites[0]])
    for site in sites[1:]:
        if set(cka[site]) != set(layers):
            odd = sorted(set(cka[site]) ^ set(layers))
            raise ValueError(f"lwr_layer_weights: {site} reports other layers than {sites[0]}: {odd[:5]}")
    weights = {}
    for layer in layers:
        diff = {}
        for site in sites:
            delta = float(cka[site][layer])
            if math.isnan(delta):
                raise ValueError(f"lwr_layer_weights: CKA of {site} for {layer} is NaN")
            diff[site] = 1.0 - min(max(delta, lo), hi)
        total = math.fsum(diff.values())
        if total > 0.0:
            weights[layer] = {site: d / total for site, d in diff.items()}
        else:  # every site identical to the anchor: nothing to favour
            weights[layer] = {site: 1.0 / len(sites) for site in sites}
    return weights


def layerwise_average(
    states: Mapping[str, Mapping[str, torch.Tensor]],
    layer_weights: Mapping[str, Mapping[str, float]],
    layers: Mapping[str, Iterable[str]],
    anchor: Mapping[str, torch.Tensor],
) -> dict:
    """Fed-LWR's re-aggregation, Eq. 6: w_m = sum_k rho_k^m w_{k,m} for every layer m.

    Args:
        states: {site: local state dict}.
        layer_weights: {layer: {site: rho}} from `lwr_layer_weights` (normalised again here).
        layers: {layer: state keys}, e.g. `fairfl.methods.fedlwr.cka.parameter_layers(model)`; every key of
            `anchor` must belong to exactly one layer, else ValueError (a key outside every
            layer would have no weights to use).
        anchor: the FedAvg model of the round; gives the keys, order, and integer buffers.

    Returns:
        A new state dict with the anchor's keys in the anchor's order.
    """
    sites = list(states)
    if not sites:
        raise ValueError("layerwise_average: no states")
    owner: dict[str, str] = {}
    for layer, keys in layers.items():
        for key in keys:
            if key in owner:
                raise ValueError(f"layerwise_average: {key} is in layers {owner[key]} and {layer}")
            owner[key] = layer
    unmapped = [k for k in anchor if k not in owner]
    if unmapped:
        raise ValueError(f"layerwise_average: keys in no layer: {unmapped[:5]}")
    unknown = [k for k in owner if k not in anchor]
    if unknown:
        raise ValueError(f"layerwise_average: layer keys not in the anchor: {unknown[:5]}")
    if set(layer_weights) != set(layers):
        odd = sorted(set(layer_weights) ^ set(layers))
        raise ValueError(f"layerwise_average: layer_weights and layers name other layers: {odd[:5]}")
    for site in sites:
        missing = [k for k in anchor if k not in states[site]]
        if missing:
            raise ValueError(f"layerwise_average: {site} lacks {missing[:5]}")
    normalised = {}
    for layer, per_site in layer_weights.items():
        if set(per_site) != set(sites):
            raise ValueError(
                f"layerwise_average: weights of {layer} are for {sorted(per_site)}, states for {sorted(sites)}"
            )
        normalised[layer] = _normalised([per_site[s] for s in sites], f"weights of {layer}")
    out = {}
    for key, ref in anchor.items():
        if _is_averaged(ref):
            out[key] = _mix([states[s][key] for s in sites], normalised[owner[key]], key)
        else:
            out[key] = ref.clone()
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
        if mode == "median":
            middle = ordered[(count - 1) // 2 : count // 2 + 1]
        else:
            middle = ordered[trim : count - trim]
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
