"""The POC commands: prepare never deletes a folder that is not a POC workspace, stop waits for every live
process, and (slow) prepare, start, submit, download, stop and clean with real NVFlare processes on 127.0.0.1,
always stopped: through `nvflare poc stop`, then every process whose command line names the test's own folder."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairfl.deploy import admin
from fairfl.flare.components import ALLOW_LIST

from deploy_helpers import JOB_TIMEOUT, fairfl, free_port, kill_processes_under, site_env
from helpers import make_job


@pytest.fixture
def cleanup(tmp_path):
    """Whatever a test started under tmp_path is killed at the end, even when it failed half-way."""
    yield
    kill_processes_under(tmp_path)


def test_poc_prepare_never_deletes_a_folder_that_is_not_a_poc_workspace(tmp_path, monkeypatch, capsys):
    from fairfl.cli import main

    thesis = tmp_path / "x" / "thesis.txt"
    thesis.parent.mkdir()
    thesis.write_text("keep")
    monkeypatch.setenv("NVFLARE_POC_WORKSPACE", str(thesis.parent))
    assert main(["poc", "prepare", "-n", "1"]) == 1
    assert "x is not empty" in capsys.readouterr().err
    assert main(["poc", "prepare", "-n", "1", "--force"]) == 1
    assert "does not look like a POC workspace" in capsys.readouterr().err
    assert thesis.read_text() == "keep"


def test_poc_stop_waits_for_every_live_pid_file_and_ignores_broken_or_stale_ones(tmp_path, monkeypatch):
    from fairfl.deploy import poc

    monkeypatch.setenv("NVFLARE_POC_WORKSPACE", str(tmp_path))
    assert poc._live_pids() == {}  # not prepared: nothing runs
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    files = {
        "localhost": {"pid.fl": "not a pid", "daemon_pid.fl": str(dead.pid)},
        "site-2": {"pid.fl": str(os.getpid())},
    }
    for participant, pid_files in files.items():
        folder = tmp_path / poc.PROJECT / "prod_00" / participant
        folder.mkdir(parents=True)
        for name, text in pid_files.items():
            (folder / name).write_text(text)
    assert poc._live_pids() == {"site-2": [os.getpid()]}  # a live site counts, not only the server
    monkeypatch.setattr(poc, "_nvflare", lambda *args, **kwargs: None)
    with pytest.raises(RuntimeError, match=r"POC processes \{'site-2': \[\d+\]\} still run 0 s after stop"):
        poc.stop(timeout=0)


@pytest.mark.slow
def test_poc_commands_prepare_start_submit_download_stop_clean(tmp_path, cache_dir, cleanup, monkeypatch, capsys):
    from fairfl.cli import main
    from fairfl.deploy.poc import is_poc_workspace

    workspace = tmp_path / "poc"
    # nvflare poc keeps its settings in ~/.nvflare: a home of the test's own
    env = site_env(HOME=str(tmp_path / "home"), NVFLARE_POC_WORKSPACE=str(workspace))

    def poc(*args):
        return fairfl("poc", *args, env=env)

    # an earlier POC workspace is replaced only with --force
    (workspace / "fairfl").mkdir(parents=True)
    (workspace / "fairfl" / "earlier.txt").write_text("an earlier run's")
    (workspace / "project.yml").write_text("name: fairfl\n")
    monkeypatch.setenv("NVFLARE_POC_WORKSPACE", str(workspace))
    assert main(["poc", "prepare"]) == 1 and "give --force" in capsys.readouterr().err
    port = free_port()
    poc("prepare", "-n", "2", "--port", str(port), "--force")
    assert is_poc_workspace(workspace) and not (workspace / "fairfl" / "earlier.txt").exists()
    site_resources = json.loads((workspace / "fairfl" / "prod_00" / "site-1" / "local" / "resources.json").read_text())
    assert set(ALLOW_LIST) <= set(site_resources["class_allow_list"])
    assert "fairfl." not in site_resources["class_allow_list"]
    started = False
    try:
        poc("start", "--timeout", "120")
        started = True
        if shutil.which("ss"):  # the server port is bound on loopback only
            listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
            ours = [line for line in listening.splitlines() if f":{port} " in line]
            assert ours and all("127.0.0.1:" in line for line in ours), ours

        t0 = time.time()
        out = poc("submit", make_job("fedavg", str(tmp_path / "fedavg")), "--timeout", str(JOB_TIMEOUT))
        print(f"POC fedavg job: {time.time() - t0:.0f} s")
        job_id, status = re.search(r"^job (\S+): (\S+)$", out, re.M).groups()
        assert status == "FINISHED:COMPLETED", out
        # while it waited: one progress line per round, as `fairfl run` prints them, before the outcome
        progress = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("POC round ")]
        assert progress == ["POC round 1/2", "POC round 2/2"], out
        out = poc("download")  # the last job submitted
        folder = tmp_path / "poc-results" / job_id
        assert str(folder) in out and "| FedAvg |" in out
        results = json.loads(Path(admin.find_results(str(folder))).read_text())
        assert results["sites"] == ["site-1", "site-2"] and results["final"]
        assert (folder / "report" / "report.md").is_file()
    finally:
        if started:
            poc("stop")
    poc("clean")
    assert not workspace.exists()
