"""AFL's minimax step (fairfl.methods.afl.minimax) on plain numbers: the projections against their optimality (KKT)
conditions and against random points of the set, the round against a hand computation, the toy minimax problem it
solves, invariance to the order of the sites, and what hostile or broken numbers can and cannot do."""

import math
import random

import pytest

from fairfl.methods.afl.minimax import (
    bounded_losses,
    minimax_round,
    project_onto_mixtures,
    project_onto_simplex,
    uniform_mixture,
)

import helpers

TOLERANCE = 1e-12


def random_point(generator, size):
    return [generator.uniform(-3.0, 3.0) for _ in range(size)]


def random_simplex_point(generator, size, total=1.0):
    draws = [generator.expovariate(1.0) for _ in range(size)]
    return [total * d / sum(draws) for d in draws]


def check_kkt(point, projected, floors, total):
    """x is the projection of v onto {x >= floors, sum x = total} iff one theta has x_i = v_i - theta where
    x_i > floor_i and v_i - theta <= floor_i where x_i = floor_i (the optimality conditions of the QP)."""
    assert math.fsum(projected) == pytest.approx(total, abs=1e-9)
    assert all(x >= f - TOLERANCE for x, f in zip(projected, floors, strict=True))
    free = [v - x for v, x, f in zip(point, projected, floors, strict=True) if x > f + 1e-9]
    assert free, "the projection has no free coordinate"
    theta = free[0]
    assert all(t == pytest.approx(theta, abs=1e-9) for t in free)
    assert all(v - theta <= f + 1e-9 for v, x, f in zip(point, projected, floors, strict=True) if x <= f + 1e-9)


def distance(a, b):
    return math.sqrt(math.fsum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_the_simplex_projection_meets_kkt_and_is_nearer_than_any_other_point_of_the_simplex(size):
    generator = random.Random(size)
    for _ in range(200):
        point = random_point(generator, size)
        total = generator.choice([1.0, 0.3, 5.0])
        projected = project_onto_simplex(point, total)
        check_kkt(point, projected, [0.0] * size, total)
        nearest = distance(point, projected)
        for _ in range(20):  # no point of the simplex is nearer (a brute-force check, no QP solver)
            assert distance(point, random_simplex_point(generator, size, total)) >= nearest - 1e-12


def test_the_simplex_projection_on_hand_computed_points():
    assert project_onto_simplex([0.2, 0.3, 0.5]) == pytest.approx([0.2, 0.3, 0.5])  # inside: itself
    assert project_onto_simplex([1.0, 1.0]) == pytest.approx([0.5, 0.5])
    assert project_onto_simplex([2.0, 0.0, -1.0]) == [1.0, 0.0, 0.0]
    assert project_onto_simplex([0.5, 0.4, -3.0]) == pytest.approx([0.55, 0.45, 0.0])  # theta = -0.05
    assert project_onto_simplex([7.0]) == [1.0] and project_onto_simplex([1.0, 2.0], total=0.0) == [0.0, 0.0]
    # adding the same number to every coordinate changes nothing: only the losses' differences move lambda
    assert project_onto_simplex([0.1, 0.7, 0.3]) == pytest.approx(project_onto_simplex([100.1, 100.7, 100.3]))
    for bad in ([], [float("nan"), 1.0], [math.inf, 0.0]):
        with pytest.raises(ValueError, match="project_onto_simplex"):
            project_onto_simplex(bad)
    with pytest.raises(ValueError, match="total"):
        project_onto_simplex([1.0], total=-1.0)


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 1.0])
def test_the_mixture_projection_keeps_every_site_its_floor_and_is_the_nearest_mixture(alpha):
    generator = random.Random(int(alpha * 10))
    for size in (1, 2, 4, 6):
        for _ in range(100):
            fedavg, point = random_simplex_point(generator, size), random_point(generator, size)
            projected = project_onto_mixtures(point, fedavg, alpha)
            floors = [(1 - alpha) * p for p in fedavg]
            assert all(
                x <= f + alpha + 1e-12 for x, f in zip(projected, floors, strict=True)
            )  # no site above p_k (1-a) + a
            if alpha == 0.0:
                assert projected == pytest.approx(fedavg)  # Lambda is FedAvg's weights alone
                continue
            check_kkt(point, projected, floors, 1.0)
            nearest = distance(point, projected)
            for _ in range(10):  # (1 - alpha) p + alpha mu, mu anywhere in the simplex: never nearer
                mu = random_simplex_point(generator, size)
                assert distance(point, [f + alpha * m for f, m in zip(floors, mu, strict=True)]) >= nearest - 1e-12
    point = [0.3, -0.2, 0.9]
    assert project_onto_mixtures(point, [0.2, 0.3, 0.5], 1.0) == pytest.approx(project_onto_simplex(point))
    with pytest.raises(ValueError, match="alpha"):
        project_onto_mixtures(point, [0.2, 0.3, 0.5], 1.5)


