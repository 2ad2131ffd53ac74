"""Helpers of the deployment tests (test_deploy_*.py): free ports, a site process's environment, the fairfl CLI
as a user runs it, a provisioned project, killing what a test started, file modes."""

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from fairfl.simulate import nvflare_command

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: faults.py
JOB_TIMEOUT = 240
PROJECT_ADMIN = "admin@coordinating-center.example.org"  # the project template's project admin
PROJECT_TEMPLATE = os.path.join(os.path.dirname(TESTS), "provisioning", "project.yml")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def site_env(**extra) -> dict:
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), TESTS) if p)
    return {**os.environ, "PYTHONPATH": python_path, "OMP_WAIT_POLICY": "PASSIVE", **extra}


def fairfl_command(*args, prefix=()) -> list:
    """The command line of `fairfl ARGS` as a user runs it, after `prefix` (e.g. `ip netns exec NAME`)."""
    return [*prefix, sys.executable, "-m", "fairfl.cli", *args]


def fairfl(*args, env=None, timeout=300, prefix=()) -> str:
    """Run `fairfl ARGS` as a user would (after `prefix`, see fairfl_command); its output (it must succeed)."""
    proc = subprocess.run(
        fairfl_command(*args, prefix=prefix),
        env=env or site_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"fairfl {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def provision_project(root, name: str, port: int, sites=("site-1", "site-2"), server="localhost") -> str:
    """The repo's project.yml template, cut down to the server `server` (the host name everyone connects to, in its
    certificate) on `port`, `sites` without GPUs, the project admin and the org admins and leads of those sites'
    organisations, provisioned with `nvflare provision` into root/name; the prod folder."""
    project = yaml.safe_load(Path(PROJECT_TEMPLATE).read_text())
    project["name"] = name
    orgs = {p["org"] for p in project["participants"] if p["type"] == "client" and p["name"] in sites}
    participants = []
    for p in project["participants"]:
        if p["type"] == "server":
            participants.append({**p, "name": server, "fed_learn_port": port})
        elif p["type"] == "client" and p["name"] in sites:
            participants.append({k: v for k, v in p.items() if k != "capacity"})  # the test machine has no GPU
        elif p["type"] == "admin" and (p["role"] == "project_admin" or p["org"] in orgs):
            participants.append(p)
    project["participants"] = participants
    path = Path(root) / f"{name}.yml"
    path.write_text(yaml.safe_dump(project))
    subprocess.run(
        nvflare_command() + ["provision", "-p", str(path), "-w", str(Path(root) / name)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return str(Path(root) / name / name / "prod_00")


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a participant started by `start` and its job processes (a crash: nothing is shut down cleanly)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def read(path) -> str:
    return open(path, errors="replace").read() if os.path.exists(path) else ""


def kill_processes_under(folder: str) -> None:
    """Kill every process whose command line names `folder` (all of them started by this test)."""
    folder = str(folder)
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if folder in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)
