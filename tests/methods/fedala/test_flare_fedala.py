"""FedALA's FLARE parts on tiny data: the controller's settings and refusals, and the site's executor: its first round
FedAvg's, later rounds trained from theta_hat (W learned first, kept; a repeated round the same), scored with the
theta_hat its next round starts from; eta 0 is FedAvg; W independent of the order of the site's training datalist;
broken kept weights, bad task fields and too many layers refused (DP-SGD: tests/methods/test_own_training_loops.py)."""

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_task import check_meta
from fairfl.methods.fedala.adaptive import personalised_state
from fairfl.methods.fedala.controller import FedALAController
from fairfl.methods.fedala.protocol import (
    FEDALA_ETA,
    FEDALA_LAYERS,
    FEDALA_MAX_PASSES,
    FEDALA_RAND_PERCENT,
    FEDALA_THRESHOLD,
    FEDALA_WINDOW,
    PREVIOUS_WEIGHTS_FILE,
    WEIGHTS_FILE,
)
from fairfl.models import initial_state, state_to_numpy

import helpers
from helpers import kept_local_model as local_model
from helpers import torch_state, trained_weights

TINY = {"model_channels": [8, 16, 32], "model_strides": [2, 2], "num_rounds": 2}
FAST = {"fedala_window": 2, "fedala_max_passes": 3}  # a short start phase
SITE = "site-2"
TOP = ("model.2.1.conv.unit0.conv.weight", "model.2.1.conv.unit0.conv.bias")  # the U-Net's output convolution


def test_controller_settings_and_refusal():
    controller = FedALAController(**TINY)
    assert controller.method == "fedala" and controller.evaluate == protocol.FROM_PERSONAL and controller.scores_global
    assert controller.train_meta(0) == {}
    assert controller.site_meta() == {
        FEDALA_LAYERS: 2,
        FEDALA_ETA: 1.0,
        FEDALA_RAND_PERCENT: 80,
        FEDALA_THRESHOLD: 0.01,
        FEDALA_WINDOW: 10,
        FEDALA_MAX_PASSES: 20,
    }
    assert controller.config()["fedala_rand_percent"] == 80 and controller.config()["fedala_layers"] == 2
    for name, bad in (
        ("fedala_layers", 0),
        ("fedala_layers", 36),  # the tiny U-Net has 35 parameter tensors
        ("fedala_rand_percent", 0),
        ("fedala_rand_percent", 101),
        ("fedala_eta", -1.0),
        ("fedala_threshold", math.nan),
        ("fedala_window", 1),
        ("fedala_max_passes", 0),
    ):
        with pytest.raises(ValueError, match=name):
            FedALAController(**{name: bad}, **TINY)
    assert FedALAController(fedala_layers=35, **TINY).site_meta()[FEDALA_LAYERS] == 35  # every layer


@pytest.fixture
def site(cache_dir):
    return helpers.unit_site(FedALAController(**FAST, **TINY))


def train(executor, meta, params, state_dir, round_num):
    return helpers.site_train(executor, SITE, meta, params, state_dir, round_num)


def plain(meta) -> dict:
    """The task meta without FedALA's fields: FedAvg's."""
    return {k: v for k, v in meta.items() if not k.startswith("fedala_")}


def validate(executor, meta, params, state_dir, round_num=0, **extra):
    return helpers.site_validate(executor, SITE, meta, params, state_dir, round_num, **extra)


def kept(state_dir, name=WEIGHTS_FILE):
    return torch.load(Path(state_dir) / name)


def score(executor, meta, state) -> float:
    """The Dice of the job's network with `state` on site-2's test split."""
    return helpers.site_dice(executor, meta, SITE, state)


