"""The classification side of the FLARE layer without FLARE running: built-in datasets, task-aware presets and
model specs, FedISM(+) and q-FedAvg aggregation in their controllers (rejections, restart), and the executor's
train/validate on tiny built-in skin data."""

import json
import math

import numpy as np
import pytest
import torch

from fairfl.data.builtin import BUILTIN_DATASETS, builtin_dataset
from fairfl.data.classification_sites import SETTINGS
from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController, SiteUpdate
from fairfl.flare.executor import FairflExecutor
from fairfl.methods.fedism.controller import FedISMController
from fairfl.methods.fedism.protocol import SALT_ALPHA, SALT_RHO, SHARPNESS, SHARPNESS_RHO
from fairfl.methods.fedism.saga import SagaState
from fairfl.methods.qfedavg.controller import QFedAvgController
from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS, MEASURE_LOSS
from fairfl.models import initial_state, state_to_torch
from fairfl.presets import PRESETS, apply_preset, resolve_preset
from fairfl.site_checks import number_problem

from helpers import screened, trained_weights

SITES = ("site-1", "site-2", "site-3")
TINY = {"dataset": "skin", "model_channels": [4, 8], "num_rounds": 4}


@pytest.mark.parametrize("name", ["skin", "skin_blur", "ich", "ich_blur"])
def test_classification_datasets_are_registered_with_the_generator_shapes(name):
    data = builtin_dataset(name)
    setting = SETTINGS[name.split("_")[0]]
    assert data.task == "classification" and data.min_sites == 2
    assert (data.in_channels, data.num_classes) == (setting.in_channels, len(setting.classes))
    assert data.ensure_function().__name__ == f"ensure_builtin_{name}"
    assert {d.task for d in BUILTIN_DATASETS.values()} == {"segmentation", "classification"}


def test_task_sets_metric_model_and_paper_preset(monkeypatch):
    seg, cls = FairRoundController(), FairRoundController(dataset="ich", model_norm="instance")
    assert (seg.task, seg.metric, seg.model_spec()["name"]) == ("segmentation", "dice", "unet")
    assert (cls.task, cls.metric) == ("classification", "auc")
    assert cls.model_spec() == {
        "name": "cnn",
        "in_channels": 1,
        "num_classes": 5,
        "channels": [16, 32, 64],
        "norm": "instance",
    }
    assert seg.model_spec()["channels"] == [16, 32, 64, 128]
    assert FairRoundController(dataset="ich", model_channels=[8]).model_spec()["channels"] == [8]
    resnet = FairRoundController(dataset="skin", model="resnet18").model_spec()
    assert resnet == {"name": "resnet18", "in_channels": 3, "num_classes": 8}
    monkeypatch.setenv("FAIRFL_PRESET", "paper")
    assert resolve_preset("", "segmentation") is PRESETS["paper"]
    paper = resolve_preset("", "classification")
    assert (paper["model"], paper["image_size"], paper["lr"], paper["batch_size"]) == ("resnet18", 224, 3e-4, 32)


def test_null_settings_take_the_task_defaults_and_set_ones_are_kept(monkeypatch):
    monkeypatch.delenv("FAIRFL_PRESET", raising=False)
    for task, expected in (("segmentation", (8, 1e-3, 1e-4, 2.0)), ("classification", (32, 3e-4, 5e-4, 1.0))):
        executor = FairflExecutor()
        apply_preset(executor, "", task)
        assert (executor.batch_size, executor.lr, executor.weight_decay, executor.synthetic_size_scale) == expected
    executor = FairflExecutor(lr=0.01, batch_size=4)
    apply_preset(executor, "", "classification")
    assert (executor.lr, executor.batch_size, executor.weight_decay) == (0.01, 4, 5e-4)


def test_number_problem():
    assert number_problem(0.5, "loss") is None and number_problem(0, "loss", 0.0, 1.0) is None
    for bad in (None, True, float("nan"), float("inf"), -0.1, "1", [1.0]):
        assert number_problem(bad, "loss").startswith("loss is ")
    assert number_problem(1.5, "error", 0.0, 1.0)


