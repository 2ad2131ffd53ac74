"""The local training options a job chooses: the optimiser (Adam or plain SGD, q-FedAvg's authors' local solver),
keeping its state across rounds, and which training augmentation runs. Each is checked against a hand computation
or against the data it must leave alone, and for the hostile or broken input a site can meet."""

import os

import numpy as np
import pytest
import torch
from monai.transforms import RandFlipd, RandRotate90d, RandScaleIntensityd, RandShiftIntensityd
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.data.loaders import AUGMENTATIONS, _augmentation, check_augmentation, make_loader
from fairfl.errors import DataError
from fairfl.files import save_atomic
from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask, check_meta
from fairfl.models import build_model, initial_state, load_numpy_state, state_to_numpy
from fairfl.report.runs import group_of
from fairfl.training import (
    TrainSettings,
    check_optimizer_settings,
    load_optimizer_state,
    make_optimizer,
    optimizer_state,
    seed_everything,
    site_seed,
    train_local,
)

import helpers
from helpers import trained_weights

TINY = {"model_channels": [8, 16, 32], "model_strides": [2, 2], "num_rounds": 2}


# ----------------------------------------------------------------------------------------------------- the optimiser
def test_sgd_is_a_plain_gradient_step_and_adam_the_default():
    model = torch.nn.Linear(3, 1, bias=False)
    before = model.weight.detach().clone()
    x, y = torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.zeros(5, 1)
    settings = TrainSettings(lr=0.1, weight_decay=0.0, optimizer="sgd")
    optimizer = make_optimizer(model, settings)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    gradient = model.weight.grad.clone()
    optimizer.step()
    torch.testing.assert_close(model.weight.detach(), before - 0.1 * gradient)
    assert isinstance(make_optimizer(model, TrainSettings()), torch.optim.Adam)
    with pytest.raises(ValueError, match="optimizer"):
        make_optimizer(model, TrainSettings(optimizer="lbfgs"))


@pytest.mark.parametrize(
    "bad, word",
    [
        (None, "object"),
        ({"name": "rmsprop", "momentum": 0.0, "keep_state": False}, "name"),
        ({"name": "sgd", "momentum": 1.0, "keep_state": False}, "momentum"),
        ({"name": "sgd", "momentum": float("nan"), "keep_state": False}, "momentum"),
        ({"name": "sgd", "momentum": True, "keep_state": False}, "momentum"),
        ({"name": "adam", "momentum": 0.0, "keep_state": "yes"}, "keep_state"),
        ({"name": "adam", "momentum": 0.0, "keep_state": False, "betas": [0.9, 1.0]}, "betas"),
        ({"name": "adam", "momentum": 0.0, "keep_state": False, "betas": [0.9]}, "betas"),
        ({"name": "adam", "momentum": 0.0, "keep_state": False, "betas": [float("nan"), 0.9]}, "betas"),
        ({"name": "adam", "momentum": 0.0, "keep_state": False, "betas": "0.9,0.99"}, "betas"),
    ],
)
def test_bad_optimiser_settings_are_named(bad, word):
    assert word in check_optimizer_settings(bad)
    if bad is not None:  # the same refusal as a job argument
        argument = {
            "name": "local_optimizer",
            "momentum": "momentum",
            "keep_state": "keep_optimizer_state",
            "betas": "adam_betas",
        }[word]
        with pytest.raises(ValueError, match=f"FairRoundController: {argument} must be"):
            FairRoundController(
                local_optimizer=bad["name"],
                momentum=bad["momentum"],
                keep_optimizer_state=bad["keep_state"],
                adam_betas=bad.get("betas", [0.9, 0.999]),
                **TINY,
            )


def test_the_controller_sends_and_records_the_optimiser():
    controller = FairRoundController(local_optimizer="sgd", momentum=0.9, keep_optimizer_state=True, **TINY)
    config = controller.config()
    assert (config["local_optimizer"], config["momentum"], config["keep_optimizer_state"]) == ("sgd", 0.9, True)
    assert group_of({"method": "fedavg", "config": config}) == "fedavg (SGD; optimiser state kept)"
    assert group_of({"method": "fedavg", "config": FairRoundController(**TINY).config()}) == "fedavg"
    # Fed-LWR's authors' Adam: its betas are sent to every site, recorded and keep such runs apart in the report
    authors = FairRoundController(keep_optimizer_state=True, adam_betas=[0.9, 0.99], **TINY)
    assert authors.common_task_meta(["site-1"])[protocol.OPTIMIZER] == {
        "name": "adam",
        "momentum": 0.0,
        "keep_state": True,
        "betas": [0.9, 0.99],
    }
    assert authors.config()["adam_betas"] == [0.9, 0.99]
    assert group_of({"method": "fedlwr", "config": authors.config()}) == (
        "fedlwr (optimiser state kept; Adam betas [0.9, 0.99])"
    )
    assert FairRoundController(**TINY).config()["adam_betas"] == [0.9, 0.999]  # PyTorch's, as before


