"""Submit a job, wait for it and download its results through NVFlare's admin API, as an admin user.

One path for POC and production: an admin startup kit (a folder with `startup/fed_admin.json`) whose folder
name is the user name (`admin@hospital.org`), as `nvflare provision` writes it."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from contextlib import contextmanager

from fairfl.results import RESULTS_FILE

COMPLETED = "FINISHED:COMPLETED"


def admin_user(kit: str) -> str:
    """The user name of an admin kit: its folder name, as provisioned."""
    if not os.path.isfile(os.path.join(kit, "startup", "fed_admin.json")):
        raise FileNotFoundError(f"{kit} is not an admin startup kit (no startup/fed_admin.json)")
    return os.path.basename(os.path.abspath(kit).rstrip("/"))


@contextmanager
def admin_session(kit: str, user: str | None = None, timeout: float = 30.0):
    """A logged-in `nvflare.fuel.flare_api` session; closed on exit."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    session = new_secure_session(user or admin_user(kit), os.path.abspath(kit), timeout=timeout)
    try:
        yield session
    finally:
        session.close()


def without_custom(job: str, tmp: str) -> str:
    """The job folder itself if it carries no `custom/` code, else a copy without it (in `tmp`).

    Our jobs' `app/custom/` holds only a README that marks them BYOC for the simulator; production sites
    run the installed package instead (see `fairfl export-job`)."""
    if not os.path.isfile(os.path.join(job, "meta.json")):
        raise FileNotFoundError(f"{job} is not a job folder (no meta.json)")
    if not glob.glob(os.path.join(job, "*", "custom")):
        return job
    copy = os.path.join(tmp, os.path.basename(os.path.abspath(job).rstrip("/")))
    shutil.copytree(job, copy, ignore=shutil.ignore_patterns("custom", "__pycache__"))
    return copy


def submit(kit: str, job: str, user: str | None = None) -> str:
    """Submit `job` (without any custom/ folder) and return its job id."""
    with tempfile.TemporaryDirectory() as tmp, admin_session(kit, user) as session:
        return session.submit_job(os.path.abspath(without_custom(job, tmp)))


def wait(kit: str, job_id: str, timeout: float = 0.0, user: str | None = None) -> str:
    """Block until the job ends (timeout seconds, 0: no limit); its final status, e.g. FINISHED:COMPLETED."""
    with admin_session(kit, user) as session:
        return session.wait_for_job(job_id, timeout=timeout, poll_interval=2.0)["status"]


def download(kit: str, job_id: str, out: str, user: str | None = None) -> str:
    """Download a finished job's workspace into `out`; the downloaded folder."""
    with admin_session(kit, user) as session:
        return session.download_job_result(job_id, destination=os.path.abspath(out))


def find_results(folder: str) -> str:
    """The results.json written by the server inside a downloaded job folder."""
    found = sorted(glob.glob(os.path.join(folder, "**", RESULTS_FILE), recursive=True))
    if not found:
        raise FileNotFoundError(f"no {RESULTS_FILE} under {folder}: did the job finish? (see its server log there)")
    return found[0]