def updates_with(global_state, reports, key, seed=0, lr=None):
    """SiteUpdates as a controller receives them: a perturbed copy of the global model per site and its report."""
    generator = torch.Generator().manual_seed(seed)
    updates = {}
    for i, site in enumerate(sorted(reports)):
        state = {
            k: v + 0.01 * (i + 1) * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in state_to_torch(global_state).items()
        }
        meta = {} if reports[site] is None else {key: reports[site]}
        if lr:
            meta[protocol.LR] = lr
        updates[site] = SiteUpdate(state, 10 + i, meta)
    return updates


def sharpness(s, loss=1.0):
    return {"loss": loss, "perturbed_loss": loss + s, "sharpness": s, "rho": 0.1, "grad_norm": 1.0, "samples": 10}


def mixture(updates, weights):
    return {
        k: sum(weights[s] * updates[s].state[k].double() for s in weights) for k in next(iter(updates.values())).state
    }


def test_fedism_schedule_and_names():
    plus = FedISMController(**TINY)
    assert plus.method == "fedismplus_s" and FedISMController(variant="L", **TINY).method == "fedismplus_l"
    rhos = [plus.train_meta(r)[SALT_RHO] for r in range(4)]
    assert rhos == pytest.approx([0.1 * ((r + 1) / 4) ** 0.5 for r in range(4)]) and rhos[-1] == pytest.approx(0.1)
    meta = plus.train_meta(1)
    assert meta[SHARPNESS_RHO] == meta[SALT_RHO] and meta[SALT_ALPHA] == 0.1
    fixed = FedISMController(rho_max=0.05, tau=0.0, **TINY)
    assert fixed.method == "fedism" and FedISMController(tau=0, variant="L", **TINY).method == "fedism_l"
    assert {fixed.train_meta(r)[SALT_RHO] for r in range(4)} == {0.05}
    with pytest.raises(ValueError):
        FedISMController(variant="X", **TINY)


@pytest.mark.parametrize("variant", ["S", "L"])
def test_fedism_aggregates_by_saga_weights_and_rejects_bad_reports(variant):
    controller = FedISMController(variant=variant, **TINY)
    state0 = initial_state(controller.model_spec(), seed=0)
    reports = {
        "site-1": sharpness(0.1, 1.0),
        "site-2": sharpness(0.3, 2.0),
        "site-3": sharpness(float("nan")),
        "site-4": sharpness(-2e6, 1.0),
        "site-5": None,
    }  # site-4: absurd (a negative one is clipped to 0)
    rejected = {}
    updates = screened(controller, 0, updates_with(state0, reports, SHARPNESS), rejected)
    new, extras = controller.aggregate(0, state0, updates, rejected)
    assert set(rejected) == {"site-3", "site-4", "site-5"} and all("sharpness" in r for r in rejected.values())
    values = {"site-1": 0.1, "site-2": 0.3} if variant == "S" else {"site-1": 1.1, "site-2": 2.3}
    expected = {s: v**2 / sum(x**2 for x in values.values()) for s, v in values.items()}
    assert extras["weights"] == pytest.approx(expected) and extras["raw_weights"] == pytest.approx(expected)
    assert extras["rho"] == pytest.approx(0.1 * (1 / 4) ** 0.5)
    assert extras["sharpness"]["site-2"]["sharpness"] == pytest.approx(0.3)
    for name, value in mixture(updates, expected).items():
        np.testing.assert_allclose(new[name], value.numpy(), rtol=1e-5, atol=1e-6)
    # round 2: the moving average of Eq. 18
    _, extras1 = controller.aggregate(
        1,
        new,
        updates_with(new, {"site-1": sharpness(0.3, 1.0), "site-2": sharpness(0.1, 2.0)}, SHARPNESS),
        {},
    )
    values1 = {"site-1": 0.3, "site-2": 0.1} if variant == "S" else {"site-1": 1.3, "site-2": 2.1}
    raw1 = {s: v**2 / sum(x**2 for x in values1.values()) for s, v in values1.items()}
    assert extras1["weights"] == pytest.approx({s: 0.5 * raw1[s] + 0.5 * expected[s] for s in raw1})


