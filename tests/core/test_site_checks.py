"""Hostile site answers: every one is rejected for the round (naming the site and the field) or bounded, the round
goes on with the others, and the server never raises. Through the controllers' real screening and aggregation,
without the simulator (tests/integration/test_simulator_jobs.py carries hostile sites through real runs)."""

import json
import math
import os

import numpy as np
import pytest
import torch
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import make_reply
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.aggregation import cap_shares, robust_average
from fairfl.files import json_safe, save_atomic, write_atomic, write_json_atomic
from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.methods.ditto.controller import DittoController
from fairfl.methods.fedbn.controller import FedBNController
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
from fairfl.methods.solo.controller import SoloController
from fairfl.models import initial_state, state_to_torch
from fairfl.results import ResultsLog
from fairfl.site_checks import metrics_problem, norm_outliers, number_problem, samples_problem, tensor_state

from helpers import check_tracking, tensorboard_scalars

SEG = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": 3}
SITES = ["site-1", "site-2", "site-3", "site-4"]


def honest_params(global_state, i, scale=0.01):
    generator = torch.Generator().manual_seed(100 + i)
    return {
        k: (
            v + scale * torch.randn(v.shape, generator=generator).numpy().astype(v.dtype)
            if v.dtype.kind == "f"
            else v.copy()
        )
        for k, v in global_state.items()
    }


def answer(site, params, num_samples=20, metrics=None, **meta):
    return FLModel(
        params_type=ParamsType.FULL,
        params=params,
        metrics={"train_loss": 0.5} if metrics is None else metrics,
        meta={"client_name": site, protocol.NUM_SAMPLES: num_samples, protocol.LR: 1e-3, **meta},
    )


def make(cls=FairRoundController, tmp_path=None, **kwargs):
    controller = cls(**{**SEG, **kwargs})
    controller.trainers = controller.sites = list(SITES)
    controller.min_responses = len(SITES)
    controller.absent, controller.task_meta = [], {}
    if tmp_path is not None:
        controller.get_run_dir = lambda: str(tmp_path)
    return controller


def train_round(controller, global_state, answers, round_num=0):
    """The controller's real `_train_round` on these answers (the sending replaced)."""
    controller._ask_models = lambda *args, **kwargs: list(answers)
    return controller._train_round(round_num, global_state)


def honest_answers(global_state, **meta):
    return [answer(s, honest_params(global_state, i), num_samples=20 + i, **meta) for i, s in enumerate(SITES)]


def hostile(global_state, site_index, **change):
    """Honest answers, one of which (SITES[site_index]) is changed by `change` (params, num_samples, metrics, meta)."""
    answers = honest_answers(global_state)
    bad = answers[site_index]
    for field, value in change.items():
        if field in ("params", "metrics"):
            setattr(bad, field, value(bad.params) if callable(value) else value)
        elif field == "num_samples":
            bad.meta[protocol.NUM_SAMPLES] = value
        else:
            bad.meta[field] = value
    return answers


def with_tensor(key_index, make_value):
    def change(params):
        params = dict(params)
        key = sorted(params)[key_index]
        params[key] = make_value(params[key])
        return params

    return change


def with_extra_key(params):
    return {**params, "backdoor.weight": np.zeros(3, dtype=np.float32)}


def without_first_key(params):
    return {k: v for k, v in params.items() if k != sorted(params)[0]}


def huge_update(params):
    return {k: (v + 1e3 * np.ones_like(v) if v.dtype.kind == "f" else v) for k, v in params.items()}