def test_one_round_agrees_with_a_hand_computation():
    """lambda = 0.5 p + 0.5 / 3; signal = min(L / median, 3) = (0.5, 1, 3); lambda + 0.05 signal projected onto
    Lambda (floors 0.5 p, free part of total 0.5): theta = 0.075 leaves every free coordinate positive."""
    fedavg, losses = {"a": 0.5, "b": 0.3, "c": 0.2}, {"a": 0.2, "b": 0.4, "c": 5.0}
    result = minimax_round(uniform_mixture(["a", "b", "c"]), fedavg, losses, alpha=0.5, step=0.05, loss_cap=3.0)
    assert result.weights == pytest.approx({"a": 0.25 + 1 / 6, "b": 0.15 + 1 / 6, "c": 0.1 + 1 / 6})
    assert result.signal == pytest.approx({"a": 0.5, "b": 1.0, "c": 3.0}) and result.capped == ["c"]
    stepped = {"a": 0.25 + 1 / 6 + 0.025, "b": 0.15 + 1 / 6 + 0.05, "c": 0.1 + 1 / 6 + 0.15}
    free = {s: stepped[s] - 0.5 * fedavg[s] - 0.075 for s in fedavg}  # sums to 0.5
    assert result.mixture == pytest.approx({s: v / 0.5 for s, v in free.items()})
    # the paper's step, literally: the next round's lambda is Proj_Lambda(lambda + gamma signal)
    again = minimax_round(result.mixture, fedavg, losses, alpha=0.5, step=0.0, loss_cap=3.0)
    expected = project_onto_mixtures([stepped[s] for s in "abc"], [fedavg[s] for s in "abc"], 0.5)
    assert [again.weights[s] for s in "abc"] == pytest.approx(expected)


@pytest.mark.parametrize("alpha, minimax_w", [(1.0, 2.0), (0.5, 2.0), (0.2, 1.12), (0.0, 0.4)])
def test_on_two_quadratic_sites_afl_finds_the_constrained_minimax_model(alpha, minimax_w):
    """L_k(w) = (w - c_k)^2, c = (0, 4), FedAvg weights (0.9, 0.1): FedAvg's model is 0.4 (site b's loss 12.96).
    The agnostic model equalises the losses at w = 2 when Lambda lets lambda_b reach 0.5; with alpha = 0.2 lambda_b
    is at most 0.1 * 0.8 + 0.2 = 0.28 and the minimax model is 0.28 * 4 = 1.12. Each round every site takes one
    gradient step from the global model and the server averages them with lambda (AFL's descent), then steps lambda."""
    centres, fedavg = {"a": 0.0, "b": 4.0}, {"a": 0.9, "b": 0.1}
    w, mixture = 0.0, uniform_mixture(list(centres))
    for _ in range(400):
        losses = {s: (w - c) ** 2 for s, c in centres.items()}
        result = minimax_round(mixture, fedavg, losses, alpha, step=0.05, loss_cap=3.0)
        mixture = result.mixture
        w = math.fsum(result.weights[s] * (w - 0.25 * 2 * (w - c)) for s, c in centres.items())
    assert w == pytest.approx(minimax_w, abs=1e-3)
    assert result.weights["b"] <= 0.1 * (1 - alpha) + alpha + 1e-12 and result.weights["a"] >= 0.9 * (1 - alpha)


def test_the_order_of_the_sites_changes_nothing():
    generator = random.Random(7)
    sites = ["site-1", "site-2", "site-3", "site-4", "site-5"]
    mixture = dict(zip(sites, random_simplex_point(generator, 5), strict=True))
    fedavg = dict(zip(sites[:4], random_simplex_point(generator, 4), strict=True))  # site-5 missing from the round
    losses = {s: generator.uniform(0.1, 2.0) for s in sites[:4]}
    first = minimax_round(mixture, fedavg, losses, 0.5, 0.3, 1.5)
    assert first.capped  # the cap and the floors both bind somewhere
    for result in helpers.minimax_in_every_order(mixture, fedavg, losses, 0.5, 0.3, 1.5):
        assert result == first  # exactly: every sum runs in site order
        assert list(result.mixture) == sorted(sites) and list(result.weights) == sorted(sites[:4])


