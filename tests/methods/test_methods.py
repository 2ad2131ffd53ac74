"""The method registry (fairfl.methods): every name, job and claim in one place, the committed jobs/ made from it, and
each variant's controller recording the name the registry gives it."""

import json
import os
import shutil
from pathlib import Path

import pytest

from fairfl.cli import main as cli_main
from fairfl.jobconfig import component_arguments
from fairfl.methods import (
    FAMILIES,
    UNITS,
    VARIANTS,
    Job,
    MethodSpec,
    Variant,
    _unique,
    display_name,
    family_claims,
    family_methods,
    variant_job,
)
from fairfl.methods import (
    JOBS as SPEC_JOBS,
)
from fairfl.methods.make_jobs import differences, job_configs, load_class, write_jobs
from fairfl.methods.steps import registered_tasks

from helpers import JOBS, REPO


def test_the_committed_jobs_are_exactly_what_the_registry_makes():
    assert differences(JOBS) == [], "run `fairfl make-jobs` and commit jobs/"
    assert cli_main(["make-jobs", "--check"]) == 0


def test_a_hand_edited_missing_or_unknown_job_is_reported_by_file(tmp_path, capsys):
    root = str(tmp_path / "jobs")
    shutil.copytree(JOBS, root)
    server = os.path.join(root, "fedlwr", "app", "config", "config_fed_server.json")
    with open(server) as f:
        config = json.load(f)
    config["workflows"][0]["args"]["weighting"] = "samples"  # same JSON kind, another method
    with open(server, "w") as f:
        json.dump(config, f)
    os.remove(os.path.join(root, "ditto", "meta.json"))
    os.makedirs(os.path.join(root, "fedmystery", "app"))
    with open(os.path.join(root, "fedce", "app", "custom", "helper.py"), "w") as f:
        f.write("import os\n")  # code in a job folder: the registry makes none
    assert sorted(differences(root)) == [
        "ditto/meta.json: missing",
        "fedce/app/custom/helper.py: not made by the registry",
        "fedlwr/app/config/config_fed_server.json: differs",
        "fedmystery/: no method spec makes this job",
    ]
    assert cli_main(["make-jobs", "--check", "--out", root]) == 1
    assert "4 difference(s)" in capsys.readouterr().err
    written = write_jobs(root)
    assert sorted(written) == ["ditto/meta.json", "fedlwr/app/config/config_fed_server.json"]
    assert differences(root) == [
        "fedce/app/custom/helper.py: not made by the registry",
        "fedmystery/: no method spec makes this job",
    ]  # reported, never deleted


def test_a_job_spec_naming_an_argument_its_controller_lacks_is_refused():
    typo = Job("fedlwr", "fairfl.methods.fedlwr.controller.FedLWRController", server={"cka_clipp": [0.0, 1.0]})
    with pytest.raises(ValueError, match="cka_clipp"):
        job_configs(typo)
    with pytest.raises(ValueError, match="lr_max"):
        job_configs(Job("fedavg", "fairfl.methods.fedavg.controller.FedAvgController", client={"lr_max": 1.0}))


def test_job_arguments_are_the_fairfl_constructors_own_with_the_most_derived_default():
    lwr = component_arguments(load_class(SPEC_JOBS["fedlwr"].controller))
    assert lwr["weighting"] == "uniform" and lwr["model_strides"] == [2, 2, 2] and "cka_clip" in lwr
    assert "persistor_id" not in lwr and "ignore_result_error" not in lwr  # NVFlare's ModelController's, not ours
    assert list(lwr).index("num_rounds") < list(lwr).index("cka_clip")  # the shared arguments first


def test_a_job_lists_train_validate_and_its_own_units_site_tasks_only():
    """The sites route a task to the executor only if the job lists it: each job lists the two every method runs and
    the site tasks of its own unit (Fed-LWR's cka), no other unit's."""
    tasks = registered_tasks()
    for unit in UNITS:
        own = [load_class(path).name for path in unit.site_tasks]
        assert set(own) <= set(tasks), unit.name
        for job in unit.jobs:
            assert job.tasks == ("train", "validate", *own), job.name
    assert "cka" in {load_class(path).name for unit in UNITS if unit.name == "fedlwr" for path in unit.site_tasks}