def test_salt_only_ablation_aggregates_like_fedavg_and_asks_for_no_sharpness():
    """saga: false is FedISM+'s Table I ablation: the same SALT training (rho schedule in the task), FedAvg's
    sample-size weights whatever the sites report, and no sharpness probe to pay for."""
    controller = FedISMController(saga=False, **TINY)
    assert controller.method == "salt" and controller.config()["saga"] is False
    meta = controller.train_meta(0)
    assert SALT_RHO in meta and SHARPNESS_RHO not in meta
    state0 = initial_state(controller.model_spec(), seed=0)
    reports = {"site-1": sharpness(0.9), "site-2": None, "site-3": sharpness(float("nan"))}  # ignored, never rejected
    updates = updates_with(state0, reports, SHARPNESS)
    rejected = {}
    new, extras = controller.aggregate(0, state0, updates, rejected)
    expected = {s: u.num_samples / sum(v.num_samples for v in updates.values()) for s, u in updates.items()}
    assert not rejected and extras["weights"] == pytest.approx(expected) and "raw_weights" not in extras
    for name, value in mixture(updates, expected).items():
        np.testing.assert_allclose(new[name], value.numpy(), rtol=1e-5, atol=1e-6)
    assert FedISMController(saga=False, tau=0.0, **TINY).method == "salt_fixed_rho"  # FedISM's rho: its own row
    with pytest.raises(ValueError, match="saga"):
        FedISMController(saga="no", **TINY)


def test_fedism_keeps_the_global_model_when_no_report_is_valid():
    controller = FedISMController(**TINY)
    state0 = initial_state(controller.model_spec(), seed=0)
    rejected = {}
    updates = screened(controller, 0, updates_with(state0, {"site-1": None}, SHARPNESS), rejected)
    new, extras = controller.aggregate(0, state0, updates, rejected)
    assert new is state0 and "weights" not in extras and set(rejected) == {"site-1"}
    assert controller.saga_state.rounds == 0  # the next round still starts from raw weights


def test_fedism_state_on_disk_gives_the_same_next_round_as_staying_up():
    up = FedISMController(**TINY)
    state = initial_state(up.model_spec(), seed=0)
    for r in range(2):
        reports = {s: sharpness(0.1 * (i + 1 + r)) for i, s in enumerate(SITES)}
        state, _ = up.aggregate(r, state, updates_with(state, reports, SHARPNESS, seed=r), {})
    saved = json.loads(json.dumps(up.method_state()))  # what method_state.json holds
    restarted = FedISMController(**TINY)
    restarted.load_method_state(saved)
    assert isinstance(restarted.saga_state, SagaState) and restarted.saga_state.rounds == 2
    updates = updates_with(state, {s: sharpness(0.05 * (i + 1)) for i, s in enumerate(SITES)}, SHARPNESS, 2)
    new_up, extras_up = up.aggregate(2, state, updates, {})
    new_restarted, extras_restarted = restarted.aggregate(2, state, updates, {})
    assert extras_up["weights"] == extras_restarted["weights"]
    for name in new_up:
        np.testing.assert_array_equal(new_up[name], new_restarted[name])


