"""FedFloor's FLARE parts: the controller's settings, and the site's validated mix on tiny data, re-scored."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask
from fairfl.methods.ditto.protocol import DITTO_LAMBDA, PERSONAL_MODEL_FILE
from fairfl.methods.fedfloor.controller import FedFloorController
from fairfl.methods.fedfloor.mixing import DEFAULT_GRID, choose_alpha, mix_states
from fairfl.methods.fedfloor.protocol import MIX_GRID
from fairfl.models import build_model, load_numpy_state

import helpers

TINY = {"model_channels": [8, 16, 32], "model_strides": [2, 2], "num_rounds": 2}


def test_controller_is_dittos_with_the_grid_in_every_task():
    controller = FedFloorController(**TINY)
    assert controller.method == "fedfloor" and controller.evaluate == protocol.FROM_PERSONAL
    assert controller.train_meta(0) == {DITTO_LAMBDA: 0.1}
    assert controller.site_meta() == {MIX_GRID: list(DEFAULT_GRID)}
    assert controller.config()["mix_grid"] == list(DEFAULT_GRID) and controller.scores_global
    assert FedFloorController(mix_grid=[1, 0], **TINY).method == "fedfloor_pick"
    for bad in ([], [0, 0], [2], "0,1"):
        with pytest.raises(ValueError, match="mix_grid"):
            FedFloorController(mix_grid=bad, **TINY)


def validate(executor, meta, sent, state_dir, grid, **extra):
    task_meta = {**meta, protocol.EVALUATE: protocol.FROM_PERSONAL, MIX_GRID: grid, **extra}
    task = FLModel(params_type=ParamsType.FULL, params=sent, meta=task_meta)
    return executor._validate(SiteTask.of("site-2", task), str(state_dir))


def site_task(meta):
    """`meta` as site-2 reads it."""
    return helpers.site_task(meta, "site-2")


def test_the_site_is_scored_with_the_mix_its_validation_split_favours(trained):
    executor, meta, sent, state_dir = trained
    spec = meta[protocol.MODEL_SPEC]
    global_state = load_numpy_state(build_model(spec), sent).state_dict()
    personal_state = torch.load(state_dir / PERSONAL_MODEL_FILE)["model"]
    device = torch.device("cpu")

    def mixed(alpha):
        return _model(spec, mix_states(global_state, personal_state, alpha))

    validation = {a: executor._validation_score(site_task(meta), mixed(a), device) for a in DEFAULT_GRID}
    assert len(set(validation.values())) > 1  # the mixes differ on this site's validation split
    alpha = choose_alpha(validation)
    test_loader = executor._loader(site_task(meta), "testing", train=False, seed=executor.seed)
    expected = executor._evaluate(mixed(alpha), test_loader, site_task(meta))["dice"]
    scores = validate(executor, meta, sent, state_dir, list(DEFAULT_GRID), **{protocol.SCORE_GLOBAL: True}).metrics
    assert scores["mix_alpha"] == alpha and scores["personal_model"] == 1.0
    assert scores["dice"] == pytest.approx(expected, abs=1e-9)
    assert scores["global_dice"] == pytest.approx(
        executor._evaluate(mixed(0.0), test_loader, site_task(meta))["dice"], abs=1e-9
    )
    # the grid's ends are Ditto's two models exactly: [1] is the personal model Ditto scores, [0] the model sent
    personal = FLModel(
        params_type=ParamsType.FULL, params=sent, meta={**meta, protocol.EVALUATE: protocol.FROM_PERSONAL}
    )
    ditto = executor._validate(SiteTask.of("site-2", personal), str(state_dir)).metrics
    assert validate(executor, meta, sent, state_dir, [1.0]).metrics["dice"] == pytest.approx(ditto["dice"], abs=1e-9)
    only_global = validate(executor, meta, sent, state_dir, [0.0]).metrics
    assert only_global["dice"] == pytest.approx(scores["global_dice"], abs=1e-9) and only_global["mix_alpha"] == 0.0


def _model(spec, state):
    model = build_model(spec)
    model.load_state_dict(state)
    return model


def test_before_its_first_personal_model_and_when_held_out_a_site_is_scored_with_the_model_sent(trained, tmp_path):
    executor, meta, sent, state_dir = trained
    test_loader = executor._loader(site_task(meta), "testing", train=False, seed=executor.seed)
    on_sent = executor._evaluate(
        load_numpy_state(build_model(meta[protocol.MODEL_SPEC]), sent), test_loader, site_task(meta)
    )
    fresh = validate(executor, meta, sent, tmp_path / "never_trained", list(DEFAULT_GRID)).metrics
    assert fresh["mix_alpha"] == 0.0 and fresh["personal_model"] == 0.0
    assert fresh["dice"] == pytest.approx(on_sent["dice"], abs=1e-9)
    held_out = validate(executor, meta, sent, state_dir, list(DEFAULT_GRID), **{protocol.HELD_OUT: ["site-2"]})
    assert held_out.metrics["dice"] == pytest.approx(on_sent["dice"], abs=1e-9) and "mix_alpha" not in held_out.metrics


@pytest.mark.parametrize("grid", [[], [0.5, 0.5], [1.5], "all"])
def test_a_bad_grid_from_the_server_fails_the_task_naming_it(trained, grid):
    executor, meta, sent, state_dir = trained
    with pytest.raises((DataError, ValueError), match="mix_grid"):
        validate(executor, meta, sent, state_dir, grid)


def test_a_site_whose_personal_model_is_broken_is_scored_with_the_global_side_of_the_grid(trained):
    """The choice must reach the score: with a personal model wrecked by noise the validation split picks a mix near
    the global model, and the site's Dice is that mix's, not the personal model's (each mix is built from copies:
    a state_dict aliases the model it came from)."""
    executor, meta, sent, state_dir = trained
    spec = meta[protocol.MODEL_SPEC]
    path = state_dir / PERSONAL_MODEL_FILE
    saved = torch.load(path)
    generator = torch.Generator().manual_seed(0)
    for value in saved["model"].values():
        if value.is_floating_point():
            value.add_(5 * torch.randn(value.shape, generator=generator))
    torch.save(saved, path)
    scores = validate(executor, meta, sent, state_dir, list(DEFAULT_GRID)).metrics
    assert scores["mix_alpha"] < 1.0
    global_state = load_numpy_state(build_model(spec), sent).state_dict()
    chosen = _model(spec, mix_states(global_state, saved["model"], scores["mix_alpha"]))
    test_loader = executor._loader(site_task(meta), "testing", train=False, seed=executor.seed)
    assert scores["dice"] == pytest.approx(executor._evaluate(chosen, test_loader, site_task(meta))["dice"], abs=1e-9)
    wrecked = executor._evaluate(_model(spec, saved["model"]), test_loader, site_task(meta))["dice"]
    assert scores["dice"] != pytest.approx(wrecked, abs=1e-6)


def test_the_choice_does_not_depend_on_the_order_of_the_sites_validation_split(trained, tmp_path):
    """The same validation images in another order must give the same mix and the same score: the choice is a
    property of the site's data, not of how its datalist happens to list it."""
    executor, meta, sent, state_dir = trained
    root = Path(executor._data_root(site_task(meta)))
    shuffled_root = tmp_path / "shuffled"
    shutil.copytree(root, shuffled_root)
    datalist = json.loads((root / "site-2.json").read_text())
    order = np.random.default_rng(0).permutation(len(datalist["validation"]))
    assert len(order) > 2 and list(order) != sorted(order)
    datalist["validation"] = [datalist["validation"][i] for i in order]
    (shuffled_root / "site-2.json").write_text(json.dumps(datalist))
    scores = validate(executor, meta, sent, state_dir, list(DEFAULT_GRID)).metrics
    reordered = FairflExecutor(
        image_size=32, batch_size=8, lr=1e-3, weight_decay=1e-4, synthetic_size_scale=0.5, data_root=str(shuffled_root)
    )
    assert reordered._data_root(site_task(meta)) == str(shuffled_root)  # it reads the shuffled datalist
    again = validate(reordered, meta, sent, state_dir, list(DEFAULT_GRID)).metrics
    assert again["mix_alpha"] == scores["mix_alpha"]
    assert again["dice"] == pytest.approx(scores["dice"], abs=1e-9)