def test_names_are_unique_and_duplicates_refused():
    assert len({v.display for v in VARIANTS.values()}) == len(VARIANTS)
    assert len({u.name for u in UNITS}) == len(UNITS)
    twice = [Variant("fedavg", "FedAvg", "fedavg"), Variant("fedavg", "FedAvg again", "fedavg")]
    with pytest.raises(ValueError, match="two variants named 'fedavg'"):
        _unique(twice, "variants")


def test_every_variant_runs_a_registered_job_and_every_unit_has_its_page():
    for name, variant in VARIANTS.items():
        assert variant.job in SPEC_JOBS, name
        assert set(variant.families) <= set(FAMILIES), name
        assert display_name(name) == variant.display
    assert display_name("an_old_method") == "an_old_method"
    for unit in UNITS:
        assert isinstance(unit, MethodSpec) and os.path.isfile(os.path.join(REPO, "docs", unit.doc)), unit.name
        assert unit.variants and all(v.job in {j.name for j in unit.jobs} | set(SPEC_JOBS) for v in unit.variants)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_s_controller_records_the_variant_s_name(name):
    """The name a run records (results.json `method`) is the one the registry, the benchmark and the report use: the
    controller built from the variant's job and arguments must say so."""
    job_name, arguments = variant_job(name)
    job = SPEC_JOBS[job_name]
    server_args = job_configs(job)["app/config/config_fed_server.json"]["workflows"][0]["args"]
    client_args = job_configs(job)["app/config/config_fed_client.json"]["executors"][0]["executor"]["args"]
    assert set(arguments) <= set(server_args) | set(client_args), f"{name}: arguments its job lacks"
    controller = load_class(job.controller)(
        **{**server_args, **{k: v for k, v in arguments.items() if k in server_args}}
    )
    assert controller.method == VARIANTS[name].records
    assert VARIANTS[name].records == name or controller.config()["local_optimizer"] != "adam"


def test_every_claim_compares_two_variants_its_family_runs_by_default():
    for family in FAMILIES:
        methods = family_methods(family)
        assert methods and len(methods) == len(set(methods))
        for claim in family_claims(family):
            assert claim.method in methods and claim.baseline in methods, claim.text(display_name)
            assert claim.statistic in ("avg", "std")
    assert sum(len(family_claims(f)) for f in FAMILIES) == sum(len(u.claims) for u in UNITS)  # none unfiled


def test_dataset_defaults_yield_to_the_variant_s_component_arguments():
    assert variant_job("fedprox_npr", "ich_imbalanced") == ("fednpr", {"num_subclusters": 2, "mu": 0.01})
    assert variant_job("fednpr", "prostate") == ("fednpr", {})
    odd = Variant(
        "odd", "Odd", "fednpr", {"num_subclusters": 3}, dataset_arguments={"ich_imbalanced": {"num_subclusters": 2}}
    )
    VARIANTS["odd"] = odd
    try:
        assert variant_job("odd", "ich_imbalanced")[1] == {"num_subclusters": 3}
    finally:
        del VARIANTS["odd"]
    with pytest.raises(TypeError):
        odd.arguments["num_subclusters"] = 4  # a spec cannot be changed by whoever reads it


@pytest.mark.parametrize("job_name", sorted(SPEC_JOBS))
def test_a_controller_s_config_records_every_argument_it_was_given(job_name):
    """config() is derived from the constructor: a new argument is recorded (results.json, the checkpoint a resumed
    run must match) without a hand-kept list, and one stored under another name fails here."""
    job = SPEC_JOBS[job_name]
    cls = load_class(job.controller)
    arguments = component_arguments(cls)
    config = cls(**job.server).config()
    assert set(arguments) - {"task_check_period"} <= set(config), job_name
    assert "task_check_period" not in config  # how often the server polls changes no result
    assert cls(**{**job.server, "average_last": 3}).config()["average_last"] == 3


def test_only_the_fan_out_touches_nvflare_s_private_task_fields():
    private = ("_current_failed_clients", "_current_num_targets", "_current_min_responses", "_task_check_period")
    package = os.path.join(REPO, "custom", "fairfl")
    users = sorted(
        os.path.relpath(os.path.join(folder, f), package)
        for folder, _, files in os.walk(package)
        for f in files
        if f.endswith(".py") and any(name in Path(folder, f).read_text() for name in private)
    )
    assert users == [os.path.join("flare", "fanout.py")]
