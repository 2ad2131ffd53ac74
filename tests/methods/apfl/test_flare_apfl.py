"""APFL's FLARE parts on tiny data: the controller's settings, and the site's executor training the model sent (sent
back as FedAvg's), its personal model and alpha (kept across rounds, a repeated round included) and scoring the mix;
its limits (alpha 0 and 1 held fixed), the order of the test split, broken state and bad task fields (DP-SGD refused:
tests/methods/test_own_training_loops.py)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_task import check_meta
from fairfl.methods.apfl.controller import APFLController
from fairfl.methods.apfl.mixing import mixed_state
from fairfl.methods.apfl.protocol import (
    APFL_ALPHA_INIT,
    APFL_ALPHA_LR,
    PERSONAL_MODEL_FILE,
    PREVIOUS_PERSONAL_MODEL_FILE,
)
from fairfl.models import build_model, initial_state, load_numpy_state

import helpers
from helpers import segmentation_task_meta, trained_weights

TINY = {"model_channels": [8, 16, 32], "model_strides": [2, 2], "num_rounds": 2}
SITE = "site-2"


def test_controller_settings_and_refusal():
    controller = APFLController(**TINY)
    assert controller.method == "apfl" and controller.evaluate == protocol.FROM_PERSONAL and controller.scores_global
    assert controller.train_meta(0) == {}  # alpha steps at the site's own lr
    assert controller.site_meta() == {APFL_ALPHA_INIT: 0.5}
    assert controller.config()["apfl_alpha_init"] == 0.5 and controller.config()["apfl_alpha_lr"] is None
    fixed = APFLController(apfl_alpha_init=1, apfl_alpha_lr=0, **TINY)
    assert fixed.site_meta() == {APFL_ALPHA_INIT: 1.0} and fixed.train_meta(3) == {APFL_ALPHA_LR: 0.0}
    for name, bad in (("apfl_alpha_init", 1.5), ("apfl_alpha_init", None), ("apfl_alpha_lr", -0.1)):
        with pytest.raises(ValueError, match=name):
            APFLController(**{name: bad}, **TINY)


@pytest.fixture
def site(cache_dir):
    return helpers.unit_site(APFLController(**TINY))


def task_meta(meta, **apfl) -> dict:
    """The meta of a train task; with `apfl` (APFL's task fields) APFL's, without FedAvg's."""
    return {**{k: v for k, v in meta.items() if k != APFL_ALPHA_INIT}, **apfl}


def train(executor, meta, params, state_dir, round_num, **apfl):
    """site-2's train task of `round_num` (`task_meta`)."""
    return helpers.site_train(executor, SITE, task_meta(meta, **apfl), params, state_dir, round_num)


def validate(executor, meta, params, state_dir, **extra):
    return helpers.site_validate(executor, SITE, meta, params, state_dir, **extra)


def kept(state_dir, name=PERSONAL_MODEL_FILE):
    return torch.load(Path(state_dir) / name)


def score(executor, meta, state) -> float:
    """The Dice of the job's network with `state` on site-2's test split."""
    return helpers.site_dice(executor, meta, SITE, state)


def apfl_fields(alpha_init=0.5, alpha_lr=None):
    """APFL's train task fields (without apfl_alpha_lr: the site's lr)."""
    return {APFL_ALPHA_INIT: alpha_init, **({} if alpha_lr is None else {APFL_ALPHA_LR: alpha_lr})}


def test_the_model_sent_back_is_fedavgs_and_v_and_alpha_persist_and_a_repeated_round_starts_where_it_did(
    site, tmp_path
):
    controller, meta, executor = site
    w0, w1 = helpers.initial_states(controller)
    apfl_dir = tmp_path / "apfl"
    apfl_meta, plain = task_meta(meta, **apfl_fields()), task_meta(meta)
    result, _ = helpers.trained_as_fedavg(executor, SITE, apfl_meta, plain, w0, apfl_dir, tmp_path / "plain", 0)
    first = kept(apfl_dir)
    assert first["round"] == 0 and 0.0 <= first["alpha"] <= 1.0 and first["alpha"] != 0.5  # learned, moved
    assert result.metrics["apfl_alpha"] == first["alpha"] and math.isfinite(result.metrics["personal_train_loss"])
    assert not (tmp_path / "plain" / PERSONAL_MODEL_FILE).exists()

    # round 1, sent w1: v and alpha continue from round 0's, not from w1 and apfl_alpha_init
    train(executor, meta, w1, apfl_dir, 1, **apfl_fields())
    second = kept(apfl_dir)
    fresh = tmp_path / "fresh"
    train(executor, meta, w1, fresh, 1, **apfl_fields())
    assert second["round"] == 1 and kept(apfl_dir, PREVIOUS_PERSONAL_MODEL_FILE)["round"] == 0
    assert second["alpha"] != kept(fresh)["alpha"]
    assert not all(torch.allclose(second["model"][k], kept(fresh)["model"][k], atol=1e-4) for k in second["model"])
    # a resumed run repeating round 1 starts again from round 0's v and alpha (the previous file): the same result
    train(executor, meta, w1, apfl_dir, 1, **apfl_fields())
    again = kept(apfl_dir)
    assert again["round"] == 1 and kept(apfl_dir, PREVIOUS_PERSONAL_MODEL_FILE)["round"] == 0
    assert again["alpha"] == pytest.approx(second["alpha"], abs=1e-9)
    assert all(torch.allclose(again["model"][k], second["model"][k], atol=1e-6) for k in second["model"])


def test_the_site_is_scored_with_its_mix_and_with_the_model_sent_before_it_has_one(site, tmp_path):
    controller, meta, executor = site
    w0 = initial_state(controller.model_spec(), 0)
    train(executor, meta, w0, tmp_path, 0, **apfl_fields())
    saved = kept(tmp_path)
    global_state = load_numpy_state(build_model(meta[protocol.MODEL_SPEC]), w0).state_dict()
    expected = score(executor, meta, mixed_state(global_state, saved["model"], saved["alpha"]))
    scores = validate(executor, meta, w0, tmp_path, **{protocol.SCORE_GLOBAL: True}).metrics
    assert scores["dice"] == pytest.approx(expected, abs=1e-9)
    assert scores["apfl_alpha"] == saved["alpha"] and scores["personal_model"] == 1.0
    on_sent = score(executor, meta, global_state)
    assert scores["global_dice"] == pytest.approx(on_sent, abs=1e-9) and scores["dice"] != pytest.approx(on_sent)
    # before its first round: the model sent (v would start as it), with the alpha it would start from
    fresh = validate(executor, meta, w0, tmp_path / "never_trained").metrics
    assert fresh["personal_model"] == 0.0 and fresh["apfl_alpha"] == 0.5
    assert fresh["dice"] == pytest.approx(on_sent, abs=1e-9)
    # held out of training: the model sent alone, never the mix it may hold
    held = validate(executor, meta, w0, tmp_path, **{protocol.HELD_OUT: [SITE], protocol.SCORE_GLOBAL: True}).metrics
    assert held["dice"] == pytest.approx(on_sent, abs=1e-9) and not {"apfl_alpha", "global_dice"} & set(held)
    # cross-site evaluation: the site hands over the mix it is scored with
    submitted = validate(executor, meta, w0, tmp_path, **{protocol.SUBMIT_MODEL: True})
    mix = mixed_state(global_state, saved["model"], saved["alpha"])
    assert set(submitted.params) == set(mix) and all(np.allclose(submitted.params[k], mix[k].numpy()) for k in mix)


def test_alpha_zero_held_fixed_scores_the_global_model_and_one_the_site_s_own_local_model(site, tmp_path):
    controller, meta, executor = site
    w0 = initial_state(controller.model_spec(), 0)
    zero, one = tmp_path / "zero", tmp_path / "one"
    result = train(executor, {**meta, APFL_ALPHA_INIT: 0.0}, w0, zero, 0, **apfl_fields(0.0, 0.0))
    assert result.metrics["apfl_alpha"] == 0.0 and kept(zero)["alpha"] == 0.0
    scores = validate(executor, {**meta, APFL_ALPHA_INIT: 0.0}, w0, zero, **{protocol.SCORE_GLOBAL: True}).metrics
    assert scores["dice"] == scores["global_dice"] and scores["apfl_alpha"] == 0.0  # FedAvg's global model
    # alpha 1: v trains on the site's data alone, from the model sent: in round 0 the same training as w's
    train(executor, {**meta, APFL_ALPHA_INIT: 1.0}, w0, one, 0, **apfl_fields(1.0, 0.0))
    personal = kept(one)["model"]
    local = trained_weights(result, w0)
    assert all(torch.allclose(personal[k].float(), torch.as_tensor(local[k]).float(), atol=1e-6) for k in personal)
    scores = validate(executor, {**meta, APFL_ALPHA_INIT: 1.0}, w0, one, **{protocol.SCORE_GLOBAL: True}).metrics
    assert scores["dice"] == pytest.approx(score(executor, meta, personal), abs=1e-9)
    assert scores["dice"] != pytest.approx(scores["global_dice"], abs=1e-6)


def test_the_score_does_not_depend_on_the_order_of_the_site_s_test_split(site, tmp_path):
    controller, meta, executor = site
    w0 = initial_state(controller.model_spec(), 0)
    train(executor, meta, w0, tmp_path / "state", 0, **apfl_fields())
    reordered = helpers.reordered_executor(executor, meta, SITE, tmp_path / "shuffled", "testing")
    scores = validate(executor, meta, w0, tmp_path / "state").metrics
    again = validate(reordered, meta, w0, tmp_path / "state").metrics
    assert again["apfl_alpha"] == scores["apfl_alpha"] and again["dice"] == pytest.approx(scores["dice"], abs=1e-9)


@pytest.mark.parametrize("damage", ["garbage", "other_network", "nan", "alpha_out_of_range", "no_alpha"])
def test_a_broken_personal_state_is_an_error_naming_site_and_file(site, tmp_path, damage):
    controller, meta, executor = site
    path = tmp_path / PERSONAL_MODEL_FILE
    state = build_model(controller.model_spec()).state_dict()
    saved = {"round": 0, "model": state, "alpha": 0.5}
    if damage == "garbage":
        path.write_bytes(b"not a checkpoint")
    else:
        if damage == "other_network":
            saved["model"] = build_model({**controller.model_spec(), "channels": [4, 8, 16]}).state_dict()
        elif damage == "nan":
            next(v for v in state.values() if v.is_floating_point()).fill_(float("nan"))
        elif damage == "alpha_out_of_range":
            saved["alpha"] = 1.5
        else:
            del saved["alpha"]
        torch.save(saved, path)
    w0 = initial_state(controller.model_spec(), 0)
    problem = {
        "garbage": "unreadable",
        "other_network": "shape mismatch",
        "nan": "NaN",
        "alpha_out_of_range": "alpha must be a number in [0, 1], got 1.5",
        "no_alpha": "alpha must be a number in [0, 1], got None",
    }[damage]
    tasks = (
        lambda: validate(executor, meta, w0, tmp_path),
        lambda: train(executor, meta, w0, tmp_path, 1, **apfl_fields()),
    )
    helpers.refused_by_both_tasks(tasks, SITE, path, problem)


@pytest.mark.parametrize(
    "field, bad",
    [
        (APFL_ALPHA_INIT, 1.5),
        (APFL_ALPHA_INIT, "0.5"),
        (APFL_ALPHA_INIT, float("nan")),
        (APFL_ALPHA_LR, -1),
        (APFL_ALPHA_LR, float("inf")),
        (APFL_ALPHA_LR, None),  # absent means the site's lr; null is no step size
    ],
)
def test_a_site_refuses_bad_apfl_fields_naming_them(field, bad):
    meta = {**segmentation_task_meta(APFLController(**TINY).model_spec()), **apfl_fields()}
    check_meta(SITE, meta)
    with pytest.raises(DataError, match=f"task field {field}"):
        check_meta(SITE, {**meta, field: bad})
