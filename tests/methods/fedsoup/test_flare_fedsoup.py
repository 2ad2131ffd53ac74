"""FedSoup's FLARE parts on tiny data: the controller's settings and refusals, and the site's executor: what it sends
back is FedAvg's, bit for bit; from the soup's start the model sent joins the soup exactly when the site's validation
split scores the patched model no worse (kept, a repeated round the same); the site is scored with its local model
patched with its soup (its local model alone before the soup starts; the model sent before it has trained); a
validation split that scores nothing adds every model offered, an empty one is refused; the soup independent of the
order of the validation datalist; a broken kept soup and bad task fields refused (DP-SGD allowed:
tests/privacy/test_dp_refusals.py)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_task import check_meta
from fairfl.methods.fedsoup.controller import FedSoupController
from fairfl.methods.fedsoup.protocol import FEDSOUP_START_ROUND, PREVIOUS_SOUP_FILE, SOUP_FILE
from fairfl.methods.fedsoup.soup import joins, patched_state, with_ingredient
from fairfl.models import build_model, initial_state, state_to_numpy

import helpers
from helpers import kept_local_model as local_model
from helpers import torch_state, trained_weights

TINY = {"model_channels": [8, 16, 32], "model_strides": [2, 2], "num_rounds": 2}
SITE = "site-2"
CPU = torch.device("cpu")


def test_controller_settings_and_refusal():
    controller = FedSoupController(**TINY)
    assert controller.method == "fedsoup" and controller.evaluate == protocol.FROM_PERSONAL and controller.scores_global
    assert controller.train_meta(0) == {}
    assert controller.site_meta() == {FEDSOUP_START_ROUND: 1}  # floor(0.75 x 2): the last round
    assert controller.config()["fedsoup_start"] == 0.75
    assert FedSoupController(**{**TINY, "num_rounds": 20}).site_meta() == {FEDSOUP_START_ROUND: 15}
    assert FedSoupController(fedsoup_start=0, **TINY).site_meta() == {FEDSOUP_START_ROUND: 0}
    assert FedSoupController(fedsoup_start=1, **TINY).site_meta() == {FEDSOUP_START_ROUND: 2}  # never
    for bad in (1.5, -0.1, None, math.nan, "0.75"):
        with pytest.raises(ValueError, match="fedsoup_start"):
            FedSoupController(fedsoup_start=bad, **TINY)


@pytest.fixture
def site(cache_dir):
    """The soup from round 0 on (fedsoup_start 0), so that two rounds show it grow."""
    return helpers.unit_site(FedSoupController(fedsoup_start=0, **TINY))


def train(executor, meta, params, state_dir, round_num):
    return helpers.site_train(executor, SITE, meta, params, state_dir, round_num)


def plain(meta) -> dict:
    """The task meta without FedSoup's field: FedAvg's."""
    return {k: v for k, v in meta.items() if k != FEDSOUP_START_ROUND}


def validate(executor, meta, params, state_dir, round_num=0, **extra):
    return helpers.site_validate(executor, SITE, meta, params, state_dir, round_num, **extra)


def kept(state_dir, name=SOUP_FILE):
    return torch.load(Path(state_dir) / name)


def score(executor, meta, state, split="testing") -> float | None:
    """The Dice of the job's network with `state` on site-2's `split` (validation: as the site's soup step scores)."""
    if split == "validation":
        model = build_model(meta[protocol.MODEL_SPEC])
        model.load_state_dict(state)
        return executor._validation_score(helpers.site_task(meta, SITE), model, CPU)
    return helpers.site_dice(executor, meta, SITE, state, split)


def greedy_step(executor, meta, local, soup, ingredients, offered, round_num):
    """The soup after offering `offered` in `round_num`, as the paper's greedy test computes it by hand here."""
    grown = with_ingredient(soup, len(ingredients), offered)
    current = score(executor, meta, patched_state(local, soup, len(ingredients)), "validation")
    candidate = score(executor, meta, patched_state(local, grown, len(ingredients) + 1), "validation")
    return (grown, [*ingredients, round_num]) if joins(current, candidate) else (soup, ingredients)


def same_soup(saved, soup, ingredients) -> bool:
    return (
        saved["ingredients"] == ingredients
        and set(saved["soup"]) == set(soup)
        and all(torch.allclose(saved["soup"][k], soup[k], atol=1e-6) for k in soup)
    )


def test_what_goes_back_is_fedavgs_and_the_soup_grows_by_the_greedy_test_and_a_repeat_starts_where_it_did(
    site, tmp_path
):
    controller, meta, executor = site
    w0, w1 = helpers.initial_states(controller)
    state = tmp_path / "fedsoup"
    first, fedavg = helpers.trained_as_fedavg(executor, SITE, meta, plain(meta), w0, state, tmp_path / "plain", 0)
    assert not (tmp_path / "plain" / SOUP_FILE).exists() and "fedsoup_added" not in fedavg.metrics
    # round 0: the soup is empty, so the test is the local model against it averaged with w0
    soup, ingredients = greedy_step(executor, meta, local_model(state), {}, [], torch_state(meta, w0), 0)
    assert kept(state)["round"] == 0 and same_soup(kept(state), soup, ingredients)
    assert first.metrics["fedsoup_added"] == float(ingredients == [0]) and first.metrics["fedsoup_scored"] == 1.0
    assert first.metrics["fedsoup_soup_size"] == len(ingredients) and first.metrics["fedsoup_seconds"] > 0

    # round 1, sent w1: offered to round 0's soup, after training from w1
    second = train(executor, meta, w1, state, 1)
    soup, ingredients = greedy_step(executor, meta, local_model(state), soup, ingredients, torch_state(meta, w1), 1)
    assert kept(state)["round"] == 1 and same_soup(kept(state), soup, ingredients)
    assert kept(state, PREVIOUS_SOUP_FILE)["round"] == 0
    assert second.metrics["fedsoup_soup_size"] == len(ingredients)
    # a resumed run repeating round 1 starts again from round 0's soup (the previous file): the same soup
    again = train(executor, meta, w1, state, 1)
    assert kept(state)["round"] == 1 and same_soup(kept(state), soup, ingredients)
    assert kept(state, PREVIOUS_SOUP_FILE)["round"] == 0
    assert all(np.allclose(trained_weights(again, w1)[k], trained_weights(second, w1)[k], atol=1e-6) for k in w1)


def test_a_site_whose_training_leaves_the_model_sent_as_it_is_ties_and_the_model_joins(site, tmp_path, monkeypatch):
    """Training that changes nothing: the local model is the model sent, so in round 0 both patched models are it and
    score alike; the tie joins. In round 1 the test is a real one, and as computed by hand."""
    import fairfl.flare.executor

    controller, meta, executor = site
    monkeypatch.setattr(fairfl.flare.executor, "train_local", lambda *args, **kwargs: {"train_loss": 0.0, "steps": 1})
    w0, w1 = (torch_state(meta, initial_state(controller.model_spec(), seed)) for seed in (0, 1))
    first = train(executor, meta, state_to_numpy(w0), tmp_path, 0)
    assert all(torch.equal(local_model(tmp_path)[k], w0[k]) for k in w0)
    assert first.metrics["fedsoup_added"] == 1.0 and same_soup(kept(tmp_path), w0, [0])
    second = train(executor, meta, state_to_numpy(w1), tmp_path, 1)
    soup, ingredients = greedy_step(executor, meta, w1, w0, [0], w1, 1)
    assert same_soup(kept(tmp_path), soup, ingredients) and second.metrics["fedsoup_soup_size"] == len(ingredients)


def test_the_site_is_scored_with_its_local_model_patched_with_its_soup_and_with_the_model_sent_before_it_has_one(
    site, tmp_path
):
    controller, meta, executor = site
    w0, w1 = helpers.initial_states(controller)
    on_sent = score(executor, meta, torch_state(meta, w1))
    fresh = validate(executor, meta, w1, tmp_path / "never_trained").metrics
    assert fresh["personal_model"] == 0.0 and fresh["dice"] == pytest.approx(on_sent, abs=1e-9)
    assert "fedsoup_local_share" not in fresh
    state = tmp_path / "state"
    train(executor, meta, w0, state, 0)
    saved = kept(state)
    patched = patched_state(local_model(state), saved["soup"], len(saved["ingredients"]))
    # round 0's evaluation, sent w1 (the global model after round 0): the local model patched with round 0's soup
    scores = validate(executor, meta, w1, state, 0, **{protocol.SCORE_GLOBAL: True}).metrics
    assert scores["personal_model"] == 1.0 and scores["fedsoup_local_share"] == 1 / (len(saved["ingredients"]) + 1)
    assert scores["dice"] == pytest.approx(score(executor, meta, patched), abs=1e-6)
    assert scores["global_dice"] == pytest.approx(on_sent, abs=1e-9)
    # held out of training: the model sent alone
    held = validate(executor, meta, w1, state, 0, **{protocol.HELD_OUT: [SITE], protocol.SCORE_GLOBAL: True}).metrics
    assert held["dice"] == pytest.approx(on_sent, abs=1e-9) and not {"personal_model", "global_dice"} & set(held)
    # cross-site evaluation: the site hands over the model it is scored with
    submitted = validate(executor, meta, w1, state, 0, **{protocol.SUBMIT_MODEL: True})
    assert set(submitted.params) == set(patched)
    assert all(np.allclose(submitted.params[k], patched[k].numpy(), atol=1e-6) for k in patched)


def test_before_the_soup_starts_the_site_keeps_none_and_is_scored_with_its_local_model(site, tmp_path):
    controller, meta, executor = site
    later = {**meta, FEDSOUP_START_ROUND: 1}  # the job's default on 2 rounds
    w0 = initial_state(controller.model_spec(), 0)
    result = train(executor, later, w0, tmp_path, 0)
    assert not (tmp_path / SOUP_FILE).exists()
    assert result.metrics["fedsoup_soup_size"] == 0.0 and "fedsoup_added" not in result.metrics
    scores = validate(executor, later, w0, tmp_path, 0).metrics
    assert scores["personal_model"] == 1.0 and scores["fedsoup_local_share"] == 1.0
    assert scores["dice"] == pytest.approx(score(executor, meta, local_model(tmp_path)), abs=1e-6)


def fake_validation(monkeypatch, executor, scores):
    """The site's validation scores replaced by `scores`, in the order asked for."""
    answers = iter(scores)
    monkeypatch.setattr(executor, "_validation_score", lambda task, model, device: next(answers))


def test_a_worse_score_keeps_the_model_out_and_a_split_that_scores_nothing_adds_every_model_offered(
    site, tmp_path, monkeypatch
):
    controller, meta, executor = site
    w0, w1 = helpers.initial_states(controller)
    fake_validation(monkeypatch, executor, [0.6, 0.5])  # the soup with w0 scores worse than without
    refused = train(executor, meta, w0, tmp_path / "worse", 0)
    assert refused.metrics["fedsoup_added"] == 0.0 and kept(tmp_path / "worse")["ingredients"] == []
    fake_validation(monkeypatch, executor, [None, None, None, None])  # no foreground to score, both rounds
    state = tmp_path / "unscored"
    for round_num, sent in ((0, w0), (1, w1)):
        result = train(executor, meta, sent, state, round_num)
        assert result.metrics["fedsoup_added"] == 1.0 and result.metrics["fedsoup_scored"] == 0.0
    expected = with_ingredient(torch_state(meta, w0), 1, torch_state(meta, w1))  # the uniform soup of w0 and w1
    assert same_soup(kept(state), expected, [0, 1])


def test_the_soup_does_not_depend_on_the_order_of_the_site_s_validation_datalist(site, tmp_path):
    controller, meta, executor = site
    w0 = initial_state(controller.model_spec(), 0)
    reordered = helpers.reordered_executor(
        executor, meta, SITE, tmp_path / "data", "validation", lambda entries: entries[::-1]
    )
    first = train(executor, meta, w0, tmp_path / "state", 0)
    second = train(reordered, meta, w0, tmp_path / "copy", 0)
    assert first.metrics["fedsoup_added"] == second.metrics["fedsoup_added"]
    saved = kept(tmp_path / "state")
    assert same_soup(kept(tmp_path / "copy"), saved["soup"], saved["ingredients"])


def test_an_empty_validation_split_is_refused_before_anything_trains(site, tmp_path):
    controller, meta, executor = site
    empty = helpers.reordered_executor(executor, meta, SITE, tmp_path / "data", "validation", lambda entries: [])
    with pytest.raises(DataError, match="split 'validation' is empty"):
        train(empty, meta, initial_state(controller.model_spec(), 0), tmp_path / "state", 0)


@pytest.mark.parametrize("damage", ["garbage", "other_network", "nan", "ingredients", "no_soup"])
def test_a_broken_kept_soup_is_an_error_naming_site_and_file(site, tmp_path, damage):
    controller, meta, executor = site
    spec = controller.model_spec()
    w0 = initial_state(spec, 0)
    train(executor, meta, w0, tmp_path, 0)  # a local model, so that the soup is read when scoring
    path = tmp_path / SOUP_FILE
    soup = build_model(spec).state_dict()
    saved = {"round": 0, "soup": soup, "ingredients": [0]}
    if damage == "garbage":
        path.write_bytes(b"not a checkpoint")
    else:
        if damage == "other_network":
            saved["soup"] = build_model({**spec, "channels": [4, 8, 16]}).state_dict()
        elif damage == "nan":
            next(v for v in soup.values() if v.is_floating_point()).fill_(math.nan)
        elif damage == "ingredients":
            saved["ingredients"] = [1]  # after the file's own round
        else:
            del saved["soup"]
        torch.save(saved, path)
    problem = {
        "garbage": "unreadable FedSoup soup",
        "other_network": "shape mismatch",
        "nan": "NaN in",
        "ingredients": "not distinct rounds in ascending order",
        "no_soup": "is a NoneType, not a dict of tensors",
    }[damage]
    tasks = (lambda: validate(executor, meta, w0, tmp_path, 0), lambda: train(executor, meta, w0, tmp_path, 1))
    helpers.refused_by_both_tasks(tasks, SITE, path, problem)


@pytest.mark.parametrize("bad", [-1, 1.0, None, "1", True, 10**6 + 1])
def test_a_site_refuses_a_bad_start_round_naming_it(bad):
    meta = helpers.unit_meta(FedSoupController(**TINY))
    check_meta(SITE, meta)
    with pytest.raises(DataError, match=f"task field {FEDSOUP_START_ROUND}"):
        check_meta(SITE, {**meta, FEDSOUP_START_ROUND: bad})
