"""A proof-of-concept federation on this machine: NVFlare's `nvflare poc` with our settings.

- the server is named `localhost`, so the server and every site listen on 127.0.0.1 only;
- each site's (and the server's) class allow-list admits fairfl's component classes (nothing else of the
  installed package), and the authorization policy is the production one (only the project admin submits,
  nobody has BYOC);
- jobs are submitted without `app/custom/` (not BYOC), through the admin API, as the project admin.

The workspace is `$NVFLARE_POC_WORKSPACE`, else `workspaces/poc` under the current folder. Site processes
inherit this environment: `FAIRFL_DATA_ROOT` (default: built-in synthetic data), `FAIRFL_CACHE_DIR`."""

from __future__ import annotations

import glob
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import yaml

from fairfl.deploy import admin
from fairfl.deploy.kits import complete_kits

PROJECT = "fairfl"
ADMIN = "admin@fairfl.org"
SERVER = "localhost"  # a loopback name: the server then binds 127.0.0.1 only
LAST_JOB = "last_job_id"


def workspace() -> str:
    return os.path.abspath(os.environ.get("NVFLARE_POC_WORKSPACE") or os.path.join("workspaces", "poc"))


def prod_dir(ws: str | None = None) -> str:
    return os.path.join(ws or workspace(), PROJECT, "prod_00")


def admin_kit(ws: str | None = None) -> str:
    kit = os.path.join(prod_dir(ws), ADMIN)
    if not os.path.isdir(kit):
        raise FileNotFoundError(f"no POC admin kit at {kit}: run `fairfl poc prepare` first")
    return kit


