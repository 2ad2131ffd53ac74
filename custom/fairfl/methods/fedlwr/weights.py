"""Fed-LWR's server-side math: what a site's CKA report must be (`cka_report`), the layer weights from the reports
(Eq. 5, `lwr_layer_weights`) and the layer-wise re-aggregation with them (Eq. 6, `layerwise_average`).

Plain functions on `{key: torch.Tensor}` state dicts, no FLARE: the controller (fairfl.methods.fedlwr.controller)
calls them. Integer and bool tensors are never averaged (fairfl.aggregation): `layerwise_average` takes them from the
anchor."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

from fairfl.aggregation import is_averaged, normalised, weighted_sum
from fairfl.kinds import Real, Record

__all__ = ["CKA_TOLERANCE", "cka_report", "check_cka", "lwr_layer_weights", "layerwise_average"]

CKA_TOLERANCE = 1e-6  # rounding allowed outside [0, 1] by cka_report


def cka_report(layers: Iterable[str]) -> Record:
    """A site's CKA report {layer: CKA(local, anchor)}: every layer of `layers` (and no other), each a finite number
    in [0, 1], allowing CKA_TOLERANCE of rounding (`lwr_layer_weights` clamps it away)."""
    return Record({name: Real(-CKA_TOLERANCE, 1.0 + CKA_TOLERANCE) for name in layers})


def check_cka(cka: Mapping, layers: Iterable[str]) -> str | None:
    """Why a site's CKA report {layer: value} is unusable (`cka_report`), or None if it is fine."""
    problem = cka_report(layers).problem(cka)
    return f"CKA {problem}" if problem else None


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
    shares = {}
    for layer, per_site in layer_weights.items():
        if set(per_site) != set(sites):
            raise ValueError(
                f"layerwise_average: weights of {layer} are for {sorted(per_site)}, states for {sorted(sites)}"
            )
        shares[layer] = normalised([per_site[s] for s in sites], f"weights of {layer}")
    out = {}
    for key, ref in anchor.items():
        if is_averaged(ref):
            out[key] = weighted_sum([states[s][key] for s in sites], shares[owner[key]], key)
        else:
            out[key] = ref.clone()
    return out