# (case name, change of site-3's train answer, a word the rejection must contain)
TRAIN_CASES = [
    ("string metric", {"metrics": {"train_loss": "0.1; rm -rf /"}}, "train_loss"),
    ("bool metric", {"metrics": {"train_loss": True}}, "train_loss"),
    ("NaN metric", {"metrics": {"train_loss": float("nan")}}, "train_loss"),
    ("Inf metric", {"metrics": {"train_loss": float("inf")}}, "train_loss"),
    ("dict instead of a metric", {"metrics": {"train_loss": {"value": 0.1}}}, "train_loss"),
    ("metrics a list", {"metrics": [0.1, 0.2]}, "metrics"),
    ("10000 metrics", {"metrics": {f"m{i}": 0.0 for i in range(10000)}}, "metrics"),
    ("metric name not a string", {"metrics": {7: 0.1}}, "metric name"),
    ("metric name MLflow refuses", {"metrics": {"dice": 0.5, "loss; DROP": 0.1}}, "metric name 'loss; DROP' has"),
    ("metric name climbing out", {"metrics": {"train_loss": 0.1, "../x": 0.1}}, "metric name '../x' is absolute"),
    ("metric name climbing inside", {"metrics": {"a/../../b": 0.1}}, "metric name 'a/../../b'"),
    ("metric name absolute", {"metrics": {"/abs": 0.1}}, "metric name '/abs'"),
    ("metric name with an empty segment", {"metrics": {"a//b": 0.1}}, "metric name 'a//b'"),
    ("metric name with a dot segment", {"metrics": {"./loss": 0.1}}, "metric name './loss'"),
    ("metric name a dot", {"metrics": {".": 0.1}}, "metric name '.'"),
    ("metric name ending in a slash", {"metrics": {"loss/": 0.1}}, "metric name 'loss/'"),
    ("NaN tensor", {"params": with_tensor(0, lambda v: np.full_like(v, np.nan))}, "NaN"),
    ("Inf tensor", {"params": with_tensor(1, lambda v: np.full_like(v, np.inf))}, "Inf"),
    ("missing tensor", {"params": without_first_key}, "missing keys"),
    ("extra tensor", {"params": with_extra_key}, "unexpected keys"),
    ("wrong shape", {"params": with_tensor(0, lambda v: v[:-1])}, "shape"),
    ("integer tensor for a float one", {"params": with_tensor(0, lambda v: v.astype(np.int64))}, "dtype"),
    # the aggregate takes the first site's dtype: a float16 model would quantise (and at 65504 overflow) everyone's
    ("a float16 model", {"params": lambda p: {k: v.astype(np.float16) for k, v in p.items()}}, "float16"),
    ("a float64 tensor", {"params": with_tensor(1, lambda v: v.astype(np.float64))}, "float64"),
    ("tensor of strings", {"params": with_tensor(0, lambda v: np.array(["x"] * v.size))}, "numeric"),
    ("model a string", {"params": "weights.pt"}, "not a mapping"),
    ("num_samples 10**18", {"num_samples": 10**18}, "max_samples"),
    ("num_samples a bool", {"num_samples": True}, "num_samples"),
    ("num_samples a string", {"num_samples": "100"}, "num_samples"),
    ("num_samples a float", {"num_samples": 10.5}, "num_samples"),
    ("num_samples 0", {"num_samples": 0}, "num_samples"),
    ("num_samples negative", {"num_samples": -5}, "num_samples"),
    ("huge finite update", {"params": huge_update}, "median"),
]


