"""Collaborative-fairness rewards: every site gets its own share of the aggregated update (CFFL, CGSV).

Plain functions on `{name: torch.Tensor}` dicts; `fairfl.methods.rewards.controller` calls them.

- CFFL (Lyu et al., "Collaborative Fairness in Federated Learning", 2020): reputations from each site's validation
  metric through sinh(alpha v), smoothed over rounds; the update aggregated with them, U = sum_i r_i delta_i.
- CGSV (Xu et al., NeurIPS 2021, Algorithm 1): updates normalised to a common norm Gamma, u_N = sum_i r_i u_i,
  cosine-gradient Shapley values psi_i = cos(u_i, u_N), reputations r_i <- alpha r_i + (1 - alpha) psi_i.

Both reward site i with the top fraction q_i of the aggregate's entries by magnitude, per tensor
(`mask_top_fraction`): w_i <- w_i + mask(U, q_i). Only floating-point tensors are updates; integer and bool tensors
(BatchNorm's num_batches_tracked) are never added to or masked: a rewarded site takes them from its own trained
model, the others keep theirs (`reward_states`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from fairfl.methods.fedce.contribution import flatten, normalise

__all__ = [
    "update_keys",
    "state_delta",
    "weighted_update",
    "update_norm",
    "normalised_update",
    "cgsv_values",
    "cffl_reputations",
    "update_reputation",
    "apply_threshold",
    "reward_fractions",
    "mask_top_fraction",
    "reward_states",
]


def update_keys(state: Mapping[str, torch.Tensor]) -> list[str]:
    """The keys whose tensors are updated: the floating-point ones, in the state's order."""
    return [k for k, t in state.items() if t.is_floating_point()]


def state_delta(new: Mapping[str, torch.Tensor], old: Mapping[str, torch.Tensor]) -> dict:
    """delta = new - old over the floating-point tensors of `old`."""
    return {k: new[k].to(old[k].dtype) - old[k] for k in update_keys(old)}


def weighted_update(updates: Mapping[str, Mapping[str, torch.Tensor]], weights: Mapping[str, float]) -> dict:
    """sum_i weights[i] * updates[i] over the sites of `weights` (weights used as given, not renormalised)."""
    sites = [s for s in weights if weights[s] != 0.0] or list(weights)
    first = updates[sites[0]]
    zero = torch.zeros((), dtype=torch.float64)  # sum()'s start as a float64 tensor: the same sums as from the int 0
    return {k: sum((float(weights[s]) * updates[s][k].double() for s in sites), zero).to(first[k].dtype) for k in first}


def update_norm(update: Mapping[str, torch.Tensor]) -> float:
    """The Euclidean norm of all of an update's tensors together."""
    return float(flatten(update, list(update)).norm())


def normalised_update(update: Mapping[str, torch.Tensor], gamma: float) -> dict:
    """CGSV's upload u = Gamma * delta / ||delta||; a zero update stays zero (it points nowhere)."""
    norm = update_norm(update)
    scale = gamma / norm if norm > 0.0 else 0.0
    return {k: t * scale for k, t in update.items()}


def cgsv_values(normalised: Mapping[str, Mapping[str, torch.Tensor]], aggregate: Mapping[str, torch.Tensor]) -> dict:
    """CGSV's cosine-gradient Shapley value psi_i = cos(u_i, u_N), in [-1, 1]; 0 when either vector is zero."""
    keys = list(aggregate)
    total = flatten(aggregate, keys)
    values = {}
    for site, update in normalised.items():
        u = flatten(update, keys)
        denominator = float(u.norm()) * float(total.norm())
        values[site] = float(u @ total) / denominator if denominator > 0.0 else 0.0
    return values


def cffl_reputations(metrics: Mapping[str, float], alpha: float) -> dict:
    """CFFL's round reputations: sinh(alpha * v_i) / sum_j sinh(alpha * v_j) of validation metrics v in [0, 1]
    (all zero: equal shares)."""
    return normalise({s: math.sinh(alpha * float(v)) for s, v in metrics.items()})


