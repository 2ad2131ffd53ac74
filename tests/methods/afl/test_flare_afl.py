"""AFL's controller through the round loop's real screening and aggregation (the sending replaced): what it asks the
sites for, the weights and record of a round as the minimax step gives them, a hostile or broken loss rejected for the
round or capped, gaining no more than its bound, a missing site's share kept, the mixture surviving a resume, and what
robust aggregation and DP-SGD do with it."""

import json
import math
import os

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.aggregation import robust_average
from fairfl.flare import protocol
from fairfl.flare.checkpoint import METHOD_STATE_FILE
from fairfl.kinds import Real
from fairfl.methods.afl.controller import AFLController
from fairfl.methods.afl.minimax import minimax_round, uniform_mixture
from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS, MEASURE_LOSS
from fairfl.models import initial_state, state_to_torch
from fairfl.privacy.settings import job_refusal
from fairfl.site_checks import MAX_REPORTED

from helpers import variant_controller

SITES = ["site-1", "site-2", "site-3", "site-4"]
TINY = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": 20}
SAMPLES = {"site-1": 40, "site-2": 30, "site-3": 20, "site-4": 10}  # FedAvg's weights 0.4, 0.3, 0.2, 0.1
HONEST = {"site-1": 0.3, "site-2": 0.5, "site-3": 0.4, "site-4": 0.6}


def make(tmp_path, **settings):
    return variant_controller("afl", tmp_path, SITES, **{**TINY, **settings})


def trained(state: dict, seed: int) -> dict:
    generator = np.random.default_rng(seed)
    return {
        k: v + 0.01 * generator.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else v
        for k, v in state.items()
    }


def play(controller, state, round_num, losses=None, missing=()):
    """One train round through the real screening and aggregation: every site of SITES but `missing` answers with
    its loss of `losses` (default HONEST; a value None leaves the field out). Returns (new state, rejected, the
    round's record fields, the sites' trained models)."""
    answers, models = [], {}
    for i, site in enumerate(SITES):
        if site in missing:
            continue
        loss = (losses or HONEST)[site]
        meta = {"client_name": site, protocol.NUM_SAMPLES: SAMPLES[site]}
        meta.update({} if loss is None else {GLOBAL_LOSS: loss})
        models[site] = trained(state, 10 * round_num + i)
        answers.append(
            FLModel(params_type=ParamsType.FULL, params=models[site], metrics={"train_loss": 0.5}, meta=meta)
        )
    controller._ask_models = lambda *args, **kwargs: list(answers)
    updates, rejected, _ = controller._train_round(round_num, state)
    new_state, extras = controller._server_step(round_num, state, updates, rejected)
    return new_state, rejected, extras, models