@pytest.mark.parametrize("case, change, word", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_a_hostile_train_answer_rejects_that_site_and_the_round_goes_on(case, change, word):
    controller = make()
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected, train_metrics = train_round(controller, state0, hostile(state0, 2, **change))
    assert set(rejected) == {"site-3"} and word in rejected["site-3"], rejected
    assert set(updates) == {"site-1", "site-2", "site-4"} and set(train_metrics) == set(SITES)
    new, extras = controller.aggregate(0, state0, updates, rejected)
    assert set(extras["weights"]) == set(updates) and sum(extras["weights"].values()) == pytest.approx(1.0)
    assert all(np.isfinite(v).all() for v in new.values() if v.dtype.kind == "f")
    json.dumps(train_metrics, allow_nan=False)  # what reaches results.json and TensorBoard is plain numbers
    assert all(isinstance(v, float) for m in train_metrics.values() for v in m.values())


def test_a_site_cannot_claim_more_samples_than_in_its_first_round():
    controller = make()
    state0 = initial_state(controller.model_spec(), 0)
    train_round(controller, state0, honest_answers(state0))
    assert controller.declared_samples == {s: 20 + i for i, s in enumerate(SITES)}
    answers = honest_answers(state0)
    answers[1].meta[protocol.NUM_SAMPLES] = 500
    answers[2].meta[protocol.NUM_SAMPLES] = 5  # fewer is fine (a site may drop bad images)
    updates, rejected, _ = train_round(controller, state0, answers, round_num=1)
    assert set(rejected) == {"site-2"} and "declared in its first round" in rejected["site-2"]
    assert updates["site-3"].num_samples == 5


def test_a_huge_sample_count_under_the_cap_cannot_take_more_than_max_share():
    controller = make(max_samples=10**9)
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected, _ = train_round(controller, state0, hostile(state0, 0, num_samples=10**8))
    assert not rejected
    _, extras = controller.aggregate(0, state0, updates, rejected)
    assert extras["weights"]["site-1"] == pytest.approx(0.5) and sum(extras["weights"].values()) == pytest.approx(1)
    others = {s: 20 + i for i, s in enumerate(SITES) if s != "site-1"}
    for site, n in others.items():  # the rest shared in proportion to the honest counts
        assert extras["weights"][site] == pytest.approx(0.5 * n / sum(others.values()))


EVAL_CASES = [
    ("string evaluation metric", {"dice": "excellent"}),
    ("evaluation metric above 1", {"dice": 7.0}),
    ("negative evaluation metric", {"dice": -0.5}),
    ("NaN evaluation metric", {"dice": float("nan")}),
    ("no main metric", {"accuracy": 0.5}),
    ("evaluation metrics a string", "0.9"),
]


@pytest.mark.parametrize("case, metrics", EVAL_CASES, ids=[c[0] for c in EVAL_CASES])
def test_a_hostile_evaluation_is_left_out_and_recorded(case, metrics):
    controller = make()
    state0 = initial_state(controller.model_spec(), 0)
    answers = [answer(s, {}, metrics={"dice": 0.5 + 0.1 * i}) for i, s in enumerate(SITES)]
    answers[3].metrics = metrics
    controller._ask_models = lambda *args, **kwargs: answers
    rejected = {"site-4": "NaN in w"}
    per_site = controller._evaluate(0, state0, rejected)
    assert set(per_site) == {"site-1", "site-2", "site-3"}
    assert rejected["site-4"].startswith("NaN in w; evaluation: ")  # both reasons kept


GLOBAL_CASES = [
    (
        "NaN global metric",
        {"dice": 0.5, "global_dice": float("nan")},
        "metric global_dice is nan, expected a finite number in [0, 1]",
    ),
    (
        "global metric above 1",
        {"dice": 0.5, "global_dice": 1.5},
        "metric global_dice is 1.5, expected a finite number in [0, 1]",
    ),
    (
        "string global metric",
        {"dice": 0.5, "global_dice": "0.9"},
        "metric global_dice is '0.9', expected a finite number in [0, 1]",
    ),
    (
        "other global metric out of range",
        {"dice": 0.5, "global_dice": 0.4, "global_dice_se": -1},
        "metric global_dice_se is -1, expected a finite number in [0, 1]",
    ),
    ("no global metric", {"dice": 0.5, "global_dice_se": 0.1}, "no global_dice"),
]


@pytest.mark.parametrize("case, metrics, problem", GLOBAL_CASES, ids=[c[0] for c in GLOBAL_CASES])
def test_a_personalised_sites_global_model_scores_are_checked_like_its_own(case, metrics, problem):
    """Ditto asks its federation's sites for the global model's scores too and checks them like the main ones; the
    held-out site (exclude_sites) is asked for neither and scores the global model alone."""
    controller = make(DittoController, exclude_sites=["site-4"])
    state0 = initial_state(controller.model_spec(), 0)
    answers = [answer(s, {}, metrics={"dice": 0.5, "global_dice": 0.4}) for s in SITES[:3]]
    answers.append(answer("site-4", {}, metrics={"dice": 0.3}))
    answers[1].metrics = metrics
    sent = []
    controller._ask_models = lambda round_num, task, model, targets, state: sent.append(model.meta) or answers
    rejected = {}
    per_site = controller._evaluate(0, state0, rejected)
    assert sent[0][protocol.SCORE_GLOBAL] is True and sent[0][protocol.HELD_OUT] == ["site-4"]
    assert set(per_site) == {"site-1", "site-3", "site-4"} and rejected == {"site-2": f"evaluation: {problem}"}
    assert per_site["site-1"] == {"dice": 0.5, "global_dice": 0.4} and per_site["site-4"] == {"dice": 0.3}


def test_global_scores_are_asked_of_personalised_methods_only_and_held_out_sites_need_a_global_model():
    assert FedBNController(**{**SEG, "model_norm": "batch"}).scores_global and make(DittoController).scores_global
    controller = make()  # FedAvg scores the global model itself: a site's global_ copy is not recorded
    answers = [answer(s, {}, metrics={"dice": 0.5, "global_dice": 0.1}) for s in SITES]
    sent = []
    controller._ask_models = lambda round_num, task, model, targets, state: sent.append(model.meta) or answers
    per_site = controller._evaluate(0, initial_state(controller.model_spec(), 0), {})
    assert protocol.SCORE_GLOBAL not in sent[0] and protocol.HELD_OUT not in sent[0]
    assert all(m == {"dice": 0.5} for m in per_site.values()) and not make(SoloController).scores_global
    with pytest.raises(ValueError, match="solo has no global model to score held-out sites with"):
        SoloController(**SEG, exclude_sites=["site-2"])


def test_a_huge_but_finite_cross_site_model_is_never_sent_to_the_other_sites():
    # keys, shapes and finiteness pass at 1e30: the model is bounded like an update (max_update_ratio) before it
    # reaches the other sites
    controller = make(DittoController, cross_site_eval=True)
    state0 = initial_state(controller.model_spec(), 0)
    models = [answer(s, honest_params(state0, i)) for i, s in enumerate(SITES)]
    models[3].params = {k: (v + 1e30 if v.dtype.kind == "f" else v) for k, v in models[3].params.items()}
    controller._ask_models = lambda *args: models
    sent = []
    controller.ask = lambda round_num, task, model, targets: (
        sent.append(model.params) or [answer(s, {}, metrics={"dice": 0.5}) for s in targets]
    )
    record = controller._cross_site(2, state0)
    assert set(record["matrix"]) == {"site-1", "site-2", "site-3"} and len(sent) == 3
    assert "cross-site model: update norm" in record["rejected"]["site-4"]
    assert all(np.abs(v).max() < 1e3 for params in sent for v in params.values() if v.dtype.kind == "f")


def test_a_site_that_keeps_its_model_at_home_is_recorded_as_declining_not_failing():
    controller = make(DittoController, cross_site_eval=True)
    state0 = initial_state(controller.model_spec(), 0)
    models = [answer(s, honest_params(state0, i)) for i, s in enumerate(SITES) if s != "site-2"]

    def ask_models(*args):  # site-2's FAIRFL_SHARE_OWN_MODEL is 0: it answers TASK_UNSUPPORTED
        controller.failed.update({"site-2": ReturnCode.TASK_UNSUPPORTED, "site-4": ReturnCode.EXECUTION_EXCEPTION})
        return [m for m in models if m.meta["client_name"] != "site-4"]

    controller._ask_models = ask_models
    controller.ask = lambda round_num, task, model, targets: [answer(s, {}, metrics={"dice": 0.5}) for s in targets]
    record = controller._cross_site(2, state0)
    assert record["declined"] == ["site-2"] and record["failed"] == {"site-4": ReturnCode.EXECUTION_EXCEPTION}
    assert set(record["matrix"]) == {"site-1", "site-3"} and "site-2" in record["matrix"]["site-1"]


def test_an_aggregate_that_is_not_finite_never_becomes_the_global_model():
    controller = make()
    state0 = initial_state(controller.model_spec(), 0)
    overflowed = {k: np.full_like(v, np.inf) if v.dtype.kind == "f" else v for k, v in state0.items()}
    extras = {}
    assert controller._usable_aggregate(3, overflowed, state0, extras) is state0
    assert extras["global_model_kept"].startswith("Inf in ")
    assert controller._usable_aggregate(3, dict(state0), state0, {}) == state0


def test_a_trimmed_mean_says_what_it_trimmed_and_is_refused_where_it_cannot_trim():
    controller = make(robust_aggregation="trimmed_mean")
    assert controller._robust_record(4) == {"robust": {"mode": "trimmed_mean", "sites": 4, "trimmed_per_side": 1}}
    assert controller._robust_record(10)["robust"]["trimmed_per_side"] == 2
    assert controller._robust_record(2)["robust"]["trimmed_per_side"] == 0  # a round left with 2: the plain mean
    assert make(robust_aggregation="median")._robust_record(4) == {"robust": {"mode": "median", "sites": 4}}
    assert make()._robust_record(4) == {}
    two = make(robust_aggregation="trimmed_mean")
    two.sample_clients = lambda: ["site-1", "site-2"]
    with pytest.raises(ValueError, match="trimmed_mean needs at least 3 training sites"):
        two._run_rounds()


def test_cross_site_evaluation_screens_the_sites_models_and_their_scores(tmp_path):
    """Ditto's cross-site evaluation: each federation site's model is screened like a trained one (a NaN or a missing
    tensor rejects it), each accepted one is sent to every site as it is (held-out site included), and a bad score
    rejects that one cell; what is left is the matrix. Methods without models of the sites' own refuse it."""
    controller = make(DittoController, exclude_sites=["site-4"], cross_site_eval=True)
    controller.trainers = SITES[:3]
    state0 = initial_state(controller.model_spec(), 0)
    models = [answer(s, honest_params(state0, i)) for i, s in enumerate(SITES[:3])]
    next(v for v in models[1].params.values() if v.dtype.kind == "f").flat[0] = np.nan
    models[2].params.popitem()
    asked = []
    controller._ask_models = lambda round_num, task, model, targets, state: asked.append(model.meta) or models

    def ask(round_num, task, model, targets):
        asked.append(model.meta)
        scores = [answer(s, {}, metrics={"dice": 0.1 * (i + 1)}) for i, s in enumerate(targets)]
        scores[1].metrics = {"dice": 2.0}
        return scores

    controller.ask = ask
    record = controller._cross_site(2, state0)
    assert asked[0][protocol.SUBMIT_MODEL] is True and len(asked) == 2  # one model accepted, sent once
    assert asked[1][protocol.HELD_OUT] == SITES  # every site scores it as it is
    assert record["matrix"] == {"site-1": {"site-1": 0.1, "site-3": 0.30000000000000004, "site-4": 0.4}}
    assert "NaN" in record["rejected"]["site-2"] and "cross-site model" in record["rejected"]["site-2"]
    assert "missing keys" in record["rejected"]["site-3"]
    assert record["rejected"]["site-2"].endswith(
        "scoring site-1's model: metric dice is 2.0, expected a finite number in [0, 1]"
    )
    refused = make(cross_site_eval=True)
    refused.sample_clients = lambda: list(SITES)
    with pytest.raises(ValueError, match="cross_site_eval: fedavg scores every site with the one global model"):
        refused._run_rounds()
    with pytest.raises(ValueError, match="cross_site_eval must be true or false"):
        make(cross_site_eval="yes")


def reports_round(controller, state0, key, values, round_num=0):
    answers = honest_answers(state0)
    for a, value in zip(answers, values):
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
    for layer, weights in extras["layer_weights"].items():
        assert set(weights) == {"site-1", "site-2", "site-4"} and sum(weights.values()) == pytest.approx(1.0)
        assert weights["site-1"] == pytest.approx(0.5)  # 1 - CKA = 1 against 0.01: capped at max_share


def test_a_failed_task_is_recorded_as_failed_not_absent():
    controller = make()
    controller._current_failed_clients = set()
    assert controller._accept_train_result("site-2", make_reply(ReturnCode.EXECUTION_EXCEPTION), None) is False
    assert controller.failed == {"site-2": "EXECUTION_EXCEPTION"}
    controller._record_absent(
        0, "train", SITES, [FLModel(params={}, meta={"client_name": s}) for s in ("site-1", "site-3")]
    )
    assert controller.absent == ["site-4"]


def test_an_error_inside_the_server_leaves_results_json_with_stopped(tmp_path):
    controller = make(tmp_path=tmp_path)

    def broken():
        raise RuntimeError("disk on fire")

    controller._run_rounds = broken
    with pytest.raises(RuntimeError):
        controller.run()
    results = json.loads((tmp_path / "results.json").read_text())
    assert "disk on fire" in results["stopped"] and results["method"] == "fedavg"


# ---------------------------------------------------------------- the plain functions
def test_number_samples_and_metrics_problems():
    assert number_problem(np.float32(0.5), "x") is None and number_problem(np.int64(3), "x") is None
    for bad in (None, True, np.bool_(True), "0.5", float("nan"), float("inf"), -1.0, [0.5], {"v": 0.5}):
        assert number_problem(bad, "x") is not None
    assert samples_problem(10, None, 100) is None and samples_problem(np.int64(10), 20, 100) is None
    assert "first round" in samples_problem(30, 20, 100) and "max_samples" in samples_problem(101, None, 100)
    assert metrics_problem(None) is None and metrics_problem({"a": 1.0, "b": 2}) is None
    assert "x" * 80 not in metrics_problem({"m": "x" * 10_000})  # a reason stays short
    state, problem = tensor_state({"w": np.zeros(3, dtype=object)})
    assert state is None or problem is None  # an object array of numbers may convert; strings never do
    assert tensor_state({"w": np.array(["a"])})[1] and tensor_state([1, 2])[1] and tensor_state({1: np.zeros(1)})[1]


def test_norm_outliers_uses_the_lower_median():
    assert norm_outliers({"a": 1.0, "b": 1e6}, 10) == {"b": norm_outliers({"a": 1.0, "b": 1e6}, 10)["b"]}
    assert norm_outliers({"a": 1.0, "b": 3.0, "c": 9.0}, 10) == {}
    assert norm_outliers({"a": 1.0, "b": 1e6}, 0) == {} and norm_outliers({"a": 0.0, "b": 1.0, "c": 0.0}, 10) == {}


def test_cap_shares():
    assert cap_shares({"a": 0.4, "b": 0.3, "c": 0.3}, 0.5) == {"a": 0.4, "b": 0.3, "c": 0.3}  # below: unchanged
    assert cap_shares({"a": 0.9, "b": 0.1}, 0.5) == {"a": 0.9, "b": 0.1}  # two sites: no majority to protect
    capped = cap_shares({"a": 97.0, "b": 2.0, "c": 1.0}, 0.5)
    assert capped == pytest.approx({"a": 50.0, "b": 100 / 3, "c": 50 / 3})  # total kept, the rest in proportion
    capped = cap_shares({"a": 0.45, "b": 0.45, "c": 0.05, "d": 0.05}, 0.3)
    assert max(capped.values()) <= 0.3 + 1e-12 and sum(capped.values()) == pytest.approx(1.0)
    assert cap_shares({"a": 1.0, "b": 0.0, "c": 0.0}, 0.2) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})