def project(n_sites: int, port: int = 8002) -> dict:
    """A POC project.yml: server `localhost` (loopback only), one project admin, sites site-1..site-N."""
    if n_sites < 1:
        raise ValueError(f"need at least one site, got {n_sites}")
    participants = [
        {"name": SERVER, "type": "server", "org": "fairfl", "fed_learn_port": port},
        {"name": ADMIN, "type": "admin", "org": "fairfl", "role": "project_admin"},
    ]
    participants += [{"name": f"site-{i}", "type": "client", "org": "fairfl"} for i in range(1, n_sites + 1)]
    return {
        "api_version": 3,
        "name": PROJECT,
        "description": "fairfl POC federation on 127.0.0.1",
        "participants": participants,
        "builders": [
            {
                "path": "nvflare.lighter.impl.workspace.WorkspaceBuilder",
                "args": {"template_file": ["master_template.yml"]},
            },
            {"path": "nvflare.lighter.impl.static_file.StaticFileBuilder", "args": {"config_folder": "config"}},
            {"path": "nvflare.lighter.impl.cert.CertBuilder"},
            {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
        ],
    }


def _nvflare(*args, ws: str | None = None, timeout: float = 300) -> None:
    from fairfl.simulate import nvflare_command

    env = {**os.environ, "NVFLARE_POC_WORKSPACE": ws or workspace()}
    proc = subprocess.run(nvflare_command() + ["poc", *args], env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"`nvflare poc {' '.join(args)}` failed with exit code {proc.returncode} (see above)")


def is_poc_workspace(folder) -> bool:
    """Whether `folder` is a workspace `prepare` made (its project.yml and project folder)."""
    return os.path.isfile(os.path.join(folder, "project.yml")) and os.path.isdir(os.path.join(folder, PROJECT))


def prepare(n_sites: int = 2, port: int = 8002, force: bool = False) -> str:
    """Provision a fresh POC workspace and complete its kits; the workspace. `nvflare poc prepare` deletes the
    folder first: a non-empty one is refused unless `force`, and even then unless it is an earlier POC
    workspace."""
    from fairfl.overwrite import refuse_to_overwrite

    ws = workspace()
    problem = refuse_to_overwrite(ws, force, "POC workspace", is_poc_workspace)
    if problem:
        raise FileExistsError(problem)
    with tempfile.TemporaryDirectory() as tmp:  # not inside the workspace, which nvflare empties first
        project_file = os.path.join(tmp, "project.yml")
        with open(project_file, "w") as f:
            yaml.safe_dump(project(n_sites, port), f, sort_keys=False)
        _nvflare("prepare", "-i", project_file, "--force", ws=ws)
    # just provisioned: nothing in it is a site's edit (nvflare poc writes the server's resources.json itself)
    complete_kits(prod_dir(ws), storage=os.path.join(ws, "storage"), force=True)
    return ws


def start(timeout: int = 120) -> None:
    """Start the server and every site (background processes); returns once they are connected."""
    admin_kit()
    _nvflare("start", "--timeout", str(timeout), timeout=timeout + 60)


def stop(timeout: float = 120) -> None:
    """Stop the server and the sites; returns once their processes are gone (`nvflare poc stop` returns before they
    are, and `poc clean` must not delete the folders of processes that still run)."""
    # --no-wait: nvflare's own wait gives up after 30 s, which a busy machine can exceed; this one waits `timeout`
    _nvflare("stop", "--no-wait")
    deadline = time.time() + timeout
    while live := _live_pids():
        if time.time() > deadline:
            raise RuntimeError(f"POC processes {live} still run {timeout:.0f} s after stop")
        time.sleep(1)


def _live_pids() -> dict:
    """{participant: pids} of the server's and the sites' pid files whose process still exists."""
    live = {}
    root = prod_dir()
    for participant in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for name in ("pid.fl", "daemon_pid.fl"):
            try:
                pid = int(Path(root, participant, name).read_text().strip())
                os.kill(pid, 0)
                live.setdefault(participant, []).append(pid)
            except (OSError, ValueError):
                continue
    return live


def clean() -> None:
    _nvflare("clean")


def submit(job: str, wait: bool = True, timeout: float = 0.0, on_round=None) -> tuple:
    """Submit a job as the project admin, once every argument of its components checks (fairfl.jobconfig.check_job:
    else a ValueError naming it, nothing submitted); (job id, final status or None when not waiting). While it waits,
    each round the job's results file records is passed to on_round(record, results, elapsed seconds), as `fairfl run`
    shows them: in POC the server's run folder is on this machine."""
    from fairfl.jobconfig import check_job
    from fairfl.results import RESULTS_FILE
    from fairfl.simulate import Watch

    check_job(job)  # a bad argument is refused here, not by the server after the job was accepted
    kit = admin_kit()
    job_id = admin.submit(kit, job)
    with open(os.path.join(workspace(), LAST_JOB), "w") as f:
        f.write(job_id)
    if not wait:
        return job_id, None
    run_dir = os.path.join(prod_dir(), SERVER, job_id)

    def results_path() -> str:  # the server's run folder of the job, once it has one
        found = sorted(glob.glob(os.path.join(run_dir, "**", RESULTS_FILE), recursive=True))
        return found[0] if found else os.path.join(run_dir, RESULTS_FILE)

    watch = Watch(results_path(), time.time(), on_round)
    done = threading.Event()

    def follow():
        while not done.wait(1.0):
            watch.results_path = results_path()
            watch.poll()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        status = admin.wait(kit, job_id, timeout)
    finally:
        done.set()
        follower.join()
    watch.results_path = results_path()
    watch.poll(last=True)  # the rounds written since the last look
    return job_id, status


def last_job_id() -> str:
    path = os.path.join(workspace(), LAST_JOB)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no job submitted from {workspace()} yet: give the job id")
    return open(path).read().strip()


def download(job_id: str | None = None, out: str | None = None) -> tuple:
    """Download a job (default: the last submitted) and write its report; (downloaded folder, report dict)."""
    from fairfl.report.document import make_report

    job_id = job_id or last_job_id()
    out = os.path.abspath(out or os.path.join(workspace().rstrip("/") + "-results"))
    folder = admin.download(admin_kit(), job_id, out)
    results = admin.find_results(folder)
    return folder, make_report([results], os.path.join(folder, "report"))