def test_a_site_missing_from_the_round_keeps_its_share_of_the_mixture():
    mixture = {"site-1": 0.1, "site-2": 0.2, "site-3": 0.3, "site-4": 0.4}
    fedavg = {"site-1": 0.5, "site-2": 0.25, "site-4": 0.25}
    result = minimax_round(mixture, fedavg, {"site-1": 1.0, "site-2": 1.0, "site-4": 2.0}, 0.5, 0.1, 3.0)
    assert result.mixture["site-3"] == pytest.approx(0.3)  # absent: its share waits for it
    assert sum(result.mixture.values()) == pytest.approx(1.0)
    assert result.mixture["site-4"] > 0.4 and set(result.weights) == set(fedavg)
    # the round's lambda: mu renormalised over the round's sites
    assert result.weights["site-1"] == pytest.approx(0.5 * 0.5 + 0.5 * 0.1 / 0.7)
    # all of the mixture held by the missing site: the round is FedAvg's and the mixture waits
    idle = minimax_round(
        {"site-1": 0.0, "site-2": 0.0, "site-3": 1.0},
        {"site-1": 0.6, "site-2": 0.4},
        {"site-1": 1.0, "site-2": 9.0},
        0.5,
        0.1,
        3.0,
    )
    assert idle.weights == pytest.approx({"site-1": 0.6, "site-2": 0.4})
    assert idle.mixture == {"site-1": 0.0, "site-2": 0.0, "site-3": 1.0}
    # a site the mixture has never seen holds none of it, and can gain some
    new = minimax_round({"site-1": 1.0}, {"site-1": 0.5, "site-9": 0.5}, {"site-1": 1.0, "site-9": 2.0}, 0.5, 0.1, 3.0)
    assert new.weights["site-9"] == pytest.approx(0.25) and new.mixture["site-9"] > 0


def test_alpha_zero_is_fedavg_and_step_zero_never_moves_lambda():
    mixture, fedavg = uniform_mixture(["a", "b", "c"]), {"a": 0.6, "b": 0.3, "c": 0.1}
    losses = {"a": 0.1, "b": 0.5, "c": 0.9}
    fedavg_round = minimax_round(mixture, fedavg, losses, alpha=0.0, step=1.0, loss_cap=3.0)
    assert fedavg_round.weights == pytest.approx(fedavg) and fedavg_round.mixture == pytest.approx(mixture)
    still = minimax_round(mixture, fedavg, losses, alpha=0.5, step=0.0, loss_cap=3.0)
    assert still.mixture == pytest.approx(mixture)


def test_the_loss_signal_is_bounded_relative_to_the_lower_median():
    assert bounded_losses({"a": 0.2, "b": 0.4, "c": 0.8, "d": 100.0}, 3.0) == pytest.approx(
        {"a": 0.5, "b": 1.0, "c": 2.0, "d": 3.0}
    )
    # two sites: the lower median is the honest one's, so the other alone cannot set the scale
    assert bounded_losses({"honest": 0.5, "liar": 1e300}, 3.0) == {"honest": 1.0, "liar": 3.0}
    assert bounded_losses({"a": 0.0, "b": 0.0, "c": 5.0}, 3.0) == {"a": 0.0, "b": 0.0, "c": 0.0}  # median 0
    # the step does not depend on the loss's unit: Dice loss or cross-entropy, the same lambda
    assert bounded_losses({"a": 2.0, "b": 4.0}, 3.0) == bounded_losses({"a": 0.02, "b": 0.04}, 3.0)


HOSTILE_LOSSES = {
    "NaN": float("nan"),
    "inf": math.inf,
    "negative": -1.0,
    "a string": "0.5",
    "None": None,
    "a bool": True,
    "an int beyond float's range": 10**400,
}


@pytest.mark.parametrize("label", HOSTILE_LOSSES)
def test_an_unusable_loss_is_refused_naming_the_site(label):
    losses = {"site-1": 0.5, "site-2": HOSTILE_LOSSES[label], "site-3": 0.7}
    with pytest.raises(ValueError, match="site-2"):
        minimax_round(uniform_mixture(list(losses)), {s: 1.0 for s in losses}, losses, 0.5, 0.05, 3.0)