def test_the_betas_reach_adam():
    model = torch.nn.Linear(3, 2)
    assert make_optimizer(model, TrainSettings()).param_groups[0]["betas"] == (0.9, 0.999)
    assert make_optimizer(model, TrainSettings(betas=(0.9, 0.99))).param_groups[0]["betas"] == (0.9, 0.99)


def adam_after_one_step(model):
    adam = make_optimizer(model, TrainSettings())
    model(torch.ones(1, 3)).sum().backward()
    adam.step()
    return adam


def test_a_fitting_state_is_loaded_with_the_jobs_settings_never_the_files():
    model = torch.nn.Linear(3, 2)
    saved = optimizer_state(adam_after_one_step(model), "adam", 0)
    saved["moments"][0]["exp_avg"] = saved["moments"][0]["exp_avg"] + 1.0
    fresh = make_optimizer(model, TrainSettings(lr=5e-4, weight_decay=0.0))
    assert load_optimizer_state(fresh, "adam", saved) is None
    torch.testing.assert_close(fresh.state_dict()["state"][0]["exp_avg"], saved["moments"][0]["exp_avg"])
    group = fresh.param_groups[0]
    assert group["lr"] == 5e-4 and group["weight_decay"] == 0.0  # the file held 1e-3 and 1e-4


def damaged(kind):
    model = torch.nn.Linear(3, 2)
    saved = optimizer_state(adam_after_one_step(model), "adam", 0)
    entry = saved["moments"][0]
    if kind == "step_negative":
        entry["step"] = torch.tensor(-1.0)
    elif kind == "step_nan":
        entry["step"] = torch.tensor(float("nan"))
    elif kind == "step_text":
        entry["step"] = "1"
    elif kind == "missing_moment":
        del entry["exp_avg_sq"]
    elif kind == "negative_second_moment":
        entry["exp_avg_sq"] = -torch.ones_like(entry["exp_avg_sq"])
    elif kind == "nan_moment":
        entry["exp_avg"] = torch.full_like(entry["exp_avg"], float("nan"))
    elif kind == "not_a_dict":
        saved["moments"][0] = "x"
    elif kind == "bad_index":
        saved["moments"][7] = saved["moments"].pop(0)
    elif kind == "other_network":
        return saved, torch.nn.Linear(4, 2)
    elif kind == "other_optimizer":
        saved["optimizer"] = "sgd"
    return saved, model


@pytest.mark.parametrize(
    "kind",
    [
        "step_negative",
        "step_nan",
        "step_text",
        "missing_moment",
        "negative_second_moment",
        "nan_moment",
        "not_a_dict",
        "bad_index",
        "other_network",
        "other_optimizer",
    ],
)
def test_a_state_that_does_not_fit_is_refused_and_nothing_is_loaded(kind):
    saved, model = damaged(kind)
    optimizer = make_optimizer(model, TrainSettings())
    assert load_optimizer_state(optimizer, "adam", saved)
    assert optimizer.state_dict()["state"] == {}  # untouched: a fresh optimiser


@pytest.fixture
def site(cache_dir):
    controller = FairRoundController(**TINY)
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


def site_task(meta, params, round_num, **optimizer) -> SiteTask:
    chosen = {"name": "adam", "momentum": 0.0, "keep_state": False, **optimizer}
    task = FLModel(
        params_type=ParamsType.FULL, params=params, current_round=round_num, meta={**meta, protocol.OPTIMIZER: chosen}
    )
    return SiteTask.of("site-2", task)


def train(executor, meta, params, state_dir, round_num, **optimizer):
    return executor._train(site_task(meta, params, round_num, **optimizer), str(state_dir))


