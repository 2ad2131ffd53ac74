"""Every field of every answer a method's server reads, fuzzed, for every registered method variant.

For each variant of the registry (fairfl.methods.VARIANTS: a new method is covered without new test code), one honest
round, then round 1 again with one site's answer changed: each hostile value (a string, a list, a dict, None, NaN,
inf, an int beyond float's range, a large negative number, a bool, an array for a number) put into each field the
server reads: a training metric, the sample count, a tensor of the model, and every number the method declares it
reads (`answer_fields`: FedISM's sharpness report field by field, FedCE's leave-one-out error, q-FedAvg's loss and
lr, CFFL's validation score, Fed-LWR's CKA per layer in its own task), plus an evaluation metric. The site must be
rejected for the round naming the field, the method must aggregate the others, and the global model must stay finite.

Through the controllers' real screening and aggregation with the sending replaced (tests/core/test_site_checks.py
does the same by hand for chosen cases; the simulator tests carry hostile sites through real runs)."""

import os

import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.flare import protocol
from fairfl.methods import VARIANTS
from fairfl.methods.steps import registered_tasks
from fairfl.models import initial_state

from helpers import variant_controller

SITES = ["site-1", "site-2", "site-3", "site-4"]
BAD_SITE = "site-3"
TINY = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": 3, "eval_every": 1}
HOSTILE = {
    "a string": "0.5",
    "a list": [0.5],
    "a dict": {"value": 0.5},
    "None": None,
    "NaN": float("nan"),
    "inf": float("inf"),
    "10**400": 10**400,
    "-1e9": -1e9,
    "a bool": True,
    "an array": np.array([0.5]),
}


def fuzzed_controller(name, tmp_path):
    return variant_controller(name, tmp_path, SITES, **TINY)


def honest_model(start: dict, reference_keys, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        k: (start[k] + 0.01 * torch.randn(start[k].shape, generator=generator).numpy()).astype(start[k].dtype)
        if start[k].dtype.kind == "f"
        else start[k].copy()
        for k in reference_keys
    }


def honest_answers(controller, task_name, round_num, global_state, targets):
    """What honest sites answer to `task_name`: a model (train: trained from what each was sent), metrics, and an
    honest value of every field the method declares it reads."""
    fields = controller.answer_fields(task_name, round_num)
    starts = controller.models_for(round_num, global_state, targets) or {s: global_state for s in targets}
    keys = list(controller.update_reference(global_state))
    answers = []
    for i, site in enumerate(targets):
        meta = {"client_name": site, protocol.NUM_SAMPLES: 20 + i, **{k: f.example() for k, f in fields.items()}}
        if task_name == protocol.TASK_TRAIN:
            sends = controller.start_from == protocol.FROM_GLOBAL  # Solo's weights never leave the site
            params = honest_model(starts[site], keys, 100 * round_num + i) if sends else {}
            metrics = {"train_loss": 0.5}
        else:
            params = {}
            metrics = {controller.metric: 0.5 + 0.1 * i} if task_name == protocol.TASK_VALIDATE else None
            if controller.scores_global and task_name == protocol.TASK_VALIDATE:
                metrics["global_" + controller.metric] = 0.4
        answers.append(FLModel(params_type=ParamsType.FULL, params=params, metrics=metrics, meta=meta))
    return answers


def fields_to_fuzz(controller, round_num) -> list:
    """(task, where, path) of every value of an answer the server reads."""
    found = [(protocol.TASK_TRAIN, "metrics", ("train_loss",)), (protocol.TASK_VALIDATE, "metrics", (None,))]
    if controller.start_from == protocol.FROM_GLOBAL:
        found += [(protocol.TASK_TRAIN, "meta", (protocol.NUM_SAMPLES,)), (protocol.TASK_TRAIN, "params", (None,))]
    for task in (protocol.TASK_TRAIN, *registered_tasks()):  # and every method's own site task
        for key, schema in controller.answer_fields(task, round_num).items():
            found += [(task, "meta", (key, *path)) for path, _ in schema.leaves()]
    return found


def put(answer: FLModel, where: str, path: tuple, value, controller) -> None:
    if where == "metrics":
        name = path[0] or controller.metric
        answer.metrics = {**answer.metrics, name: value}
    elif where == "params":
        key = next(k for k, v in answer.params.items() if v.dtype.kind == "f")
        answer.params = {**answer.params, key: value}
    else:
        container = answer.meta
        for step in path[:-1]:
            container[step] = dict(container[step])
            container = container[step]
        container[path[-1]] = value


