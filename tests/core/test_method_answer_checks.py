"""Hostile values in the fields only one method reads (q-FedAvg's loss, FedCE's leave-one-out error, FedISM's
sharpness, CFFL's validation metric, Fed-LWR's CKA) and updates that would steer CGSV: each rejects that site for
the round or is bounded, and the others are aggregated. Through the controllers' real screening and aggregation,
without the simulator."""

import math

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel

from fairfl.flare.engine import FairRoundController
from fairfl.methods.fedce.controller import FedCEController
from fairfl.methods.fedce.protocol import LOO_ERROR
from fairfl.methods.fedism.controller import FedISMController
from fairfl.methods.fedism.protocol import SHARPNESS
from fairfl.methods.fedlwr.controller import FedLWRController
from fairfl.methods.fedlwr.protocol import CKA
from fairfl.methods.qfedavg.controller import QFedAvgController
from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS
from fairfl.methods.qfedavg.qffl import qffl_coefficients
from fairfl.methods.rewards.controller import CFFLController, CGSVController
from fairfl.methods.rewards.protocol import VAL_METRIC
from fairfl.models import initial_state, state_to_torch

from site_answers import SEG, SITES, answer, honest_answers, honest_params, hostile, huge_update, make, train_round


def reports_round(controller, state0, key, values, round_num=0):
    answers = honest_answers(state0)
    for a, value in zip(answers, values, strict=True):
        if value is not None:
            a.meta[key] = value
    updates, rejected, _ = train_round(controller, state0, answers, round_num)
    return updates, rejected


def check_only_rejected(rejected, site, word, extras, weights_key="weights"):
    assert set(rejected) == {site} and word in rejected[site], rejected
    assert site not in extras[weights_key]


@pytest.mark.parametrize("bad", [1e300, "1.0", {"loss": 1.0}, float("nan"), -1.0])
def test_qfedavg_rejects_an_absurd_or_malformed_loss(bad):
    controller = make(QFedAvgController, q=2.0)
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected = reports_round(controller, state0, GLOBAL_LOSS, [0.5, 0.7, bad, 0.6])
    new, extras = controller.aggregate(0, state0, updates, rejected)
    check_only_rejected(rejected, "site-3", "loss", extras)
    assert all(math.isfinite(v) for v in extras["weights"].values())


def test_qffl_shares_stay_finite_for_huge_losses_and_large_q():
    state0 = state_to_torch(initial_state(make().model_spec(), 0))
    local = {
        s: state_to_torch(honest_params({k: v.numpy() for k, v in state0.items()}, i)) for i, s in enumerate(SITES)
    }
    for q in (2.0, 5.0, 50.0):
        shares = qffl_coefficients(
            state0, local, {"site-1": 1e300, "site-2": 0.5, "site-3": 0.7, "site-4": 1e-12}, q, lipschitz=1e3
        )
        assert all(math.isfinite(c) and 0.0 <= c <= 1.0 for c in shares.values()) and sum(shares.values()) <= 1 + 1e-9
    # the log-space form equals the direct formula where the direct one does not overflow
    losses = {"site-1": 0.9, "site-2": 0.5, "site-3": 0.7, "site-4": 1.3}
    shares = qffl_coefficients(state0, local, losses, 2.0, 10.0)
    squared = {
        s: sum(
            float(((state0[k].double() - local[s][k].double()) ** 2).sum())
            for k in state0
            if state0[k].is_floating_point()
        )
        for s in SITES
    }
    f = {s: v + 1e-10 for s, v in losses.items()}
    denominator = sum(f[s] ** 2 + 2.0 * 10.0 * f[s] * squared[s] for s in SITES)
    assert shares == pytest.approx({s: f[s] ** 2 / denominator for s in SITES}, rel=1e-12)


def test_qfedavg_a_huge_loss_cannot_take_more_than_max_share():
    controller = make(QFedAvgController, q=2.0, lipschitz=0)
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected = reports_round(controller, state0, GLOBAL_LOSS, [0.5, 0.7, 1e5, 0.6])
    _, extras = controller.aggregate(0, state0, updates, rejected)
    assert not rejected and extras["weights"]["site-3"] == pytest.approx(0.5)


@pytest.mark.parametrize("bad", ["0.2", 1.5, float("nan"), None, [0.1]])
def test_fedce_rejects_a_bad_leave_one_out_error(bad):
    controller = make(FedCEController)
    state0 = initial_state(controller.model_spec(), 0)
    state1, _ = controller.aggregate(0, state0, train_round(controller, state0, honest_answers(state0))[0], {})
    updates, rejected = reports_round(controller, state1, LOO_ERROR, [0.3, 0.2, bad, 0.25], 1)
    _, extras = controller.aggregate(1, state1, updates, rejected)
    check_only_rejected(rejected, "site-3", "loo_error", extras)


@pytest.mark.parametrize(
    "bad, word",
    [
        (1e300, "sharpness is 1e+300, expected"),
        (-1e300, "sharpness is -1e+300, expected"),
        ("0.1", "sharpness is '0.1', expected"),
        ({"v": 1}, "sharpness is {'v': 1}, expected"),
        (None, "lacks sharpness"),
    ],
)
def test_fedism_rejects_absurd_sharpness_and_keeps_rounding(bad, word):
    controller = make(FedISMController)
    state0 = initial_state(controller.model_spec(), 0)
    report = {"loss": 1.0, "perturbed_loss": 1.1, "sharpness": 0.1, "grad_norm": 0.5}
    reports = [report, {**report, "sharpness": -1e-8}, {**report, "sharpness": bad}, {**report, "sharpness": 0.2}]
    updates, rejected = reports_round(controller, state0, SHARPNESS, reports)
    _, extras = controller.aggregate(0, state0, updates, rejected)
    check_only_rejected(rejected, "site-3", word, extras)
    assert extras["weights"]["site-2"] == 0.0  # a sharpness of -1e-8 is rounding: 0, accepted


