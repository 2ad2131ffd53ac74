"""fairfl.tracking: NVFlare's TensorBoard receiver in every job, MLflow's on request, never imported unasked."""

import json
import os
import re
import subprocess
import sys

import pytest

from fairfl import tracking
from fairfl.flare.components import ALLOW_LIST
from fairfl.jobconfig import SERVER_CONFIG
from fairfl.recipe import FairflRecipe
from fairfl.tracking import MLFLOW_RECEIVER, TB_RECEIVER, tensorboard_receiver, with_mlflow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_job_has_nvflares_tensorboard_receiver_and_the_allow_list_adds_only_the_two_receivers():
    jobs = [p for p in os.listdir(os.path.join(REPO, "jobs")) if os.path.isdir(os.path.join(REPO, "jobs", p))]
    assert len(jobs) >= 14
    for job in jobs:
        with open(os.path.join(REPO, "jobs", job, SERVER_CONFIG)) as f:
            assert json.load(f)["components"] == [tensorboard_receiver()], job
    assert tensorboard_receiver() == {"id": "tb_receiver", "path": TB_RECEIVER, "args": {"tb_folder": "tb_events"}}
    assert [p for p in ALLOW_LIST if not p.startswith("fairfl.")] == [TB_RECEIVER] and MLFLOW_RECEIVER in ALLOW_LIST


def test_with_mlflow_adds_one_receiver_and_refuses_a_second_or_a_bad_uri():
    server = {"workflows": [], "components": [tensorboard_receiver()]}
    added = with_mlflow(server, True)
    assert server == {"workflows": [], "components": [tensorboard_receiver()]}  # the job's own config untouched
    assert added["components"][0] == tensorboard_receiver()
    assert added["components"][1]["path"] == MLFLOW_RECEIVER
    assert added["components"][1]["args"]["tracking_uri"] is None  # NVFlare's SQLite store in the run folder
    assert added["components"][1]["args"]["kw_args"]["experiment_name"] == "fairfl"
    uri = with_mlflow({}, " http://127.0.0.1:5000 ")["components"][0]["args"]["tracking_uri"]
    assert uri == "http://127.0.0.1:5000"
    assert with_mlflow(server, False) == server
    with pytest.raises(ValueError, match="already has an MLflow receiver"):
        with_mlflow(added, "http://127.0.0.1:5000")
    for bad in ("", "  ", 5, None, ["file:///x"]):
        with pytest.raises(ValueError, match="true .a store in the run folder. or a tracking URI"):
            with_mlflow(server, bad)
    assert tracking.mlflow_location("runs/x", True) == f"sqlite:///{os.path.abspath('runs/x')}/mlflow.db"


def test_mlflow_asked_for_without_mlflow_installed_is_refused_before_the_run(monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "alembic" else real(name))
    with pytest.raises(ValueError, match=r"needs alembic: pip install 'fairfl\[tracking\]'"):
        with_mlflow({}, True)
    assert with_mlflow({}, "http://127.0.0.1:5000")["components"]  # a tracking server needs no SQLite store