def test_robust_average_resists_one_site():
    honest = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)} for _ in range(4)]
    hostile = {"w": torch.tensor([1e9, -1e9]), "n": torch.tensor(7)}
    states = honest[:2] + [hostile] + honest[2:]
    for mode in ("median", "trimmed_mean"):
        out = robust_average(states, mode, 0.2)
        assert torch.equal(out["w"], torch.tensor([1.0, 2.0])) and int(out["n"]) == 3
    out = robust_average([{"w": torch.tensor([float(v)])} for v in (1, 2, 3, 10)], "median")
    assert float(out["w"]) == 2.5
    out = robust_average([{"w": torch.tensor([float(v)])} for v in (1, 2, 3, 10)], "trimmed_mean", 0.25)
    assert float(out["w"]) == 2.5
    assert (
        float(robust_average([{"w": torch.tensor([float(v)])} for v in (1, 2, 3, 10)], "trimmed_mean", 0.0)["w"]) == 2.5
    )  # floor(0.2 * 4) = 0, but a trimmed mean of 3 or more values drops at least one at each end
    assert float(robust_average([{"w": torch.tensor([float(v)])} for v in (1, 10)], "trimmed_mean")["w"]) == 5.5
    with pytest.raises(ValueError):
        robust_average(states, "mean")


