"""fairfl.recipe: a job through NVFlare 2.9's recipe API (Job API, SimEnv, export, `python -m fairfl.recipe`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nvflare.apis.app_validation import AppValidationKey
from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST
from nvflare.app_common.filters.exclude_vars import ExcludeVars
from nvflare.recipe import PocEnv, SimEnv

from fairfl.flare.components import ALLOW_LIST
from fairfl.jobconfig import CLIENT_CONFIG, SERVER_CONFIG, customize_job
from fairfl.recipe import FairflRecipe, _workspace_problem, allow_fairfl_classes, main
from fairfl.results import SIMULATOR_RESULTS
from fairfl.tracking import UNCHECKED_RECEIVERS

from helpers import JOBS, TINY_CLIENT, TINY_SERVER

TINY = {**TINY_SERVER, **TINY_CLIENT}
NO_FILTERS = {"components": [], "task_data_filters": [], "task_result_filters": []}  # what NVFlare reads as absent


def exported(recipe, root) -> Path:
    recipe.export(str(root))
    return Path(root) / recipe.name


def read(folder, name):
    return json.loads((Path(folder) / name).read_text())


def executor_args(folder):
    return read(folder, CLIENT_CONFIG)["executors"][0]["executor"]["args"]


def controller_args(folder):
    return read(folder, SERVER_CONFIG)["workflows"][0]["args"]


@pytest.mark.parametrize("job", sorted(p.name for p in Path(JOBS).iterdir() if (p / "meta.json").is_file()))
def test_every_job_exports_as_its_configuration_with_the_arguments_set(tmp_path, job):
    folder = exported(FairflRecipe(job, **TINY), tmp_path / "export")
    copy = customize_job(os.path.join(JOBS, job), str(tmp_path / "copy"), TINY)  # what `fairfl run --set` runs
    for name in (SERVER_CONFIG, CLIENT_CONFIG):
        assert read(folder, name) == {**NO_FILTERS, **read(copy, name)}, name
    assert read(folder, "meta.json") == read(copy, "meta.json")
    # configuration only: the installed package is the code (no app/custom, so no bring-your-own-code)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == sorted(
        ["meta.json", SERVER_CONFIG, CLIENT_CONFIG]
    )


def test_each_argument_goes_to_the_side_that_has_it(tmp_path):
    folder = exported(FairflRecipe("fedprox", num_rounds=3, mu=0.5, image_size=32, lr=0.01, seed=7), tmp_path)
    server, client = controller_args(folder), executor_args(folder)
    assert (server["num_rounds"], server["mu"], server["seed"]) == (3, 0.5, 7)  # an object would keep mu alone
    assert (client["image_size"], client["lr"], client["seed"]) == (32, 0.01, 7)  # seed: both sides have it
    assert not {"image_size", "lr"} & set(server) and not {"num_rounds", "mu"} & set(client)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"num_round": 3}, "job fedavg has no argument(s) ['num_round']"),
        ({"num_rounds": "many"}, "FedAvgController: num_rounds must be an integer in [1, 100000], got 'many'"),
        ({"free_riders": "site-1"}, "FAIRFL_FREE_RIDERS"),  # the site's own setting, never the job's
    ],
)
def test_an_argument_the_job_lacks_or_of_another_kind_is_refused_naming_it(arguments, message):
    with pytest.raises(ValueError) as e:
        FairflRecipe("fedavg", **arguments)
    assert message in str(e.value) and "/tmp" not in str(e.value)


def job_with_meta(tmp_path, **meta) -> str:
    folder = customize_job(os.path.join(JOBS, "fedavg"), str(tmp_path / "job"))
    (Path(folder) / "meta.json").write_text(json.dumps({**read(folder, "meta.json"), **meta}))
    return folder


def job_with_server_text(tmp_path, text) -> str:
    folder = customize_job(os.path.join(JOBS, "fedavg"), str(tmp_path / "job"))
    (Path(folder) / SERVER_CONFIG).write_text(text)
    return folder


def job_with_meta_text(tmp_path, text) -> str:
    folder = customize_job(os.path.join(JOBS, "fedavg"), str(tmp_path / "job"))
    (Path(folder) / "meta.json").write_text(text)
    return folder


@pytest.mark.parametrize(
    "job, message",
    [
        (lambda tmp: "no_such_job", "no job 'no_such_job': give a job folder"),
        (lambda tmp: str(tmp), "give a job folder (meta.json, app/config/config_fed_server.json"),
        (lambda tmp: job_with_meta(tmp, deploy_map={"app": ["site-1"], "app_2": ["site-2"]}), "one app on every site"),
        (lambda tmp: job_with_meta(tmp, name="../up"), "meta.json: name must start with a letter or digit"),
        (lambda tmp: job_with_meta(tmp, min_clients=0), "meta.json"),
        (lambda tmp: job_with_meta_text(tmp, "{not json"), "meta.json: Expecting property name"),
        (lambda tmp: job_with_meta_text(tmp, "[" * 100_000 + "]" * 100_000), "meta.json: JSON nested too deeply"),
        (lambda tmp: job_with_server_text(tmp, '{"workflows": 5}'), "workflows must be a list of objects"),
    ],
)
def test_a_missing_or_broken_job_is_refused_naming_it(tmp_path, job, message):
    with pytest.raises(ValueError) as e:
        FairflRecipe(job(tmp_path))
    assert message in str(e.value)


def test_what_the_recipe_api_adds_is_kept_and_never_silently_replaced(tmp_path):
    recipe = FairflRecipe("fedavg")
    recipe.add_client_output_filter(ExcludeVars(exclude_vars=["head"]), tasks=["train"])
    filters = read(exported(recipe, tmp_path / "a"), CLIENT_CONFIG)["task_result_filters"]
    assert [(f["tasks"], [(g["path"], g["args"]["exclude_vars"]) for g in f["filters"]]) for f in filters] == [
        (["train"], [("nvflare.app_common.filters.exclude_vars.ExcludeVars", ["head"])])
    ]
    # a job whose own configuration has result filters: one set would replace the other; refused instead
    job = customize_job(
        os.path.join(JOBS, "fedavg"),
        str(tmp_path / "job"),
        client_config={
            "task_result_filters": [
                {
                    "tasks": ["validate"],
                    "filters": [
                        {"path": "nvflare.app_common.filters.exclude_vars.ExcludeVars", "args": {"exclude_vars": ["x"]}}
                    ],
                }
            ]
        },
    )
    assert read(exported(FairflRecipe(job), tmp_path / "b"), CLIENT_CONFIG)["task_result_filters"][0]["tasks"] == [
        "validate"
    ]
    recipe = FairflRecipe(job)
    recipe.add_client_output_filter(ExcludeVars(exclude_vars=["head"]), tasks=["train"])
    with pytest.raises(ValueError, match="task_result_filters added through the Job API would be replaced"):
        recipe.export(str(tmp_path / "c"))


def test_sim_env_workspace_allow_lists_our_classes_and_nvflare_keeps_them(tmp_path):
    SimEnv._ensure_default_component_policy(str(tmp_path / "plain"))  # what SimEnv alone writes: refuses our classes
    assert read(tmp_path / "plain" / "local", "resources.json.default")["class_allow_list"] == list(
        DEFAULT_CLASS_ALLOW_LIST
    )

    path = allow_fairfl_classes(str(tmp_path / "ws"))
    SimEnv._ensure_default_component_policy(str(tmp_path / "ws"))  # SimEnv.deploy runs it after the recipe's
    allowed = read(tmp_path / "ws" / "local", "resources.json")["class_allow_list"]
    assert path == str(tmp_path / "ws" / "local" / "resources.json")
    # NVFlare's defaults but its MLflow and W&B receivers (a job could name any destination), then ours
    defaults = [c for c in DEFAULT_CLASS_ALLOW_LIST if c not in UNCHECKED_RECEIVERS]
    assert allowed == list(dict.fromkeys([*defaults, *ALLOW_LIST]))

    # a workspace's own settings and entries are kept; made from resources.json.default when that is all there is
    local = tmp_path / "own" / "local"
    local.mkdir(parents=True)
    (local / "resources.json.default").write_text(
        json.dumps({"format_version": 2, "mine": 1, "class_allow_list": ["hospital.models"]})
    )
    allow_fairfl_classes(str(tmp_path / "own"))
    assert read(local, "resources.json")["mine"] == 1
    assert read(local, "resources.json")["class_allow_list"] == ["hospital.models", *ALLOW_LIST]

    for text, why in (
        ('{"class_allow_list": ["*"]}', "every class allowed"),
        ("[1]", "is not a JSON object"),
        ("{oops", "Expecting property name"),
    ):
        (local / "resources.json").write_text(text)
        with pytest.raises(ValueError, match=why) as e:
            allow_fairfl_classes(str(tmp_path / "own"))
        assert str(local / "resources.json") in str(e.value)


def test_poc_env_is_refused_before_it_stops_a_running_poc_naming_fairfl_poc_and_prod_env(tmp_path, monkeypatch):
    # PocEnv would stop and delete the POC of NVFlare's recorded workspace, then provision one whose sites refuse our
    # classes; ProdEnv with the POC's admin kit runs the recipe (the POC test submits one)
    monkeypatch.setenv("NVFLARE_POC_WORKSPACE", str(tmp_path / "poc"))  # never a user's own
    (tmp_path / "poc").mkdir()
    with pytest.raises(ValueError, match=r"fairfl poc prepare.*fairfl poc start.*ProdEnv\(startup_kit_location="):
        FairflRecipe("fedavg").execute(PocEnv(num_clients=2))
    assert os.listdir(tmp_path / "poc") == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no_such_job"], "no job 'no_such_job'"),
        (["fedavg", "-n", "0"], "argument -n/--n-clients: must be at least 1"),
        (["fedavg", "-n", "2", "-t", "3"], "argument -t/--threads: at most -n (2), got 3"),
        (["fedavg", "-t", "x"], "argument -t/--threads: expected an integer"),
        (["fedavg", "-w", __file__], "argument -w/--workspace-root: not a folder"),
        (["fedavg", "-w", ""], "argument -w/--workspace-root: not a folder"),
        (["fedavg", "--set", "num_rounds"], "expected key=value, got 'num_rounds'"),
        (["fedavg", "--set", "num_round=3"], "job fedavg has no argument(s) ['num_round']"),
        (
            ["fedavg", "--set", "image_size=big"],
            "FairflExecutor: image_size must be an integer in [16, 2048], got 'big'",
        ),
    ],
)
def test_cli_refuses_bad_arguments_before_running(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cli_never_replaces_what_is_not_an_earlier_run(tmp_path, capsys):
    workspace = tmp_path / "fedavg"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("mine")
    assert main(["fedavg", "-w", str(tmp_path)]) == 1
    assert "is not empty: choose another workspace or give --force" in capsys.readouterr().err
    assert main(["fedavg", "-w", str(tmp_path), "--force"]) == 1
    assert "does not look like a workspace" in capsys.readouterr().err
    assert (workspace / "notes.txt").read_text() == "mine"
    # what the simulator keeps (the sites' settings) is no obstacle; an earlier run is replaced only with --force
    (workspace / "notes.txt").unlink()
    (workspace / "local").mkdir()
    assert _workspace_problem(str(workspace), force=False) is None
    (workspace / "server").mkdir()
    assert "give --force" in _workspace_problem(str(workspace), force=False)
    assert _workspace_problem(str(workspace), force=True) is None


def fairfl_recipe(*argv, cwd):
    return subprocess.run(
        [sys.executable, "-m", "fairfl.recipe", *argv], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_recipe_in_sim_env_gives_the_numbers_of_nvflare_simulator(tmp_path, tiny_fedavg_run):
    """`python -m fairfl.recipe` (FairflRecipe.execute(SimEnv)) against `nvflare simulator` on jobs/fedavg with
    the same tiny settings and seeds: the same per-site final scores, to the last bit."""
    settings = [f"--set={key}={json.dumps(value)}" for key, value in TINY.items()]
    run = fairfl_recipe("fedavg", *settings, "-n", "2", "-w", "runs", cwd=tmp_path)
    workspace = tmp_path / "runs" / "fedavg"
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"results: {workspace / SIMULATOR_RESULTS}" in run.stdout
    recipe_results = json.loads((workspace / SIMULATOR_RESULTS).read_text())
    assert tiny_fedavg_run.ok, tiny_fedavg_run.describe_failure()
    simulator_results = json.loads(Path(tiny_fedavg_run.results_path).read_text())
    assert recipe_results["sites"] == ["site-1", "site-2"]
    assert recipe_results["config"] == simulator_results["config"]
    assert recipe_results["final"]["per_site"] == simulator_results["final"]["per_site"]
    assert [r.get("per_site") for r in recipe_results["rounds"]] == [
        r.get("per_site") for r in simulator_results["rounds"]
    ]

    # no bring-your-own-code: the sites ran our installed classes because the workspace's allow-list names them
    job = workspace / "server" / "simulate_job"
    assert not (job / "app_server" / "custom").exists()
    assert not json.loads((job / "meta.json").read_text()).get(AppValidationKey.BYOC)
    assert set(ALLOW_LIST) <= set(read(workspace / "local", "resources.json")["class_allow_list"])

    # NVFlare's --export writes the job folder instead of running it: the configuration the simulator just ran
    export = fairfl_recipe("fedavg", *settings, "--export", "--export-dir", "exported", cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-3000:]
    assert read(tmp_path / "exported" / "fedavg", SERVER_CONFIG) == read(
        job / "app_server", "config/config_fed_server.json"
    )
    assert not (tmp_path / "exported" / "fedavg" / "app" / "custom").exists()