def test_kept_state_is_one_adam_continued_across_the_rounds(site, tmp_path):
    """With keep_state and Fed-LWR's authors' betas, a site's second round is exactly what one torch.optim.Adam of
    those betas gives when it goes on from its first round onto the new global model (the authors' code), the state
    passing through the site's state folder; a fresh optimiser gives another model."""
    controller, meta, _ = site
    # two Adam steps a round
    executor = FairflExecutor(
        image_size=32, batch_size=8, lr=1e-3, weight_decay=1e-4, synthetic_size_scale=0.5, local_steps=2
    )
    w0 = initial_state(controller.model_spec(), 0)
    kept0 = train(executor, meta, w0, tmp_path, 0, keep_state=True, betas=[0.9, 0.99])
    w1 = {k: v + 0.01 * np.sign(v) if v.dtype.kind == "f" else v for k, v in trained_weights(kept0, w0).items()}
    kept1 = train(executor, meta, w1, tmp_path, 1, keep_state=True, betas=[0.9, 0.99])
    fresh1 = train(executor, meta, w1, tmp_path / "fresh", 1, betas=[0.9, 0.99])

    # the reference: one Adam, its state never reset, the weights replaced in place by the global model's
    reference = build_model(controller.model_spec())
    load_numpy_state(reference, w0)
    adam = torch.optim.Adam(
        reference.parameters(), lr=executor.lr, betas=(0.9, 0.99), weight_decay=executor.weight_decay
    )
    settings = executor._train_settings(site_task(meta, w0, 0, betas=[0.9, 0.99]))
    assert settings.betas == (0.9, 0.99)  # the server's betas reach the site's settings
    for round_num, start, answer in ((0, w0, kept0), (1, w1, kept1)):
        task = site_task(meta, start, round_num)
        load_numpy_state(reference, start)  # copies into the same parameters: Adam's state stays theirs
        seed = site_seed(executor.seed, "site-2") + round_num
        seed_everything(seed)  # as the site seeds its round
        loader = executor._loader(task, "training", train=True, seed=seed)
        train_local(reference, loader, settings, torch.device("cpu"), loss_fn=executor._loss(task), optimizer=adam)
        expected = state_to_numpy(reference.state_dict())
        got = trained_weights(answer, start)
        assert all(np.allclose(got[k], expected[k], rtol=1e-5, atol=1e-6) for k in expected), f"round {round_num}"
    assert not all(np.allclose(trained_weights(fresh1, w1)[k], expected[k]) for k in expected)
    assert all(group["betas"] == (0.9, 0.99) for group in adam.param_groups)
    next_task = site_task(meta, w1, 2, keep_state=True, betas=[0.9, 0.99])
    built = executor._optimizer(next_task, reference, settings, tmp_path)
    assert built.param_groups[0]["betas"] == (0.9, 0.99) and built.state_dict()["state"]  # the kept state, loaded


def test_a_kept_optimiser_state_carries_adams_moments_into_the_next_round(site, tmp_path):
    controller, meta, executor = site
    w0 = initial_state(controller.model_spec(), 0)
    fresh = train(executor, meta, w0, tmp_path / "fresh", 0)
    w1 = trained_weights(fresh, w0)
    assert not os.path.exists(tmp_path / "fresh" / protocol.OPTIMIZER_STATE_FILE)  # the default keeps nothing
    kept = train(executor, meta, w0, tmp_path / "kept", 0, keep_state=True)
    assert all(np.array_equal(kept.params[k], fresh.params[k]) for k in fresh.params)  # round 0: nothing to keep
    assert torch.load(tmp_path / "kept" / protocol.OPTIMIZER_STATE_FILE)["round"] == 0
    again_fresh = train(executor, meta, w1, tmp_path / "fresh", 1)
    again_kept = train(executor, meta, w1, tmp_path / "kept", 1, keep_state=True)
    assert not all(np.allclose(again_kept.params[k], again_fresh.params[k]) for k in again_fresh.params)

    # a round repeated after a restart starts from the state the round before left, not from its first try's
    assert torch.load(tmp_path / "kept" / protocol.PREVIOUS_OPTIMIZER_STATE_FILE)["round"] == 0
    repeat = train(executor, meta, w1, tmp_path / "kept", 1, keep_state=True)
    assert all(np.array_equal(repeat.params[k], again_kept.params[k]) for k in again_kept.params)

    # a state from another round (an old run under the same run_name) is never used: the optimiser starts afresh
    stale = train(executor, meta, w1, tmp_path / "kept", 5, keep_state=True)
    from_nothing = train(executor, meta, w1, tmp_path / "nothing", 5, keep_state=True)
    assert all(np.array_equal(stale.params[k], from_nothing.params[k]) for k in stale.params)


