"""Experiment tracking the NVFlare way: the server's controller, once it has checked a site's metrics, fires NVFlare's
federated analytics event for that site (`fairfl.flare.engine`), and NVFlare's receivers on the server record it:
TensorBoard in every job (`tb_events/<site>/` in the server's run folder, one curve per metric name), MLflow when
asked for. Only numbers the server accepted are recorded: a site's own metric stream is never trusted.

This module holds the job configuration entries of the receivers; nothing here imports NVFlare or MLflow (the MLflow
receiver's module imports mlflow, so only a job that names it needs it installed)."""

from __future__ import annotations

import copy
import importlib.util
import os

TB_RECEIVER = "nvflare.app_opt.tracking.tb.tb_receiver.TBAnalyticsReceiver"
MLFLOW_RECEIVER = "nvflare.app_opt.tracking.mlflow.mlflow_receiver.MLflowReceiver"
TB_FOLDER = "tb_events"  # in the server's run folder, one subfolder per site
# NVFlare's MLflowReceiver without a tracking_uri writes a SQLite store here, in the server's run folder (MLflow 3
# refuses its old file store, ./mlruns, unless told to)
MLFLOW_DB = "mlflow.db"
MLFLOW_EXPERIMENT = "fairfl"  # every fairfl run in one experiment, one MLflow run per site and job run


def tensorboard_receiver() -> dict:
    """The server component that writes TensorBoard event files, in every job."""
    return {"id": "tb_receiver", "path": TB_RECEIVER, "args": {"tb_folder": TB_FOLDER}}


def mlflow_receiver(tracking_uri: str | None = None) -> dict:
    """The server component that sends every site's metrics to MLflow: to `tracking_uri` (e.g. an MLflow server's
    http://host:5000), or None: a SQLite store `mlflow.db` in the server's run folder (no server needed)."""
    args = {"kw_args": {"experiment_name": MLFLOW_EXPERIMENT, "experiment_tags": {}, "run_tags": {}}}
    return {"id": "mlflow_receiver", "path": MLFLOW_RECEIVER, "args": {"tracking_uri": tracking_uri, **args}}


def with_mlflow(server_config: dict, mlflow: bool | str) -> dict:
    """A copy of a job's server config, with the MLflow receiver added when `mlflow` is True (the store in the run
    folder) or a tracking URI; False: unchanged. A job that already has one is refused: no metric is sent twice."""
    if mlflow is False:
        return copy.deepcopy(server_config)
    if mlflow is not True and (not isinstance(mlflow, str) or not mlflow.strip()):
        raise ValueError(f"mlflow: true (a store in the run folder) or a tracking URI, got {mlflow!r}")
    if any(c.get("path") == MLFLOW_RECEIVER for c in server_config.get("components", [])):
        raise ValueError("the job's server config already has an MLflow receiver")
    needed = ("mlflow", "alembic") if mlflow is True else ("mlflow",)  # alembic: MLflow's SQLite store
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:  # found now, not by the server as it starts the job
        raise ValueError(f"MLflow tracking needs {', '.join(missing)}: pip install 'fairfl[tracking]'")
    config = copy.deepcopy(server_config)
    receiver = mlflow_receiver(None if mlflow is True else mlflow.strip())
    config["components"] = [*config.get("components", []), receiver]
    return config


def mlflow_location(run_dir: str, mlflow: bool | str) -> str:
    """Where a run's MLflow records are (`with_mlflow`), as the URI `mlflow ui --backend-store-uri` takes."""
    if isinstance(mlflow, str):
        return mlflow.strip()
    return f"sqlite:///{os.path.join(os.path.abspath(run_dir), MLFLOW_DB)}"
