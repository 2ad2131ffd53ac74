"""Bad configuration, table-driven: a job's arguments at the server and the sites, a site's own settings (its
environment), the server's tasks (run names, built-in data settings, the model spec, FedNPR's settings) and a
checkpoint or local model holding a pickled object. Every one is refused with an error naming the setting (and the
site where a site refuses it), through the real controller, executor and checkpoint code; nothing outside the site's
data and workspace is read, written or run."""

import os
from unittest import mock

import pytest
import torch

from fairfl.data.datalist import SPLITS
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import check_meta
from fairfl.methods.fednpr.protocol import NPR

from site_data import SITE, good_site, site_task


def model_spec_check(spec):
    """The network of a server task, checked as a site checks it before anything is built."""

    def attempt(tmp_path):
        check_meta(SITE, {protocol.MODEL_SPEC: spec})

    return attempt


def executor_task(meta_changes):
    """A site asked for built-in data by a server task with hostile meta."""

    def attempt(tmp_path):
        meta = {
            protocol.MODEL_SPEC: {"name": "unet", "in_channels": 1, "num_classes": 2},
            protocol.DATASET: "prostate",
            protocol.NUM_SITES: 2,
            protocol.DATA_SEED: 0,
            **meta_changes,
        }
        FairflExecutor(image_size=16)._load_datalist(site_task(meta))

    return attempt


def state_dir_of(run_name):
    def attempt(tmp_path):
        protocol.run_state_dir(str(tmp_path), SITE, run_name)

    return attempt


def controller_with(**args):
    def attempt(tmp_path):
        from fairfl.methods.fedavg.controller import FedAvgController

        FedAvgController(**args)

    return attempt


def executor_with(**args):
    def attempt(tmp_path):
        FairflExecutor(**args)

    return attempt


def site_environment(**variables):
    """A site whose own environment holds a malformed setting, asked for its data."""

    def attempt(tmp_path):
        with mock.patch.dict(os.environ, variables):
            executor_task({})(tmp_path)

    return attempt


def server_task_check(meta_changes, **variables):
    """What a site checks of every server task before it builds or loops over anything (FairflExecutor.execute)."""

    def attempt(tmp_path):
        meta = {protocol.MODEL_SPEC: {"name": "cnn", "in_channels": 1, "num_classes": 2}, **meta_changes}
        with mock.patch.dict(os.environ, variables):
            check_meta(SITE, meta)

    return attempt


def model_spec(**spec):
    return server_task_check({protocol.MODEL_SPEC: spec})


def npr_settings(**changes):
    settings = {"k": 4, "weight": 1.0, "epsilon": 0.05, "iterations": 50, "temperature": 1.0, "logits": "layernorm"}
    return server_task_check({NPR: {**settings, **changes}})


