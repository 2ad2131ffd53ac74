"""Hostile site answers: every one is rejected for the round (naming the site and the field) or bounded, the round
goes on with the others, and the server never raises. Through the controllers' real screening and aggregation,
without the simulator (tests/integration/test_simulator_hostile_sites.py carries hostile sites through real runs).
The fields only one method reads: test_method_answer_checks.py; the plain checks and robust aggregation:
test_site_check_functions.py; what the round loop records: test_round_loop_records.py."""

import json

import numpy as np
import pytest
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import make_reply
from nvflare.app_common.abstract.fl_model import FLModel

from fairfl.flare import protocol
from fairfl.methods.ditto.controller import DittoController
from fairfl.methods.fedbn.controller import FedBNController
from fairfl.methods.solo.controller import SoloController
from fairfl.models import initial_state

from site_answers import SEG, SITES, answer, honest_answers, honest_params, hostile, huge_update, make, train_round


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
    per_site, _ = controller._evaluate(0, state0, rejected)
    assert set(per_site) == {"site-1", "site-2", "site-3"}
    assert rejected["site-4"].startswith("NaN in w; evaluation: ")  # both reasons kept


def test_a_hostile_test_influence_rejects_that_sites_evaluation_and_an_honest_one_is_kept():
    controller = make()
    state0 = initial_state(controller.model_spec(), 0)
    answers = [answer(s, {}, metrics={"dice": 0.5 + 0.1 * i}) for i, s in enumerate(SITES)]
    honest = {"dice": {"cases": "0123456789abcdef", "values": [0.01, -0.01]}}
    answers[0].meta[protocol.TEST_INFLUENCE] = honest
    answers[1].meta[protocol.TEST_INFLUENCE] = {"dice": {"cases": "0123456789abcdef", "values": [float("nan")]}}
    controller._ask_models = lambda *args, **kwargs: answers
    rejected = {}
    per_site, influence = controller._evaluate(0, state0, rejected)
    assert set(per_site) == {"site-1", "site-3", "site-4"} and influence == {"site-1": honest}
    assert "test_influence" in rejected["site-2"]


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
    per_site, _ = controller._evaluate(0, state0, rejected)
    assert sent[0][protocol.SCORE_GLOBAL] is True and sent[0][protocol.HELD_OUT] == ["site-4"]
    assert set(per_site) == {"site-1", "site-3", "site-4"} and rejected == {"site-2": f"evaluation: {problem}"}
    assert per_site["site-1"] == {"dice": 0.5, "global_dice": 0.4} and per_site["site-4"] == {"dice": 0.3}


def test_global_scores_are_asked_of_personalised_methods_only_and_held_out_sites_need_a_global_model():
    assert FedBNController(**{**SEG, "model_norm": "batch"}).scores_global and make(DittoController).scores_global
    controller = make()  # FedAvg scores the global model itself: a site's global_ copy is not recorded
    answers = [answer(s, {}, metrics={"dice": 0.5, "global_dice": 0.1}) for s in SITES]
    sent = []
    controller._ask_models = lambda round_num, task, model, targets, state: sent.append(model.meta) or answers
    per_site, _ = controller._evaluate(0, initial_state(controller.model_spec(), 0), {})
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


def test_a_failed_task_is_recorded_as_failed_not_absent():
    controller = make()
    controller._current_failed_clients = set()
    assert controller._accept_train_result("site-2", make_reply(ReturnCode.EXECUTION_EXCEPTION), None) is False
    assert controller.failed == {"site-2": "EXECUTION_EXCEPTION"}
    controller._record_absent(
        0, "train", SITES, [FLModel(params={}, meta={"client_name": s}) for s in ("site-1", "site-3")]
    )
    assert controller.absent == ["site-4"]
