"""NVFlare's MLflow receiver with the tracking URI checked where it runs: on the server, against the server's own
environment (fairfl.tracking.check_tracking_uri).

`fairfl run --mlflow` and the recipe check the URI when they write the job, but a job written by hand could name
NVFlare's own receiver with any URI and make the server send every site's metrics (and its own MLflow credentials) to
a host of the job's choosing. So the jobs name this class, the allow-lists admit it and not NVFlare's MLflow and
Weights & Biases receivers (fairfl.deploy.kits.allow_listed), and it refuses a URI or artifact location the server
does not allow before it records anything."""

from __future__ import annotations

from nvflare.app_opt.tracking.mlflow.mlflow_receiver import MLflowReceiver

from fairfl.tracking import check_tracking_uri


class CheckedMLflowReceiver(MLflowReceiver):
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
