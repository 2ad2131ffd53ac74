"""AFL's optional ceiling (`max_gain`, beta: lambda_k <= (1 + beta) p_k) on plain numbers: the exact projection onto a
box-constrained simplex against its optimality (KKT) conditions, against random points of the set and against a
general QP solver (scipy's SLSQP), invariance to the order of the coordinates, bounds that leave no point refused;
then the round with a ceiling: a liar held at (1 + beta) p_k every round, the starting weights inside the ceiling,
the mixture consistent with lambda, and no ceiling giving exactly the numbers AFL gave before the option existed."""

import itertools
import math
import random

import numpy as np
import pytest
from scipy.optimize import minimize

from fairfl.aggregation import cap_shares, normalised
from fairfl.methods.afl.minimax import (
    minimax_round,
    project_onto_box_simplex,
    project_onto_mixtures,
    project_onto_simplex,
    uniform_mixture,
)

import helpers


def random_box(generator, size):
    """(lower, upper, total) with total inside [sum lower, sum upper]; some coordinates pinned (lower = upper)."""
    lower = [generator.uniform(-1.0, 1.0) for _ in range(size)]
    upper = [lo + (0.0 if generator.random() < 0.15 else generator.uniform(0.0, 2.0)) for lo in lower]
    total = generator.uniform(math.fsum(lower), math.fsum(upper))
    return lower, upper, total


def check_box_kkt(point, projected, lower, upper, total):
    """x is the projection of v onto {sum x = total, lower <= x <= upper} iff one theta has x_k = v_k - theta where
    lower_k < x_k < upper_k, v_k - theta <= lower_k where x_k = lower_k, v_k - theta >= upper_k where x_k = upper_k
    (the optimality conditions of the QP; a pinned coordinate lower_k = upper_k can take any theta)."""
    assert math.fsum(projected) == pytest.approx(total, abs=1e-9)
    assert all(lo <= x <= hi for x, lo, hi in zip(projected, lower, upper, strict=True))  # exactly: clipped
    moving = [(v, x, lo, hi) for v, x, lo, hi in zip(point, projected, lower, upper, strict=True) if lo < hi]
    free = [v - x for v, x, lo, hi in moving if lo + 1e-9 < x < hi - 1e-9]
    if free:
        theta = free[0]
        assert all(t == pytest.approx(theta, abs=1e-9) for t in free)
    else:  # every coordinate at a bound: any theta between the active sides' breakpoints
        at_lower = [v - lo for v, x, lo, hi in moving if x <= lo + 1e-9]
        at_upper = [v - hi for v, x, lo, hi in moving if x >= hi - 1e-9]
        theta = max(at_upper, default=-math.inf)
        assert theta <= min(at_lower, default=math.inf) + 1e-9
        if not math.isfinite(theta):
            theta = min(at_lower, default=0.0)
    for v, x, lo, hi in moving:
        if x <= lo + 1e-9:
            assert v - theta <= lo + 1e-9
        elif x >= hi - 1e-9:
            assert v - theta >= hi - 1e-9


@pytest.mark.parametrize("size", [1, 2, 3, 6, 11])
def test_the_box_projection_meets_kkt_and_no_point_of_the_box_is_nearer(size):
    """The variational inequality (v - x) . (y - x) <= 0 for every y of the set characterises the projection x: it is
    checked on random points of the box (made feasible by the projection itself, their feasibility checked)."""
    generator = random.Random(100 + size)
    for _ in range(150):
        lower, upper, total = random_box(generator, size)
        point = [generator.uniform(-4.0, 4.0) for _ in range(size)]
        projected = project_onto_box_simplex(point, lower, upper, total)
        check_box_kkt(point, projected, lower, upper, total)
        for _ in range(10):
            other = project_onto_box_simplex([generator.uniform(-4.0, 4.0) for _ in range(size)], lower, upper, total)
            assert math.fsum(other) == pytest.approx(total, abs=1e-9)
            assert all(lo <= y <= hi for y, lo, hi in zip(other, lower, upper, strict=True))
            inner = math.fsum((v - x) * (y - x) for v, x, y in zip(point, projected, other, strict=True))
            assert inner <= 1e-9


