"""The method units as the registry finds them (fairfl.methods): in today's order, their client steps in today's
order, and every unit meeting the contract a newcomer might forget (its page, its jobs, its controllers' arguments,
its client steps' fields, a place of its own)."""

import dataclasses
import importlib
import os

import pytest

from fairfl.kinds import Kind
from fairfl.methods import CLIENT_STEPS, UNITS, discovered_units, in_order, step_order
from fairfl.methods.make_jobs import job_configs, load_class
from fairfl.methods.spec import ControllerArguments
from fairfl.methods.steps import ClientStep

from helpers import JOBS, REPO

# the benchmark's default method lists, its claims and so the SUMMARY tables follow this order (the units shipped
# before the registry found them; a new unit is placed by its own `order`)
ORDER = (
    "solo",
    "fedavg",
    "fedprox",
    "fedbn",
    "qfedavg",
    "ditto",
    "rewards",
    "fedce",
    "fedlwr",
    "fedism",
    "fednpr",
    "fedfloor",
)
STEPS = (
    "fairfl.methods.fedce.client.LeaveOneOutError",
    "fairfl.methods.fednpr.client.PersonalHead",
    "fairfl.methods.fedbn.client.LocalNorm",
    "fairfl.methods.rewards.client.ValidateTrained",
    "fairfl.methods.ditto.client.PersonalTraining",
    "fairfl.methods.fedfloor.client.ValidatedMix",
    "fairfl.methods.ditto.client.PersonalEvaluation",
    "fairfl.methods.fedism.client.ProbeModelSent",
    "fairfl.methods.fednpr.client.NPRObjective",
    "fairfl.methods.fedprox.client.ProximalTerm",
    "fairfl.methods.fedism.client.SALTTraining",
)
UNIT_NAMES = [unit.name for unit in UNITS]


def test_the_units_are_found_in_their_order():
    """The units shipped so far keep their order among themselves; a new unit stands where its own order puts it, with
    no edit here (FedAvgM, added that way at order 25, stood between FedAvg and FedProx)."""
    assert [name for name in UNIT_NAMES if name in ORDER] == list(ORDER)
    assert {unit.name for unit in discovered_units()} == set(UNIT_NAMES) >= set(ORDER)
    assert [unit.order for unit in UNITS] == sorted(unit.order for unit in UNITS)


def test_the_client_steps_run_in_their_order():
    assert [step for step in CLIENT_STEPS if step in STEPS] == list(STEPS)


def test_two_units_in_one_place_or_two_steps_of_one_rank_are_refused():
    fedavg, fedprox = (next(u for u in UNITS if u.name == name) for name in ("fedavg", "fedprox"))
    with pytest.raises(ValueError, match="method units fedavg and fedprox have the same order, 20"):
        in_order([fedavg, dataclasses.replace(fedprox, order=fedavg.order)])
    assert in_order([fedprox, fedavg]) == (fedavg, fedprox)
    twin = dataclasses.replace(fedavg, client_steps=(("fairfl.methods.fedavg.client.Twin", 100),))
    with pytest.raises(ValueError, match="client steps .*ProximalTerm and .*Twin have the same rank, 100"):
        step_order([fedprox, twin])


@pytest.mark.parametrize("name", UNIT_NAMES)
def test_each_unit_meets_the_contract(name):
    unit = next(u for u in UNITS if u.name == name)
    assert os.path.isfile(os.path.join(REPO, "docs", unit.doc)), f"{name}: no page docs/{unit.doc}"
    for job in unit.jobs:
        for path in job_configs(job):
            assert os.path.isfile(os.path.join(JOBS, job.name, path)), f"jobs/{job.name}/{path}: run fairfl make-jobs"
    # its controllers' arguments, declared in its own arguments module
    controllers = importlib.import_module(f"{unit.package}.arguments").CONTROLLERS
    assert {job.controller for job in unit.jobs} <= set(controllers), f"{name}: a job's controller is not declared"
    for path, arguments in controllers.items():
        assert path.startswith(f"{unit.package}.") and isinstance(arguments, ControllerArguments), path
        assert isinstance(load_class(path), type), path
    # its client steps: its own, each reading declared kinds
    for path, rank in unit.client_steps:
        step = load_class(path)
        assert path.startswith(f"{unit.package}.") and issubclass(step, ClientStep) and isinstance(rank, int), path
        assert all(isinstance(kind, Kind) for kind in step.fields.values()), path
    assert isinstance(unit.order, int) and [u.order for u in UNITS].count(unit.order) == 1
