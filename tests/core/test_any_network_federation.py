"""Every method on networks and data it was not written for: a hospital's MONAI network (not fairfl's unet, cnn or
resnet18), 3-D volumes and 2-D images. Each registered variant plays real rounds in one process: its controller's
round steps as the round loop runs them, and at every site the real executor (the server's task checked and read as a
site reads it, its loaders, steps and method tasks), only NVFlare's transport left out. The real simulator runs the
same on Fed-LWR and Solo (tests/integration/test_simulator_jobs.py); this file holds every variant to it cheaply.

A variant either trains and scores every site with finite numbers, or refuses the task at its construction with a
reason (FedNPR needs classes to form prototypes of: a segmentation task is refused)."""

import math

import pytest
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from fairfl.data.builtin import ensure_builtin
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import read_task
from fairfl.methods import VARIANTS
from fairfl.methods.steps import registered_tasks
from fairfl.models import initial_state
from fairfl.presets import apply_preset

from helpers import variant_controller

SITES = ["site-1", "site-6"]  # a large site and the minority one
# A 3-D SegResNet on the built-in volumes (16 x 32 x 32 at image size 32), patches of 16 voxels a side
VOLUMES = {
    "server": {
        "dataset": "prostate3d",
        "model": "SegResNet",
        "model_args": {
            "init_filters": 4,
            "norm": ["group", {"num_groups": 2}],
            "blocks_down": [1, 1, 1],
            "blocks_up": [1, 1],
        },
        "num_rounds": 1,
        "eval_every": 1,
    },
    "site": {"image_size": 32, "patch_size": [16, 16, 16], "batch_size": 2, "synthetic_size_scale": 0.1},
}
# A 2-D DenseNet121 classifying the built-in imbalanced skin images (every classification method's data)
IMAGES = {
    "server": {
        "dataset": "skin_imbalanced",
        "model": "DenseNet121",
        "model_args": {"init_features": 8, "growth_rate": 4, "block_config": [2, 2]},
        "num_rounds": 1,
        "eval_every": 1,
    },
    "site": {"image_size": 32, "batch_size": 16, "synthetic_size_scale": 0.25},
}
NEEDS_CLASSES = {"fednpr", "fednpr_per", "fedprox_npr", "fedprox_npr_per"}  # prototypes of classes
# one variant of every job (each method's own code once; tests/core/test_checkpoint_contract.py holds every variant's
# state through rounds): the first variant registered for it
ONE_PER_JOB = sorted({variant.job: name for name, variant in reversed(VARIANTS.items())}.values())


def site_answer(executors, state_dirs, task_name, model: FLModel, site) -> FLModel:
    """What `site` answers, its task read from the shareable exactly as FairflExecutor.execute reads it."""
    executor = executors[site]
    method_task = registered_tasks().get(task_name)
    task = read_task(site, FLModelUtils.to_shareable(model), method_task)
    apply_preset(executor, executor.preset, task.kind)
    if task_name == protocol.TASK_TRAIN:
        result = executor._train(task, state_dirs[site])
    elif task_name == protocol.TASK_VALIDATE:
        result = executor._validate(task, state_dirs[site])
    else:
        result = executor._method_task(method_task, task, state_dirs[site])
    result.meta = {**(result.meta or {}), "client_name": site}
    return result


def federation(variant, tmp_path, settings, data_root):
    """`variant`'s controller with every site answering in this process (`site_answer`)."""
    controller = variant_controller(variant, tmp_path / "server", SITES, **settings["server"])
    (tmp_path / "server").mkdir()
    controller.task_meta = controller.common_task_meta(SITES)
    controller.results = controller._results_log(SITES)
    executors = {site: FairflExecutor(data_root=str(data_root), **settings["site"]) for site in SITES}
    state_dirs = {site: str(tmp_path / site) for site in SITES}

    def ask(round_num, task_name, model, targets):
        return [site_answer(executors, state_dirs, task_name, model, site) for site in targets]

    controller.ask = ask
    controller.ask_each = lambda round_num, task_name, models: [
        site_answer(executors, state_dirs, task_name, model, site) for site, model in models.items()
    ]
    return controller


def play(controller) -> list:
    """The rounds as the round loop plays them; the per-site scores of each."""
    global_state, scores = initial_state(controller.model_spec(), controller.settings.seed), []
    for round_num in range(controller.settings.num_rounds):
        controller.absent, controller.failed = [], {}
        updates, rejected, _ = controller._train_round(round_num, global_state)
        assert not rejected and not controller.failed, (rejected, controller.failed)
        global_state, _ = controller._server_step(round_num, global_state, updates, rejected)
        assert not rejected, rejected
        scores.append(controller._evaluate(round_num, global_state, rejected)[0])
        assert not rejected and not controller.failed, (rejected, controller.failed)
    return scores


# the run's data cache (FAIRFL_CACHE_DIR): made once, whichever test process asks first
@pytest.fixture(scope="module")
def volumes():
    return ensure_builtin("prostate3d", image_size=32, num_sites=6, size_scale=0.1)


@pytest.fixture(scope="module")
def images():
    return ensure_builtin("skin_imbalanced", image_size=32, num_sites=6, size_scale=0.25)


@pytest.mark.parametrize("variant", ONE_PER_JOB)
def test_every_variant_trains_a_3d_monai_network_on_volumes_or_says_why_not(variant, tmp_path, volumes):
    """Every site of every variant trains SegResNet on patches of its resampled volumes and is scored on its whole test
    volumes (sliding window): Dice, HD95 and surface Dice, finite, at every site; or the variant refuses."""
    if variant in NEEDS_CLASSES:
        with pytest.raises(ValueError, match="classification|segmentation"):
            federation(variant, tmp_path, VOLUMES, volumes)
        return
    scores = play(federation(variant, tmp_path, VOLUMES, volumes))
    for per_site in scores:
        assert set(per_site) == set(SITES)
        for site, metrics in per_site.items():
            assert 0.0 <= metrics["dice"] <= 1.0 and 0.0 <= metrics["surface_dice"] <= 1.0, (site, metrics)
            assert math.isfinite(metrics["hd95"]) and metrics["hd95"] >= 0.0, (site, metrics)


@pytest.mark.parametrize("variant", [v for v in ONE_PER_JOB if v in NEEDS_CLASSES or v.startswith(("fedism", "qfed"))])
def test_the_classification_methods_train_a_2d_densenet(variant, tmp_path, images):
    """FedISM+ (sharpness and SAGA, with DenseNet's batch norm), q-FedAvg and FedNPR(-Per) (its head found as the
    network's last linear layer) on a network none of them was written for: finite balanced accuracy everywhere."""
    scores = play(federation(variant, tmp_path, IMAGES, images))
    for per_site in scores:
        assert set(per_site) == set(SITES)
        for site, metrics in per_site.items():
            assert 0.0 <= metrics["balanced_accuracy"] <= 1.0, (site, metrics)