def test_the_box_projection_agrees_with_a_general_qp_solver():
    """scipy's SLSQP on min 1/2 |x - v|^2 s.t. sum x = total, lower <= x <= upper: the same point to solver tolerance,
    and never a smaller objective than the exact one's beyond it."""
    generator = random.Random(5)
    worst = 0.0
    for _ in range(120):
        size = generator.choice([2, 3, 5, 8])
        lower, upper, total = random_box(generator, size)
        point = np.array([generator.uniform(-3.0, 3.0) for _ in range(size)])
        exact = np.array(project_onto_box_simplex(list(point), lower, upper, total))
        solved = minimize(
            lambda x, v=point: 0.5 * float(np.sum((x - v) ** 2)),
            x0=np.clip(np.full(size, total / size), lower, upper),
            jac=lambda x, v=point: x - v,
            bounds=list(zip(lower, upper, strict=True)),
            constraints=[
                {"type": "eq", "fun": lambda x, t=total: float(np.sum(x)) - t, "jac": lambda x: np.ones(len(x))}
            ],
            method="SLSQP",
            options={"ftol": 1e-12, "maxiter": 1000},
        )
        assert solved.success, solved.message
        worst = max(worst, float(np.max(np.abs(solved.x - exact))))
        assert np.sum((exact - point) ** 2) <= np.sum((solved.x - point) ** 2) + 1e-10
    assert worst < 1e-7


def test_the_box_projection_on_hand_computed_points():
    # no upper bound binding, lower bounds 0: the simplex projection
    point = [0.5, 0.4, -3.0, 0.2]
    assert project_onto_box_simplex(point, [0.0] * 4, [1.0] * 4) == pytest.approx(project_onto_simplex(point))
    # one coordinate over its ceiling: cut to it, the rest shares what is left as the simplex would (theta = -0.05)
    assert project_onto_box_simplex([0.9, 0.05, 0.05], [0.0] * 3, [0.5, 1.0, 1.0]) == pytest.approx([0.5, 0.25, 0.25])
    # a point already inside is itself; a pinned coordinate keeps its value whatever the point
    assert project_onto_box_simplex([0.2, 0.3, 0.5], [0.1] * 3, [0.6] * 3) == pytest.approx([0.2, 0.3, 0.5])
    assert project_onto_box_simplex([9.0, 0.0, 0.0], [0.0, 0.3, 0.0], [1.0, 0.3, 1.0])[1] == 0.3
    # the total at a side's sum: that side itself (exactly), whatever the point
    assert project_onto_box_simplex([5.0, -5.0], [0.2, 0.8], [0.5, 0.9]) == [0.2, 0.8]
    assert project_onto_box_simplex([5.0, -5.0], [0.0, 0.0], [0.25, 0.75]) == [0.25, 0.75]
    # adding the same number to every coordinate changes nothing
    lower, upper = [0.1, 0.0, 0.2], [0.4, 0.5, 0.6]
    assert project_onto_box_simplex([0.1, 0.7, 0.3], lower, upper) == pytest.approx(
        project_onto_box_simplex([100.1, 100.7, 100.3], lower, upper)
    )


def test_the_order_of_the_coordinates_changes_nothing():
    generator = random.Random(11)
    for _ in range(30):
        lower, upper, total = random_box(generator, 5)
        point = [generator.uniform(-3.0, 3.0) for _ in range(5)]
        point[3] = point[1]  # ties among the breakpoints
        first = project_onto_box_simplex(point, lower, upper, total)
        for order in itertools.permutations(range(5)):
            again = project_onto_box_simplex(
                [point[i] for i in order], [lower[i] for i in order], [upper[i] for i in order], total
            )
            assert again == [first[i] for i in order]  # exactly


