"""The job folders are configuration only, name importable classes, and can be customised safely."""

import glob
import importlib
import json
import os
import shutil
from pathlib import Path

import pytest

from fairfl import cli
from fairfl.jobconfig import SERVER_CONFIG, customize_job, parse_assignments
from fairfl.presets import PRESETS, apply_preset, resolve_preset

from helpers import JOBS, REPO

JOB_NAMES = sorted(os.listdir(JOBS))


def component_paths(config):
    for workflow in config.get("workflows", []):
        yield workflow["path"], workflow.get("args", {})
    for executor in config.get("executors", []):
        yield executor["executor"]["path"], executor["executor"].get("args", {})
    for component in config.get("components", []):
        yield component["path"], component.get("args", {})


@pytest.mark.parametrize("job", JOB_NAMES)
def test_job_is_configuration_only_and_its_classes_accept_its_arguments(job):
    assert not glob.glob(os.path.join(JOBS, job, "**", "*.py"), recursive=True)
    assert os.listdir(os.path.join(JOBS, job, "app", "custom")) == ["README.md"]
    for side in ("server", "client"):
        config = json.loads(Path(JOBS, job, "app", "config", f"config_fed_{side}.json").read_text())
        for path, args in component_paths(config):
            module, _, name = path.rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            cls(**args)  # every argument in the file is one the class takes


@pytest.mark.parametrize("job", JOB_NAMES)
def test_every_job_exposes_the_site_bounds_and_robust_aggregation(job, tmp_path):
    robust = {
        "robust_aggregation": "median",
        "trim_fraction": 0.1,
        "max_share": 0.4,
        "max_update_ratio": 5,
        "max_samples": 1000,
    }
    if job == "qfedavg":  # its step is not an average: a clear refusal
        robust["robust_aggregation"] = "none"
    custom = customize_job(os.path.join(JOBS, job), str(tmp_path / "job"), robust)
    config = json.loads(Path(custom, "app", "config", "config_fed_server.json").read_text())
    path, args = next(component_paths(config))  # the controller
    module, _, name = path.rpartition(".")
    controller = getattr(importlib.import_module(module), name)(**args)
    assert {k: controller.config()[k] for k in robust} == robust


def test_customize_job_sets_arguments_on_both_sides_and_refuses_unknown(tmp_path):
    job = customize_job(
        os.path.join(JOBS, "fedlwr"),
        str(tmp_path / "job"),
        {"num_rounds": 3, "seed": 7, "image_size": 32, "cka_clip": [0.0001, 0.99]},
    )
    server = json.loads(Path(job, "app", "config", "config_fed_server.json").read_text())
    client = json.loads(Path(job, "app", "config", "config_fed_client.json").read_text())
    server_args, client_args = server["workflows"][0]["args"], client["executors"][0]["executor"]["args"]
    assert server_args["num_rounds"] == 3 and server_args["cka_clip"] == [0.0001, 0.99]
    assert server_args["seed"] == client_args["seed"] == 7 and client_args["image_size"] == 32
    original = json.loads(Path(JOBS, "fedlwr", "app", "config", "config_fed_server.json").read_text())
    assert original["workflows"][0]["args"]["num_rounds"] != 3
    with pytest.raises(ValueError, match="num_round"):
        customize_job(os.path.join(JOBS, "fedavg"), str(tmp_path / "bad"), {"num_round": 3})
    assert not os.path.exists(tmp_path / "bad")


