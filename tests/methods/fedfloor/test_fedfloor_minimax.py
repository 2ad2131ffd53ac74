"""FedFloor's composition with AFL (`minimax_aggregation`): off, FedFloor is exactly what it was (its task fields,
the answers it reads, its FedAvg global model, no server state); on, its global model is AFL's round for round on
the same answers (weights, model, mixture), Ditto's task fields stay, a hostile loss is rejected for the round as
AFL rejects it, and the mixture survives a resume."""

import numpy as np
import pytest

from fairfl.flare import protocol
from fairfl.methods.afl.controller import MinimaxAggregation
from fairfl.methods.ditto.protocol import DITTO_LAMBDA
from fairfl.methods.fedfloor.controller import FedFloorController
from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS, MEASURE_LOSS
from fairfl.models import initial_state

import helpers
from helpers import variant_controller

SITES = ["site-1", "site-2", "site-3", "site-4"]
TINY = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": 20}
SAMPLES = {"site-1": 40, "site-2": 30, "site-3": 20, "site-4": 10}
LOSSES = {"site-1": 0.3, "site-2": 0.5, "site-3": 0.4, "site-4": 0.6}


def play(controller, state, round_num, losses=LOSSES):
    """One train round through the real screening and aggregation (the sending replaced), every site answering with
    its model and, where `losses` has one, its loss."""
    return helpers.server_round(controller, state, helpers.loss_answers(state, round_num, SAMPLES, losses), round_num)


def test_off_fedfloor_asks_reads_and_aggregates_as_before(tmp_path):
    floor = variant_controller("fedfloor", tmp_path, SITES, **TINY)
    assert floor.method == "fedfloor" and not floor.minimax
    assert floor.train_meta(0) == {DITTO_LAMBDA: 0.1}  # Ditto's alone: no loss asked for
    assert floor.answer_fields(protocol.TASK_TRAIN, 0) == {}
    assert floor.method_state() is None and floor.final_extras() == {}
    assert not floor.config()["minimax_aggregation"]  # recorded in results.json's config beside AFL's defaults
    state = initial_state(floor.model_spec(), 0)
    new_state, rejected, extras = play(floor, state, 0, losses={})  # no loss sent: nothing to reject
    assert not rejected and set(extras) == {"weights"}
    assert extras["weights"] == pytest.approx({s: n / 100 for s, n in SAMPLES.items()})
    assert floor.method_state() is None


def test_on_its_global_model_is_afls_round_for_round(tmp_path):
    composed = variant_controller("fedfloor_minimax", tmp_path / "floor", SITES, **TINY)
    afl = variant_controller("afl", tmp_path / "afl", SITES, **TINY)
    assert composed.method == "fedfloor_minimax" and composed.minimax
    assert composed.train_meta(0) == {DITTO_LAMBDA: 0.1, MEASURE_LOSS: True}
    assert composed.answer_fields(protocol.TASK_TRAIN, 0) == afl.answer_fields(protocol.TASK_TRAIN, 0)
    assert composed.site_meta()["mix_grid"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    state = initial_state(composed.model_spec(), 0)
    for round_num in range(3):
        ours, rejected, extras = play(composed, state, round_num)
        theirs, _, expected = play(afl, state, round_num)
        assert not rejected and extras == expected
        assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
        state = ours
    assert extras["weights"]["site-4"] > SAMPLES["site-4"] / 100  # leaning toward the worst-served site
    assert composed.method_state() == {"mixture": afl.mixture}


def test_on_a_hostile_loss_rejects_that_site_for_the_round(tmp_path):
    composed = variant_controller("fedfloor_minimax", tmp_path, SITES, **TINY)
    state = initial_state(composed.model_spec(), 0)
    for bad in (1e30, float("nan"), -1.0, "0.4"):
        _, rejected, extras = play(composed, state, 0, losses={**LOSSES, "site-2": bad})
        assert set(rejected) == {"site-2"} and GLOBAL_LOSS in rejected["site-2"]
        assert set(extras["weights"]) == {"site-1", "site-3", "site-4"}


def test_on_the_mixture_survives_a_resume(tmp_path):
    first = variant_controller("fedfloor_minimax", tmp_path / "a", SITES, **TINY)
    state = initial_state(first.model_spec(), 0)
    state, _, _ = play(first, state, 0)
    resumed = variant_controller("fedfloor_minimax", tmp_path / "b", SITES, **TINY)
    resumed.load_method_state(first.method_state())
    ours, _, extras = play(first, state, 1)
    again, _, expected = play(resumed, state, 1)
    assert extras == expected and all(np.array_equal(ours[k], again[k]) for k in ours)


def test_a_bad_afl_argument_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="afl_alpha"):
        FedFloorController(**TINY, minimax_aggregation=True, afl_alpha=2.0)
    with pytest.raises(ValueError, match="minimax_aggregation"):  # an arm no variant names
        FedFloorController(**TINY, minimax_aggregation=True, mix_grid=[0, 1])
    assert issubclass(FedFloorController, MinimaxAggregation)  # one copy of the minimax round
