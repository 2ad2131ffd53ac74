"""A proof-of-concept federation on this machine: NVFlare's `nvflare poc` with our settings.

- the server is named `localhost`, so the server and every site listen on 127.0.0.1 only;
- each site's (and the server's) class allow-list admits fairfl's component classes (nothing else of the
  installed package), and the authorization policy is the production one (only the project admin submits,
  nobody has BYOC);
- jobs are submitted without `app/custom/` (not BYOC), through the admin API, as the project admin.

The workspace is `$NVFLARE_POC_WORKSPACE`, else `workspaces/poc` under the current folder. Site processes
inherit this environment: `FAIRFL_DATA_ROOT` (default: built-in synthetic data), `FAIRFL_CACHE_DIR`."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
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


def _nvflare(*args, ws: str | None = None, timeout: float = 300, quiet: bool = False) -> None:
    """`nvflare poc ARGS` on the workspace; quiet: its output is kept back and shown only when it fails."""
    from fairfl.simulate import nvflare_command

    env = {**os.environ, "NVFLARE_POC_WORKSPACE": ws or workspace()}
    proc = subprocess.run(
        nvflare_command() + ["poc", *args],
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        capture_output=quiet,
        text=True,
    )
    if proc.returncode != 0:
        said = f":\n{(proc.stdout + proc.stderr)[-3000:]}" if quiet else " (see above)"
        raise RuntimeError(f"`nvflare poc {' '.join(args)}` failed with exit code {proc.returncode}{said}")


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


POLL_SECONDS = 2.0  # between two looks at a starting POC (each a login once the port answers)


@dataclass(frozen=True)
class Federation:
    """What of the POC runs: each participant's live processes (its pid files), whether the server's admin port
    answers on this machine, and the sites the server lists as connected (None: not asked, or no answer yet)."""

    server: str
    sites: tuple[str, ...]
    pids: dict[str, list[int]]
    port: int
    port_answers: bool
    connected: frozenset[str] | None = None

    @property
    def ready(self) -> bool:
        """Every participant runs, the port answers and the server lists every site: a job can be submitted."""
        everyone = all(name in self.pids for name in (self.server, *self.sites))
        return everyone and self.port_answers and self.connected is not None and set(self.sites) <= self.connected

    def lines(self) -> list[str]:
        """A line per participant: its processes, then the server's port or whether the server lists the site."""
        names = [f"server {self.server}", *self.sites]
        width = max(len(name) for name in names)
        lines = []
        for name, label in zip((self.server, *self.sites), names, strict=True):
            pids = self.pids.get(name)
            if not pids:
                lines.append(f"  {label:{width}}  no process")
                continue
            if name == self.server:
                state = f"admin port {self.port} {'answers' if self.port_answers else 'does not answer yet'}"
            elif self.connected is None:
                state = "connection unknown (the server did not answer)"
            else:
                state = "connected" if name in self.connected else "not connected yet"
            lines.append(f"  {label:{width}}  pids {', '.join(map(str, pids))}  {state}")
        return lines


class StartTimeout(RuntimeError):
    """The POC was not ready in time; `federation` is what ran at the deadline (its processes are left running)."""

    def __init__(self, federation: Federation, timeout: float):
        self.federation = federation
        what = "\n".join(federation.lines())
        if federation.pids:
            advice = (
                "Its processes keep running and may still get ready: `fairfl poc status` shows them, "
                "`fairfl poc stop` stops them."
            )
        else:
            advice = "Nothing of it runs."
        super().__init__(
            f"the POC was not ready after {timeout:.0f} s (wait longer with --timeout SECONDS):\n{what}\n{advice} "
            f"Logs: {prod_dir()}/<participant>/log.txt and poc_console.log"
        )


def participants(ws: str | None = None) -> tuple[str, tuple[str, ...]]:
    """(server, sites) of the POC, as its project.yml names them."""
    path = os.path.join(ws or workspace(), "project.yml")
    try:
        with open(path) as f:
            people = yaml.safe_load(f)["participants"]
        server = next(p["name"] for p in people if p.get("type") == "server")
        return server, tuple(p["name"] for p in people if p.get("type") == "client")
    except (OSError, KeyError, StopIteration, TypeError, yaml.YAMLError) as e:
        raise FileNotFoundError(f"no usable POC project at {path} ({e!r}): run `fairfl poc prepare` first") from None


def admin_port(ws: str | None = None) -> int:
    """The port the admin kit connects to (this POC's server port: federation and admin share it)."""
    with open(os.path.join(admin_kit(ws), "startup", "fed_admin.json")) as f:
        return int(json.load(f)["admin"]["port"])


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _connected_sites(timeout: float = 10.0) -> frozenset[str] | None:
    """The sites the server lists as connected, asked through the admin API; None while it does not answer."""
    try:  # the admin API prints "Connecting to FLARE ..." on every try
        with contextlib.redirect_stdout(io.StringIO()), admin.admin_session(admin_kit(), timeout=timeout) as session:
            return frozenset(client.name for client in session.get_system_info().client_info)
    except Exception:  # starting: the server refuses logins, or answers nothing, until it is up
        return None


def status(ask_server: bool = True) -> Federation:
    """What of the POC runs now; ask_server: also ask the server which sites are connected (a login, when its process
    runs and its port answers)."""
    server, sites = participants()
    pids = _live_pids()
    port = admin_port()
    answers = _port_answers(port)
    connected = _connected_sites() if ask_server and answers and server in pids else None
    return Federation(server, sites, pids, port, answers, connected)


def start(timeout: float, check=None, clock=None, sleep=None) -> tuple[Federation, float]:
    """Start the server and every site as background processes (`nvflare poc start --no-wait`, whose own lines are
    kept back: they name an admin port this POC does not use), then wait until `check()` (default `status`) finds
    them all running, the admin port answering and every site connected; (the Federation, seconds it took). After
    `timeout` seconds a StartTimeout says what runs and how to stop it; nothing is stopped. check, clock (default
    time.monotonic) and sleep (time.sleep): for tests."""
    check, clock, sleep = check or status, clock or time.monotonic, sleep or time.sleep
    admin_kit()
    before = check(ask_server=False)
    if before.pids:
        running = "\n".join(check().lines())
        raise RuntimeError(
            f"a POC already runs from {workspace()}:\n{running}\n`fairfl poc status` shows it, `fairfl poc stop` "
            f"stops it"
        )
    started = clock()
    deadline = started + timeout
    try:
        _nvflare("start", "--no-wait", timeout=max(1.0, deadline - clock()), quiet=True)
    except subprocess.TimeoutExpired:
        pass  # what it started runs on: judged below, like everything else
    except RuntimeError as e:
        now = check()
        if now.pids:
            running = "\n".join(now.lines())
            raise RuntimeError(f"{e}\nyet these run:\n{running}\nstop them with `fairfl poc stop`") from None
        raise
    while True:
        federation = check()
        if federation.ready:
            return federation, clock() - started
        if clock() >= deadline:
            raise StartTimeout(federation, timeout)
        sleep(POLL_SECONDS)


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
