"""fairfl.simulate's watch over a simulator run: a site whose process never comes up is caught, not waited for."""

import json
import subprocess
import sys
import time

import pytest

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
    # a site whose process started, logged and died because another process took its port (what hung a benchmark
    # for an hour): it never came up either; another error in its log does not count
    (tmp_path / "site-10" / "error_log.txt").write_text("ValueError: a bad datalist entry\n")
    assert simulate.never_started(workspace, sites) == ["site-2"]
    (tmp_path / "site-10" / "error_log.txt").write_text(f"OSError: [Errno 98] {simulate.PORT_CLASH}\n")
    assert simulate.never_started(workspace, sites) == ["site-2", "site-10"]


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


STAGES = """
import json, os, sys, time
path = sys.argv[1]
def write(text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    time.sleep(0.6)
print("starting", flush=True)
write('{"rounds": [{"round": 0, "seco')  # half written (a writer that is not atomic)
write('{"rounds": "none yet", "config": [1]}')  # the wrong types
write(json.dumps({"config": {"num_rounds": 3}, "rounds": [{"round": 0, "seconds": 1.0, "mean": float("nan")}]}))
print("round 0 done", flush=True)
write("[" * 50000 + "]" * 50000)  # absurd nesting
write(json.dumps({"config": {"num_rounds": 3}, "rounds": [{"round": 0}, None, {"round": 1, "absent": ["site-2"]}]}))
sys.stdout.write("no newline yet")
sys.stdout.flush()
time.sleep(0.6)
print(" - the last line", flush=True)
rounds = [{"round": 0}, {"round": 1}, {"round": 2, "mean": 0.5, "worst": 0.4, "worst_site": "site-1"}]
with open(path, "w") as f:  # the last round lands as the process exits: only the final poll sees it
    json.dump({"config": {"num_rounds": 3}, "rounds": rounds}, f)
"""


def test_the_watch_reports_each_round_once_whatever_the_results_file_holds_meanwhile(tmp_path):
    """A results file polled while it is being written: half-written, of the wrong types, NaN, absurdly nested. The
    run goes on, each round reaches on_round once and in order (the last one after the process ended), a failing
    on_round is left out rather than ending the run, and the simulator's output is echoed line by line."""
    import io

    workspace = fake_workspace(tmp_path, ["site-1"], ["site-1"])
    results = tmp_path / "server" / "simulate_job" / "results.json"
    results.unlink()
    output, echoed, seen = tmp_path / "output.txt", io.StringIO(), []
    with open(output, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", STAGES, str(results)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        watch = simulate.Watch(
            str(results), time.time(), lambda r, res, t: seen.append(r["round"]), str(output), echoed
        )
        assert simulate._wait(proc, workspace, timeout=60, kill_after_round=None, watch=watch) == 0
        while_running = echoed.getvalue()
        assert while_running.endswith("\n") and output.read_text().startswith(while_running)  # whole lines only
        watch.poll(last=True)
    assert seen == [0, 1, 2]
    assert echoed.getvalue() == output.read_text() == "starting\nround 0 done\nno newline yet - the last line\n"

    def broken(record, results, elapsed):
        raise BrokenPipeError("stdout closed")

    watch = simulate.Watch(str(results), time.time(), broken)
    assert watch.poll()["rounds"] and watch.on_round is None and watch.reported == 3


def test_a_kill_reaches_a_process_in_a_session_of_its_own(tmp_path):
    """NVFlare's SimEnv starts the simulator with os.setsid: a kill of our child's process group alone left the
    server running (a resume drill's "killed" server finished the run)."""
    import os

    import psutil

    pid_file = tmp_path / "pid"
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], preexec_fn=os.setsid)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.time() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    server = psutil.Process(int(pid_file.read_text()))
    assert os.getsid(server.pid) != os.getsid(proc.pid)  # out of reach of a group kill
    simulate.kill_all(proc)
    proc.wait(timeout=10)
    server.wait(timeout=10)
    assert not server.is_running()


# --- the simulator's GPUs (--gpu) -----------------------------------------------------------------------------------
BAD_GPUS = ["", "0, 1", "gpu0", "0;touch x", "[0,1", "[[0]]", "0,,1", "-1", "0,0", "[0],[0,1]", "[0,1]2", "[0],1"]
BAD_GPUS += ["12345", "0\n1"]


@pytest.mark.parametrize("gpu", ["0", "0,1", "[0,1],[2,3]", "[3]"])
def test_the_gpu_option_reaches_the_simulator_by_either_way_in(gpu, tmp_path):
    from fairfl import recipe

    command = simulate.simulator_command("jobs/fedavg", str(tmp_path / "ws"), 4, None, simulate.RECIPE, gpu)
    assert command[command.index("--gpu") + 1] == gpu
    assert recipe.build_parser().parse_args(command[3:]).gpu == gpu  # the recipe CLI takes it as it is
    command = simulate.simulator_command("jobs/fedavg", str(tmp_path / "ws"), 4, None, simulate.NVFLARE_SIMULATOR, gpu)
    assert command[command.index("-gpu") + 1] == gpu
    assert "-gpu" not in simulate.simulator_command("jobs/fedavg", str(tmp_path), 4, None, simulate.NVFLARE_SIMULATOR)


