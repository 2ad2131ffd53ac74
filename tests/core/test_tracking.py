"""fairfl.tracking: NVFlare's TensorBoard receiver in every job, MLflow's on request, never imported unasked."""

import json
import os
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
    assert [p for p in ALLOW_LIST if not p.startswith("fairfl.")] == [TB_RECEIVER, MLFLOW_RECEIVER]


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
