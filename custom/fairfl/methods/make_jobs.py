"""Job folders written from the method registry (`fairfl make-jobs`): jobs/<job>/ is configuration only, made from
a `Job` spec, so the committed folders cannot drift from the code (tests/methods/test_methods.py compares them).

Every argument of the controller and of the executor is written out with its value (the constructor's default unless
the spec changes it), so a user reads and edits a job's settings in one place, as `nvflare simulator jobs/<job>`
runs them."""

from __future__ import annotations

import importlib
import json
import os

from fairfl.jobconfig import CLIENT_CONFIG, SERVER_CONFIG, component_arguments
from fairfl.methods import JOBS, Job
from fairfl.tracking import tensorboard_receiver

EXECUTOR = "fairfl.flare.executor.FairflExecutor"
MIN_CLIENTS = 2
# seconds a site waits after answering a task before it asks for the next one (NVFlare's server setting
# `task_request_interval`, default 2): with several tasks a round, NVFlare's 2 s were most of a small round's time
TASK_REQUEST_INTERVAL = 0.2
# the one file of a job's app/custom/, which holds no code: it makes `nvflare simulator` treat the job as bringing its
# own code, so that a fresh simulator workspace admits fairfl's classes; fairfl's submits leave it out (deploy/admin.py)
BYOC_MARKER = "README.md"
# what it says: why the job carries app/custom/, and what to submit instead
CUSTOM_README = """\
This folder holds no code: all of it comes from the installed `fairfl` package. It is here for
`nvflare simulator jobs/{job} -w WS`: NVFlare 2.9 checks a job's classes against the site's class allow-list
unless the job brings its own code (this folder), and a fresh simulator workspace allows only NVFlare's classes.

POC and production sites forbid bring-your-own-code, so this folder as it is ends there FINISHED:FAILED_TO_RUN
("BYOC not permitted"). Submit with `fairfl poc submit jobs/{job}` or `fairfl submit jobs/{job} --admin KIT`, which
leave this folder out, or write a copy without it for NVFlare's own tools (`nvflare job submit -j OUT`, the FLARE
API, a recipe's ProdEnv): `fairfl export-job jobs/{job} OUT`. See docs/running.md, "How the jobs find the code".
"""


def load_class(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _with_changes(defaults: dict, changes, where: str) -> dict:
    unknown = sorted(set(changes) - set(defaults))
    if unknown:
        raise ValueError(f"{where} has no argument(s) {unknown}")
    return {**defaults, **changes}


def job_configs(job: Job) -> dict:
    """{path inside the job folder: JSON-able content} of `job`: meta.json and the server and client configs."""
    server = _with_changes(component_arguments(job.controller), job.server, job.controller)
    client = _with_changes(component_arguments(EXECUTOR), job.client, EXECUTOR)
    return {
        "meta.json": {
            "name": job.name,
            "resource_spec": {},
            "deploy_map": {"app": ["@ALL"]},
            "min_clients": MIN_CLIENTS,
        },
        SERVER_CONFIG: {
            "format_version": 2,
            "server": {"task_request_interval": TASK_REQUEST_INTERVAL},
            "workflows": [{"id": "controller", "path": job.controller, "args": server}],
            "components": [tensorboard_receiver()],
        },
        CLIENT_CONFIG: {
            "format_version": 2,
            "executors": [{"tasks": list(job.tasks), "executor": {"path": EXECUTOR, "args": client}}],
            "task_result_filters": [],
            "task_data_filters": [],
            "components": [],
        },
    }


def to_json(value, indent: int = 0) -> str:
    """JSON with objects one key per line and lists of plain values on one line, as a person would write it."""
    pad = "  " * (indent + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = ",\n".join(f"{pad}{json.dumps(k)}: {to_json(v, indent + 1)}" for k, v in value.items())
        return "{\n" + items + "\n" + "  " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(pad + to_json(v, indent + 1) for v in value) + "\n" + "  " * indent + "]"
    return json.dumps(value)


def job_files(job: Job) -> dict:
    """{path inside the job folder: text} of everything `make-jobs` writes for `job`."""
    files = {path: to_json(content) + "\n" for path, content in job_configs(job).items()}
    return {**files, f"app/custom/{BYOC_MARKER}": CUSTOM_README.format(job=job.name)}


def _stale(root: str, name: str, files: dict) -> dict:
    """{path: "missing" or "differs"} of the `files` ({path: text}) that the job folder root/name does not hold as
    written."""
    stale = {}
    for path, text in files.items():
        full = os.path.join(root, name, path)
        if not os.path.isfile(full):
            stale[path] = "missing"
        else:
            with open(full) as f:
                if f.read() != text:
                    stale[path] = "differs"
    return stale


def differences(root: str) -> list[str]:
    """What in `root` (a jobs/ folder) differs from the registry: missing, changed or extra files of its jobs, and
    job folders no spec makes."""
    found = []
    for name, job in JOBS.items():
        files = job_files(job)
        found += [f"{name}/{path}: {why}" for path, why in _stale(root, name, files).items()]
        expected = {os.path.normpath(p) for p in files}
        for folder, _, names in os.walk(os.path.join(root, name)):
            for file in names:
                relative = os.path.relpath(os.path.join(folder, file), os.path.join(root, name))
                if relative not in expected:
                    found.append(f"{name}/{relative}: not made by the registry")
    if os.path.isdir(root):
        found += [
            f"{entry}/: no method spec makes this job"
            for entry in sorted(os.listdir(root))
            if os.path.isdir(os.path.join(root, entry)) and entry not in JOBS
        ]
    return found


def write_jobs(root: str) -> list[str]:
    """Write every registered job into `root` (files rewritten only where they differ); the paths written."""
    written = []
    for name, job in JOBS.items():
        files = job_files(job)
        for path in _stale(root, name, files):
            full = os.path.join(root, name, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(files[path])
            written.append(os.path.join(name, path))
    return written