def test_the_controller_asks_for_the_loss_of_the_model_sent_and_reads_it_as_q_fedavg_does():
    controller = AFLController(**TINY)
    assert controller.method == "afl" and controller.train_meta(0) == {MEASURE_LOSS: True}
    assert controller.answer_fields(protocol.TASK_TRAIN, 0) == {GLOBAL_LOSS: Real(0.0, MAX_REPORTED)}
    assert controller.answer_fields(protocol.TASK_VALIDATE, 0) == {}
    config = controller.config()
    assert (config["afl_alpha"], config["afl_step"], config["afl_loss_cap"]) == (0.5, 0.05, 3.0)
    for bad in ({"afl_alpha": 1.5}, {"afl_step": -1}, {"afl_loss_cap": 0.5}, {"afl_alpha": math.nan}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AFLController(**TINY, **bad)


def test_a_round_averages_the_models_with_lambda_and_records_who_got_which_weight(tmp_path):
    controller = make(tmp_path)
    state = initial_state(controller.model_spec(), 0)
    mixture, records = uniform_mixture(SITES), []
    for round_num in range(3):
        new_state, rejected, extras, models = play(controller, state, round_num)
        assert not rejected
        fedavg = {s: SAMPLES[s] / 100 for s in SITES}
        expected = minimax_round(mixture, fedavg, HONEST, 0.5, 0.05, 3.0)
        assert extras["fedavg_weights"] == pytest.approx(fedavg)
        assert extras["weights"] == pytest.approx(expected.weights)  # below max_share: uncapped
        assert extras["mixture"] == pytest.approx(expected.mixture) == controller.mixture
        assert extras["losses"] == HONEST and extras["loss_signal"] == pytest.approx(expected.signal)
        assert extras["capped_losses"] == []
        for key, value in state_to_torch(new_state).items():  # the lambda-weighted average of the sites' models
            if value.is_floating_point():
                average = sum(expected.weights[s] * torch.as_tensor(models[s][key]).double() for s in SITES)
                assert torch.allclose(value.double(), average, atol=1e-6), key
        mixture, state = expected.mixture, new_state
        records.append(extras)
    # the aggregation moves toward the site the global model serves worst (site-4, loss 0.6), from the best (site-1)
    first, last = records[0]["weights"], records[-1]["weights"]
    assert last["site-4"] > first["site-4"] and last["site-1"] < first["site-1"]
    assert json.loads(json.dumps(extras)) == extras  # JSON as results.json records it


HOSTILE = {
    "1e30": 1e30,
    "NaN": float("nan"),
    "inf": math.inf,
    "negative": -0.5,
    "a string": "0.4",
    "None (left out)": None,
    "a bool": True,
    "a list": [0.4],
}


@pytest.mark.parametrize("label", HOSTILE)
def test_an_unusable_loss_rejects_that_site_for_the_round_and_leaves_its_share_untouched(label, tmp_path):
    controller = make(tmp_path)
    state = initial_state(controller.model_spec(), 0)
    state, rejected, _, _ = play(controller, state, 0)
    before = dict(controller.mixture)
    state, rejected, extras, _ = play(controller, state, 1, {**HONEST, "site-3": HOSTILE[label]})
    assert set(rejected) == {"site-3"} and GLOBAL_LOSS in rejected["site-3"], rejected
    assert set(extras["weights"]) == {"site-1", "site-2", "site-4"}
    assert controller.mixture["site-3"] == pytest.approx(before["site-3"])  # as if it had not answered
    assert all(np.isfinite(v).all() for v in state.values() if v.dtype.kind == "f")


def test_a_site_claiming_a_huge_loss_within_the_screen_is_capped_and_gains_no_more_than_its_bound(tmp_path):
    """site-4 (FedAvg weight 0.1) claims 1e5 every round, below MAX_REPORTED: it counts as 3 medians, its lambda
    grows to 0.1 * 0.5 + 0.5 = 0.55 at most and is cut at max_share (0.5); every honest site keeps half its FedAvg
    weight, and the liar's weight per round rises by no more than the step allows."""
    controller = make(tmp_path)
    state = initial_state(controller.model_spec(), 0)
    liar = {**HONEST, "site-4": 1e5}
    previous = None
    for round_num in range(20):
        state, rejected, extras, _ = play(controller, state, round_num, liar)
        assert not rejected and extras["capped_losses"] == ["site-4"] and extras["loss_signal"]["site-4"] == 3.0
        weights = extras["weights"]
        assert weights["site-4"] <= 0.5 + 1e-12 and sum(weights.values()) == pytest.approx(1.0)
        assert all(weights[s] >= 0.5 * SAMPLES[s] / 100 - 1e-12 for s in SITES)
        if previous is not None:
            assert weights["site-4"] - previous <= 0.05 * 3.0 + 1e-12
        previous = weights["site-4"]
    assert weights["site-4"] == pytest.approx(0.5)  # held at max_share; uncapped it would stop at its bound
    with_no_cap = make(tmp_path, max_share=1.0)
    state = initial_state(with_no_cap.model_spec(), 0)
    for round_num in range(40):
        state, _, extras, _ = play(with_no_cap, state, round_num, liar)
    assert extras["weights"]["site-4"] == pytest.approx(0.55)


def test_a_missing_site_keeps_its_share_and_is_weighted_again_when_it_is_back(tmp_path):
    controller = make(tmp_path)
    state = initial_state(controller.model_spec(), 0)
    state, _, _, _ = play(controller, state, 0)
    kept = controller.mixture["site-2"]
    state, rejected, extras, _ = play(controller, state, 1, missing=["site-2"])
    assert not rejected and set(extras["weights"]) == {"site-1", "site-3", "site-4"}
    assert set(extras["mixture"]) == set(SITES) and extras["mixture"]["site-2"] == pytest.approx(kept)
    state, rejected, extras, _ = play(controller, state, 2)
    assert not rejected and set(extras["weights"]) == set(SITES)


def test_the_mixture_survives_a_resume_and_is_written_every_round(tmp_path):
    controller = make(tmp_path)
    state = initial_state(controller.model_spec(), 0)
    for round_num in range(3):
        state, _, _, _ = play(controller, state, round_num)
        controller._save_method_state(str(tmp_path), round_num)
    with open(os.path.join(tmp_path, METHOD_STATE_FILE)) as f:
        saved = json.load(f)
    assert saved["method"] == "afl" and saved["round"] == 2 and saved["state"]["mixture"] == controller.mixture
    restored = make(tmp_path)
    restored.load_method_state(saved["state"])
    _, _, expected, _ = play(controller, state, 3)
    _, _, resumed, _ = play(restored, state, 3)
    assert resumed == expected and restored.final_extras() == controller.final_extras()


def test_robust_aggregation_replaces_the_average_and_lambda_is_still_stepped_and_recorded(tmp_path):
    controller = make(tmp_path, robust_aggregation="median")
    state = initial_state(controller.model_spec(), 0)
    new_state, rejected, extras, models = play(controller, state, 0)
    assert not rejected and extras["robust"] == {"mode": "median", "sites": 4}
    median = robust_average([state_to_torch(models[s]) for s in SITES], "median")
    assert all(torch.allclose(state_to_torch(new_state)[k], median[k]) for k in median)
    assert extras["mixture"] != uniform_mixture(SITES)  # the step is taken all the same


def test_dp_sgd_is_supported_the_loss_probe_runs_outside_training():
    server = AFLController(dp_epsilon=8, **TINY)
    assert job_refusal(server.method, {**server.common_task_meta(SITES), **server.train_meta(0)}) is None