def test_customize_job_replaces_only_its_own_copies_and_writes_nothing_on_error(tmp_path):
    """customize_job never deletes a folder it did not write (it used to rmtree its destination)."""
    src = os.path.join(JOBS, "fedavg")
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep")
    for dst in (precious, precious / "notes.txt"):  # a user's folder, a user's file
        with pytest.raises(ValueError, match="not a job copy"):
            customize_job(src, str(dst), {"num_rounds": 3})
    assert (precious / "notes.txt").read_text() == "keep"
    copy = customize_job(src, str(tmp_path / "copy"), {"num_rounds": 3})
    customize_job(src, copy, {"num_rounds": 4})  # an earlier copy is replaced
    assert json.loads(Path(copy, SERVER_CONFIG).read_text())["workflows"][0]["args"]["num_rounds"] == 4
    for bad in ({"num_rounds": "abc"}, {"free_riders": ["site-4"]}):  # refused, and the earlier copy stays as it was
        with pytest.raises(ValueError, match=next(iter(bad))):
            customize_job(src, copy, bad)
        assert json.loads(Path(copy, SERVER_CONFIG).read_text())["workflows"][0]["args"]["num_rounds"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "mine"]  # no staging folder left behind


def test_parse_assignments_reads_json_values():
    assert parse_assignments(["num_rounds=50", "cka_clip=[0.0001, 0.99]", "device=cpu", "data_root="]) == {
        "num_rounds": 50,
        "cka_clip": [0.0001, 0.99],
        "device": "cpu",
        "data_root": "",
    }
    with pytest.raises(ValueError):
        parse_assignments(["num_rounds"])


def test_paper_preset_overrides_named_keys_and_environment_wins(monkeypatch):
    class Component:
        num_rounds, image_size, lr = 20, 64, 1e-3

    monkeypatch.delenv("FAIRFL_PRESET", raising=False)
    component = Component()
    apply_preset(component, "")
    assert (component.num_rounds, component.image_size) == (20, 64)
    monkeypatch.setenv("FAIRFL_PRESET", "paper")
    apply_preset(component, "cpu")
    assert (component.num_rounds, component.image_size, component.lr) == (200, 384, 1e-3)
    assert resolve_preset() is PRESETS["paper"]
    monkeypatch.setenv("FAIRFL_PRESET", "nope")
    with pytest.raises(ValueError, match="nope"):
        resolve_preset()


BAD_JOB_CONFIGS = [
    ({"workflows": 5}, "config_fed_server.json: workflows must be a list of objects"),
    ({"workflows": [7]}, "config_fed_server.json: workflows must be a list of objects"),
    (
        {"workflows": [{"id": "c", "path": "fairfl.methods.fedavg.controller.FedAvgController", "args": [1]}]},
        "the args of fairfl.methods.fedavg.controller.FedAvgController must be an object",
    ),
    ({"workflows": "[" * 100_000 + "]" * 100_000}, "nested too deeply"),
]


@pytest.mark.parametrize("server, problem", BAD_JOB_CONFIGS)
def test_a_job_config_of_the_wrong_shape_is_refused_naming_the_file_before_anything_runs(
    tmp_path, capsys, server, problem
):
    # each of these ended `fairfl run` in a traceback (an int is not iterable; args.setdefault on a list; recursion)
    job = tmp_path / "job"
    shutil.copytree(os.path.join(REPO, "jobs", "fedavg"), job)
    config = job / SERVER_CONFIG
    raw = server["workflows"] if isinstance(server["workflows"], str) else None
    config.write_text('{"workflows": ' + raw + "}" if raw else json.dumps({**json.loads(config.read_text()), **server}))
    for argv in (
        ["run", str(job), "-w", str(tmp_path / "ws"), "--set", "num_rounds=3"],
        ["export-job", str(job), str(tmp_path / "out")],
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert problem in err and "Traceback" not in err, err
    assert not (tmp_path / "ws").exists() and not (tmp_path / "out").exists()


BAD_META = ["[]", "{", "[" * 100_000 + "]" * 100_000]


@pytest.mark.parametrize("meta", BAD_META)
def test_export_job_checks_meta_json_before_it_copies_anything(tmp_path, capsys, meta):
    job = tmp_path / "job"
    shutil.copytree(os.path.join(REPO, "jobs", "fedavg"), job)
    (job / "meta.json").write_text(meta)
    assert cli.main(["export-job", str(job), str(tmp_path / "out"), "--gpus", "1"]) == 2
    assert "meta.json" in capsys.readouterr().err and not (tmp_path / "out").exists()