def test_a_site_claiming_a_huge_loss_every_round_gains_no_more_than_its_bound():
    """site-3 reports 1e30 in every round (a finite number, were it let through): its signal is the cap, its weight
    grows to (1 - alpha) p + alpha at most, and every honest site keeps (1 - alpha) of its FedAvg weight."""
    sites = ["site-1", "site-2", "site-3", "site-4"]
    fedavg = {"site-1": 0.4, "site-2": 0.3, "site-3": 0.2, "site-4": 0.1}
    mixture, alpha = uniform_mixture(sites), 0.5
    for _ in range(200):
        losses = {"site-1": 0.3, "site-2": 0.5, "site-3": 1e30, "site-4": 0.6}
        result = minimax_round(mixture, fedavg, losses, alpha, 0.05, 3.0)
        mixture = result.mixture
        assert result.signal["site-3"] == 3.0 and result.capped == ["site-3"]
        assert result.weights["site-3"] <= 0.2 * (1 - alpha) + alpha + 1e-12
        assert all(result.weights[s] >= fedavg[s] * (1 - alpha) - 1e-12 for s in sites)
    assert result.weights["site-3"] == pytest.approx(0.6)  # its bound, reached: no further
    # with the paper's whole simplex (alpha 1) the same liar would take every weight: why alpha < 1 by default
    mixture = uniform_mixture(sites)
    for _ in range(200):
        result = minimax_round(mixture, fedavg, losses, 1.0, 0.05, 3.0)
        mixture = result.mixture
    assert result.weights["site-3"] == pytest.approx(1.0)


def test_the_bound_limits_a_liar_but_does_not_neutralise_it():
    """What docs/methods/afl.md says of the defaults: six equal sites, one claiming a huge loss every round, holds
    max_share's 0.5 of the global model from round 4 on, counted from 0 (its bound in Lambda, 1/12 + 1/2, is above
    the cap); two sites, where max_share does not apply: the liar's bound, 0.75."""
    from fairfl.aggregation import cap_shares

    sites = [f"site-{k}" for k in range(1, 7)]
    fedavg, mixture, shares = {s: 1 / 6 for s in sites}, uniform_mixture(sites), []
    for _ in range(6):
        losses = {s: 0.5 for s in sites} | {"site-6": 1e6}
        result = minimax_round(mixture, fedavg, losses, 0.5, 0.05, 3.0)
        mixture = result.mixture
        shares.append(cap_shares(result.weights, 0.5)["site-6"])
    assert shares[4] == pytest.approx(0.5) and all(share < 0.5 for share in shares[:4])  # rounds from 0
    assert shares == sorted(shares)
    two, mixture = {"site-1": 0.5, "site-2": 0.5}, uniform_mixture(["site-1", "site-2"])
    for _ in range(100):
        result = minimax_round(mixture, two, {"site-1": 0.5, "site-2": 1e6}, 0.5, 0.05, 3.0)
        mixture = result.mixture
    assert result.weights["site-2"] == pytest.approx(0.75)


def test_a_site_claiming_zero_loss_stops_lambda_for_the_round_and_never_gains():
    """With two sites the lower median is the smaller loss: a site claiming 0 sets it to 0, every signal is 0 and
    lambda stays; a site claiming a tiny loss moves weight away from itself."""
    two = {"site-1": 0.5, "site-2": 0.5}
    start = uniform_mixture(list(two))
    frozen = minimax_round(start, two, {"site-1": 0.5, "site-2": 0.0}, 0.5, 0.05, 3.0)
    assert frozen.mixture == pytest.approx(start) and set(frozen.signal.values()) == {0.0}
    tiny = minimax_round(start, two, {"site-1": 0.5, "site-2": 1e-9}, 0.5, 0.05, 3.0)
    assert tiny.mixture["site-2"] < start["site-2"]


def test_bad_settings_and_mismatched_sites_are_refused():
    mixture, fedavg, losses = uniform_mixture(["a", "b"]), {"a": 0.5, "b": 0.5}, {"a": 0.1, "b": 0.2}
    with pytest.raises(ValueError, match="no sites"):
        minimax_round(mixture, {}, {}, 0.5, 0.05, 3.0)
    with pytest.raises(ValueError, match="FedAvg weights for"):
        minimax_round(mixture, {"a": 1.0}, losses, 0.5, 0.05, 3.0)
    with pytest.raises(ValueError, match="alpha"):
        minimax_round(mixture, fedavg, losses, -0.1, 0.05, 3.0)
    with pytest.raises(ValueError, match="step"):
        minimax_round(mixture, fedavg, losses, 0.5, math.nan, 3.0)
    with pytest.raises(ValueError, match="loss_cap"):
        minimax_round(mixture, fedavg, losses, 0.5, 0.05, 0.5)
    with pytest.raises(ValueError, match="mixture"):
        minimax_round({"a": -0.5, "b": 1.5}, fedavg, losses, 0.5, 0.05, 3.0)
    with pytest.raises(ValueError, match="FedAvg weights"):
        minimax_round(mixture, {"a": math.nan, "b": 0.5}, losses, 0.5, 0.05, 3.0)
