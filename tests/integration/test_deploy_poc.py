"""The POC commands: prepare never deletes a folder that is not a POC workspace, stop waits for every live
process, start waits for what runs and says so (its clock and look at the processes injected), and (slow) prepare,
start, submit (fairfl's own, NVFlare's FLARE API, a recipe's ProdEnv), download, stop and clean with real NVFlare
processes on 127.0.0.1, always stopped: through `nvflare poc stop`, then every process whose command line names the
test's own folder."""

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
from fairfl.deploy.poc import Federation, StartTimeout
from fairfl.flare.components import ALLOW_LIST

from deploy_helpers import JOB_TIMEOUT, fairfl, free_port, kill_processes_under, site_env
from helpers import JOBS, TINY_CLIENT, TINY_SERVER

SITES = ("site-1", "site-2")
READY = Federation(
    "localhost",
    SITES,
    {"localhost": [101, 100], "site-1": [201, 200], "site-2": [301, 300]},
    8502,
    True,
    frozenset(SITES),
)


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


class Clock:
    """Time that passes only when the code under test sleeps."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def fake_poc(tmp_path, monkeypatch):
    """A prepared POC as `start` sees it, with `nvflare poc` replaced: the list of the commands it was given."""
    from fairfl.deploy import poc

    commands = []
    monkeypatch.setattr(poc, "admin_kit", lambda ws=None: str(tmp_path))
    monkeypatch.setattr(poc, "_nvflare", lambda *args, **kwargs: commands.append(args))
    return poc, commands


def looks(*federations):
    """A look at the POC (poc.status) that finds `federations` in turn, the last one from then on; nothing runs
    before the start (the look that asks no server)."""
    found = list(federations)

    def status(ask_server=True):
        if not ask_server:
            return Federation("localhost", SITES, {}, 8502, False)
        return found.pop(0) if len(found) > 1 else found[0]

    return status


def test_poc_start_waits_until_every_site_is_connected_and_says_what_runs(fake_poc, monkeypatch, capsys):
    poc, commands = fake_poc
    server_only = Federation("localhost", SITES, {"localhost": [101, 100]}, 8502, False)
    not_connected = Federation("localhost", SITES, READY.pids, 8502, True, frozenset({"site-2"}))
    clock = Clock()
    federation, seconds = poc.start(60, looks(server_only, not_connected, READY), clock, clock.sleep)
    assert federation == READY and seconds == 2 * poc.POLL_SECONDS and commands == [("start", "--no-wait")]
    assert not server_only.ready and not not_connected.ready and READY.ready
    assert not_connected.lines() == [
        "  server localhost  pids 101, 100  admin port 8502 answers",
        "  site-1            pids 201, 200  not connected yet",
        "  site-2            pids 301, 300  connected",
    ]

    # the command's own lines, not NVFlare's (an admin port this POC does not use, a submit that its jobs fail)
    from fairfl.cli import main

    monkeypatch.setattr(poc, "start", lambda timeout: (READY, 14.4))
    assert main(["poc", "start"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("POC federation ready after 14 s, from ")
    assert out[1:] == [
        "  server localhost  pids 101, 100  admin port 8502 answers",
        "  site-1            pids 201, 200  connected",
        "  site-2            pids 301, 300  connected",
        "submit: fairfl poc submit jobs/fedlwr",
        "        with NVFlare's own tools, a copy without the job's app/custom marker: fairfl export-job jobs/fedlwr "
        "OUT, then nvflare job submit -j OUT",
        "stop:   fairfl poc stop",
    ]
    monkeypatch.setattr(poc, "status", lambda: READY)
    assert main(["poc", "status"]) == 0 and "  site-2            pids 301, 300  connected" in capsys.readouterr().out


def test_poc_start_times_out_naming_what_runs_and_how_to_stop_it_and_stops_nothing(fake_poc, monkeypatch, capsys):
    poc, commands = fake_poc
    half = Federation("localhost", SITES, {"localhost": [101, 100], "site-1": [201, 200]}, 8502, True, frozenset())
    clock = Clock()
    with pytest.raises(StartTimeout) as raised:
        poc.start(300, looks(half), clock, clock.sleep)
    assert clock.now - 1000 == pytest.approx(300, abs=poc.POLL_SECONDS) and commands == [("start", "--no-wait")]
    message = str(raised.value)
    assert message.startswith("the POC was not ready after 300 s (wait longer with --timeout SECONDS):\n")
    for line in (
        "  server localhost  pids 101, 100  admin port 8502 answers",
        "  site-1            pids 201, 200  not connected yet",
        "  site-2            no process",
        "Its processes keep running and may still get ready: `fairfl poc status` shows them, `fairfl poc stop` "
        "stops them.",
    ):
        assert line in message
    assert raised.value.federation == half  # nothing stopped: the only command given was the start
    # a POC already running is not started twice
    with pytest.raises(RuntimeError, match=r"a POC already runs from .*\n  server localhost  pids 101, 100"):
        poc.start(300, lambda ask_server=True: half, clock, clock.sleep)
    assert commands == [("start", "--no-wait")]

    # the command: exit 1 with that message
    from fairfl.cli import main

    def times_out(timeout):
        raise StartTimeout(half, timeout)

    monkeypatch.setattr(poc, "start", times_out)
    assert main(["poc", "start", "--timeout", "5"]) == 1
    assert "not ready after 5 s" in capsys.readouterr().err


def assignments(arguments: dict) -> list[str]:
    """`--set KEY=VALUE` for each argument."""
    return [f"--set={key}={json.dumps(value)}" for key, value in arguments.items()]


@pytest.mark.slow
def test_poc_commands_prepare_start_submit_download_stop_clean(tmp_path, cache_dir, cleanup, monkeypatch, capsys):
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    from fairfl.cli import main
    from fairfl.deploy.poc import ADMIN, is_poc_workspace

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
        out = poc("start")
        started = True
        # what runs, how to submit and how to stop, in its own words (not NVFlare's, which name another admin port)
        assert re.search(rf"^  server localhost  pids \d+, \d+  admin port {port} answers$", out, re.M), out
        for site in ("site-1", "site-2"):
            assert re.search(rf"^  {site} +pids \d+, \d+  connected$", out, re.M), out
        assert "fairfl poc submit jobs/fedlwr" in out and "stop:   fairfl poc stop" in out
        assert "Admin address" not in out and "<job_folder>" not in out
        if shutil.which("ss"):  # the server port is bound on loopback only
            listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
            ours = [line for line in listening.splitlines() if f":{port} " in line]
            assert ours and all("127.0.0.1:" in line for line in ours), ours

        # NVFlare's own tools, while fairfl's submit below runs: a tiny one-round jobs/fedavg without its app/custom
        # marker (fairfl export-job) through the FLARE API
        kit = str(workspace / "fairfl" / "prod_00" / ADMIN)
        one_round = {**TINY_SERVER, **TINY_CLIENT, "num_rounds": 1}
        exported = str(tmp_path / "exported")
        assert main(["export-job", os.path.join(JOBS, "fedavg"), exported, *assignments(one_round)]) == 0
        t0 = time.time()
        session = new_secure_session(ADMIN, kit)
        try:
            flare_api_job = session.submit_job(exported)

            # fairfl's own submit, of the repository's job folder itself (its marker left out), tiny
            out = poc(
                "submit",
                os.path.join(JOBS, "fedavg"),
                *assignments({**TINY_SERVER, **TINY_CLIENT}),
                "--timeout",
                str(JOB_TIMEOUT),
            )
            print(f"POC fedavg job: {time.time() - t0:.0f} s")
            job_id, status = re.search(r"^job (\S+) \(with .*\): (\S+)$", out, re.M).groups()
            assert status == "FINISHED:COMPLETED", out
            # while it waited: one progress line per round, as `fairfl run` prints them, before the outcome
            progress = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("POC round ")]
            assert progress == ["POC round 1/2", "POC round 2/2"], out
            assert session.wait_for_job(flare_api_job, timeout=JOB_TIMEOUT)["status"] == admin.COMPLETED
            print(f"POC fedavg jobs (fairfl, FLARE API): {time.time() - t0:.0f} s")
            assert not list(Path(JOBS, "fedavg").rglob(".__nvfl_*"))  # NVFlare signed copies, never the repository's
        finally:
            session.close()
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
