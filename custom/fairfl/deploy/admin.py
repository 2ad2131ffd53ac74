"""Submit a job, wait for it and download its results through NVFlare's admin API, as an admin user.

One path for POC and production: an admin startup kit (a folder with `startup/fed_admin.json`) whose folder
name is the user name (`admin@hospital.org`), as `nvflare provision` writes it."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from contextlib import contextmanager

from fairfl.methods.make_jobs import BYOC_MARKER
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


# what NVFlare's admin API writes into every folder of a job it submits (its signature), in place
SIGNATURE_FILES = (".__nvfl_sig.json", ".__nvfl_submitter.crt")


def custom_code(job: str) -> list[str]:
    """The files in the custom/ folders of `job`'s apps other than fairfl's marker (a README.md directly in the folder,
    what `fairfl make-jobs` writes for `nvflare simulator`) and NVFlare's signature files: code the sites would have
    to run as bring-your-own-code."""
    found = []
    for custom in glob.glob(os.path.join(job, "*", "custom")):
        for folder, _, names in os.walk(custom):
            for name in names:
                if name in SIGNATURE_FILES or (name == BYOC_MARKER and folder == custom):
                    continue
                found.append(os.path.relpath(os.path.join(folder, name), job))
    return sorted(found)


def refuse_custom_code(job: str) -> None:
    """A ValueError saying what to do when `job` brings code in app/custom, which no fairfl federation runs."""
    code = custom_code(job)
    if code:
        shown = ", ".join(code[:3]) + (f" and {len(code) - 3} more" if len(code) > 3 else "")
        raise ValueError(
            f"{job} brings code in app/custom ({shown}): the sites of a fairfl POC or federation run only the "
            f"installed fairfl package and nobody may bring code, so the server would refuse the job (BYOC not "
            f"permitted). Put the code in the package (its classes allow-listed by `fairfl provision-complete`), or, "
            f"if the job names only installed classes, write a copy without app/custom with `fairfl export-job {job} "
            f"OUT` and submit OUT"
        )


def submittable_copy(job: str, tmp: str) -> str:
    """A copy of the job folder in `tmp` without its app/custom marker (so not BYOC); a job with code there is refused
    (refuse_custom_code). A copy, since NVFlare's admin API writes its signature into the folder it submits."""
    if not os.path.isfile(os.path.join(job, "meta.json")):
        raise FileNotFoundError(f"{job} is not a job folder (no meta.json)")
    refuse_custom_code(job)
    copy = os.path.join(tmp, os.path.basename(os.path.abspath(job).rstrip("/")))  # the name it is listed under
    shutil.copytree(job, copy, ignore=shutil.ignore_patterns("custom", "__pycache__", *SIGNATURE_FILES))
    return copy


def submit(kit: str, job: str, user: str | None = None) -> str:
    """Submit a copy of `job` without its app/custom marker (submittable_copy) and return its job id."""
    with tempfile.TemporaryDirectory() as tmp, admin_session(kit, user) as session:
        return session.submit_job(os.path.abspath(submittable_copy(job, tmp)))


def wait(kit: str, job_id: str, timeout: float = 0.0, user: str | None = None) -> str:
    """Block until the job ends (timeout seconds, 0: no limit); its final status, e.g. FINISHED:COMPLETED, and for a
    job that did not complete what the server recorded of its deployment, e.g. FINISHED:FAILED_TO_RUN (server: BYOC
    not permitted)."""
    with admin_session(kit, user) as session:
        meta = session.wait_for_job(job_id, timeout=timeout, poll_interval=2.0)
    status = meta["status"]
    problems = [str(d) for d in meta.get("job_deploy_detail") or [] if not str(d).endswith(": OK")]
    return f"{status} ({'; '.join(problems)})" if status != COMPLETED and problems else status


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
