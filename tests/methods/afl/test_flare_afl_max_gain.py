"""AFL's ceiling `afl_max_gain` through the controllers (the round loop's real screening and aggregation, the sending
replaced): off by default with the record as before, refused when hostile before anything runs (AFL's controller and
FedFloor's, which declares AFL's arguments), a liar held at its ceiling round after round and recorded there, FedFloor's
minimax global model still AFL's round for round with it, and what `max_share`, applied after lambda as for every
method, can and cannot do to the bound."""

import math

import numpy as np
import pytest

from fairfl.aggregation import cap_shares
from fairfl.methods.afl.controller import AFLController
from fairfl.methods.afl.minimax import minimax_round, uniform_mixture
from fairfl.methods.fedfloor.controller import FedFloorController
from fairfl.models import initial_state

import helpers
from helpers import variant_controller

SITES = ["site-1", "site-2", "site-3", "site-4"]
TINY = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": 20}
SAMPLES = {"site-1": 40, "site-2": 30, "site-3": 20, "site-4": 10}  # FedAvg's weights 0.4, 0.3, 0.2, 0.1
HONEST = {"site-1": 0.3, "site-2": 0.5, "site-3": 0.4, "site-4": 0.6}
LIAR = {**HONEST, "site-4": 1e5}  # below the screen's 1e6: counted, at afl_loss_cap medians


def play(controller, state, round_num, losses):
    """One train round through the real screening and aggregation, every site answering with its loss of `losses`.
    Returns (new state, rejected, the round's record fields)."""
    answers = helpers.loss_answers(state, round_num, SAMPLES, losses)
    return helpers.server_round(controller, state, answers, round_num)


HOSTILE = {
    "negative": -0.5,
    "NaN": math.nan,
    "inf": math.inf,
    "a string": "1.0",
    "a bool": True,
    "a list": [1.0],
    "above 1000": 1001.0,
}


@pytest.mark.parametrize("label", HOSTILE)
def test_a_hostile_ceiling_is_refused_before_anything_runs_by_afl_and_by_fedfloor(label):
    with pytest.raises(ValueError, match="afl_max_gain"):
        AFLController(**TINY, afl_max_gain=HOSTILE[label])
    with pytest.raises(ValueError, match="afl_max_gain"):
        FedFloorController(**TINY, minimax_aggregation=True, afl_max_gain=HOSTILE[label])


def test_the_ceiling_is_off_by_default_and_declared_by_both_controllers():
    assert AFLController(**TINY).config()["afl_max_gain"] is None
    floor = FedFloorController(**TINY, minimax_aggregation=True)
    assert floor.config()["afl_max_gain"] is None  # FedFloor declares AFL's arguments
    assert FedFloorController(**TINY, minimax_aggregation=True, afl_max_gain=1.0).config()["afl_max_gain"] == 1.0
    assert AFLController(**TINY, afl_max_gain=0).config()["afl_max_gain"] == 0  # 0 = FedAvg's weights


def test_off_the_round_and_its_record_are_as_before(tmp_path):
    controller = variant_controller("afl", tmp_path, SITES, **TINY)
    state = initial_state(controller.model_spec(), 0)
    mixture = uniform_mixture(SITES)
    for round_num in range(3):
        state, rejected, extras = play(controller, state, round_num, LIAR)
        expected = minimax_round(mixture, {s: n / 100 for s, n in SAMPLES.items()}, LIAR, 0.5, 0.05, 3.0)
        assert not rejected and "at_ceiling" not in extras
        assert extras["mixture"] == pytest.approx(expected.mixture)
        mixture = expected.mixture