@pytest.mark.parametrize("damage", ["garbage", "other_optimizer", "nan", "not_a_state", "other_shapes"])
def test_a_broken_kept_state_is_an_error_naming_site_and_file(site, tmp_path, damage):
    controller, meta, executor = site
    w0 = initial_state(controller.model_spec(), 0)
    train(executor, meta, w0, tmp_path, 0, keep_state=True)
    path = tmp_path / protocol.OPTIMIZER_STATE_FILE
    saved = torch.load(path)
    if damage == "garbage":
        path.write_bytes(b"not a torch file")
    elif damage == "other_optimizer":
        save_atomic({**saved, "optimizer": "sgd"}, str(path))
    elif damage == "not_a_state":
        save_atomic({"round": "0"}, str(path))
    elif damage == "other_shapes":  # another network's state (a stale file under the same run_name)
        first = next(iter(saved["moments"]))
        saved["moments"][first]["exp_avg"] = torch.zeros(3, 1, 2)
        save_atomic(saved, str(path))
    else:
        first = next(iter(saved["moments"]))
        saved["moments"][first]["exp_avg"].fill_(float("nan"))
        save_atomic(saved, str(path))
    with pytest.raises(DataError, match="site-2") as error:
        train(executor, meta, w0, tmp_path, 1, keep_state=True)
    assert str(path) in str(error.value) and "delete it" in str(error.value)


def test_a_hostile_servers_optimiser_settings_are_bad_task_data(site):
    _, meta, _ = site
    for bad in (
        {"name": "adam; rm -rf /", "momentum": 0.0, "keep_state": False},
        {"name": "sgd", "momentum": 1e300, "keep_state": False},
    ):
        with pytest.raises(DataError, match="the server's task.*optimizer"):
            check_meta("site-1", {**meta, protocol.OPTIMIZER: bad})


def test_local_sgd_trains_the_unet(site):
    """Plain SGD at the lr q-FedAvg (SGD) runs with lowers the Dice loss of a site within a round's steps."""
    controller, meta, executor = site
    from fairfl.models import build_model

    model = build_model(controller.model_spec())
    loader = executor._loader(SiteTask.of("site-2", FLModel(meta=meta)), "training", train=True, seed=0)
    first = train_local(
        model, loader, TrainSettings(lr=0.5, weight_decay=0.0, optimizer="sgd", local_epochs=1), torch.device("cpu")
    )
    later = train_local(
        model, loader, TrainSettings(lr=0.5, weight_decay=0.0, optimizer="sgd", local_epochs=3), torch.device("cpu")
    )
    assert later["train_loss"] < first["train_loss"]


# ------------------------------------------------------------------------------------------------------ augmentation
def test_the_default_augmentation_is_the_one_every_benchmark_ran():
    """Bit-identical to the hard-coded list before it became a job argument: the same transforms in the same order
    (each draws from the seeded generator in turn)."""
    assert [type(t) for t in _augmentation(["image", "label"])] == [
        RandFlipd,
        RandFlipd,
        RandRotate90d,
        RandScaleIntensityd,
        RandShiftIntensityd,
    ]
    # the very transforms (probabilities, axes, factors) the benchmarks ran with, frozen here: same seed, same output
    from monai.transforms import Compose

    keys = ["image", "label"]
    before = Compose(
        [
            RandFlipd(keys, prob=0.5, spatial_axis=0),
            RandFlipd(keys, prob=0.5, spatial_axis=1),
            RandRotate90d(keys, prob=0.5, max_k=3),
            RandScaleIntensityd("image", factors=0.1, prob=0.5),
            RandShiftIntensityd("image", offsets=0.1, prob=0.5),
        ]
    )
    now = Compose(_augmentation(keys))
    sample = {
        "image": torch.randn(1, 8, 8, generator=torch.Generator().manual_seed(0)),
        "label": (torch.arange(64).reshape(1, 8, 8) % 3 == 0).long(),
    }
    before.set_random_state(seed=7)
    now.set_random_state(seed=7)
    for _ in range(20):
        a, b = before(dict(sample)), now(dict(sample))
        assert torch.equal(torch.as_tensor(a["image"]), torch.as_tensor(b["image"]))
        assert torch.equal(torch.as_tensor(a["label"]), torch.as_tensor(b["label"]))
    assert check_augmentation(None) == list(AUGMENTATIONS)
    assert _augmentation("image", []) == []
    for bad in (["flip", "flip"], ["mirror"], "flip", [None], 3):
        with pytest.raises(ValueError, match="augmentation"):
            check_augmentation(bad)
    with pytest.raises(ValueError, match="augmentation"):
        FairflExecutor(augmentation=["rotate45"])