def test_qfedavg_with_lipschitz_zero_is_loss_weighted_fedavg_and_rejects_bad_losses():
    controller = QFedAvgController(q=2.0, lipschitz=0.0, **TINY)
    assert controller.method == "qfedavg_lossweighted" and QFedAvgController(**TINY).method == "qfedavg"
    state0 = initial_state(controller.model_spec(), seed=0)
    rejected = {}
    updates = updates_with(state0, {"site-1": 1.0, "site-2": 2.0, "site-3": float("nan"), "site-4": None}, GLOBAL_LOSS)
    updates = screened(controller, 0, updates, rejected)
    new, extras = controller.aggregate(0, state0, updates, rejected)
    assert set(rejected) == {"site-3", "site-4"}
    assert extras["weights"] == pytest.approx({"site-1": 0.2, "site-2": 0.8}) and extras[
        "global_share"
    ] == pytest.approx(0)
    for name, value in mixture(updates, {"site-1": 0.2, "site-2": 0.8}).items():
        if value.is_floating_point() and state_to_torch(state0)[name].is_floating_point():
            np.testing.assert_allclose(new[name], value.numpy(), rtol=1e-5, atol=1e-6)


def test_qfedavg_lipschitz_from_the_sites_lr_keeps_part_of_the_global_model():
    controller = QFedAvgController(q=1.0, **TINY)
    state0 = initial_state(controller.model_spec(), seed=0)
    updates = updates_with(state0, {"site-1": 1.0, "site-2": 2.0}, GLOBAL_LOSS, lr=1e-3)
    _, extras = controller.aggregate(0, state0, updates, {})
    assert extras["lipschitz"] == pytest.approx(1e3)
    assert 0 < extras["global_share"] < 1 and sum(extras["weights"].values()) + extras["global_share"] == pytest.approx(
        1
    )
    # a site without an lr, or with another lr than most sites', is rejected; the job goes on
    rejected = {}
    updates = screened(controller, 0, updates_with(state0, {"site-1": 1.0}, GLOBAL_LOSS), rejected)
    new, extras = controller.aggregate(0, state0, updates, rejected)
    assert new is state0 and extras == {} and "no lr in the answer" in rejected["site-1"]
    updates = updates_with(state0, {"site-1": 1.0, "site-2": 2.0, "site-3": 1.5}, GLOBAL_LOSS, lr=1e-3)
    updates["site-2"].meta[protocol.LR] = 1e-9  # a tiny lr would make L huge and freeze the model
    rejected = {}
    _, extras = controller.aggregate(0, state0, updates, rejected)
    assert set(rejected) == {"site-2"} and "differs" in rejected["site-2"]
    assert set(extras["weights"]) == {"site-1", "site-3"} and extras["lipschitz"] == pytest.approx(1e3)


def test_executor_trains_with_salt_measures_and_evaluates_clean_and_corrupted(tmp_path, cache_dir):
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    from fairfl.flare.executor import FairflExecutor
    from fairfl.flare.site_task import SiteTask

    controller = FedISMController(dataset="skin", model_channels=[4, 8], num_rounds=2)
    meta = {
        protocol.MODEL_SPEC: controller.model_spec(),
        protocol.DATASET: "skin",
        protocol.TASK: "classification",
        protocol.NUM_SITES: 4,
        protocol.DATA_SEED: 0,
        protocol.START_FROM: protocol.FROM_GLOBAL,
        MEASURE_LOSS: True,
        **controller.train_meta(1),
    }
    executor = FairflExecutor(image_size=32, batch_size=16, lr=3e-4, weight_decay=5e-4, synthetic_size_scale=0.2)
    params = initial_state(controller.model_spec(), 0)
    sent = FLModel(params_type=ParamsType.FULL, params=params, current_round=1, meta=meta)
    result = executor._train(SiteTask.of("site-4", sent), str(tmp_path))
    report = result.meta[SHARPNESS]
    assert report["rho"] == pytest.approx(0.1) and report["samples"] == result.meta[protocol.NUM_SAMPLES]
    assert report["sharpness"] == pytest.approx(report["perturbed_loss"] - report["loss"])
    assert result.meta[GLOBAL_LOSS] == report["loss"] and result.meta[protocol.LR] == 3e-4
    assert result.metrics["rho"] == pytest.approx(0.1) and "train_perturbed_loss" in result.metrics
    assert result.metrics["probe_seconds"] > 0
    weights = trained_weights(result, params)
    changed = [k for k in params if not np.array_equal(params[k], weights[k])]
    assert changed  # it trained
    trained = FLModel(
        params_type=ParamsType.FULL, params=weights, meta={**meta, protocol.EVALUATE: protocol.FROM_GLOBAL}
    )
    scores = executor._validate(SiteTask.of("site-4", trained), str(tmp_path)).metrics
    names = ("accuracy", "balanced_accuracy", "auc", "balanced_accuracy_se", "auc_se")  # with their standard errors
    assert set(scores) == {*names, "corrupted_site", *(f"{q}_{n}" for n in names for q in ("clean", "corrupted"))}
    assert all(0.0 <= v <= 1.0 and math.isfinite(v) for v in scores.values())
    # site-4 of 4 is the corrupted one (the last 20%): its own-quality scores are the corrupted test set's
    assert scores["corrupted_site"] == 1.0 and all(scores[n] == scores[f"corrupted_{n}"] for n in names)
    other_site = FairflExecutor(image_size=32, batch_size=16, synthetic_size_scale=0.2)  # one site per process
    clean = other_site._validate(SiteTask.of("site-1", trained), str(tmp_path / "site-1")).metrics
    assert clean["corrupted_site"] == 0.0 and all(clean[n] == clean[f"clean_{n}"] for n in names)
    assert clean["clean_auc"] == scores["clean_auc"]  # one shared test set: the same model scores the same