def run_round(controller, round_num, global_state, hostile=None, missing=()):
    """One round through the real screening, the method's aggregation (and its own tasks) and the evaluation; the
    sites' answers honest except `hostile` = (task, where, path, value) for BAD_SITE, and no answer at all from the
    `missing` sites (they failed or stalled: absent). Returns (new state, rejected, the round's extras)."""

    def answers_to(task_name, targets):
        answers = honest_answers(
            controller, task_name, round_num, global_state, [s for s in targets if s not in missing]
        )
        if hostile and hostile[0] == task_name:
            put(next(a for a in answers if a.meta["client_name"] == BAD_SITE), *hostile[1:], controller)
        return answers

    controller._ask_models = lambda r, task, model, targets, state: answers_to(task, targets)
    controller.ask = lambda r, task, model, targets: answers_to(task, targets)
    updates, rejected, _ = controller._train_round(round_num, global_state)
    new_state, extras = controller.aggregate_round(round_num, global_state, updates, rejected)
    controller._evaluate(round_num, new_state, rejected)
    return new_state, rejected, extras


def fuzzed_cases(name, tmp_path) -> tuple:
    """(the state after an honest round 0, [(task, where, path, label, value)] of every hostile value in every field
    variant `name`'s server reads in round 1)."""
    controller = fuzzed_controller(name, tmp_path)
    state0 = initial_state(controller.model_spec(), 0)
    state1, rejected, _ = run_round(controller, 0, state0)
    assert not rejected, f"{name}: honest answers rejected: {rejected}"
    fields = fields_to_fuzz(controller, 1)
    return state0, state1, [(*where, label, value) for where in fields for label, value in HOSTILE.items()]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_hostile_value_in_any_field_rejects_only_that_site_and_the_round_goes_on(name, tmp_path):
    state0, state1, cases = fuzzed_cases(name, tmp_path)
    assert cases
    for task, where, path, label, value in cases:
        fresh = fuzzed_controller(name, tmp_path)
        run_round(fresh, 0, state0)
        new, rejected, _ = run_round(fresh, 1, state1, (task, where, path, value))
        what = f"{name}: {label} in {task} {where} {path}"
        assert set(rejected) == {BAD_SITE}, f"{what}: rejected {rejected}"
        field = path[-1] if path[-1] is not None else (fresh.metric if where == "metrics" else "")
        assert str(field) in rejected[BAD_SITE] or where == "params", f"{what}: {rejected[BAD_SITE]!r}"
        assert all(np.isfinite(np.asarray(v)).all() for v in new.values() if np.asarray(v).dtype.kind == "f"), what


def method_memory(controller) -> dict:
    """What a stateful method's server keeps about BAD_SITE across rounds."""
    memory = {}
    if getattr(controller, "saga_state", None) is not None and BAD_SITE in controller.saga_state.weights:
        memory["SAGA weight"] = controller.saga_state.weights[BAD_SITE]
    if BAD_SITE in getattr(controller, "reputations", {}):  # its reputation is carried, then renormalised with all
        memory["model"] = {k: v.tobytes() for k, v in controller.site_models[BAD_SITE].items()}
    return memory


def weighted_sites(extras: dict) -> set:
    """The sites a round's aggregation weighted (its weights, Fed-LWR's anchor and layer weights)."""
    found = set(extras.get("weights", {})) | set(extras.get("anchor_weights", {}))
    for per_site in extras.get("layer_weights", {}).values():
        found |= set(per_site)
    return found


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_site_missing_from_one_round_is_left_out_of_it_and_counted_again_when_it_is_back(name, tmp_path):
    # what every method does with a site that failed or stalled in round 1 (the others answered: the quorum holds)
    # and answers again in round 2; each method page says what it keeps for such a site
    controller = fuzzed_controller(name, tmp_path)
    state = initial_state(controller.model_spec(), 0)
    state, rejected, first = run_round(controller, 0, state)
    kept = method_memory(controller)
    state, rejected, without = run_round(controller, 1, state, missing=(BAD_SITE,))
    after = method_memory(controller)
    for what in kept:  # SAGA's last weight, CFFL's and CGSV's model of the site: kept through the absence
        assert after[what] == kept[what], f"{name}: {what} of the absent site changed"
    if hasattr(controller, "reputations"):  # still in the federation, not removed for its absence
        assert controller.reputations[BAD_SITE] > 0 and BAD_SITE not in getattr(controller, "removed", [])
    if hasattr(controller, "contribution"):  # FedCE: it had no share of the global model it receives next
        assert controller.contribution.weights[BAD_SITE] == 0.0
    assert not rejected and all(
        np.isfinite(np.asarray(v)).all() for v in state.values() if np.asarray(v).dtype.kind == "f"
    )
    state, rejected, back = run_round(controller, 2, state)
    assert not rejected, f"{name}: the site back in round 2 was rejected: {rejected}"
    if weighted_sites(first):  # every method that weights sites (not Solo)
        assert weighted_sites(first) == weighted_sites(back) == set(SITES), name
        assert weighted_sites(without) == set(SITES) - {BAD_SITE}, name


def test_every_method_page_says_what_the_method_does_with_a_site_missing_from_a_round():
    from fairfl.methods import UNITS

    from helpers import REPO

    for page in sorted({unit.doc for unit in UNITS}):
        with open(os.path.join(REPO, "docs", page)) as f:
            assert "**A site missing from a round**" in f.read(), page
