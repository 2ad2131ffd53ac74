"""NVFlare's MLflow receiver with the tracking URI checked where it runs: on the server, against the server's own
environment (fairfl.tracking.check_tracking_uri), and with what tells runs apart.

`fairfl run --mlflow` and the recipe check the URI when they write the job, but a job written by hand could name
NVFlare's own receiver with any URI and make the server send every site's metrics (and its own MLflow credentials) to
a host of the job's choosing. So the jobs name this class, the allow-lists admit it and not NVFlare's MLflow and
Weights & Biases receivers (fairfl.deploy.kits.allow_listed), and it refuses a URI or artifact location the server
does not allow before it records anything.

Besides NVFlare's run per site it keeps one for the fairness summary (fairfl.tracking.SUMMARY_SOURCE), tags every
run with the server's run folder, and as the job ends gives each run the job's parameters and results.json
(fairfl.tracking.run_params)."""

from __future__ import annotations

import os

from mlflow.entities import Param
from nvflare.apis.fl_context import FLContext
from nvflare.app_opt.tracking.mlflow.mlflow_receiver import MLflowReceiver

from fairfl.progress import read_results
from fairfl.results import RESULTS_FILE
from fairfl.tracking import RUN_DIR_TAG, SUMMARY_SOURCE, check_tracking_uri, run_params

RUN_TAGS = "run_tags"  # NVFlare's kw_args key (TrackConst.RUN_TAGS)


class CheckedMLflowReceiver(MLflowReceiver):
    kw_args: dict  # NVFlare's, set in its __init__ (mypy cannot see its type there)

    def __init__(self, tracking_uri: str | None = None, artifact_location: str | None = None, **kwargs):
        """
        Args:
            tracking_uri: where MLflow records, as `check_tracking_uri` allows on this server; null = a SQLite store
                in the server's run folder.
            artifact_location: where MLflow keeps artifacts; null = MLflow's default for the store; else checked as
                a tracking URI.
            **kwargs: NVFlare's MLflowReceiver's (kw_args, events, buffer_flush_time).
        """
        for uri in (tracking_uri, artifact_location):
            if uri is not None:
                check_tracking_uri(uri)
        super().__init__(tracking_uri=tracking_uri, artifact_location=artifact_location, **kwargs)
        self.run_dir: str | None = None

    def initialize(self, fl_ctx: FLContext):
        self.run_dir = os.path.realpath(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))
        self.kw_args = {**self.kw_args, RUN_TAGS: {**(self.kw_args.get(RUN_TAGS) or {}), RUN_DIR_TAG: self.run_dir}}
        super().initialize(fl_ctx)

    def _mlflow_setup(self, art_full_path, experiment_name, experiment_tags, site_names, fl_ctx):
        super()._mlflow_setup(art_full_path, experiment_name, experiment_tags, [*site_names, SUMMARY_SOURCE], fl_ctx)

    def _init_buffer(self, site_names):
        super()._init_buffer([*site_names, SUMMARY_SOURCE])

    def finalize(self, fl_ctx: FLContext):
        """The job's parameters and results.json on every run (the server wrote its last results before the run
        ended), then NVFlare's flush and end of the runs. A failure is logged: the job's results stand without it."""
        results_path = os.path.join(self.run_dir or "", RESULTS_FILE)
        params = [Param(key, value) for key, value in run_params(read_results(results_path)).items()]
        for site, run_id in self.run_ids.items():
            try:
                self.mlflow_clients[site].log_batch(run_id=run_id, params=params)
                if os.path.isfile(results_path):
                    self.mlflow_clients[site].log_artifact(run_id, results_path)
            except Exception as e:  # noqa: BLE001 - MLflow's and the store's errors alike: tracking is not the job
                self.log_error(fl_ctx, f"MLflow run of {site}: parameters or results.json not recorded: {e}")
        super().finalize(fl_ctx)