def test_checkpoint_restores_round_model_saga_state_and_results_and_refuses_other_settings(tmp_path):
    from fairfl.results import ResultsLog

    def controller(**changes):
        c = FedISMController(run_name="trial", **{**TINY, **changes})
        c.results = ResultsLog(
            str(tmp_path / f"results{len(changes)}.json"),
            method=c.method,
            task=c.task,
            metric=c.metric,
            seed=0,
            sites=["site-1", "site-2"],
            config=c.config(),
        )
        return c

    first = controller()
    state0 = initial_state(first.model_spec(), seed=0)
    updates = updates_with(state0, {"site-1": sharpness(0.2), "site-2": sharpness(0.4)}, SHARPNESS)
    state1, extras = first.aggregate(0, state0, updates, {})
    first.results.add_round(0, 1.0, weights=extras["weights"])
    first.results.cross_site(0, {"site-1": {"site-1": 0.5, "site-2": 0.25}})  # kept by a resubmitted run
    path = str(tmp_path / "trial" / "checkpoint.pt")
    assert first._load_checkpoint(path) is None  # a new run
    first._save_checkpoint(path, 0, state1)
    # restarted with more rounds and a lower min_clients: allowed
    resumed = controller(num_rounds=6, min_clients=1)
    loaded = resumed._load_checkpoint(path)
    assert loaded["round"] == 0 and all(np.array_equal(loaded["global_state"][k], state1[k]) for k in state1)
    assert resumed.saga_state.to_dict() == first.saga_state.to_dict()
    assert resumed.results.data["rounds"] == first.results.data["rounds"] and resumed.results.data["resumed"] == 1
    assert resumed.results.data["cross_site"] == first.results.data["cross_site"]
    with pytest.raises(ValueError, match="other settings .*q"):
        controller(q=1.0)._load_checkpoint(path)
    # a checkpoint written before an argument existed (here: this release's optimiser, average_last and saga
    # arguments) ran at that argument's default: it resumes; a non-default value for it is another run
    import torch

    old = torch.load(path, weights_only=True)
    for key in ("local_optimizer", "momentum", "keep_optimizer_state", "adam_betas", "average_last", "saga"):
        del old["config"][key]
    torch.save(old, path)
    assert controller(num_rounds=6)._load_checkpoint(path)["round"] == 0
    with pytest.raises(ValueError, match="other settings .*average_last"):
        controller(average_last=3)._load_checkpoint(path)
