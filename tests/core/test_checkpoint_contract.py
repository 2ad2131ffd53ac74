"""The resume contract (FairRoundController.method_state): a controller restored from a round's checkpoint continues
exactly as the one that never stopped. For every registered method variant (fairfl.methods.VARIANTS: a new method is
held to it without new test code), a few rounds through the controller's real round steps, the sending replaced by
sites whose answers follow from what they were sent; a fresh controller restored from the checkpoint of a middle
round must then give the same global models, weights and every other field of the rounds that follow. A method that
leaves part of what it carries between rounds out of `method_state`/`method_tensors` fails here."""

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.files import json_safe
from fairfl.flare import protocol
from fairfl.kinds import Real
from fairfl.methods import JOBS, VARIANTS
from fairfl.models import initial_state

from helpers import variant_controller

SITES = ["site-1", "site-2", "site-3", "site-4"]
ROUNDS, CHECKPOINTED = 4, 1  # the checkpoint of round 1; rounds 2 and 3 must then be the same
TINY = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": ROUNDS, "eval_every": 1}


def started_controller(name, run_dir):
    """The controller of variant `name`, its task meta and results log made as the round loop makes them."""
    run_dir.mkdir(parents=True)
    controller = variant_controller(name, run_dir, SITES, **TINY)
    controller.task_meta = controller.common_task_meta(SITES)
    controller.results = controller._results_log(SITES)
    return controller


def draw(task_name, round_num, site) -> np.random.Generator:
    """The same numbers for the same site, round and task, whichever controller asks."""
    return np.random.default_rng([round_num, SITES.index(site), sum(map(ord, task_name))])


def honest_value(kind, generator):
    """A value of `kind` that differs between sites and rounds: a number drawn within [low, low + 1] of its range."""
    if not isinstance(kind, Real):
        return kind.example()
    low = max(kind.low, 0.0)
    return low + (min(kind.high, low + 1.0) - low) * generator.uniform(0.1, 0.9)


def honest_fields(controller, task_name, round_num, generator) -> dict:
    """Every field the method reads from an answer to `task_name` (`answer_fields`), each leaf drawn."""
    fields = {}
    for key, kind in controller.answer_fields(task_name, round_num).items():
        leaves = list(kind.leaves())
        if leaves == [((), kind)]:
            fields[key] = honest_value(kind, generator)
        else:
            fields[key] = {path[-1]: honest_value(leaf, generator) for path, leaf in leaves}
    return fields


def trained(sent: dict, seed: int) -> dict:
    """The torch state `sent` after a small step of local training, as numpy arrays (integer buffers unchanged)."""
    noise = torch.Generator().manual_seed(seed)
    return {
        k: (v + 0.01 * torch.randn(v.shape, generator=noise) if v.is_floating_point() else v).numpy()
        for k, v in sent.items()
    }


def site_answer(controller, task_name, model: FLModel, site) -> FLModel:
    """What an honest `site` answers to `task_name`: trained from the parameters it was sent (those it returns:
    `update_reference`), scores, and the method's fields; all drawn from the site, round and task alone."""
    round_num = model.current_round
    generator = draw(task_name, round_num, site)
    meta = {"client_name": site, protocol.NUM_SAMPLES: 20 + SITES.index(site)}
    params, metrics = {}, None
    if task_name == protocol.TASK_TRAIN:
        metrics = {"train_loss": generator.uniform(0.1, 1.0)}
        if model.meta[protocol.SEND_PARAMS]:
            params = trained(controller.update_reference(model.params), int(generator.integers(2**31)))
    elif task_name == protocol.TASK_VALIDATE:
        metrics = {controller.metric: generator.uniform(0.2, 0.9)}
        if model.meta.get(protocol.SCORE_GLOBAL):
            metrics["global_" + controller.metric] = generator.uniform(0.2, 0.9)
    meta.update(honest_fields(controller, task_name, round_num, generator))
    return FLModel(params_type=ParamsType.FULL, params=params, metrics=metrics, meta=meta)


def with_honest_sites(controller):
    """`controller` with its fan-out replaced: every target answers at once, honestly (`site_answer`)."""
    controller.ask = lambda round_num, task_name, model, targets: [
        site_answer(controller, task_name, model, site) for site in targets
    ]
    controller.ask_each = lambda round_num, task_name, models: [
        site_answer(controller, task_name, model, site) for site, model in models.items()
    ]
    return controller


def play_round(controller, round_num, global_state) -> tuple:
    """One round as the round loop plays it: train, the method's server step, evaluation. Returns the new global
    state and what the round's record gets from the method."""
    controller.absent, controller.failed = [], {}
    updates, rejected, _ = controller._train_round(round_num, global_state)
    global_state, extras = controller._server_step(round_num, global_state, updates, rejected)
    per_site = controller._evaluate(round_num, global_state, rejected)
    return global_state, {**extras, "rejected": rejected, "per_site": per_site}


def differing(a: dict, b: dict) -> list:
    """The keys of two states whose tensors differ (or that only one has)."""
    return sorted(k for k in a.keys() | b.keys() if k not in a or k not in b or not np.array_equal(a[k], b[k]))


def test_every_registered_controller_is_held_to_the_contract():
    assert {JOBS[v.job].controller for v in VARIANTS.values()} == {job.controller for job in JOBS.values()}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_controller_restored_from_a_checkpoint_continues_as_the_one_that_never_stopped(name, tmp_path):
    path = str(tmp_path / "checkpoint.pt")
    uninterrupted = with_honest_sites(started_controller(name, tmp_path / "uninterrupted"))
    state = initial_state(uninterrupted.model_spec(), 0)
    for round_num in range(CHECKPOINTED + 1):
        state, record = play_round(uninterrupted, round_num, state)
        assert not record["rejected"], f"{name}: honest sites rejected in round {round_num}: {record['rejected']}"
    uninterrupted._save_checkpoint(path, CHECKPOINTED, state)

    restored = with_honest_sites(started_controller(name, tmp_path / "restored"))
    loaded = restored._load_checkpoint(path)
    assert loaded["round"] == CHECKPOINTED and not differing(loaded["global_state"], state)
    restored_state = loaded["global_state"]
    for round_num in range(CHECKPOINTED + 1, ROUNDS):
        state, expected = play_round(uninterrupted, round_num, state)
        restored_state, record = play_round(restored, round_num, restored_state)
        assert not differing(restored_state, state), f"{name}: another global model in round {round_num}"
        assert json_safe(record) == json_safe(expected), f"{name}: another record of round {round_num}"
    assert json_safe(restored.method_state()) == json_safe(uninterrupted.method_state()), name
