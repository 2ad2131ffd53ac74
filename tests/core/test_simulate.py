"""fairfl.simulate's watch over a simulator run: a site whose process never comes up is caught, not waited for."""

import json
import subprocess
import sys
import time

from fairfl import simulate


def fake_workspace(root, started_sites, all_sites):
    (root / "server" / "simulate_job").mkdir(parents=True)
    (root / "server" / "simulate_job" / "results.json").write_text(json.dumps({"rounds": []}))
    for site in all_sites:
        (root / site).mkdir()
        if site in started_sites:
            (root / site / "log.txt").write_text("started\n")
    return str(root)


def test_a_site_without_a_log_is_one_that_never_started(tmp_path):
    sites = ["site-1", "site-2", "site-10"]
    workspace = fake_workspace(tmp_path, ["site-1", "site-10"], sites)
    assert simulate.never_started(workspace, sites) == ["site-2"]
    assert simulate.never_started(workspace, ["site-1"]) == []


def test_a_run_with_a_site_that_never_started_is_killed_and_run_again(tmp_path, monkeypatch):
    """What hung benchmarks for an hour (task_timeout): five sites train, the sixth never came up, and the server
    waits for it. The watcher kills the whole process group soon after the rounds began, and the run counts as one
    to repeat, like a port clash."""
    monkeypatch.setattr(simulate, "SITE_START_GRACE", 0.5)
    workspace = fake_workspace(tmp_path, ["site-1"], ["site-1", "site-2"])
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    started = time.time()
    code = simulate._wait(proc, workspace, timeout=30, kill_after_round=None, sites=["site-1", "site-2"])
    assert code == simulate.NEVER_STARTED and time.time() - started < 10 and proc.poll() is not None
    run = simulate.SimulatorRun(workspace, code, 1.0, {})
    assert run.port_clash and not run.ok and "never started" in run.describe_failure()
    # every site started: the watcher waits for the process as before
    (tmp_path / "site-2" / "log.txt").write_text("started\n")
    done = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"], start_new_session=True)
    assert simulate._wait(done, workspace, timeout=30, kill_after_round=None, sites=["site-1", "site-2"]) == 0