INFEASIBLE = {
    "no coordinates": ([], [], [], "no coordinates"),
    "lengths differ": ([0.5, 0.5], [0.0], [1.0, 1.0], "lower and"),
    "a lower bound above its upper": ([0.5, 0.5], [0.0, 0.6], [1.0, 0.5], "lower bound above upper bound"),
    "lower bounds summing above the total": ([0.5, 0.5], [0.6, 0.6], [1.0, 1.0], "no point sums to"),
    "upper bounds summing below the total": ([0.5, 0.5], [0.0, 0.0], [0.4, 0.4], "no point sums to"),
    "a NaN coordinate": ([math.nan, 0.5], [0.0, 0.0], [1.0, 1.0], "coordinates must be finite"),
    "an infinite coordinate": ([math.inf, 0.5], [0.0, 0.0], [1.0, 1.0], "coordinates must be finite"),
    "an infinite upper bound": ([0.5, 0.5], [0.0, 0.0], [math.inf, 1.0], "upper bounds must be finite"),
    "a NaN lower bound": ([0.5, 0.5], [math.nan, 0.0], [1.0, 1.0], "lower bounds must be finite"),
}


@pytest.mark.parametrize("label", INFEASIBLE)
def test_a_box_with_no_point_or_unusable_numbers_is_refused_saying_why(label):
    point, lower, upper, message = INFEASIBLE[label]
    with pytest.raises(ValueError, match=message):
        project_onto_box_simplex(point, lower, upper)
    with pytest.raises(ValueError, match="total must be finite"):
        project_onto_box_simplex([0.5], [0.0], [1.0], total=math.nan)


@pytest.mark.parametrize("alpha, beta", [(0.5, 1.0), (0.2, 0.5), (1.0, 2.0), (0.5, 0.0), (0.0, 1.0)])
def test_the_mixture_projection_with_a_ceiling_is_the_nearest_point_of_the_smaller_set(alpha, beta):
    generator = random.Random(int(10 * alpha + 100 * beta))
    for size in (1, 2, 4, 6):
        for _ in range(60):
            draws = [generator.expovariate(1.0) for _ in range(size)]
            fedavg = [d / sum(draws) for d in draws]
            point = [generator.uniform(-2.0, 2.0) for _ in range(size)]
            projected = project_onto_mixtures(point, fedavg, alpha, max_gain=beta)
            p = normalised(fedavg, "p")  # as the projection normalises them
            floors, ceilings = [(1 - alpha) * pk for pk in p], [(1 + beta) * pk for pk in p]
            assert all(f <= x <= c for x, f, c in zip(projected, floors, ceilings, strict=True))
            if alpha == 0.0 or beta == 0.0:  # Lambda_beta is FedAvg's weights alone
                assert projected == pytest.approx(fedavg)
                continue
            check_box_kkt(point, projected, floors, ceilings, 1.0)
    # a ceiling no site reaches: the projection without one
    point, fedavg = [0.3, -0.2, 0.9], [0.2, 0.3, 0.5]
    assert project_onto_mixtures(point, fedavg, 0.5, max_gain=1000.0) == pytest.approx(
        project_onto_mixtures(point, fedavg, 0.5)
    )


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf, -math.inf, "1", True, [1.0]])
def test_an_unusable_ceiling_is_refused(bad):
    mixture, fedavg, losses = uniform_mixture(["a", "b"]), {"a": 0.5, "b": 0.5}, {"a": 0.1, "b": 0.2}
    with pytest.raises(ValueError, match="max_gain"):
        minimax_round(mixture, fedavg, losses, 0.5, 0.05, 3.0, max_gain=bad)
    with pytest.raises(ValueError, match="max_gain"):
        project_onto_mixtures([0.5, 0.5], [0.5, 0.5], 0.5, max_gain=bad)


