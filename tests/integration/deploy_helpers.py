"""Helpers of the deployment tests (test_deploy_*.py): free ports, a site process's environment, the fairfl CLI
as a user runs it, killing what a test started, file modes."""

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: faults.py
JOB_TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def site_env(**extra) -> dict:
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), TESTS) if p)
    return {**os.environ, "PYTHONPATH": python_path, "OMP_WAIT_POLICY": "PASSIVE", **extra}


def fairfl(*args, env=None, timeout=300) -> str:
    """Run `fairfl ARGS` as a user would; its output (it must succeed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "fairfl.cli", *args],
        env=env or site_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"fairfl {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


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
