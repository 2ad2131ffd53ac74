"""DP-SGD asked for where it cannot hold is refused, never run without DP: by the server at job start (a method whose
local training has a loop or an objective of its own, batch norm, cross-site evaluation) and by a site reading such a
task; where it holds, the server starts and its sites accept the task. Every unit with a training loop of its own:
tests/methods/test_own_training_loops.py. The arguments' own hostile values are in tests/core/test_arguments.py
(HOSTILE)."""

import importlib
import json
import os
import re
from pathlib import Path

import pytest

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_task import check_meta
from fairfl.privacy.settings import job_refusal

from helpers import JOBS, REPO, segmentation_task_meta


def controller(job: str, **arguments):
    """The server's controller of jobs/<job> with its job's arguments and `arguments`."""
    with open(os.path.join(JOBS, job, "app", "config", "config_fed_server.json")) as f:
        workflow = json.load(f)["workflows"][0]
    module, name = workflow["path"].rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**{**workflow["args"], **arguments})


def private_task(job: str, **arguments) -> tuple:
    """The server of jobs/<job> asked for DP-SGD, and the meta of its run's first train task."""
    server = controller(job, dp_epsilon=8, **arguments)
    meta = {**server.common_task_meta(["site-1", "site-2"]), **server.train_meta(0)}
    assert meta[protocol.PRIVACY] == {"epsilon": 8.0, "delta": 1e-5, "clip": 1.0, "rounds": server.settings.num_rounds}
    return server, meta


def start_refusal(job: str, **arguments):
    """What the server says at job start (fairfl.flare.engine: the check before round 0), from the run's real meta."""
    server, meta = private_task(job, **arguments)
    return job_refusal(server.method, meta)


@pytest.mark.parametrize(
    "job", ["fedavg", "fedprox", "ditto", "fedfloor", "qfedavg", "fedce", "fedlwr", "solo", "cffl", "cgsv", "fedsoup"]
)
def test_the_methods_whose_local_training_dp_sgd_covers_start_and_their_sites_accept_the_task(job):
    server, meta = private_task(job)
    assert job_refusal(server.method, meta) is None
    check_meta("site-2", meta)


@pytest.mark.parametrize(
    "job, why",
    [
        ("fedism_plus", r"fedism\w* cannot train with DP-SGD: its site step SALTTraining trains with a loop"),
        ("fedism", r"fedism\w* cannot train with DP-SGD: its site step SALTTraining trains with a loop"),
        ("fednpr", r"fednpr\w* cannot train with DP-SGD: its site step NPRObjective replaces the local loss"),
        ("fednpr_per", r"fednpr\w* cannot train with DP-SGD: its site step NPRObjective replaces the local loss"),
        ("fedbn", "fedbn cannot train with DP-SGD: the network has batch norm .* set model_norm to 'instance'"),
    ],
)
def test_a_method_dp_sgd_cannot_cover_is_refused_at_job_start_naming_it_and_why(job, why):
    problem = start_refusal(job)
    assert problem is not None and re.search(f"^dp_epsilon: {why}", problem), problem


def test_fedbn_with_group_norm_starts():
    assert start_refusal("fedbn", dataset="skin", model_norm="group") is None  # the CNN's group norm, kept local


def test_dp_with_cross_site_evaluation_is_refused_by_the_controller():
    with pytest.raises(ValueError, match="dp_epsilon with cross_site_eval"):
        controller("solo", dp_epsilon=8, cross_site_eval=True)


def test_no_dp_sends_no_privacy_field():
    server = controller("fedavg")
    assert protocol.PRIVACY not in server.common_task_meta(["site-1", "site-2"])


def test_a_site_refuses_a_private_task_whose_steps_dp_sgd_cannot_cover_and_a_bad_privacy_field():
    from fairfl.methods.fedism.protocol import SALT_RHO

    meta = {
        **segmentation_task_meta({"name": "unet", "in_channels": 1, "num_classes": 2}),
        protocol.PRIVACY: {"epsilon": 8.0, "delta": 1e-5, "clip": 1.0, "rounds": 2},
    }
    check_meta("site-1", meta)  # FedAvg's task: fine
    with pytest.raises(DataError, match="asks for DP-SGD, but its site step SALTTraining trains with a loop"):
        check_meta("site-1", {**meta, SALT_RHO: 0.05})
    for bad in ({"epsilon": 0, "delta": 1e-5, "clip": 1.0, "rounds": 2}, {"epsilon": 8.0, "clip": 1.0, "rounds": 2}):
        with pytest.raises(DataError, match=f"task field {protocol.PRIVACY}"):
            check_meta("site-1", {**meta, protocol.PRIVACY: bad})


def method_pages():
    """{docs/methods page: the jobs its Paper table lists} for every method page."""
    pages = {}
    for name in sorted(os.listdir(os.path.join(REPO, "docs", "methods"))):
        if name.endswith(".md") and not name.startswith("_"):
            text = Path(REPO, "docs", "methods", name).read_text()
            paper = text.split("## Paper", 1)[1].split("\n## ", 1)[0]
            pages[name] = sorted(set(re.findall(r"^\| `jobs/(\w+)`", paper, flags=re.M)))
    return pages


@pytest.mark.parametrize("page, jobs", method_pages().items())
def test_each_method_page_says_what_the_server_does_with_dp_on_its_jobs(page, jobs):
    text = Path(REPO, "docs", "methods", page).read_text()
    row = next(line for line in text.split("## Privacy", 1)[1].splitlines() if line.startswith("| `dp_epsilon`"))
    refused = {job: start_refusal(job) is not None for job in jobs}
    assert jobs and ("**refused**" in row) == any(refused.values()), (row, refused)
    assert "**supported**" in row or all(refused.values()), (row, refused)