def test_the_first_round_is_fedavgs_and_later_rounds_train_from_theta_hat_and_a_repeat_starts_where_it_did(
    site, tmp_path
):
    controller, meta, executor = site
    w0, w1 = helpers.initial_states(controller)
    state = tmp_path / "fedala"
    # round 0: no local model yet, so theta_hat is the model sent: FedAvg's round bit for bit, no W
    first, _ = helpers.trained_as_fedavg(executor, SITE, meta, plain(meta), w0, state, tmp_path / "plain", 0)
    assert first.metrics["fedala_passes"] == 0.0 and not (state / WEIGHTS_FILE).exists()
    theta_i = local_model(state)

    # round 1: W learned from ones in the start phase (2 or 3 passes), kept; training starts from theta_hat
    second = train(executor, meta, w1, state, 1)
    saved = kept(state)
    assert saved["round"] == 1 and set(saved["weights"]) == set(TOP)
    assert second.metrics["fedala_passes"] in (2.0, 3.0) and 0.0 <= second.metrics["fedala_weight_mean"] < 1.0
    assert all(bool(((w >= 0) & (w <= 1)).all()) for w in saved["weights"].values())
    start = personalised_state(torch_state(meta, w1), theta_i, saved["weights"])
    assert not torch.equal(start[TOP[0]], torch_state(meta, w1)[TOP[0]])  # theta_hat is not theta on the top
    # FedAvg trained from theta_hat itself in the same round trains the same model: the start is theta_hat, and
    # ALA's passes leave the training's random draws alone
    from_start = train(executor, plain(meta), state_to_numpy(start), tmp_path / "from_start", 1)
    trained, expected = trained_weights(second, w1), trained_weights(from_start, state_to_numpy(start))
    assert all(np.allclose(trained[k], expected[k], atol=1e-6) for k in expected)
    assert all(torch.allclose(local_model(state)[k], torch.as_tensor(expected[k]), atol=1e-6) for k in expected)

    # a resumed run repeating round 1 starts again from round 0's local model and no W (the previous files)
    again = train(executor, meta, w1, state, 1)
    assert kept(state)["round"] == 1 and not (state / PREVIOUS_WEIGHTS_FILE).exists()
    assert all(torch.equal(kept(state)["weights"][k], saved["weights"][k]) for k in TOP)
    assert all(np.allclose(trained_weights(again, w1)[k], trained[k], atol=1e-6) for k in trained)
    # round 2: one pass from round 1's W, which becomes the previous file
    third = train(executor, meta, w0, state, 2)
    assert third.metrics["fedala_passes"] == 1.0 and kept(state)["round"] == 2
    assert kept(state, PREVIOUS_WEIGHTS_FILE)["round"] == 1


def test_eta_zero_is_fedavg_in_every_round(site, tmp_path):
    controller, meta, executor = site
    w0, w1 = helpers.initial_states(controller)
    frozen = {**meta, FEDALA_ETA: 0.0}
    for round_num, sent in ((0, w0), (1, w1)):
        helpers.trained_as_fedavg(
            executor, SITE, frozen, plain(meta), sent, tmp_path / "frozen", tmp_path / "plain", round_num
        )
    assert all(bool((w == 1).all()) for w in kept(tmp_path / "frozen")["weights"].values())


def test_the_site_is_scored_with_the_start_of_its_next_round_and_with_the_model_sent_before_it_has_one(site, tmp_path):
    controller, meta, executor = site
    w0, w1 = helpers.initial_states(controller)
    on_sent = score(executor, meta, torch_state(meta, w1))
    # before its first round: the model sent
    fresh = validate(executor, meta, w1, tmp_path / "never_trained").metrics
    assert fresh["personal_model"] == 0.0 and fresh["dice"] == pytest.approx(on_sent, abs=1e-9)
    state = tmp_path / "state"
    train(executor, meta, w0, state, 0)
    theta_i = local_model(state)
    # round 0's evaluation, of w1 (the global model after round 0): theta_hat as round 1 will start, not kept
    scores = validate(executor, meta, w1, state, 0, **{protocol.SCORE_GLOBAL: True}).metrics
    assert not (state / WEIGHTS_FILE).exists()
    assert scores["personal_model"] == 1.0 and scores["global_dice"] == pytest.approx(on_sent, abs=1e-9)
    train(executor, meta, w1, state, 1)
    start = personalised_state(torch_state(meta, w1), theta_i, kept(state)["weights"])
    assert scores["dice"] == pytest.approx(score(executor, meta, start), abs=1e-6)
    weights = kept(state)["weights"]
    mean = float(sum(w.double().sum() for w in weights.values()) / sum(w.numel() for w in weights.values()))
    assert scores["fedala_weight_mean"] == pytest.approx(mean, abs=1e-9) and scores["dice"] != pytest.approx(on_sent)
    # held out of training: the model sent alone
    held = validate(executor, meta, w1, state, 1, **{protocol.HELD_OUT: [SITE], protocol.SCORE_GLOBAL: True}).metrics
    assert held["dice"] == pytest.approx(on_sent, abs=1e-9) and not {"personal_model", "global_dice"} & set(held)
    # cross-site evaluation: the site hands over the model it is scored with
    submitted = validate(executor, meta, w1, state, 1, **{protocol.SUBMIT_MODEL: True})
    scored = validate(executor, meta, w1, state, 1).metrics["dice"]
    assert set(submitted.params) == set(start) and score(
        executor, meta, {k: torch.as_tensor(v) for k, v in submitted.params.items()}
    ) == pytest.approx(scored, abs=1e-9)


