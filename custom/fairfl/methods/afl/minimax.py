"""AFL's minimax step (Mohri, Sivek and Suresh, "Agnostic Federated Learning", ICML 2019; its stochastic form as
DRFA, Deng, Kamani and Mahdavi 2020, runs it) on plain numbers: the projections, the bounded loss signal and one
round's mixture and ascent step. No FLARE import.

The paper's problem is min_w max_{lambda in Lambda} sum_k lambda_k L_k(w), Lambda a convex subset of the simplex.
Each round the global model is the lambda-weighted average of the sites' models (a descent step of w for the mixed
loss), and lambda takes a projected gradient-ascent step on the sites' losses of the model they were sent:
lambda <- Proj_Lambda(lambda + gamma L). Both use the round's lambda (simultaneous descent-ascent, as the paper's
Algorithm 1 and DRFA do).

Lambda here bounds what a hostile site can gain: with p the FedAvg weights and 0 <= alpha <= 1,

    Lambda = {(1 - alpha) p + alpha mu : mu in the simplex} = {lambda : sum lambda = 1, lambda_k >= (1 - alpha) p_k},

so every site keeps at least (1 - alpha) p_k and none exceeds (1 - alpha) p_k + alpha. The server keeps mu, the free
part (the "mixture"), over every site of the federation; p is FedAvg's weights of the round's sites. A site missing
from a round keeps its share of mu; the round's sites move theirs among themselves.

An optional ceiling (`max_gain`, beta >= 0) bounds what a site can gain relative to its own FedAvg weight, not only
in absolute terms: Lambda then also requires lambda_k <= (1 + beta) p_k for every site of the round,

    Lambda_beta = {lambda : sum lambda = 1, (1 - alpha) p_k <= lambda_k <= (1 + beta) p_k},

a box-constrained simplex, never empty (the floors sum to 1 - alpha <= 1, the ceilings to 1 + beta >= 1); beta = 0
is FedAvg. Projections onto it are `project_onto_box_simplex`'s; the round's starting weights are projected onto it
too (a uniform mixture would give a small site (1 - alpha) p_k + alpha / K, above its ceiling). The cost: the
ceiling binds an honest site as much as a liar, so it also limits how far AFL can upweight a genuinely badly served
small site (without it, small sites of the benchmarks reached several times their FedAvg weight:
docs/methods/afl.md). Without a ceiling (None, the default) every result is what it was before the option existed.

The loss signal is bounded: the step ascends along min(L_k / m, cap), m the round's lower median loss, so a site
claiming a huge loss counts as one `cap` times the median, and the step's size does not depend on the loss's scale
(gamma is in units of the median loss: the paper's step gamma / m)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fairfl.aggregation import normalise, normalised
from fairfl.kinds import Real

CEILING_TOLERANCE = 1e-12  # a weight this close below its ceiling sits at it (the mixture's round trip rounds)
MAX_GAIN = Real(0.0, math.inf)  # what the minimax step accepts as beta; the job argument is narrower (arguments.py)
LOSS = Real(0.0, math.inf)  # what the step can use; the controller reads at most MAX_REPORTED (fairfl.site_checks)


def project_onto_simplex(point: Sequence[float], total: float = 1.0) -> list[float]:
    """The Euclidean projection of `point` onto {x : x >= 0, sum x = total} (total >= 0), by sorting (Held, Wolfe and
    Crowder 1974; Duchi et al., ICML 2008): x_i = max(v_i - theta, 0), theta the one threshold that leaves `total`.
    The result does not depend on the order of the coordinates: theta is computed from their sorted values."""
    values = [float(v) for v in point]
    if not values:
        raise ValueError("project_onto_simplex: no coordinates")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"project_onto_simplex: coordinates must be finite, got {values}")
    if not (math.isfinite(total) and total >= 0.0):
        raise ValueError(f"project_onto_simplex: total must be finite and >= 0, got {total}")
    if total == 0.0:
        return [0.0] * len(values)
    running, threshold = 0.0, 0.0
    for count, value in enumerate(sorted(values, reverse=True), start=1):
        running += value
        candidate = (running - total) / count
        if value > candidate:  # this coordinate is still above the threshold: it stays in the support
            threshold = candidate
    return [max(v - threshold, 0.0) for v in values]


# how far the bounds' sums may miss `total` and still count as reaching it (rounding of normalised weights)
FEASIBILITY_SLACK = 1e-9


def project_onto_box_simplex(
    point: Sequence[float], lower: Sequence[float], upper: Sequence[float], total: float = 1.0
) -> list[float]:
    """The Euclidean projection of `point` onto {x : sum x = total, lower_k <= x_k <= upper_k}, exactly.

    The optimality (KKT) conditions of this quadratic programme give x_k = clip(v_k - theta, lower_k, upper_k) for
    one threshold theta with g(theta) = sum_k clip(v_k - theta, lower_k, upper_k) = total. g is continuous,
    non-increasing and piecewise linear, with breakpoints v_k - upper_k (above it coordinate k leaves its upper
    bound) and v_k - lower_k (above it coordinate k sits at its lower bound). A binary search over the sorted
    breakpoints finds the two neighbours between which g crosses `total`; there every coordinate is either fixed at a
    bound or free (v_k - theta), so g is linear and theta = (sum of the free v_k + sum of the fixed bounds - total) /
    (number of free coordinates), solved directly: no iteration, no tolerance beyond floating-point rounding.
    O(K log K). The result does not depend on the order of the coordinates: the breakpoints are sorted and every sum
    is math.fsum's (correctly rounded, so the same for any order).

    Refuses (ValueError): no coordinates, lengths that differ, a coordinate or bound that is not finite, a lower
    bound above its upper bound, and bounds whose sums leave `total` out of [sum lower, sum upper] by more than
    FEASIBILITY_SLACK (relative to max(1, |total|)); within it, the bound the total touches is the answer."""
    values = [float(v) for v in point]
    low = [float(v) for v in lower]
    high = [float(v) for v in upper]
    if not values:
        raise ValueError("project_onto_box_simplex: no coordinates")
    if not len(low) == len(high) == len(values):
        raise ValueError(
            f"project_onto_box_simplex: {len(values)} coordinates, {len(low)} lower and {len(high)} upper bounds"
        )
    for name, numbers in (("coordinates", values), ("lower bounds", low), ("upper bounds", high)):
        if not all(math.isfinite(v) for v in numbers):
            raise ValueError(f"project_onto_box_simplex: {name} must be finite, got {numbers}")
    if not math.isfinite(total):
        raise ValueError(f"project_onto_box_simplex: total must be finite, got {total}")
    crossed = [k for k in range(len(values)) if low[k] > high[k]]
    if crossed:
        raise ValueError(f"project_onto_box_simplex: lower bound above upper bound at coordinates {crossed}")
    low_total, high_total = math.fsum(low), math.fsum(high)
    slack = FEASIBILITY_SLACK * max(1.0, abs(total))
    if not (low_total - slack <= total <= high_total + slack):
        raise ValueError(
            f"project_onto_box_simplex: no point sums to {total!r}: the lower bounds sum to {low_total!r}, the upper "
            f"bounds to {high_total!r}"
        )
    if total <= low_total:
        return low
    if total >= high_total:
        return high

    def clipped(theta: float) -> list[float]:
        return [min(max(v - theta, lo), hi) for v, lo, hi in zip(values, low, high, strict=True)]

    leave_upper = [v - hi for v, hi in zip(values, high, strict=True)]  # <= leave_lower, coordinate by coordinate
    leave_lower = [v - lo for v, lo in zip(values, low, strict=True)]
    breakpoints = sorted(set(leave_upper) | set(leave_lower))
    # the last breakpoint where g >= total (g is non-increasing): -1 if none (only by rounding, g(first) is sum upper)
    first, last = 0, len(breakpoints) - 1
    found = -1
    while first <= last:
        middle = (first + last) // 2
        if math.fsum(clipped(breakpoints[middle])) >= total:
            found, first = middle, middle + 1
        else:
            last = middle - 1
    left = breakpoints[found] if found >= 0 else -math.inf
    right = breakpoints[found + 1] if found + 1 < len(breakpoints) else math.inf
    # between two neighbouring breakpoints each coordinate stays at its upper bound, at its lower bound, or free
    fixed, free = [], []
    for k in range(len(values)):
        if leave_upper[k] >= right:
            fixed.append(high[k])
        elif leave_lower[k] <= left:
            fixed.append(low[k])
        else:
            free.append(values[k])
    if free:
        theta = math.fsum([*free, *fixed, -total]) / len(free)
        theta = min(max(theta, left), right)  # rounding aside, it is already between them
    else:  # g is flat here: only possible by rounding; the breakpoint where g reached total
        theta = left if math.isfinite(left) else right
    return clipped(theta)


def usable_max_gain(max_gain) -> bool:
    """None (no ceiling) or a finite number >= 0 (never a bool)."""
    return max_gain is None or MAX_GAIN.allows(max_gain)


def mixture_bounds(fedavg: Sequence[float], alpha: float, max_gain: float | None) -> tuple[list, list | None]:
    """(floors, ceilings) of Lambda for the normalised FedAvg weights p: floors (1 - alpha) p_k; ceilings
    (1 + max_gain) p_k, or None without a ceiling."""
    if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if not usable_max_gain(max_gain):
        raise ValueError(f"max_gain must be None or a finite number >= 0, got {max_gain!r}")
    floors = [(1.0 - alpha) * p for p in fedavg]
    return floors, None if max_gain is None else [(1.0 + max_gain) * p for p in fedavg]


def project_onto_mixtures(
    point: Sequence[float], fedavg: Sequence[float], alpha: float, max_gain: float | None = None
) -> list[float]:
    """The Euclidean projection of `point` onto Lambda = {(1 - alpha) p + alpha mu : mu in the simplex}, p = `fedavg`
    (normalised): Lambda is the simplex of total alpha moved by the floors (1 - alpha) p, so the projection is the
    floors plus the projection of point - floors onto that simplex. alpha = 0: p itself; alpha = 1: the simplex.
    With `max_gain` (beta >= 0), onto Lambda_beta = Lambda with lambda_k <= (1 + beta) p_k too: the box-constrained
    simplex of `project_onto_box_simplex`."""
    floors, ceilings = mixture_bounds(normalised(fedavg, "AFL's FedAvg weights"), alpha, max_gain)
    if len(floors) != len(point):
        raise ValueError(f"project_onto_mixtures: {len(point)} coordinates but {len(floors)} FedAvg weights")
    if ceilings is not None:
        return project_onto_box_simplex(point, floors, ceilings)
    free = project_onto_simplex([float(v) - f for v, f in zip(point, floors, strict=True)], total=alpha)
    return [f + x for f, x in zip(floors, free, strict=True)]


def lower_median(values: Sequence[float]) -> float:
    """The lower median: with two sites, the smaller value, so one site alone never sets it."""
    return sorted(values)[(len(values) - 1) // 2]


def bounded_losses(losses: Mapping[str, float], loss_cap: float) -> dict:
    """{site: min(L_k / m, loss_cap)}, m the lower median of the round's losses: the signal lambda ascends along.
    All 0 when m is 0 (no scale to bound the others by: lambda stays). Losses must be finite and >= 0."""
    bad = {s: LOSS.problem(v) for s, v in losses.items() if not LOSS.allows(v)}
    if bad:
        raise ValueError(f"AFL: unusable losses: {bad}")
    if not (math.isfinite(loss_cap) and loss_cap >= 1.0):
        raise ValueError(f"AFL: loss_cap must be finite and >= 1, got {loss_cap}")
    median = lower_median([float(v) for v in losses.values()]) if losses else 0.0
    if median <= 0.0:
        return {s: 0.0 for s in losses}
    return {s: min(float(v) / median, loss_cap) for s, v in losses.items()}


@dataclass(frozen=True)
class MinimaxRound:
    """One round of AFL: the weights its global model is averaged with, the mixture carried to the next round, the
    signal lambda ascended along, the sites whose loss was above the cap and those whose weight sat at its ceiling."""

    weights: dict  # {site: lambda_k} over the round's sites, summing to 1: the round's average
    mixture: dict  # {site: mu_k} over every site of the federation after the ascent step, summing to 1
    signal: dict  # {site: min(L_k / median, cap)}
    capped: list  # the sites whose loss counted as `cap` medians (it was at least that)
    at_ceiling: list = field(default_factory=list)  # with max_gain: the sites whose lambda_k is (1 + beta) p_k


def minimax_round(
    mixture: Mapping[str, float],
    fedavg: Mapping[str, float],
    losses: Mapping[str, float],
    alpha: float,
    step: float,
    loss_cap: float,
    max_gain: float | None = None,
) -> MinimaxRound:
    """One AFL round over the sites of `losses` (the round's sites; every result is the same whatever their order).

    Args:
        mixture: {site: mu_k}, the free part of lambda over the federation (a site it lacks holds none of it).
        fedavg: {site: p_k}, FedAvg's weights of the round's sites (normalised here).
        losses: {site: L_k}, the loss of the model each site was sent, measured before training.
        alpha: how far lambda may leave p (Lambda above).
        step: gamma, in units of the round's median loss.
        loss_cap: the most medians a loss counts for.
        max_gain: None, or beta >= 0: no site's lambda_k above (1 + beta) p_k (Lambda_beta above).

    The round's lambda is (1 - alpha) p + alpha mu_S / m_S, mu_S the round's sites' part of the mixture and m_S its
    total (p where m_S is 0: the sites missing hold it all). The step is lambda' = Proj_Lambda(lambda + step s), s the
    bounded losses; the round's sites' mixture becomes m_S (lambda' - (1 - alpha) p) / alpha, so the sites missing
    keep theirs. alpha = 0 leaves the mixture as it was.

    With `max_gain`, Lambda is Lambda_beta: the round's lambda is (1 - alpha) p + alpha mu_S / m_S projected onto it
    (itself when it is inside), the step projects onto it, and the mixture is recovered from lambda' as without it,
    so the next round starts from lambda' when the same sites answer. Without (None) every result is bit for bit
    what it was before the option existed."""
    sites = sorted(losses)
    if not sites:
        raise ValueError("AFL: no sites")
    if set(fedavg) != set(sites):
        raise ValueError(f"AFL: FedAvg weights for {sorted(fedavg)} but losses for {sites}")
    if not (math.isfinite(alpha) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"AFL: alpha must be in [0, 1], got {alpha}")
    if not usable_max_gain(max_gain):
        raise ValueError(f"AFL: max_gain must be None or a finite number >= 0, got {max_gain!r}")
    if not (math.isfinite(step) and step >= 0.0):
        raise ValueError(f"AFL: step must be finite and >= 0, got {step}")
    mixture = {s: float(v) for s, v in mixture.items()}
    if any(not (math.isfinite(v) and v >= 0.0) for v in mixture.values()):
        raise ValueError(f"AFL: the mixture must be finite and >= 0, got {mixture}")
    p = normalised([fedavg[s] for s in sites], "AFL's FedAvg weights")
    held = [mixture.get(s, 0.0) for s in sites]
    mass = math.fsum(held)
    free = [v / mass for v in held] if mass > 0.0 else p
    weights = [(1.0 - alpha) * pk + alpha * mu for pk, mu in zip(p, free, strict=True)]
    floors, ceilings = mixture_bounds(p, alpha, max_gain)
    if ceilings is not None:  # the round's own weights respect the ceiling too
        weights = project_onto_box_simplex(weights, floors, ceilings)
    signal = bounded_losses({s: losses[s] for s in sites}, loss_cap)
    capped = [s for s in sites if signal[s] == loss_cap]
    if alpha > 0.0 and mass > 0.0:
        stepped = project_onto_mixtures(
            [w + step * signal[s] for w, s in zip(weights, sites, strict=True)], p, alpha, max_gain
        )
        # back from lambda' to the free part (>= 0 up to rounding), rescaled to the round's sites' share of mu
        moved = normalised(
            [max(w - (1.0 - alpha) * pk, 0.0) for w, pk in zip(stepped, p, strict=True)], "AFL's mixture"
        )
        mixture.update({s: mass * mu for s, mu in zip(sites, moved, strict=True)})
    return MinimaxRound(
        weights=dict(zip(sites, weights, strict=True)),
        mixture=normalise(dict(sorted(mixture.items()))),  # summed in site order: the same for any order given
        signal=signal,
        capped=capped,
        at_ceiling=[]
        if ceilings is None
        else [s for s, w, c in zip(sites, weights, ceilings, strict=True) if w >= c - CEILING_TOLERANCE],
    )


def uniform_mixture(sites: Sequence[str]) -> dict:
    """The mixture AFL starts from: every site of the federation alike (DRFA's start)."""
    return {s: 1.0 / len(sites) for s in sorted(sites)}