def test_with_a_ceiling_the_bound_holds_a_liar_at_its_ceiling_every_round():
    """The sibling of test_minimax.py's test_the_bound_limits_a_liar_but_does_not_neutralise_it: the same six equal
    sites and defaults, site-6 claiming a huge loss every round. Without a ceiling it reaches max_share's 0.5; with
    beta = 1 it never holds more than (1 + 1) / 6 of the global model (max_share then changes nothing: every site is
    below it), reaches exactly that and stays there, and every honest site keeps at least half its FedAvg weight."""
    sites = [f"site-{k}" for k in range(1, 7)]
    fedavg, losses = {s: 1 / 6 for s in sites}, {s: 0.5 for s in sites} | {"site-6": 1e6}
    free, ceiled = uniform_mixture(sites), uniform_mixture(sites)
    free_shares, ceiled_shares = [], []
    for _ in range(200):
        unbounded = minimax_round(free, fedavg, losses, 0.5, 0.05, 3.0)
        bounded = minimax_round(ceiled, fedavg, losses, 0.5, 0.05, 3.0, max_gain=1.0)
        free, ceiled = unbounded.mixture, bounded.mixture
        free_shares.append(cap_shares(unbounded.weights, 0.5)["site-6"])
        shares = cap_shares(bounded.weights, 0.5)
        assert shares == bounded.weights  # no site above max_share: it is lambda itself
        assert shares["site-6"] <= 2 / 6 + 1e-15 and max(shares.values()) <= 2 / 6 + 1e-15
        assert all(shares[s] >= 0.5 / 6 - 1e-15 for s in sites) and math.fsum(shares.values()) == pytest.approx(1.0)
        assert bounded.capped == ["site-6"] and bounded.at_ceiling in ([], ["site-6"])
        ceiled_shares.append(shares["site-6"])
    assert max(free_shares) == pytest.approx(0.5)  # the test beside this one's finding, unchanged
    assert ceiled_shares[2:] == [pytest.approx(2 / 6)] * 198 and ceiled_shares == sorted(ceiled_shares)
    assert bounded.at_ceiling == ["site-6"]
    # the mixture is the one lambda implies: mu_6 = (2/6 - 0.5/6) / 0.5 = 1/2, the rest alike
    assert ceiled["site-6"] == pytest.approx(0.5) and ceiled["site-1"] == pytest.approx(0.1)


def test_a_liar_never_passes_its_ceiling_whatever_the_weights_the_sites_and_the_rounds():
    """Random federations, FedAvg weights, ceilings and attendance; one liar claiming the largest loss every round
    and one claiming a tiny one: in every round every site's lambda is within [(1 - alpha) p_k, (1 + beta) p_k] and
    the mixture sums to 1."""
    generator = random.Random(3)
    for _ in range(20):
        size = generator.randint(2, 8)
        sites = [f"site-{k}" for k in range(1, size + 1)]
        samples = {s: generator.randint(1, 100) for s in sites}
        alpha, beta, step = (
            generator.uniform(0.1, 1.0),
            generator.choice([0.0, 0.25, 1.0, 3.0]),
            generator.uniform(0.01, 1),
        )
        mixture = uniform_mixture(sites)
        for _ in range(40):
            present = [s for s in sites if generator.random() < 0.8] or sites[:1]
            total = sum(samples[s] for s in present)
            fedavg = {s: samples[s] / total for s in present}
            losses = {s: generator.uniform(0.1, 1.0) for s in present} | (
                {sites[0]: 1e6} if sites[0] in present else {}
            )
            if len(present) > 2:
                losses[present[-1]] = 1e-9
            result = minimax_round(mixture, fedavg, losses, alpha, step, 3.0, max_gain=beta)
            mixture = result.mixture
            for s in present:
                assert (1 - alpha) * fedavg[s] - 1e-12 <= result.weights[s] <= (1 + beta) * fedavg[s] + 1e-12
            assert math.fsum(result.weights.values()) == pytest.approx(1.0, abs=1e-12)
            assert math.fsum(mixture.values()) == pytest.approx(1.0, abs=1e-12) and min(mixture.values()) >= 0.0