# case -> (attempt, what the error must name)
CONFIG_CASES = {
    "server run_name '../../etc'": (controller_with(run_name="../../etc"), "run_name"),
    "server run_name absolute": (controller_with(run_name="/tmp/x"), "run_name"),
    "server run_name with a slash": (controller_with(run_name="a/b"), "run_name"),
    "server task run_name '..' on a site": (state_dir_of(".."), "run_name"),
    "server task run_name absolute on a site": (state_dir_of("/etc"), "run_name"),
    "server task run_name not a string": (state_dir_of(["x"]), "run_name"),
    "server task data_seed a path": (executor_task({protocol.DATA_SEED: "0/../../../x"}), "data_seed"),
    "server task num_sites huge": (executor_task({protocol.NUM_SITES: 10**9}), "num_sites"),
    "server task num_sites 0": (executor_task({protocol.NUM_SITES: 0}), "num_sites"),
    "server task dataset a path": (executor_task({protocol.DATASET: "../../x"}), "../../x"),
    "server task dataset a list": (executor_task({protocol.DATASET: ["x"]}), "dataset"),
    "server task model name a list": (model_spec_check({"name": ["unet"]}), "name ['unet']"),
    **{
        f"server task test_scale {bad!r}": (executor_task({protocol.TEST_SCALE: bad}), "test_scale")
        for bad in (1e9, -1, "3", float("nan"), True, None)
    },
    "server test_scale 0.5": (controller_with(test_scale=0.5), "test_scale"),
    # the site's own settings (its environment), never the job's: a job setting one fails at load
    "job sets allow_absolute_paths": (executor_with(allow_absolute_paths=True), "allow_absolute_paths"),
    "job sets free_riders": (executor_with(free_riders=["site-1"]), "free_riders"),
    "job sets free_rider_source": (executor_with(free_rider_source="site-2"), "free_rider_source"),
    "site's free rider named '../site-2'": (
        site_environment(FAIRFL_FREE_RIDERS="site-3,../site-2"),
        "FAIRFL_FREE_RIDERS",
    ),
    "site's free rider source a path": (
        site_environment(FAIRFL_FREE_RIDERS="site-2", FAIRFL_FREE_RIDER_SOURCE="/etc/passwd"),
        "FAIRFL_FREE_RIDER_SOURCE",
    ),
    "site's free rider source is a free rider": (site_environment(FAIRFL_FREE_RIDERS="site-1"), "FAIRFL_FREE_RIDERS"),
    "site's absolute-path switch neither 1 nor 0": (
        site_environment(FAIRFL_ALLOW_ABSOLUTE_PATHS="maybe"),
        "FAIRFL_ALLOW_ABSOLUTE_PATHS",
    ),
    "site's parameter limit negative": (
        site_environment(FAIRFL_MAX_MODEL_PARAMETERS="-5"),
        "FAIRFL_MAX_MODEL_PARAMETERS",
    ),
    **{
        f"site's {what}": (site_environment(**{variable: value}), variable)
        for what, variable, value in (
            ("image side limit 0", "FAIRFL_MAX_IMAGE_SIDE", "0"),
            ("voxel limit in words", "FAIRFL_MAX_IMAGE_VOXELS", "lots"),
            ("voxel limit a superscript digit", "FAIRFL_MAX_IMAGE_VOXELS", "2²"),
            ("model-sharing switch neither 1 nor 0", "FAIRFL_SHARE_OWN_MODEL", "maybe"),
        )
    },
    # the server's model spec and FedNPR settings: bounded before anything is built (144 GiB, 242 GiB otherwise)
    "model spec: CNN of 65536 channels": (model_spec(name="cnn", channels=[65536, 65536]), "channels"),
    "model spec: a billion classes": (model_spec(name="resnet18", num_classes=10**9), "num_classes"),
    "model spec: 1.4 billion parameters within every range": (
        model_spec(name="cnn", channels=[4096] * 10),
        "parameters",
    ),
    "model spec: above the site's own parameter limit": (
        server_task_check({}, FAIRFL_MAX_MODEL_PARAMETERS="1000"),
        "limit of 1,000",
    ),
    "model spec: unknown network": (model_spec(name="../evil"), "../evil"),
    "model spec: unknown key": (model_spec(name="cnn", pretrained=True), "pretrained"),
    "model spec: in_channels a string": (model_spec(name="cnn", in_channels="1"), "in_channels"),
    "model spec: num_classes true": (model_spec(name="cnn", num_classes=True), "num_classes"),
    "model spec: U-Net strides not matching channels": (model_spec(channels=[8, 16, 32], strides=[2]), "strides"),
    "model spec: not an object": (server_task_check({protocol.MODEL_SPEC: "unet"}), protocol.MODEL_SPEC),
    "FedNPR: k 10^9 sub-clusters": (npr_settings(k=10**9), "k 1000000000"),
    "FedNPR: k a string": (npr_settings(k="4"), "k '4'"),
    "FedNPR: 10^12 Sinkhorn iterations": (npr_settings(iterations=10**12), "iterations"),
    "FedNPR: epsilon 0": (npr_settings(epsilon=0), "epsilon"),
    "FedNPR: epsilon NaN": (npr_settings(epsilon=float("nan")), "epsilon"),
    "FedNPR: temperature infinite": (npr_settings(temperature=float("inf")), "temperature"),
    "FedNPR: temperature negative": (npr_settings(temperature=-1.0), "temperature"),
    "FedNPR: weight 1e300": (npr_settings(weight=1e300), "weight"),
    "FedNPR: unknown logits form": (npr_settings(logits="evil"), "logits"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_configuration_or_server_task_is_refused_by_name(tmp_path, case, monkeypatch):
    monkeypatch.delenv(protocol.STATE_ROOT_ENV, raising=False)
    monkeypatch.delenv("FAIRFL_DATA_ROOT", raising=False)
    attempt, named = CONFIG_CASES[case]
    with pytest.raises((ValueError, TypeError)) as info:  # DataError is a ValueError; TypeError: a job's argument
        attempt(tmp_path)
    assert named in str(info.value), str(info.value)
    if isinstance(info.value, DataError):
        assert info.value.site == SITE


def test_the_server_task_cannot_make_a_site_a_free_rider(tmp_path, monkeypatch):
    """The free-rider switch lives in the site's own environment; a task asking for it is ignored."""
    root = tmp_path / "data"
    good_site(root)
    good_site(root, site="site-2")
    meta = {protocol.MODEL_SPEC: {"name": "unet", "in_channels": 1, "num_classes": 2}, "free_riders": {SITE: "site-2"}}
    own = FairflExecutor(data_root=str(root))._load_datalist(site_task(meta))
    assert len({e["image"] for e in own["training"]}) == 2 and SITE in own["training"][0]["image"]
    monkeypatch.setenv("FAIRFL_FREE_RIDERS", f"site-9,{SITE}")
    monkeypatch.setenv("FAIRFL_FREE_RIDER_SOURCE", "site-2")
    rider = FairflExecutor(data_root=str(root))._load_datalist(site_task(meta))
    assert len({e["image"] for e in rider["training"]}) == 1 and "site-2" in rider["training"][0]["image"]


def test_the_sites_data_root_wins_over_the_jobs(tmp_path, monkeypatch):
    """A production site sets FAIRFL_DATA_ROOT: the data_root a job names is then never read."""
    good_site(tmp_path / "site_data")
    job_root = tmp_path / "job_data"  # what a careless or hostile job points at
    good_site(job_root)
    monkeypatch.setenv("FAIRFL_DATA_ROOT", str(tmp_path / "site_data"))
    meta = {protocol.MODEL_SPEC: {"name": "unet", "in_channels": 1, "num_classes": 2}}
    datalist = FairflExecutor(data_root=str(job_root))._load_datalist(site_task(meta))
    assert all(e["image"].startswith(str(tmp_path / "site_data")) for s in SPLITS for e in datalist[s])


class Payload:
    """Unpickling this runs code: it writes a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_or_local_model_holding_a_pickled_object_is_refused_and_never_run(tmp_path):
    from fairfl.methods.fedavg.controller import FedAvgController

    marker = tmp_path / "code_ran"
    controller = FedAvgController(run_name="trial")
    path = tmp_path / "checkpoint.pt"
    torch.save({"round": 0, "config": controller.config(), "payload": Payload(str(marker))}, path)
    with pytest.raises(ValueError, match="cannot be loaded safely") as info:
        controller._load_checkpoint(str(path))
    assert str(path) in str(info.value) and "trial" in str(info.value)
    local = tmp_path / protocol.LOCAL_MODEL_FILE
    torch.save({"weight": Payload(str(marker))}, local)
    with pytest.raises(ValueError, match="not a readable file of tensors") as info:
        spec = {"name": "unet", "in_channels": 1, "num_classes": 2}
        FairflExecutor()._own_model(site_task({protocol.MODEL_SPEC: spec}, "site-1"), str(tmp_path), 1)
    assert str(local) in str(info.value)
    assert not marker.exists()
