"""q-FFL aggregation (q-FedAvg, Li, Sanjabi, Beirami and Smith, "Fair resource allocation in federated
learning", ICLR 2020, Algorithm 2), the loss-reweighting baseline of FedISM+, as a function on state dicts.

Per round, with w the global model the sites trained from, w_k site k's model after local training and F_k
the loss of w on site k's training data (measured by the site before it trains):

    Delta w_k = L (w - w_k)                         (the local update read as a gradient estimate)
    Delta_k   = F_k^q Delta w_k
    h_k       = q F_k^(q-1) ||Delta w_k||^2 + L F_k^q
    w_new     = w - sum_k Delta_k / sum_k h_k

How L is set. L is the Lipschitz constant of the local gradients; the authors' code uses L = 1 / lr, the
inverse of the local SGD learning rate (`lipschitz_from_lr`), for which Delta w_k is the sum of the local
gradients when the site trains with plain SGD. With Adam (FedISM+'s setting) the local update is not lr
times a gradient: ||w - w_k||^2 grows with the number of parameters, the q ||Delta w_k||^2 term dominates h_k
and the global step shrinks to a small part of FedAvg's (the prostate benchmark's q-FedAvg (L = 1/lr) ends
near 8 Dice). `lipschitz` is therefore
an option: dividing numerator and denominator by L,

    w_new = w - sum_k F_k^q (w - w_k) / sum_k (F_k^q + q L F_k^(q-1) ||w - w_k||^2),

which is well defined at L = 0, where it is FedAvg weighted by F_k^q (what the FFL4MIA code calls
"q-FedAvg"); q = 0 is FedAvg with equal weights for any L. We compute this form: it is the same update.

Written as a mixture, w_new = (1 - sum_k c_k) w + sum_k c_k w_k with c_k = F_k^q / sum_i (F_i^q + ...), so
the update is `fairfl.aggregation.weighted_average` of the global and local models; the global model keeps
the share the curvature term takes. As in the authors' code, 1e-10 is added to every F_k (F = 0 with q < 1).

The shares are computed from logarithms (log F^q = q log F, summed with log-sum-exp), so any finite loss gives
finite shares: a loss of 1e300 with q = 2 no longer overflows to inf / inf.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

import torch

from fairfl.aggregation import weighted_average

LOSS_OFFSET = 1e-10  # the authors' code: F_k + 1e-10


def round_lr(rates: dict) -> tuple[float, list]:
    """(the learning rate whose 1 / lr is the round's L, the sites outvoted) from {site: the lr it reports}: the lr
    more sites report than any other, the sites reporting another are outvoted; when no lr leads (two sites that
    disagree, or any tie) no site's place in the order decides: L comes from the smallest tied lr, the most cautious
    step (a site can then only slow the round, never enlarge its step), and nobody is outvoted."""
    counts = Counter(rates.values())
    top = max(counts.values())
    leaders = sorted(lr for lr, n in counts.items() if n == top)
    if len(leaders) == 1:
        return leaders[0], sorted(s for s, lr in rates.items() if lr != leaders[0])
    return leaders[0], []


def lipschitz_from_lr(lr: float) -> float:
    """L = 1 / lr, the authors' choice (their code divides the local update by the learning rate)."""
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    return 1.0 / lr


def qffl_coefficients(
    global_state: Mapping[str, torch.Tensor],
    local_states: Mapping[str, Mapping],
    losses: Mapping[str, float],
    q: float,
    lipschitz: float,
    keys: Iterable[str] | None = None,
) -> dict:
    """{site: c_k}: the share of each local model in the q-FFL update (see the module docstring).

    keys: the state keys that make up ||w - w_k||^2 (the gradient's norm), e.g. the model's parameter names;
    default every floating-point key (running statistics included)."""
    sites = sorted(local_states)
    if not sites:
        raise ValueError("qffl: no sites")
    if set(losses) != set(sites):
        raise ValueError(f"qffl: losses for {sorted(losses)} but models for {sites}")
    if not (math.isfinite(q) and q >= 0):
        raise ValueError(f"q must be finite and >= 0, got {q}")
    if not (math.isfinite(lipschitz) and lipschitz >= 0):
        raise ValueError(f"lipschitz must be finite and >= 0, got {lipschitz}")
    bad = {s: losses[s] for s in sites if not (math.isfinite(losses[s]) and losses[s] >= 0)}
    if bad:
        raise ValueError(f"qffl: losses must be finite and >= 0, got {bad}")
    keys = [k for k in global_state if global_state[k].is_floating_point()] if keys is None else list(keys)
    log_numerators, log_terms = {}, []
    for s in sites:
        log_f = math.log(float(losses[s]) + LOSS_OFFSET)
        squared = math.fsum(
            float(torch.sum((global_state[k].double() - local_states[s][k].double()) ** 2)) for k in keys
        )
        log_numerators[s] = q * log_f  # log F^q
        log_terms.append(q * log_f)
        if q * lipschitz * squared > 0.0:  # log(q L F^(q-1) ||w - w_k||^2)
            log_terms.append(math.log(q * lipschitz * squared) + (q - 1.0) * log_f)
    top = max(log_terms)
    log_denominator = top + math.log(math.fsum(math.exp(t - top) for t in log_terms))
    return {s: math.exp(log_numerators[s] - log_denominator) for s in sites}


def qffl_aggregate(
    global_state: Mapping[str, torch.Tensor],
    local_states: Mapping[str, Mapping],
    losses: Mapping[str, float],
    q: float,
    lipschitz: float,
    keys: Iterable[str] | None = None,
    bound=None,
) -> tuple[dict, dict]:
    """The q-FFL global model of a round and the shares used.

    Args:
        global_state: w, the state dict the sites trained from.
        local_states: {site: w_k} after local training (same keys as `global_state`).
        losses: {site: F_k}, the loss of w over the site's training data, measured before training (e.g.
            `fairfl.methods.fedism.sharpness.dataset_loss` or the "loss" of `measure_sharpness`).
        q: fairness exponent (q = 0: FedAvg with equal weights).
        lipschitz: L; `lipschitz_from_lr(lr)` is the paper's code, 0 is F^q-weighted FedAvg.
        keys: the keys whose change enters ||w - w_k||^2 (default: every floating-point key).
        bound: optional {site: c_k} -> {site: c_k} applied to the sites' shares before mixing, keeping their sum
            (the controller's cap on any one site's share, `fairfl.aggregation.cap_shares`).

    Returns:
        (new state dict, {"global": 1 - sum c_k, site: c_k, ...}). Every floating-point tensor moves with the
        same shares; integer tensors (batch-norm counters) are the global model's.
    """
    shares = qffl_coefficients(global_state, local_states, losses, q, lipschitz, keys)
    if bound is not None:
        shares = bound(shares)
    sites = sorted(shares)
    stay = max(1.0 - math.fsum(shares.values()), 0.0)  # >= 0 up to rounding: each c_k <= F^q / sum F^q
    new_state = weighted_average([global_state, *(local_states[s] for s in sites)], [stay, *(shares[s] for s in sites)])
    return new_state, {"global": stay, **shares}