def test_robust_aggregation_is_selectable_and_refused_where_it_has_no_meaning():
    controller = make(robust_aggregation="median")
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected, _ = train_round(controller, state0, hostile(state0, 2, params=huge_update))
    new, _ = controller.aggregate(0, state0, updates, rejected)
    expected = robust_average([updates[s].state for s in sorted(updates)], "median")
    assert all(np.array_equal(new[k], expected[k].numpy()) for k in new)
    assert controller.config()["robust_aggregation"] == "median"
    with pytest.raises(ValueError, match="robust_aggregation"):
        QFedAvgController(robust_aggregation="median", **SEG)
    for bad in (
        {"robust_aggregation": "mean"},
        {"trim_fraction": 0.5},
        {"max_share": 0},
        {"max_samples": 0},
        {"max_update_ratio": -1},
    ):
        with pytest.raises(ValueError):
            FairRoundController(**SEG, **bad)


# ---------------------------------------------------------------- files
def test_results_json_writes_null_for_non_finite_numbers(tmp_path):
    log = ResultsLog(
        str(tmp_path / "results.json"),
        method="fedavg",
        task="segmentation",
        metric="dice",
        seed=0,
        sites=["site-1"],
        config={},
    )
    log.add_round(0, 1.0, None, weights={"site-1": float("nan")}, gamma=np.float64("inf"))
    text = (tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    record = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))["rounds"][0]
    assert record["weights"] == {"site-1": None} and record["gamma"] is None
    assert json_safe({"a": [np.float32(1.5), (float("-inf"),)]}) == {"a": [1.5, [None]]}