def masks(loader):
    return [m for batch in loader for m in batch["label"]]


@pytest.mark.parametrize("names, moves_masks", [([], False), (["intensity"], False), (["flip", "rotate90"], True)])
def test_switching_orientation_augmentation_off_leaves_every_mask_as_it_is(site, names, moves_masks):
    """With flips and quarter turns off, every training mask is one of the site's unaugmented masks exactly (the
    intensity jitter never touches a mask); with them on, some are mirrored or turned."""
    _, meta, executor = site
    entries = executor._loader(SiteTask.of("site-2", FLModel(meta=meta)), "training", train=False, seed=0).dataset.data
    kwargs = dict(image_size=32, num_classes=2, batch_size=4, seed=3, site="site-2")
    plain = masks(make_loader(entries, train=False, **kwargs))
    augmented = masks(make_loader(entries, train=True, augmentation=names, **kwargs))
    unchanged = [any(torch.equal(m, p) for p in plain) for m in augmented]
    assert len(augmented) == len(plain)
    assert (not all(unchanged)) == moves_masks


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "5"])
def test_average_last_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="average_last"):
        FairRoundController(average_last=bad, **TINY)


# ------------------------------------------------------------------------------------- larger test splits
@pytest.mark.parametrize("bad", [0.5, 0, -1, 21, 1e9, True, "3", float("nan"), float("inf"), None, [2]])
def test_test_scale_must_be_a_number_from_1_to_20(bad):
    with pytest.raises(ValueError, match="test_scale"):
        FairRoundController(test_scale=bad, **TINY)


def test_test_scale_goes_from_the_servers_config_to_the_sites_built_in_data(tmp_path, monkeypatch):
    """The controller records test_scale and sends it in every task; the site generates the larger test split into a
    cache folder of its own; the default is test_scale 1 in the folder the data always had."""
    monkeypatch.setenv("FAIRFL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FAIRFL_DATA_ROOT", raising=False)
    assert FairRoundController(**TINY).config()["test_scale"] == 1.0
    controller = FairRoundController(test_scale=2, **TINY)
    meta = controller.common_task_meta(["site-1", "site-2"])
    assert controller.config()["test_scale"] == meta[protocol.TEST_SCALE] == 2.0
    site = FairflExecutor(image_size=32, synthetic_size_scale=0.2)
    scaled = site._data_root(SiteTask.of("site-1", FLModel(meta=meta)))
    default = site._data_root(SiteTask.of("site-1", FLModel(meta={**meta, protocol.TEST_SCALE: 1.0})))
    assert os.path.basename(default) == "prostate-v1-n6-s32-seed0-x0.2"
    assert os.path.basename(scaled) == "prostate-v1-n6-s32-seed0-x0.2-t2.0"
    before = {k: v for k, v in meta.items() if k != protocol.TEST_SCALE}  # a server from before test_scale
    assert os.path.basename(site._data_root(SiteTask.of("site-1", FLModel(meta=before)))) == os.path.basename(default)


def test_a_named_run_from_before_test_scale_resumes_at_test_scale_1_only(tmp_path):
    from fairfl.results import ResultsLog
    from fairfl.training import load_tensors

    def controller(**changes):
        c = FairRoundController(run_name="trial", **TINY, **changes)
        c.results = ResultsLog(
            str(tmp_path / "results.json"),
            method=c.method,
            task=c.task,
            metric=c.metric,
            seed=0,
            sites=["site-1"],
            config=c.config(),
        )
        return c

    path, state = str(tmp_path / "checkpoint.pt"), initial_state(controller().model_spec(), seed=0)
    controller()._save_checkpoint(path, 0, state)
    old = load_tensors(path)
    del old["config"]["test_scale"]  # as a checkpoint made before test_scale existed
    save_atomic(old, path)
    assert controller()._load_checkpoint(path)["round"] == 0
    with pytest.raises(ValueError, match=r"other settings \(test_scale\)"):
        controller(test_scale=2)._load_checkpoint(path)