def test_w_does_not_depend_on_the_order_of_the_site_s_training_datalist(site, tmp_path):
    controller, meta, executor = site
    spec = controller.model_spec()
    state = tmp_path / "state"
    train(executor, meta, initial_state(spec, 0), state, 0)
    reordered = helpers.reordered_executor(executor, meta, SITE, tmp_path / "shuffled", "training")
    copy = tmp_path / "copy"
    shutil.copytree(state, copy)  # the same local model theta_i at both
    w1 = initial_state(spec, 1)
    train(executor, meta, w1, state, 1)
    train(reordered, meta, w1, copy, 1)
    assert all(torch.equal(kept(state)["weights"][k], kept(copy)["weights"][k]) for k in TOP)


@pytest.mark.parametrize("damage", ["garbage", "other_layers", "shape", "nan", "out_of_range", "no_weights"])
def test_broken_kept_weights_are_an_error_naming_site_and_file(site, tmp_path, damage):
    controller, meta, executor = site
    spec = controller.model_spec()
    w0 = initial_state(spec, 0)
    train(executor, meta, w0, tmp_path, 0)  # a local model, so that W is read
    path = tmp_path / WEIGHTS_FILE
    reference = torch_state(meta, w0)
    weights = {k: torch.ones_like(reference[k]) for k in TOP}
    if damage == "garbage":
        path.write_bytes(b"not a checkpoint")
    else:
        if damage == "other_layers":  # kept by a run with fedala_layers 1
            del weights[TOP[0]]
        elif damage == "shape":
            weights[TOP[0]] = torch.ones(3, 3)
        elif damage == "nan":
            weights[TOP[1]][0] = math.nan
        elif damage == "out_of_range":
            weights[TOP[1]][0] = 1.5
        torch.save({"round": 0} if damage == "no_weights" else {"round": 0, "weights": weights}, path)
    problem = {
        "garbage": "unreadable FedALA aggregation weights",
        "other_layers": "missing keys",
        "shape": "shape mismatch",
        "nan": "NaN in",
        "out_of_range": "outside [0, 1]",
        "no_weights": "are a NoneType, not a dict of tensors",
    }[damage]
    tasks = (lambda: validate(executor, meta, w0, tmp_path, 0), lambda: train(executor, meta, w0, tmp_path, 1))
    helpers.refused_by_both_tasks(tasks, SITE, path, problem)


def test_more_layers_than_the_network_has_fail_the_site_s_task_naming_the_setting(site, tmp_path):
    controller, meta, executor = site
    w0 = initial_state(controller.model_spec(), 0)
    train(executor, meta, w0, tmp_path, 0)
    with pytest.raises(ValueError, match="fedala_layers is 1000, more than the 35 parameter tensors"):
        train(executor, {**meta, FEDALA_LAYERS: 1000}, w0, tmp_path, 1)


@pytest.mark.parametrize(
    "field, bad",
    [
        (FEDALA_LAYERS, 0),
        (FEDALA_LAYERS, 2.0),
        (FEDALA_ETA, -0.5),
        (FEDALA_ETA, math.nan),
        (FEDALA_RAND_PERCENT, 0),
        (FEDALA_RAND_PERCENT, 101),
        (FEDALA_THRESHOLD, math.inf),
        (FEDALA_WINDOW, 1),
        (FEDALA_MAX_PASSES, 0),
        (FEDALA_MAX_PASSES, None),
    ],
)
def test_a_site_refuses_bad_fedala_fields_naming_them(field, bad):
    meta = helpers.unit_meta(FedALAController(**TINY))
    check_meta(SITE, meta)
    with pytest.raises(DataError, match=f"task field {field}"):
        check_meta(SITE, {**meta, field: bad})