def test_atomic_writes_keep_the_old_file_and_no_temporary_on_error(tmp_path):
    path = tmp_path / "global_model.pt"
    save_atomic({"w": torch.ones(2)}, str(path))

    def half_then_fail(f):
        f.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomic(str(path), half_then_fail)
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(2))
    assert os.listdir(tmp_path) == ["global_model.pt"]
    state = tmp_path / "method_state.json"
    write_json_atomic(str(state), {"round": 1})
    with pytest.raises(TypeError):  # not JSON: the old file stays
        write_json_atomic(str(state), {"round": {2}})
    assert json.loads(state.read_text()) == {"round": 1}
    assert sorted(os.listdir(tmp_path)) == ["global_model.pt", "method_state.json"]


class ServerEngine:
    """What the round loop uses of NVFlare's server engine: new contexts, and events delivered to the job's
    components as its run manager delivers them (here NVFlare's own TensorBoard receiver, writing into `run_dir`)."""

    def __init__(self, run_dir, components):
        from nvflare.apis.fl_context import FLContextManager
        from nvflare.apis.workspace import Workspace

        for folder in ("startup", "local"):  # what NVFlare checks a workspace by
            (run_dir.parent / folder).mkdir(exist_ok=True)
        self.components, self.workspace = components, Workspace(str(run_dir.parent), "server")
        self.contexts = FLContextManager(engine=self, identity_name="server", job_id=run_dir.name)

    def new_context(self):
        return self.contexts.new_context()

    def get_workspace(self):
        return self.workspace

    def fire_event(self, event_type, fl_ctx):
        from nvflare.private.event import fire_event

        fire_event(event_type, self.components, fl_ctx)