def update_reputation(previous: Mapping[str, float], values: Mapping[str, float], keep: float) -> dict:
    """r_i <- keep * r_i + (1 - keep) * value_i for the sites in `values`, then negative reputations clipped to 0
    and all renormalised to sum 1 (all zero: equal shares).

    CFFL smooths with keep 0.5; CGSV's alpha is `keep`. A site without a previous reputation (the first round, or
    a site rejected until now) starts at its value; sites not in `values` keep their reputation before the
    renormalisation."""
    reputations = dict(previous)
    for site, value in values.items():
        reputations[site] = keep * previous[site] + (1.0 - keep) * value if site in previous else float(value)
    return normalise({s: max(0.0, r) for s, r in reputations.items()})


def apply_threshold(reputations: Mapping[str, float], threshold: float, removed=()) -> tuple[dict, list]:
    """CFFL's removal of low-reputation sites: the sites in `removed` and those below `threshold` get reputation 0
    (for good), the others are renormalised. Returns (reputations, removed sites, sorted). Removing everyone
    would leave no federation: then nobody new is removed."""
    out_sites = set(removed) | {s for s, r in reputations.items() if r < threshold}
    if out_sites >= set(reputations):
        out_sites = set(removed)
    kept = normalise({s: r for s, r in reputations.items() if s not in out_sites})
    return {s: kept.get(s, 0.0) for s in reputations}, sorted(out_sites)


def reward_fractions(reputations: Mapping[str, float], beta: float | None = None) -> dict:
    """The share of the aggregate each site receives: q_i = r_i / max_j r_j (CFFL), or with `beta`
    q_i = tanh(beta r_i) / max_j tanh(beta r_j) (CGSV's altruism degree). The top site gets q = 1; all zero: 1."""
    raw = {s: (math.tanh(beta * r) if beta is not None else float(r)) for s, r in reputations.items()}
    top = max(raw.values())
    return {s: (v / top if top > 0.0 else 1.0) for s, v in raw.items()}


def mask_top_fraction(update: Mapping[str, torch.Tensor], q: float) -> dict:
    """The update with, per tensor, only its ceil(q * n) entries of largest magnitude kept (exactly that many; ties
    broken by position) and the others zero. q >= 1 is the update itself, q <= 0 all zeros."""
    if not q >= 0.0 or math.isnan(q):
        raise ValueError(f"mask_top_fraction: q must be a number >= 0, got {q}")
    out = {}
    for key, tensor in update.items():
        n = tensor.numel()
        k = min(n, math.ceil(q * n - 1e-9))
        if k >= n:
            out[key] = tensor.clone()
            continue
        flat = torch.zeros(n, dtype=tensor.dtype, device=tensor.device)
        if k > 0:
            index = torch.topk(tensor.reshape(-1).abs(), k).indices
            flat[index] = tensor.reshape(-1)[index]
        out[key] = flat.reshape(tensor.shape)
    return out


def reward_states(
    models: Mapping[str, Mapping[str, torch.Tensor]],
    update: Mapping[str, torch.Tensor],
    fractions: Mapping[str, float],
    trained: Mapping[str, Mapping[str, torch.Tensor]],
) -> dict:
    """Every site's next model: w_i + mask(update, q_i) for the sites in `fractions`; integer and bool tensors
    from the site's own trained model (`trained[i]`) when it has one, else its current ones. Sites not in
    `fractions` (rejected or absent this round) keep their model unchanged."""
    out = {}
    for site, model in models.items():
        if site not in fractions:
            out[site] = dict(model)
            continue
        reward = mask_top_fraction(update, fractions[site])
        own = trained.get(site, model)
        out[site] = {k: (t + reward[k].to(t.dtype) if k in reward else own[k].clone()) for k, t in model.items()}
    return out
