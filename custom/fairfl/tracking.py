"""Experiment tracking the NVFlare way: the server's controller, once it has checked a site's metrics, fires NVFlare's
federated analytics event for that site (`fairfl.flare.engine`), and NVFlare's receivers on the server record it:
TensorBoard in every job (`tb_events/<site>/` in the server's run folder, one curve per metric name), MLflow when
asked for. Only numbers the server accepted are recorded: a site's own metric stream is never trusted. Beside the
sites, one more source, SUMMARY_SOURCE, carries each evaluated round's fairness summary across sites (the statistics
results.json records: `summary_series`). Steps are rounds counted from 1, as the console shows them.

MLflow runs (one per site and SUMMARY_SOURCE) carry the run's method, task, metric, seed and every argument of the
server's job (dataset, run_name, ...) as parameters (`run_params`), results.json as an artifact, and, after `fairfl
run` writes it, the report (`log_report`), so two runs can be told apart and their outcome found beside them.

This module holds the job configuration entries of the receivers; nothing here imports NVFlare or MLflow (the MLflow
receiver's module imports mlflow, so only a job that names it needs it installed).

Where MLflow records is the server's decision, not the job's: a tracking URI is checked against the environment of the
process that builds the receiver's configuration (`check_tracking_uri`), so a job cannot make the server send every
site's metrics, or the server's own MLflow credentials, to a host or file of its choosing."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

TB_RECEIVER = "nvflare.app_opt.tracking.tb.tb_receiver.TBAnalyticsReceiver"
# NVFlare's MLflowReceiver with the URI checked again on the server that runs it (a job written by hand could name any)
MLFLOW_RECEIVER = "fairfl.flare.mlflow_receiver.CheckedMLflowReceiver"
# receivers that send what the server records elsewhere, at a job's word: never on an allow-list (kits.allow_listed)
UNCHECKED_RECEIVERS = (
    "nvflare.app_opt.tracking.mlflow.mlflow_receiver.MLflowReceiver",
    "nvflare.app_opt.tracking.wandb.wandb_receiver.WandBReceiver",
)
TB_FOLDER = "tb_events"  # in the server's run folder, one subfolder per site
# NVFlare's MLflowReceiver without a tracking_uri writes a SQLite store here, in the server's run folder (MLflow 3
# refuses its old file store, ./mlruns, unless told to)
MLFLOW_DB = "mlflow.db"
MLFLOW_EXPERIMENT = "fairfl"  # every fairfl run in one experiment, one MLflow run per site and job run
# the server's own allow-list for tracking URIs: host names (comma-separated) an http(s) URI may name, loopback
# only by default; folders (os.pathsep-separated) a file: or sqlite: store may lie in, none by default (the default
# store, mlflow.db in the run folder, needs no URI)
MLFLOW_HOSTS_ENV = "FAIRFL_MLFLOW_HOSTS"
MLFLOW_PATHS_ENV = "FAIRFL_MLFLOW_PATHS"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
SQLITE_PREFIX = "sqlite:///"  # then the path: sqlite:////abs/mlflow.db (SQLAlchemy's form: three slashes, then it)
# the source of the fairness series: a dot is in no FLARE client name ([A-Za-z0-9-_]), so no site can take it
SUMMARY_SOURCE = "all.sites"
# the fairness statistics of a round (fairfl.fairness.summarize, as results.json records them) that trackers show
SUMMARY_STATISTICS = ("mean", "std", "worst", "best", "spread", "gini")
RUN_DIR_TAG = "fairfl.run_dir"  # an MLflow run's tag: the server's run folder, where its results.json lies
MLFLOW_PARAM_LIMIT = 6000  # characters of a parameter's value MLflow stores (MAX_PARAM_VAL_LENGTH)


def tensorboard_receiver() -> dict:
    """The server component that writes TensorBoard event files, in every job."""
    return {"id": "tb_receiver", "path": TB_RECEIVER, "args": {"tb_folder": TB_FOLDER}}


def _listed(value: str | None, separator: str) -> list[str]:
    return [entry.strip() for entry in (value or "").split(separator) if entry.strip()]


def check_tracking_uri(uri: str, environ=None) -> str:
    """`uri` if this server's environment (`environ`, default os.environ) lets MLflow record there; else a ValueError
    saying why and what is allowed:
    - http(s) to a host named in FAIRFL_MLFLOW_HOSTS (default loopback only), with no user name or password in the
      URI (MLflow takes them from the server's MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN);
    - file:, sqlite: or a plain path: absolute, and inside a folder named in FAIRFL_MLFLOW_PATHS (none by default),
      links resolved;
    - any other scheme (databricks, postgresql, javascript, ...) is refused."""
    env = os.environ if environ is None else environ
    where = f"MLflow tracking URI {uri!r}"
    if not isinstance(uri, str) or not uri.isprintable() or any(c.isspace() for c in uri):
        raise ValueError(f"{where}: not a URI (spaces or control characters)")
    try:
        parts = urlsplit(uri)
        scheme, host = parts.scheme.lower(), parts.hostname
    except ValueError as e:  # a malformed host ("http://[::1")
        raise ValueError(f"{where}: {e}") from None
    if scheme in ("http", "https"):
        if "@" in parts.netloc:
            raise ValueError(
                f"{where}: no user name or password in the URI; the server's MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) hold them"
            )
        hosts = [h.lower().strip("[]") for h in _listed(env.get(MLFLOW_HOSTS_ENV), ",")] or list(LOOPBACK_HOSTS)
        if host not in hosts:
            raise ValueError(
                f"{where}: host {host!r} is not one this server sends metrics to ({', '.join(hosts)}; "
                f"the server's {MLFLOW_HOSTS_ENV}, comma-separated, names others)"
            )
        return uri
    if scheme == "sqlite":
        path = uri[len(SQLITE_PREFIX) :] if uri.startswith(SQLITE_PREFIX) and "?" not in uri else ""
    elif scheme == "file":
        path = parts.path if parts.netloc in ("", "localhost") and not parts.query else ""
    elif not scheme:
        path = uri
    else:
        raise ValueError(
            f"{where}: scheme {scheme!r} is not allowed; use http(s) to a host in the server's {MLFLOW_HOSTS_ENV}, "
            f"file: or sqlite: in a folder of its {MLFLOW_PATHS_ENV}, or none (mlflow.db in the run folder)"
        )
    if "%" in path:  # SQLAlchemy and MLflow decode it after this check: %2e%2e would climb out of the folder
        raise ValueError(f"{where}: a percent-encoded path; write it plainly")
    if not os.path.isabs(path):  # "databricks" too: MLflow reads that name as its scheme
        raise ValueError(
            f"{where}: neither an absolute path nor an allowed URI (http(s)://host:port, file:///folder, "
            "sqlite:////folder/mlflow.db)"
        )
    folders = _listed(env.get(MLFLOW_PATHS_ENV), os.pathsep)
    if not any(Path(path).resolve().is_relative_to(Path(folder).resolve()) for folder in folders):
        raise ValueError(
            f"{where}: {Path(path).resolve()} is not inside a folder this server lets MLflow write to "
            f"({', '.join(folders) or 'none'}; the server's {MLFLOW_PATHS_ENV}, {os.pathsep}-separated, names them)"
        )
    return uri


def mlflow_receiver(tracking_uri: str | None = None) -> dict:
    """The server component that sends every site's metrics to MLflow: to `tracking_uri` (e.g. an MLflow server's
    http://host:5000; `check_tracking_uri`), or None: a SQLite store `mlflow.db` in the server's run folder (no server
    needed)."""
    if tracking_uri is not None:
        check_tracking_uri(tracking_uri)
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


def summary_series(record: dict, metric: str) -> dict:
    """{"<metric>_<statistic>": value} of an evaluated round's record as results.json holds it (`mean`, `std`,
    `worst`, ... of `metric` across the sites scored: fairfl.fairness.summarize, computed once, by the results log);
    {} for a round that was not evaluated. A statistic that is undefined (Gini of negative values: null) is left
    out."""
    if not record.get("per_site"):
        return {}
    values = {f"{metric}_{name}": record.get(name) for name in SUMMARY_STATISTICS}
    return {name: float(v) for name, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def run_params(results: dict) -> dict:
    """The MLflow parameters of a run from its results.json: method, task, metric, seed and every argument the
    server's config records (dataset, run_name, num_rounds, ...), as text cut to what MLflow stores."""
    config = results.get("config") if isinstance(results.get("config"), dict) else {}
    named = {key: results[key] for key in ("method", "task", "metric", "seed") if key in results}
    params = {}
    for key, value in {**config, **named}.items():
        text = value if isinstance(value, str) else json.dumps(value)
        params[str(key)] = text if len(text) <= MLFLOW_PARAM_LIMIT else text[: MLFLOW_PARAM_LIMIT - 3] + "..."
    return params


def log_report(tracking_uri: str, run_dir: str, report_dir: str) -> int:
    """Add the report folder (report.md, results.csv, figures) as the artifacts `report/` of every MLflow run of
    the job whose server run folder is `run_dir` (tagged RUN_DIR_TAG by the receiver); the number of runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    if experiment is None:
        return 0
    where = os.path.realpath(run_dir)
    quote = "'" if "'" not in where else '"'  # MLflow's filter has no escapes: the quote the path lacks
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{RUN_DIR_TAG}` = {quote}{where}{quote}")
    for run in runs:
        client.log_artifacts(run.info.run_id, report_dir, artifact_path="report")
    return len(runs)