def run_rounds(tmp_path, train, validate, **kwargs):
    """The controller's real round loop (`run`) with the sending replaced: `train(round)` and `validate(round)`
    give the answers of each task. NVFlare's TensorBoard receiver records what the loop tracks."""
    from nvflare.apis.event_type import EventType
    from nvflare.apis.signal import Signal
    from nvflare.app_opt.tracking.tb.tb_receiver import TBAnalyticsReceiver

    tmp_path.mkdir(parents=True, exist_ok=True)
    controller = make(tmp_path=tmp_path, **{"num_rounds": 2, "eval_every": 1, **kwargs})
    controller.sample_clients = lambda: list(SITES)
    controller.abort_signal, controller.fl_ctx = Signal(), None
    controller.engine = ServerEngine(tmp_path, [TBAnalyticsReceiver(tb_folder="tb_events")])
    answers = {protocol.TASK_TRAIN: train, protocol.TASK_VALIDATE: validate}
    controller._ask_models = lambda round_num, task_name, *args: answers[task_name](round_num)
    with controller.engine.new_context() as fl_ctx:
        controller.engine.fire_event(EventType.START_RUN, fl_ctx)
    controller.run()
    with controller.engine.new_context() as fl_ctx:
        controller.engine.fire_event(EventType.END_RUN, fl_ctx)
    return json.loads((tmp_path / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))


