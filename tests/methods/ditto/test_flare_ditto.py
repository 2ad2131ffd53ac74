"""Ditto (Li et al., ICML 2021): the personal objective against a hand computation, the controller's settings, and
the executor's personal model (kept across rounds in the site's state dir, used for evaluation) on tiny data."""

import copy
import math
import os

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask, check_meta
from fairfl.methods.ditto.client import train_personal
from fairfl.methods.ditto.controller import DittoController
from fairfl.methods.ditto.protocol import DITTO_LAMBDA, PERSONAL_MODEL_FILE, PREVIOUS_PERSONAL_MODEL_FILE
from fairfl.methods.fedprox.client import with_proximal_term
from fairfl.models import build_model, initial_state, load_numpy_state, state_to_numpy
from fairfl.training import TrainSettings, train_local

import helpers
from helpers import trained_weights

TINY = {"model_channels": [8, 16, 32], "model_strides": [2, 2], "num_rounds": 2}


# ------------------------------------------------------------------------------------------- the personal objective
def linear_problem():
    """A least-squares problem on a 3 -> 1 linear model: v (personal) and w (sent) differ, so the proximal term
    matters; with lam 4 it flips the sign of some gradient components (Adam's first step sees only signs)."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 3, generator=generator), torch.randn(6, 1, generator=generator)
    v, w = torch.nn.Linear(3, 1, bias=False), torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        v.weight.copy_(torch.tensor([[0.5, -1.0, 2.0]]))
        w.weight.copy_(torch.tensor([[-0.5, 1.0, 1.5]]))
    return x, y, v, w


def mse(prediction, target):
    return ((prediction - target) ** 2).mean()


def hand_gradient(x, y, v, w, lam):
    """d/dv [ mean((x v^T - y)^2) + lam / 2 ||v - w||^2 ] = 2 / N x^T (x v^T - y) + lam (v - w)."""
    residual = x @ v.T - y
    return (2.0 / len(x)) * (residual.T @ x) + lam * (v - w)


def test_personal_objective_and_gradient_match_the_hand_computation():
    x, y, v, w = linear_problem()
    lam = 4.0
    objective = with_proximal_term(mse, v, lam, reference=w)
    loss = objective(v(x), y)
    loss.backward()
    expected = mse(x @ v.weight.T, y) + lam / 2 * ((v.weight - w.weight) ** 2).sum()
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    hand = hand_gradient(x, y, v.weight.detach(), w.weight.detach(), lam)
    torch.testing.assert_close(v.weight.grad, hand, rtol=1e-5, atol=1e-6)
    plain = hand_gradient(x, y, v.weight.detach(), w.weight.detach(), 0.0)
    assert (torch.sign(hand) != torch.sign(plain)).any()  # the proximal term changes the step's direction


def test_personal_steps_are_adam_on_the_hand_gradient_and_leave_the_sent_model_alone():
    x, y, v, w = linear_problem()
    lam, lr, steps = 4.0, 0.05, 3
    w_before = w.weight.detach().clone()
    theta, m, s = v.weight.detach().clone(), torch.zeros(1, 3), torch.zeros(1, 3)
    beta1, beta2, eps = 0.9, 0.999, 1e-8  # torch.optim.Adam's defaults, as train_local uses them
    for t in range(1, steps + 1):
        g = hand_gradient(x, y, theta, w_before, lam)
        m, s = beta1 * m + (1 - beta1) * g, beta2 * s + (1 - beta2) * g * g
        theta = theta - lr * (m / (1 - beta1**t)) / ((s / (1 - beta2**t)).sqrt() + eps)
    settings = TrainSettings(lr=lr, weight_decay=0.0, local_steps=steps)
    stats = train_personal(v, w, [{"image": x, "label": y}], settings, torch.device("cpu"), mse, lam)
    assert stats["steps"] == steps
    torch.testing.assert_close(v.weight.detach(), theta, rtol=1e-5, atol=1e-6)
    assert torch.equal(w.weight.detach(), w_before)  # w_t is read, never trained


def test_lambda_zero_is_plain_local_training():
    x, y, v, w = linear_problem()
    plain = copy.deepcopy(v)
    settings = TrainSettings(lr=0.05, weight_decay=1e-4, local_steps=4)
    batches = [{"image": x, "label": y}]
    train_personal(v, w, batches, settings, torch.device("cpu"), mse, 0.0)
    train_local(plain, batches, settings, torch.device("cpu"), loss_fn=mse)
    assert torch.equal(v.weight, plain.weight)
    with_prox = copy.deepcopy(plain)
    train_personal(with_prox, w, batches, settings, torch.device("cpu"), mse, 1.0)
    assert not torch.allclose(with_prox.weight, v.weight)  # lambda > 0 does move it elsewhere


# ------------------------------------------------------------------------------------------------ the controller
def test_controller_settings_and_refusal():
    controller = DittoController(**TINY)
    assert controller.method == "ditto" and controller.evaluate == protocol.FROM_PERSONAL
    assert controller.train_meta(0) == {DITTO_LAMBDA: 0.1}
    assert controller.config()["ditto_lambda"] == 0.1
    assert DittoController(ditto_lambda=0, **TINY).train_meta(3) == {DITTO_LAMBDA: 0.0}
    assert DittoController(dataset="skin").task == "classification"
    with pytest.raises(ValueError, match="ditto_lambda"):
        DittoController(ditto_lambda=-0.1)


# -------------------------------------------------------------------------------------------------- the executor
@pytest.fixture
def setup(cache_dir):
    controller = DittoController(**TINY)
    meta = {
        protocol.MODEL_SPEC: controller.model_spec(),
        protocol.DATASET: "prostate",
        protocol.TASK: "segmentation",
        protocol.NUM_SITES: 3,
        protocol.DATA_SEED: 0,
        protocol.START_FROM: protocol.FROM_GLOBAL,
    }
    executor = helpers.tiny_executor()
    return controller, meta, executor


def train(executor, meta, params, state_dir, round_num, lam=None):
    extra = {} if lam is None else {DITTO_LAMBDA: lam}
    task = FLModel(params_type=ParamsType.FULL, params=params, current_round=round_num, meta={**meta, **extra})
    return executor._train(SiteTask.of("site-2", task), str(state_dir))


def personal_state(state_dir):
    return torch.load(os.path.join(state_dir, PERSONAL_MODEL_FILE))["model"]


def test_personal_model_persists_across_rounds_and_the_returned_model_is_fedavgs(setup, tmp_path):
    controller, meta, executor = setup
    spec = controller.model_spec()
    w0, w1 = initial_state(spec, 0), initial_state(spec, 1)
    ditto_dir, plain_dir = tmp_path / "ditto", tmp_path / "plain"

    # round 0: the returned (global) copy is exactly FedAvg's local update; the personal model is saved
    ditto = train(executor, meta, w0, ditto_dir, 0, lam=0.0)
    plain = train(executor, meta, w0, plain_dir, 0)
    assert all(np.array_equal(ditto.params[k], plain.params[k]) for k in plain.params)
    assert not os.path.exists(plain_dir / PERSONAL_MODEL_FILE)
    assert math.isfinite(ditto.metrics["personal_train_loss"]) and ditto.metrics["personal_train_seconds"] > 0
    p0 = personal_state(ditto_dir)
    # with lambda 0 and v_0 = w_0, the personal step is the same training as the global one
    assert all(torch.allclose(p0[k], torch.as_tensor(trained_weights(plain, w0)[k])) for k in p0)

    # round 1, sent w1: the personal model continues from its round-0 self, not from w1. With lambda 0 it is
    # then exactly "train p0 for round 1", which a plain site sent p0 returns.
    ditto = train(executor, meta, w1, ditto_dir, 1, lam=0.0)
    from_p0 = train(executor, meta, state_to_numpy(p0), tmp_path / "from_p0", 1)
    from_w1 = train(executor, meta, w1, tmp_path / "from_w1", 1)
    p1 = personal_state(ditto_dir)
    assert all(
        torch.allclose(p1[k], torch.as_tensor(trained_weights(from_p0, state_to_numpy(p0))[k]), atol=1e-6) for k in p1
    )
    assert not all(torch.allclose(p1[k], torch.as_tensor(trained_weights(from_w1, w1)[k]), atol=1e-3) for k in p1)
    assert all(np.array_equal(ditto.params[k], from_w1.params[k]) for k in from_w1.params)

    # a resumed run that repeats round 1 (the server died before recording it) starts again from the round-0
    # personal model, kept as the previous one, not from the first try's result: the repeat gives the same model
    assert torch.load(ditto_dir / PREVIOUS_PERSONAL_MODEL_FILE)["round"] == 0
    train(executor, meta, w1, ditto_dir, 1, lam=0.0)
    assert torch.load(ditto_dir / PERSONAL_MODEL_FILE)["round"] == 1
    assert torch.load(ditto_dir / PREVIOUS_PERSONAL_MODEL_FILE)["round"] == 0
    assert all(torch.allclose(personal_state(ditto_dir)[k], p1[k], atol=1e-6) for k in p1)

    # a lambda > 0 holds the personal model to the sent w1: it ends nearer to w1 than the lambda-0 one
    def distance(state):
        return sum(
            float(((state[k].float() - torch.as_tensor(w1[k]).float()) ** 2).sum())
            for k in state
            if state[k].is_floating_point()
        )

    strong = tmp_path / "strong"
    strong.mkdir()
    torch.save({"round": 0, "model": p0}, strong / PERSONAL_MODEL_FILE)
    train(executor, meta, w1, strong, 1, lam=100.0)
    assert distance(personal_state(strong)) < distance(p1)


def test_evaluation_uses_the_personal_model_and_the_sent_one_before_there_is_one(setup, tmp_path):
    controller, meta, executor = setup
    spec = controller.model_spec()
    w0 = initial_state(spec, 0)
    train(executor, meta, w0, tmp_path, 0, lam=0.1)
    task = FLModel(params_type=ParamsType.FULL, params=w0, meta={**meta, protocol.EVALUATE: protocol.FROM_PERSONAL})
    scores = executor._validate(SiteTask.of("site-2", task), str(tmp_path)).metrics
    personal = build_model(spec)
    personal.load_state_dict(personal_state(tmp_path))
    read = SiteTask.of("site-2", task)
    loader = executor._loader(read, "testing", train=False, seed=executor.seed)
    expected = executor._evaluate(personal, loader, read)["dice"]
    on_global = executor._evaluate(load_numpy_state(build_model(spec), w0), loader, read)["dice"]
    assert scores["personal_model"] == 1.0 and scores["dice"] == pytest.approx(expected, abs=1e-9)
    assert scores["dice"] != pytest.approx(on_global, abs=1e-6)  # not the model sent
    # a site that never trained (exclude_sites) is scored with the model sent: Ditto's v_k starts as w
    fresh = executor._validate(SiteTask.of("site-2", task), str(tmp_path / "never_trained")).metrics
    assert fresh["personal_model"] == 0.0 and fresh["dice"] == pytest.approx(on_global, abs=1e-9)
    # asked for the global model's score too: the same task also scores the model sent as it is, the personal
    # model's scores unchanged
    both = executor._validate(
        SiteTask.of("site-2", with_meta(task, {protocol.SCORE_GLOBAL: True})), str(tmp_path)
    ).metrics
    sent = executor._evaluate(load_numpy_state(build_model(spec), w0), loader, read)
    assert both["dice"] == pytest.approx(expected, abs=1e-9) and both["personal_model"] == 1.0
    assert {k: both["global_" + k] for k in sent} == pytest.approx(sent) and sent["dice"] == on_global
    # a held-out site is scored with the model sent, never with a personal model it may hold (a stale one here)
    held_out = {protocol.SCORE_GLOBAL: True, protocol.HELD_OUT: ["site-2"]}
    alone = executor._validate(SiteTask.of("site-2", with_meta(task, held_out)), str(tmp_path)).metrics
    assert alone["dice"] == pytest.approx(on_global, abs=1e-9) and not {"personal_model", "global_dice"} & set(alone)
    # cross-site evaluation: the site hands over the model it is scored with, its personal one, unscored
    submitted = executor._validate(SiteTask.of("site-2", with_meta(task, {protocol.SUBMIT_MODEL: True})), str(tmp_path))
    assert not submitted.metrics and set(submitted.params) == set(personal_state(tmp_path))
    assert all(np.array_equal(submitted.params[k], v.numpy()) for k, v in personal_state(tmp_path).items())
    for bad in ("site-2", [3]):  # the server's list is checked: a bad one is bad task data naming the field
        with pytest.raises(DataError, match="held_out is not a list of site names"):
            check_meta("site-2", {**task.meta, protocol.HELD_OUT: bad})


def with_meta(task, extra):
    return FLModel(params_type=task.params_type, params=task.params, meta={**task.meta, **extra})


@pytest.mark.parametrize("damage", ["garbage", "bare_state_dict", "other_network", "nan"])
def test_a_broken_personal_model_is_an_error_naming_site_and_file(setup, tmp_path, damage):
    controller, meta, executor = setup
    path = tmp_path / PERSONAL_MODEL_FILE
    if damage == "garbage":
        path.write_bytes(b"not a checkpoint")
    elif damage == "bare_state_dict":
        torch.save(build_model(controller.model_spec()).state_dict(), path)
    elif damage == "other_network":
        torch.save(
            {"round": 0, "model": build_model({**controller.model_spec(), "channels": [4, 8, 16]}).state_dict()}, path
        )
    else:
        state = build_model(controller.model_spec()).state_dict()
        next(v for v in state.values() if v.is_floating_point()).fill_(float("nan"))
        torch.save({"round": 0, "model": state}, path)
    task = FLModel(
        params_type=ParamsType.FULL,
        params=initial_state(controller.model_spec(), 0),
        meta={**meta, protocol.EVALUATE: protocol.FROM_PERSONAL},
    )
    with pytest.raises(DataError) as error:
        executor._validate(SiteTask.of("site-2", task), str(tmp_path))
    assert "[site-2]" in str(error.value) and str(path) in str(error.value)
    assert {
        "garbage": "unreadable",
        "bare_state_dict": "not a Ditto personal model",
        "other_network": "shape mismatch",
        "nan": "NaN",
    }[damage] in str(error.value)


@pytest.mark.parametrize("dataset", ["skin", "fundus"])
def test_personal_step_and_evaluation_on_classification_and_multiclass_segmentation(cache_dir, tmp_path, dataset):
    controller = DittoController(
        dataset=dataset, model_channels=[4, 8] if dataset == "skin" else [8, 16, 32], model_strides=[2, 2]
    )
    meta = {
        protocol.MODEL_SPEC: controller.model_spec(),
        protocol.DATASET: dataset,
        protocol.TASK: controller.task,
        protocol.NUM_SITES: 3,
        protocol.DATA_SEED: 0,
        protocol.START_FROM: protocol.FROM_GLOBAL,
        **controller.train_meta(0),
    }
    executor = FairflExecutor(image_size=32, batch_size=16, synthetic_size_scale=0.2, lr=3e-4, weight_decay=5e-4)
    params = initial_state(controller.model_spec(), 0)
    sent = FLModel(params_type=ParamsType.FULL, params=params, current_round=0, meta=meta)
    result = executor._train(SiteTask.of("site-1", sent), str(tmp_path))
    assert math.isfinite(result.metrics["personal_train_loss"])
    personal = FLModel(
        params_type=ParamsType.FULL, params=params, meta={**meta, protocol.EVALUATE: protocol.FROM_PERSONAL}
    )
    scores = executor._validate(SiteTask.of("site-1", personal), str(tmp_path)).metrics
    assert scores["personal_model"] == 1.0 and 0.0 <= scores[controller.metric] <= 1.0
