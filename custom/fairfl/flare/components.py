"""The only fairfl classes a job may name: every site's and the server's class allow-list is made from this list.

NVFlare's class loader calls whatever a job's `path` names with the job's arguments, functions included, so the
allow-list names these classes exactly, never a prefix of their paths (`fairfl.` would admit `fairfl.cli.main`). They
are the executor and the controllers of the method registry's jobs (fairfl.methods): a new controller enters by its
method unit's job spec, or no job can use it (tests/integration/test_deploy_kits.py checks every job in jobs/). Then
NVFlare's two receivers the jobs name (fairfl.tracking): NVFlare's default list has them, a site's own list may not."""

from __future__ import annotations

from fairfl.methods import JOBS
from fairfl.methods.make_jobs import EXECUTOR, load_class
from fairfl.tracking import MLFLOW_RECEIVER, TB_RECEIVER

# the paths as the jobs name them, without importing a class: writing an allow-list must not load torch
ALLOW_LIST = tuple(dict.fromkeys([EXECUTOR, *(job.controller for job in JOBS.values()), TB_RECEIVER, MLFLOW_RECEIVER]))


def dotted_path(cls: type) -> str:
    """The path a job names `cls` by, as NVFlare's loader resolves it (module, then one attribute)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def components() -> tuple:
    """The classes ALLOW_LIST names (imported: torch, nvflare, mlflow); each entry is exactly its class's own path,
    which the tests check, so an entry can admit nothing but that class."""
    return tuple(load_class(path) for path in ALLOW_LIST)