def test_the_round_loop_goes_on_past_a_hostile_site_and_stops_with_a_reason_when_no_evaluation_is_usable(tmp_path):
    state0 = initial_state(make().model_spec(), 0)

    def train(round_num):
        answers = hostile(state0, 2, metrics={"train_loss": float("nan")}, num_samples=10**18)
        return [answers[0], answers[1], answers[2], answer("site-4", honest_params(state0, 3), num_samples=23)]

    def validate(round_num):
        return [answer(s, {}, metrics={"dice": 0.5 if s != "site-3" else "0.9"}) for s in SITES]

    results = run_rounds(tmp_path / "a", train, validate)
    assert [r["round"] for r in results["rounds"]] == [0, 1] and "stopped" not in results
    for record in results["rounds"]:
        assert "train_loss" in record["rejected"]["site-3"] and "evaluation" in record["rejected"]["site-3"]
        assert set(record["weights"]) == {"site-1", "site-2", "site-4"} and record["train"]["site-3"] == {}
    assert set(results["final"]["per_site"]) == {"site-1", "site-2", "site-4"}
    # NVFlare's TensorBoard receiver shows the accepted numbers per site and round; nothing of site-3 (its NaN loss,
    # its string Dice), whose folder is never made
    check_tracking(str(tmp_path / "a"), results, SITES)
    assert tensorboard_scalars(str(tmp_path / "a"), "site-1")["dice"] == {0: 0.5, 1: 0.5}
    # no site's evaluation usable at the end: the run says so instead of ending without a word
    results = run_rounds(
        tmp_path / "b", train, lambda r: [answer(s, {}, metrics={"dice": float("nan")}) for s in SITES], num_rounds=1
    )
    assert results["final"] is None and "no site's evaluation could be used" in results["stopped"]


def test_every_metric_name_the_server_accepts_is_one_mlflow_accepts_and_the_real_receiver_keeps_every_site():
    # the rule must agree with MLflow's own validator (a name it refuses makes NVFlare's MLflow receiver drop the
    # records of every site after the one that sent it): tried on names built from MLflow's alphabet and the
    # path pieces that normalise differently
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_metric_name

    pieces = ["a", "loss", ".", "..", "/", "//", " ", "-", "_", ":", "x.y", "a/b"]
    rng = np.random.default_rng(0)
    names = {"".join(rng.choice(pieces, size=rng.integers(1, 5))) for _ in range(3000)}
    accepted = 0
    for name in sorted(names):
        ours = metrics_problem({name: 0.5}) is None
        try:
            _validate_metric_name(name)
            theirs = True
        except MlflowException:
            theirs = False
        assert ours <= theirs, f"the server accepts {name!r}, MLflow refuses it"
        accepted += ours
    assert accepted > 100  # the rule is not simply refusing everything