def test_with_a_ceiling_a_liar_is_held_at_it_every_round_and_recorded_there(tmp_path):
    """site-4 (FedAvg weight 0.1) claims 1e5 every round; afl_max_gain = 1: its weight never exceeds 0.2 (without the
    ceiling it reaches max_share's 0.5: test_flare_afl.py), reaches it and is recorded `at_ceiling`; every honest site
    keeps half its FedAvg weight; the record is the minimax round's with the ceiling."""
    controller = variant_controller("afl", tmp_path, SITES, **TINY, afl_max_gain=1.0)
    state = initial_state(controller.model_spec(), 0)
    mixture, fedavg = uniform_mixture(SITES), {s: n / 100 for s, n in SAMPLES.items()}
    for round_num in range(20):
        state, rejected, extras = play(controller, state, round_num, LIAR)
        expected = minimax_round(mixture, fedavg, LIAR, 0.5, 0.05, 3.0, max_gain=1.0)
        mixture = expected.mixture
        assert not rejected and extras["capped_losses"] == ["site-4"]
        weights = extras["weights"]
        assert weights == pytest.approx(expected.weights) and extras["at_ceiling"] == expected.at_ceiling
        assert weights["site-4"] <= 0.2 + 1e-12 and sum(weights.values()) == pytest.approx(1.0)
        assert all(weights[s] >= 0.5 * fedavg[s] - 1e-12 for s in SITES)
        assert all(weights[s] <= 2.0 * fedavg[s] + 1e-12 for s in SITES)
    assert weights["site-4"] == pytest.approx(0.2) and extras["at_ceiling"] == ["site-4"]
    assert controller.mixture == pytest.approx(mixture)


def test_fedfloor_minimax_with_a_ceiling_is_afls_round_for_round(tmp_path):
    composed = variant_controller("fedfloor_minimax", tmp_path / "floor", SITES, **TINY, afl_max_gain=0.5)
    afl = variant_controller("afl", tmp_path / "afl", SITES, **TINY, afl_max_gain=0.5)
    assert composed.afl_max_gain == afl.afl_max_gain == 0.5
    state = initial_state(composed.model_spec(), 0)
    for round_num in range(3):
        ours, rejected, extras = play(composed, state, round_num, LIAR)
        theirs, _, expected = play(afl, state, round_num, LIAR)
        assert not rejected and extras == expected and "at_ceiling" in extras
        assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
        state = ours
    assert extras["weights"]["site-4"] <= 1.5 * 0.1 + 1e-12


def test_max_share_applied_after_lambda_can_lift_a_site_at_its_ceiling_only_where_a_ceiling_is_above_it():
    """What docs/methods/afl.md says of the bound: it holds for lambda; `max_share` (0.5), applied after as for every
    method, cuts a site above it and spreads the excess over the others in proportion. site-1 (FedAvg weight 0.4,
    ceiling 0.8 with beta = 1, above max_share) and site-4 (0.1, ceiling 0.2) both report large losses: lambda puts
    site-1 at 0.55 and site-4 at its ceiling 0.2; max_share cuts site-1 to 0.5 and lifts site-4 to 0.2 * 0.5 / 0.45.
    With every ceiling at most max_share (beta = 0.25 here) max_share changes nothing: the bound holds as recorded."""
    fedavg = {s: n / 100 for s, n in SAMPLES.items()}
    losses = {"site-1": 1e5, "site-2": 0.3, "site-3": 0.3, "site-4": 1e5}
    for beta, lifted in ((1.0, True), (0.25, False)):
        mixture = uniform_mixture(SITES)
        for _ in range(100):
            result = minimax_round(mixture, fedavg, losses, 0.5, 0.05, 3.0, max_gain=beta)
            mixture = result.mixture
            assert all(result.weights[s] <= (1 + beta) * fedavg[s] + 1e-12 for s in SITES)  # lambda: always
        recorded = cap_shares(result.weights, 0.5)
        assert result.weights["site-4"] == pytest.approx((1 + beta) * 0.1)
        if lifted:
            assert result.weights["site-1"] == pytest.approx(0.55)
            assert recorded["site-4"] == pytest.approx(0.2 * 0.5 / 0.45)
        else:
            assert recorded == result.weights