def test_fedism_keeps_a_site_with_a_negative_sharpness_at_zero_raw_weight():
    controller = make(FedISMController)
    state0 = initial_state(controller.model_spec(), 0)
    report = {"loss": 1.0, "perturbed_loss": 1.1, "sharpness": 0.1, "grad_norm": 0.5}
    updates, rejected = reports_round(
        controller, state0, SHARPNESS, [report, report, {**report, "sharpness": -0.5}, report]
    )
    _, extras = controller.aggregate(0, state0, updates, rejected)
    assert not rejected and extras["raw_weights"]["site-3"] == 0.0


def test_fedism_a_huge_sharpness_under_the_bound_cannot_take_more_than_max_share():
    controller = make(FedISMController)
    state0 = initial_state(controller.model_spec(), 0)
    report = {"loss": 1.0, "perturbed_loss": 1.1, "sharpness": 0.1, "grad_norm": 0.5}
    updates, rejected = reports_round(
        controller, state0, SHARPNESS, [report, report, {**report, "sharpness": 1e5}, report]
    )
    _, extras = controller.aggregate(0, state0, updates, rejected)
    assert not rejected and extras["weights"]["site-3"] == pytest.approx(0.5)
    assert controller.saga_state.weights == extras["weights"]  # Eq. 18 goes on from the weights used


@pytest.mark.parametrize("bad, word", [(7.0, "val_metric"), ("0.9", "val_metric"), (float("inf"), "val_metric")])
def test_cffl_rejects_a_bad_validation_metric(tmp_path, bad, word):
    controller = make(CFFLController, tmp_path)
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected = reports_round(controller, state0, VAL_METRIC, [0.6, 0.7, bad, 0.65])
    _, extras = controller.aggregate(0, state0, updates, rejected)
    check_only_rejected(rejected, "site-3", word, extras)


def test_cgsv_a_huge_update_is_rejected_and_gamma_is_the_median(tmp_path):
    controller = make(CGSVController, tmp_path)
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected, _ = train_round(controller, state0, hostile(state0, 2, params=huge_update))
    assert set(rejected) == {"site-3"} and "median" in rejected["site-3"]
    _, extras = controller.aggregate(0, state0, updates, rejected)
    assert set(extras["weights"]) == {"site-1", "site-2", "site-4"}
    for site, model in controller.site_models.items():  # no site's model was blown up
        assert all(np.abs(model[k] - state0[k]).max() < 1.0 for k in state0 if state0[k].dtype.kind == "f"), site


def test_cgsv_gamma_is_the_median_norm_so_one_large_update_cannot_set_it(tmp_path):
    controller = make(CGSVController, tmp_path, max_update_ratio=0)  # let the large update through
    state0 = initial_state(controller.model_spec(), 0)
    answers = [answer(s, honest_params(state0, i, scale=0.01 if i != 2 else 1.0)) for i, s in enumerate(SITES)]
    updates, _, _ = train_round(controller, state0, answers)
    _, extras = controller.aggregate(0, state0, updates, {})
    norms = sorted(
        float(
            np.sqrt(
                sum(
                    ((updates[s].state[k].double() - torch.as_tensor(state0[k]).double()) ** 2).sum()
                    for k in state0
                    if state0[k].dtype.kind == "f"
                )
            )
        )
        for s in SITES
    )
    assert extras["gamma"] == pytest.approx((norms[1] + norms[2]) / 2, rel=1e-6)


@pytest.mark.parametrize(
    "values, word",
    [
        ({"neg": -0.3}, "is -0.3, expected a finite number in [-1e-06, 1]"),
        ({"big": 1.1}, "is 1.1, expected"),
        ({"str": "0.9"}, "is '0.9', expected"),
        ({"bool": True}, "is True, expected"),
        ({"nan": float("nan")}, "nan"),
        ("all", "is 'all', expected an object"),
    ],
)
def test_fedlwr_rejects_bad_cka_and_a_set_max_share_caps_cka_near_zero(values, word):
    assert FedLWRController(**SEG).settings.max_share == 1.0 and FairRoundController(**SEG).settings.max_share == 0.5
    controller = make(FedLWRController, max_share=0.5)
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected, _ = train_round(controller, state0, honest_answers(state0))
    layers = None

    def ask(round_num, task_name, model, targets):
        nonlocal layers
        layers = list(controller._layers)
        cka = {s: {layer: 0.99 for layer in layers} for s in targets}
        cka["site-1"] = {layer: 0.0 for layer in layers}  # CKA 0: the largest weight a site can claim
        cka["site-2"] = {layer: 1.0 + 1e-7 for layer in layers}  # rounding above 1: accepted
        bad = values if isinstance(values, str) else {layer: next(iter(values.values())) for layer in layers}
        cka["site-3"] = bad
        return [FLModel(params={}, meta={"client_name": s, CKA: cka[s]}) for s in targets]

    controller.ask = ask
    new, extras = controller.aggregate(0, state0, updates, rejected)
    assert set(rejected) == {"site-3"} and rejected["site-3"].startswith("CKA") and word in rejected["site-3"]
    for weights in extras["layer_weights"].values():
        assert set(weights) == {"site-1", "site-2", "site-4"} and sum(weights.values()) == pytest.approx(1.0)
        assert weights["site-1"] == pytest.approx(0.5)  # 1 - CKA = 1 against 0.01: capped at max_share