def test_the_starting_weights_respect_the_ceiling_and_the_mixture_follows_lambda():
    """Round 0's mixture is uniform: a small site would start at (1 - alpha) p + alpha / K, above its ceiling; it is
    projected onto the smaller set. The mixture recovered from the step's lambda' gives lambda' back next round."""
    fedavg = {"big": 0.9, "small": 0.1}
    losses = {"big": 0.5, "small": 0.5}  # equal losses: the step moves nothing
    start = minimax_round(uniform_mixture(list(fedavg)), fedavg, losses, 0.5, 0.05, 3.0)
    assert start.weights["small"] == pytest.approx(0.3)  # without a ceiling: 3 times its FedAvg weight
    ceiled = minimax_round(uniform_mixture(list(fedavg)), fedavg, losses, 0.5, 0.05, 3.0, max_gain=1.0)
    assert ceiled.weights == pytest.approx({"big": 0.8, "small": 0.2}) and ceiled.at_ceiling == ["small"]
    again = minimax_round(ceiled.mixture, fedavg, losses, 0.5, 0.0, 3.0, max_gain=1.0)
    assert again.weights == pytest.approx(ceiled.weights, abs=1e-15) and again.at_ceiling == ["small"]
    # beta = 0: FedAvg's weights, whatever anyone claims
    fedavg_only = minimax_round(uniform_mixture(list(fedavg)), fedavg, {"big": 0.5, "small": 1e6}, 0.5, 1.0, 3.0, 0.0)
    assert fedavg_only.weights == pytest.approx(fedavg) and set(fedavg_only.at_ceiling) == {"big", "small"}


def test_a_site_missing_from_a_round_keeps_its_share_with_a_ceiling_too():
    mixture = {"site-1": 0.1, "site-2": 0.2, "site-3": 0.3, "site-4": 0.4}
    fedavg = {"site-1": 0.5, "site-2": 0.25, "site-4": 0.25}
    result = minimax_round(mixture, fedavg, {"site-1": 1.0, "site-2": 1.0, "site-4": 2.0}, 0.5, 0.1, 3.0, max_gain=0.5)
    assert result.mixture["site-3"] == pytest.approx(0.3) and math.fsum(result.mixture.values()) == pytest.approx(1.0)
    assert result.weights["site-4"] <= 1.5 * 0.25 + 1e-15


def test_the_order_of_the_sites_changes_nothing_with_a_ceiling():
    generator = random.Random(17)
    sites = ["site-1", "site-2", "site-3", "site-4", "site-5"]
    draws = [generator.expovariate(1.0) for _ in sites]
    mixture = {s: d / sum(draws) for s, d in zip(sites, draws, strict=True)}
    fedavg = {"site-1": 0.4, "site-2": 0.3, "site-3": 0.2, "site-4": 0.1}
    losses = {"site-1": 0.2, "site-2": 0.5, "site-3": 1e6, "site-4": 0.9}
    first = minimax_round(mixture, fedavg, losses, 0.5, 0.3, 2.0, max_gain=0.5)
    assert first.at_ceiling and first.capped
    for result in helpers.minimax_in_every_order(mixture, fedavg, losses, 0.5, 0.3, 2.0, max_gain=0.5):
        assert result == first  # exactly


def test_without_a_ceiling_every_number_is_the_one_afl_gave_before_the_option():
    """Twelve rounds (site-2 missing every fourth), whose last round's numbers were written down from the code before
    `max_gain` existed: the default and max_gain=None give them bit for bit, and record no site at a ceiling."""
    sites = ["site-1", "site-2", "site-3", "site-4", "site-5"]
    samples = {"site-1": 0.35, "site-2": 0.3, "site-3": 0.2, "site-4": 0.1, "site-5": 0.05}
    for extra in ({}, {"max_gain": None}):
        mixture = uniform_mixture(sites)
        for r in range(12):
            present = [s for s in sites if not (s == "site-2" and r % 4 == 3)]
            losses = {s: (0.2 + 0.13 * k) * (1 + 0.05 * ((r * (k + 1)) % 3)) for k, s in enumerate(present)}
            result = minimax_round(mixture, {s: samples[s] for s in present}, losses, 0.4, 0.03, 3.0, **extra)
            mixture = result.mixture
            assert result.at_ceiling == []
        assert result.weights == {
            "site-1": 0.3,
            "site-3": 0.19613254053391896,
            "site-4": 0.22190462255875254,
            "site-5": 0.2819628369073286,
        }
        assert result.mixture == {
            "site-1": 0.0,
            "site-2": 0.0,
            "site-3": 0.0317454927489387,
            "site-4": 0.33502851166383646,
            "site-5": 0.6332259955872248,
        }
        assert result.signal == {
            "site-1": 0.634920634920635,
            "site-3": 1.0,
            "site-4": 1.3275613275613276,
            "site-5": 1.8730158730158732,
        }
