"""Aggregation of model state dicts: FedAvg's weighted average and Fed-LWR's layer-wise version.

Plain functions on `{key: torch.Tensor}` state dicts; the FLARE components call them.

Integer and bool tensors (BatchNorm's `num_batches_tracked`, masks, indices) are never averaged:
a mean of counters or indices is not a valid counter or index. `weighted_average` takes them
from the first state; `layerwise_average` from the anchor (DESIGN.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch

__all__ = [
    "weighted_average",
    "lwr_layer_weights",
    "layerwise_average",
    "check_site_state",
    "check_cka",
]

CKA_TOLERANCE = 1e-6  # rounding allowed outside [0, 1] by check_cka


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


def weighted_average(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> dict:
    """FedAvg (Fed-LWR Eq. 1): w = sum_k (n_k / sum_i n_i) w_k, over state dicts with equal keys.

    Weights are normalised to sum to 1. Floating tensors are averaged in float64 and cast back;
    integer/bool tensors are copied from the first state (see the module docstring).
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
        first = states[0][key]
        out[key] = _mix([s[key] for s in states], w, key) if _is_averaged(first) else first.clone()
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
            every CKA is above 0.99 (DESIGN.md). Without a clip, deltas are still clamped to
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
        layers: {layer: state keys}, e.g. `fairfl.cka.parameter_layers(model)`; every key of
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
            raise ValueError(f"layerwise_average: weights of {layer} are for {sorted(per_site)}, "
                             f"states for {sorted(sites)}")
        normalised[layer] = _normalised([per_site[s] for s in sites], f"weights of {layer}")
    out = {}
    for key, ref in anchor.items():
        if _is_averaged(ref):
            out[key] = _mix([states[s][key] for s in sites], normalised[owner[key]], key)
        else:
            out[key] = ref.clone()
    return out


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_complex():
        return "complex"
    return "float" if t.is_floating_point() else "integer"


def _list(keys: list[str]) -> str:
    return ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")


def check_site_state(state: Mapping, reference: Mapping[str, torch.Tensor]) -> str | None:
    """Why a site's state dict cannot be aggregated with `reference`'s, or None if it can.

    Checks, in this order: missing keys, unexpected keys, then per key in the reference's
    order: a tensor, the same shape, the same dtype kind (float/integer/bool/complex), and
    finite values. The reason names the first offending key, e.g. "NaN in conv1.weight".
    """
    missing = [k for k in reference if k not in state]
    if missing:
        return f"missing keys: {_list(missing)}"
    unexpected = [k for k in state if k not in reference]
    if unexpected:
        return f"unexpected keys: {_list(unexpected)}"
    for key, ref in reference.items():
        t = state[key]
        if not isinstance(t, torch.Tensor):
            return f"{key} is a {type(t).__name__}, not a tensor"
        if t.shape != ref.shape:
            return f"shape mismatch for {key}: got {tuple(t.shape)}, expected {tuple(ref.shape)}"
        if _kind(t) != _kind(ref):
            return f"dtype mismatch for {key}: got {t.dtype} ({_kind(t)}), expected {_kind(ref)}"
    for key in reference:
        t = state[key]
        if _is_averaged(t) and not bool(torch.isfinite(t).all()):
            return f"{'NaN' if bool(torch.isnan(t).any()) else 'Inf'} in {key}"
    return None


def check_cka(cka: Mapping, layers: Iterable[str]) -> str | None:
    """Why a site's CKA report {layer: value} is unusable, or None if it is fine.

    Every layer of `layers` must be present (and no other), each value a finite number in
    [0, 1], allowing 1e-6 of rounding (`lwr_layer_weights` clamps it away).
    """
    if not isinstance(cka, Mapping):
        return f"CKA report is a {type(cka).__name__}, not a mapping"
    expected = list(layers)
    missing = [n for n in expected if n not in cka]
    if missing:
        return f"CKA missing for layers: {_list(missing)}"
    known = set(expected)
    unexpected = [n for n in cka if n not in known]
    if unexpected:
        return f"CKA for unknown layers: {_list([str(n) for n in unexpected])}"
    for name in expected:
        value = cka[name]
        if isinstance(value, bool):
            return f"CKA of {name} is a bool, not a number"
        try:
            value = float(value)
        except (TypeError, ValueError):
            return f"CKA of {name} is not a number: {cka[name]!r}"
        if not math.isfinite(value):
            return f"CKA of {name} is {value}"
        if not -CKA_TOLERANCE <= value <= 1.0 + CKA_TOLERANCE:
            return f"CKA of {name} is {value}, outside [0, 1]"
    return None