def test_without_mlflow_installed_every_job_loads_and_exports_and_only_mlflow_tracking_is_refused(tmp_path):
    # as on a machine without mlflow: `import mlflow` fails (MONAI itself imports it when it is installed)
    code = (
        "import sys\n"
        "sys.modules['mlflow'] = None\n"
        "import fairfl.cli, fairfl.flare.engine, fairfl.flare.executor, fairfl.flare.components\n"
        "from fairfl.recipe import FairflRecipe\n"
        f"FairflRecipe('fedavg').export({str(tmp_path)!r})\n"
        "try:\n"
        "    FairflRecipe('fedavg', mlflow=True)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MLflow tracking needs mlflow: pip install 'fairfl[tracking]'" in done.stdout
    with open(tmp_path / "fedavg" / SERVER_CONFIG) as f:
        assert json.load(f)["components"] == [tensorboard_receiver()]
    exported = FairflRecipe("fedavg", mlflow=True)  # where it is installed
    exported.export(str(tmp_path / "with"))
    with open(tmp_path / "with" / "fedavg" / SERVER_CONFIG) as f:
        assert [c["path"] for c in json.load(f)["components"]] == [TB_RECEIVER, MLFLOW_RECEIVER]


# ---------------------------------------------------------------- where MLflow may record: the server's decision

REFUSED = {
    "databricks": "neither an absolute path nor an allowed URI",  # MLflow reads the bare name as its scheme
    "databricks://profile": "scheme 'databricks' is not allowed",
    "javascript:alert(1)": "scheme 'javascript' is not allowed",
    "postgresql://127.0.0.1/mlflow": "scheme 'postgresql' is not allowed",
    "http://evil.example.org:5000": "host 'evil.example.org' is not one this server sends metrics to",
    "https://localhost.evil.example.org": "host 'localhost.evil.example.org'",
    "http://evil.example.org#@127.0.0.1": "host 'evil.example.org'",
    "http://user:secret@127.0.0.1:5000": "no user name or password in the URI",
    "http://127.0.0.1@evil.example.org": "no user name or password in the URI",
    "http://[::1": "Invalid IPv6 URL",
    "http://127.0.0.1:5000/\nx": "spaces or control characters",
    "sqlite:///mlflow.db": "neither an absolute path",  # SQLAlchemy: relative to wherever the server runs
    "sqlite:////etc/mlflow.db": "/etc/mlflow.db is not inside a folder this server lets MLflow write to (none;",
    "file:///etc/mlruns": "/etc/mlruns is not inside a folder",
    "/etc/mlruns": "/etc/mlruns is not inside a folder",
    "file://evil.example.org/mlruns": "neither an absolute path",
    "sqlite:////tmp/allowed/%2e%2e/escaped.db": "a percent-encoded path",  # decoded later, past the check
    "file:///tmp/allowed/%2e%2e/escaped": "a percent-encoded path",
}


@pytest.mark.parametrize("uri", REFUSED)
def test_a_tracking_uri_outside_the_servers_allow_list_is_refused_naming_it(monkeypatch, uri):
    monkeypatch.delenv(tracking.MLFLOW_HOSTS_ENV, raising=False)
    monkeypatch.delenv(tracking.MLFLOW_PATHS_ENV, raising=False)
    for build in (lambda: with_mlflow({}, uri), lambda: tracking.mlflow_receiver(uri)):
        with pytest.raises(ValueError) as err:
            build()
        assert str(err.value).startswith(f"MLflow tracking URI {uri!r}: ") and REFUSED[uri] in str(err.value)


def test_the_servers_environment_names_the_hosts_and_folders_mlflow_may_record_to(monkeypatch, tmp_path):
    monkeypatch.delenv(tracking.MLFLOW_HOSTS_ENV, raising=False)
    monkeypatch.delenv(tracking.MLFLOW_PATHS_ENV, raising=False)
    for uri in ("http://127.0.0.1:5000", "http://localhost:5000/", "https://[::1]:8443"):  # loopback by default
        assert tracking.mlflow_receiver(uri)["args"]["tracking_uri"] == uri
    monkeypatch.setenv(tracking.MLFLOW_HOSTS_ENV, "mlflow.hospital.org, [::1]")
    assert tracking.check_tracking_uri("https://MLflow.Hospital.org/") == "https://MLflow.Hospital.org/"
    assert tracking.check_tracking_uri("http://[::1]:5000")
    with pytest.raises(ValueError, match="host '127.0.0.1' is not one .*mlflow.hospital.org, ::1"):
        tracking.check_tracking_uri("http://127.0.0.1:5000")  # the list replaces the default
    store = tmp_path / "mlflow"
    store.mkdir()
    (store / "away").symlink_to(tmp_path)
    monkeypatch.setenv(tracking.MLFLOW_PATHS_ENV, f"{tmp_path / 'nowhere'}:{store}")
    for uri in (f"sqlite:///{store}/mlflow.db", f"file://{store}/mlruns", str(store / "mlruns")):
        assert tracking.check_tracking_uri(uri) == uri
    for uri in (f"sqlite:///{store}/../other.db", f"file://{store}/away/mlruns", f"sqlite:///{store}/m.db?x=1"):
        with pytest.raises(ValueError, match=f"MLflow tracking URI {re.escape(repr(uri))}"):
            tracking.check_tracking_uri(uri)


def test_fairfl_run_and_the_recipe_refuse_a_tracking_uri_before_anything_runs(monkeypatch, tmp_path, capsys):
    from fairfl import cli

    monkeypatch.delenv(tracking.MLFLOW_HOSTS_ENV, raising=False)
    workspace = tmp_path / "ws"
    args = ["run", os.path.join(REPO, "jobs", "fedavg"), "-w", str(workspace), "--mlflow", "http://evil.example.org"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "MLflow tracking URI 'http://evil.example.org': host 'evil.example.org'" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == []  # no job copy, no workspace: the simulator never started
    with pytest.raises(ValueError, match="scheme 'databricks' is not allowed"):
        FairflRecipe("fedavg", mlflow="databricks://profile")


def test_a_job_written_by_hand_cannot_name_an_unchecked_receiver_or_send_metrics_elsewhere(monkeypatch):
    # fairfl run checks the URI when it writes the job; a job written by hand is checked by the receiver itself, on
    # the server, and NVFlare's own MLflow and W&B receivers are on no allow-list fairfl writes
    from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

    from fairfl.deploy.kits import allow_listed
    from fairfl.flare.mlflow_receiver import CheckedMLflowReceiver

    assert set(tracking.UNCHECKED_RECEIVERS) <= set(DEFAULT_CLASS_ALLOW_LIST)  # NVFlare's default admits them
    allowed = allow_listed({})["class_allow_list"]
    assert not set(tracking.UNCHECKED_RECEIVERS) & set(allowed) and MLFLOW_RECEIVER in allowed
    monkeypatch.delenv(tracking.MLFLOW_HOSTS_ENV, raising=False)
    monkeypatch.delenv(tracking.MLFLOW_PATHS_ENV, raising=False)
    for where in ("tracking_uri", "artifact_location"):
        for uri in ("https://collector.example.com", "databricks", "file:///tmp/elsewhere"):
            with pytest.raises(ValueError, match="MLflow tracking URI"):
                CheckedMLflowReceiver(**{where: uri})
    assert CheckedMLflowReceiver(tracking_uri="http://127.0.0.1:5000").tracking_uri == "http://127.0.0.1:5000"
    assert CheckedMLflowReceiver().tracking_uri is None  # the store in the server's run folder


# ---------------------------------------------------------------- what the trackers carry besides the sites' series

ROUND_DICE = {"site-1": 0.5, "site-2": 0.7, "site-3": 0.6, "site-4": 0.9}  # + 0.01 x round


def test_trackers_carry_each_rounds_fairness_summary_and_mlflow_runs_the_jobs_parameters_and_results(
    monkeypatch, tmp_path
):
    from mlflow.tracking import MlflowClient
    from test_round_loop_records import run_rounds

    from fairfl.flare.mlflow_receiver import CheckedMLflowReceiver
    from fairfl.models import initial_state

    from helpers import check_tracking, tensorboard_scalars
    from site_answers import SITES, answer, honest_params, make

    monkeypatch.chdir(tmp_path)  # whatever MLflow writes by default lands here, never in the checkout
    state0 = initial_state(make().model_spec(), 0)
    dice = {r: {s: v + 0.01 * r for s, v in ROUND_DICE.items()} for r in range(3)}
    run_dir = tmp_path / "ws" / "job"
    results = run_rounds(
        run_dir,
        lambda r: [answer(s, honest_params(state0, i)) for i, s in enumerate(SITES)],
        lambda r: [answer(s, {}, metrics={"dice": dice[r][s]}) for s in SITES],
        receivers=[CheckedMLflowReceiver(kw_args={"experiment_name": tracking.MLFLOW_EXPERIMENT})],
        num_rounds=3,
        eval_every=2,  # rounds 2 and 3 (counted from 1) are evaluated
        run_name="ablation-7",
    )
    check_tracking(str(run_dir), results, SITES)
    # the summary series, by hand from each evaluated round's per-site values; steps: rounds counted from 1
    shown = tensorboard_scalars(str(run_dir), tracking.SUMMARY_SOURCE)
    assert set(shown) == {f"dice_{s}" for s in tracking.SUMMARY_STATISTICS}
    for statistic, by_round in shown.items():
        assert set(by_round) == {2, 3}, statistic
    for step, r in ((2, 1), (3, 2)):
        values = list(dice[r].values())
        mean = sum(values) / 4
        assert shown["dice_worst"][step] == pytest.approx(min(values)) == pytest.approx(0.5 + 0.01 * r)
        assert shown["dice_best"][step] == pytest.approx(max(values))
        assert shown["dice_mean"][step] == pytest.approx(mean)
        assert shown["dice_std"][step] == pytest.approx((sum((v - mean) ** 2 for v in values) / 4) ** 0.5)
        assert shown["dice_spread"][step] == pytest.approx(max(values) - min(values))
        gini = sum(abs(a - b) for a in values for b in values) / (2 * 16 * mean)
        assert shown["dice_gini"][step] == pytest.approx(gini)
    # MLflow: a run per site and one for the summary, each with the job's parameters and results.json
    client = MlflowClient(tracking.mlflow_location(str(run_dir), True))
    runs = client.search_runs([client.get_experiment_by_name(tracking.MLFLOW_EXPERIMENT).experiment_id])
    sources = [*SITES, tracking.SUMMARY_SOURCE]
    assert sorted(next(s for s in sources if r.info.run_name.startswith(f"{s}-")) for r in runs) == sorted(sources)
    summary = next(r for r in runs if r.info.run_name.startswith(f"{tracking.SUMMARY_SOURCE}-"))
    history = {m.step: m.value for m in client.get_metric_history(summary.info.run_id, "dice_worst")}
    assert history == {2: pytest.approx(0.51), 3: pytest.approx(0.52)}
    for run in runs:
        params = run.data.params
        named = (params["method"], params["task"], params["metric"], params["seed"])
        assert named == ("fedavg", "segmentation", "dice", "0")
        assert (params["dataset"], params["run_name"], params["num_rounds"]) == ("prostate", "ablation-7", "3")
        assert params["model_channels"] == json.dumps(results["config"]["model_channels"])
        assert run.data.tags[tracking.RUN_DIR_TAG] == os.path.realpath(run_dir)
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["results.json"]
    # `fairfl run` adds the report it writes to the job's runs, and to no other job's
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.md").write_text("# fairfl report\n")
    uri = tracking.mlflow_location(str(run_dir), True)
    assert tracking.log_report(uri, str(tmp_path / "elsewhere"), str(report)) == 0
    assert tracking.log_report(uri, str(run_dir), str(report)) == len(SITES) + 1
    for run in runs:
        assert [a.path for a in client.list_artifacts(run.info.run_id, "report")] == ["report/report.md"]


def test_a_round_without_evaluation_has_no_summary_and_an_undefined_gini_is_left_out():
    assert tracking.summary_series({"round": 0, "train": {"site-1": {}}}, "dice") == {}
    record = {"per_site": {"a": {"auc": -0.1}}, "mean": -0.1, "std": 0.0, "worst": -0.1, "gini": None}
    assert tracking.summary_series(record, "auc") == {"auc_mean": -0.1, "auc_std": 0.0, "auc_worst": -0.1}
    long_value = {"config": {"note": "x" * 7000}, "method": "fedavg", "seed": 3}
    params = tracking.run_params(long_value)
    assert params["seed"] == "3" and len(params["note"]) == tracking.MLFLOW_PARAM_LIMIT
