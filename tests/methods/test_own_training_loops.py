"""The method units whose client step trains with a loop of its own (a ClientStep overriding `train`), as the registry
finds them (fairfl.methods): DP-SGD's per-item clipping covers only the executor's loop, so a run of any job of such a
unit asking for DP-SGD is refused at job start by its server and by a site reading its task, each naming the step, and
the site naming itself; the same task without DP-SGD passes the site's check."""

import pytest

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_task import SERVERS_TASK, check_meta
from fairfl.methods import UNITS
from fairfl.methods.make_jobs import load_class
from fairfl.methods.steps import ClientStep
from fairfl.privacy.settings import job_refusal

# every unit found with a loop of its own when this test replaced the units' own copies of it, and the step that runs
# it: each must still be found here (a new unit with a loop of its own is found without an edit)
COVERED = {
    "fedrdn": "RandomDomainNormalization",
    "apfl": "MixedTraining",
    "fedala": "AdaptiveStart",
    "fedism": "SALTTraining",
}
SITE = "site-2"


def own_loops(unit) -> list[str]:
    """The names of `unit`'s client steps with a training loop of their own."""
    steps = [load_class(path) for path, _ in unit.client_steps]
    return [step.__name__ for step in steps if step.train is not ClientStep.train]


OWN_LOOPS = {unit.name: steps for unit in UNITS if (steps := own_loops(unit))}
JOBS = [(unit, job) for unit in UNITS if unit.name in OWN_LOOPS for job in unit.jobs]


def test_every_unit_with_a_training_loop_of_its_own_is_found_with_its_jobs():
    assert {name: steps for name, steps in OWN_LOOPS.items() if name in COVERED} == {
        name: [step] for name, step in COVERED.items()
    }
    assert all(len(steps) == 1 for steps in OWN_LOOPS.values()), OWN_LOOPS  # a task runs at most one loop
    assert {unit.name for unit, _ in JOBS} == set(OWN_LOOPS) and all(unit.jobs for unit, _ in JOBS)


@pytest.mark.parametrize("unit, job", JOBS, ids=[job.name for _, job in JOBS])
def test_dp_sgd_is_refused_at_job_start_and_by_a_site_naming_the_step_with_its_own_loop(unit, job):
    server = load_class(job.controller)(**{**job.server, "dp_epsilon": 8})
    assert server.method in {variant.records for variant in unit.variants}
    meta = {**server.common_task_meta(["site-1", SITE]), **server.train_meta(0)}  # a run's first train task
    assert meta[protocol.PRIVACY] == {"epsilon": 8.0, "delta": 1e-5, "clip": 1.0, "rounds": server.settings.num_rounds}
    step = OWN_LOOPS[unit.name][0]
    why = f"its site step {step} trains with a loop of its own, which per-item clipping does not cover"
    assert job_refusal(server.method, meta) == f"dp_epsilon: {server.method} cannot train with DP-SGD: {why}"
    with pytest.raises(DataError) as error:
        check_meta(SITE, meta)
    assert (error.value.site, error.value.path) == (SITE, SERVERS_TASK)
    assert error.value.problem == f"{protocol.PRIVACY} asks for DP-SGD, but {why}"
    assert str(error.value).startswith(f"[{SITE}] ")
    check_meta(SITE, {k: v for k, v in meta.items() if k != protocol.PRIVACY})  # without DP-SGD: the site trains it