def test_the_recipe_gives_simenv_the_gpus(tmp_path, monkeypatch):
    from fairfl import recipe

    envs = []
    monkeypatch.setattr(recipe.FairflRecipe, "execute", lambda self, env: envs.append(env))
    recipe.main(["fedavg", "-w", str(tmp_path), "-n", "2", "--gpu", "[0],[1]"])
    assert envs[0].gpu_config == "[0],[1]"


@pytest.mark.parametrize("gpu", BAD_GPUS)
def test_a_bad_gpu_value_is_refused_before_anything_starts(gpu, tmp_path, capsys):
    from fairfl import cli, recipe

    workspace = tmp_path / "ws"
    for main, argv in (
        (cli.main, ["run", "jobs/fedavg", "-w", str(workspace), "--gpu", gpu]),
        (recipe.main, ["fedavg", "-w", str(workspace), "--gpu", gpu]),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and "--gpu" in capsys.readouterr().err
    workspace.mkdir()
    (workspace / "kept").write_text("x")
    with pytest.raises(ValueError, match="GPU"):
        simulate.run_simulator("jobs/fedavg", str(workspace), 2, gpu=gpu)
    assert (workspace / "kept").exists()  # refused before the workspace was emptied


def test_more_gpu_groups_than_sites_is_refused(tmp_path, capsys):
    from fairfl import cli, recipe

    assert cli.main(["run", "jobs/fedavg", "-w", str(tmp_path / "ws"), "-n", "2", "--gpu", "0,1,2"]) == 2
    assert "3 GPU groups need at least as many sites" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe.main(["fedavg", "-w", str(tmp_path), "-n", "1", "--gpu", "[0],[1]"])
    assert not (tmp_path / "ws").exists()


def test_a_terminated_run_kills_its_simulator_and_everything_below_it(tmp_path):
    """`timeout` and `kill` send SIGTERM, which ended `fairfl run` at once and left the simulator it started running on
    in a session of its own (a GPU benchmark's cut-off runs trained on, in the next run's time). Now the run's own
    cleanup kills it, as after Ctrl-C."""
    import os
    import signal

    import psutil

    pid_file, workspace = tmp_path / "pid", tmp_path / "ws"
    simulator = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], preexec_fn=os.setsid)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    run = (
        "import sys\n"
        "from fairfl import simulate\n"
        f"simulate.simulator_command = lambda *a, **k: [sys.executable, '-c', {simulator!r}]\n"
        f"simulate.run_simulator('job', {str(workspace)!r}, n_clients=1, timeout=120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", run], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    server = psutil.Process(int(pid_file.read_text()))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    server.wait(timeout=10)
    assert not server.is_running()
    assert (workspace / "simulator_output.txt").exists()  # what it printed is kept where a finished run keeps it


def test_a_lost_connection_as_a_finished_run_shuts_down_keeps_the_run_and_nothing_else_does(tmp_path):
    """NVFlare's simulator may log losing a site's connection as a finished run shuts down (seen with 10 sites on 2
    cores): the run's results stand when every lost site is scored in the final record and its last round lost none.
    The same line without a final record, with the lost site missing from it, or any other error beside it, still
    fails the run."""
    results = tmp_path / simulate.SIMULATOR_RESULTS
    results.parent.mkdir(parents=True)
    lost = "2026-11-28 07:59:27,278 - SimulatorClientRunner - ERROR - Communication error with client site-8: \n"
    results.write_text(json.dumps({"rounds": [{"round": 0}]}))  # no final record yet
    assert not simulate.SimulatorRun(str(tmp_path), 0, 1.0, {"server": lost}).ok
    scored = {f"site-{i}": {"auc": 0.5} for i in range(1, 11)}
    results.write_text(json.dumps({"rounds": [{"round": 0}], "final": {"per_site": scored}}))
    assert simulate.SimulatorRun(str(tmp_path), 0, 1.0, {"server": lost}).ok
    assert simulate.SimulatorRun(str(tmp_path), 0, 1.0, {}).ok
    # a site lost mid-run (killed for memory) and the run finished without it: not a shutdown, the run fails
    without = {s: v for s, v in scored.items() if s != "site-8"}
    results.write_text(json.dumps({"rounds": [{"round": 0}], "final": {"per_site": without}}))
    assert not simulate.SimulatorRun(str(tmp_path), 0, 1.0, {"server": lost}).ok
    results.write_text(json.dumps({"rounds": [{"round": 0, "absent": ["site-3"]}], "final": {"per_site": scored}}))
    assert not simulate.SimulatorRun(str(tmp_path), 0, 1.0, {"server": lost}).ok
    results.write_text(json.dumps({"rounds": [{"round": 0}], "final": {"per_site": scored}}))
    for others in (
        {"server": lost + "Traceback (most recent call last):\n"},
        {"server": lost, "site-3": "ValueError: a bad datalist entry\n"},
        {"server": "ERROR - Communication error with the server\n"},
    ):
        assert not simulate.SimulatorRun(str(tmp_path), 0, 1.0, others).ok
    assert not simulate.SimulatorRun(str(tmp_path), 1, 1.0, {"server": lost}).ok  # a failed exit stays failed
    results.write_text("[" * 50000)  # unreadable
    assert not simulate.SimulatorRun(str(tmp_path), 0, 1.0, {"server": lost}).ok
