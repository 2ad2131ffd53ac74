"""Where a round's CPU goes (benchmarks/round_threads.py), without a simulator: the split of sampled per-thread CPU
into the parts of a round over the counted window, task records that straddle the window's edges, threads that start
inside it; and the task hook (benchmarks/task_cpu_hook) in a real child process: it times the executor's calls when
asked to and changes nothing when not."""

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, benchmark_module

HOOK = os.path.join(REPO, "benchmarks", "task_cpu_hook")


@pytest.fixture(scope="module")
def round_threads():
    return benchmark_module("round_threads")


SITE, SERVER = 100, 200  # pids: a site process (its main thread's id is its pid) and the simulator's server process


def sample(t, finished, site_main, site_other, server, started_late=None):
    threads = {
        (SITE, SITE): ("site-1", site_main, 0.0),
        (SITE, SITE + 1): ("site-1", site_other, 0.0),
        (SERVER, SERVER + 1): ("", server * 0.75, server * 0.25),  # user and system alike are CPU
    }
    if started_late is not None:
        threads[(SITE, SITE + 2)] = ("site-1", started_late, 0.0)
    return (t, finished, threads)


def task(what, start, end, cpu):
    return {"what": what, "pid": SITE, "tid": SITE, "start": start, "end": end, "cpu": cpu}


def test_a_rounds_cpu_splits_into_its_parts_over_the_counted_window(round_threads):
    samples = [
        sample(0.0, 1, 1.0, 0.1, 0.2),
        sample(10.0, 2, 3.0, 0.3, 0.6),  # the window opens: two rounds finished
        sample(15.0, 3, 8.0, 0.5, 0.9),
        sample(20.0, 4, 13.0, 0.7, 1.2, started_late=0.4),  # closes: two rounds later; a thread born inside counts
    ]
    # two tasks inside the window (execute 5 CPU-s each, of which _train 4); one before it, not counted
    records = [task("execute", 1, 9, 2.0), task("_train", 1, 8, 1.5)]
    for start in (11, 16):
        records += [task("execute", start, start + 3, 5.0), task("_train", start + 1, start + 2, 4.0)]
    parts = round_threads.split_round_cpu(samples, records, first=2, last=4)
    assert parts["rounds"] == 2 and parts["window_seconds"] == 10.0
    assert parts["train"] == pytest.approx(4.0)
    assert parts["task_handling"] == pytest.approx(1.0)
    assert parts["site_main_outside_tasks"] == pytest.approx((10.0 - 10.0) / 2)
    assert parts["site_other_threads"] == pytest.approx((0.4 + 0.4) / 2)
    assert parts["server_and_simulator"] == pytest.approx(0.3)
    split = sum(parts[k] for k in round_threads.PARTS)
    assert split == pytest.approx(parts["all"]) and parts["user"] + parts["system"] == pytest.approx(parts["all"])


def test_a_task_across_the_windows_edge_counts_by_its_share_inside(round_threads):
    samples = [sample(0.0, 2, 0.0, 0.0, 0.0), sample(10.0, 3, 6.0, 0.0, 0.0)]
    # half of this task's time falls before the window: half its CPU is the window's
    records = [task("execute", -4, 4, 8.0), task("_train", -4, 4, 6.0), task("execute", 5, 7, 2.0)]
    parts = round_threads.split_round_cpu(samples, records, first=2, last=3)
    assert parts["train"] == pytest.approx(3.0)
    assert parts["task_handling"] == pytest.approx(1.0 + 2.0)
    assert parts["site_main_outside_tasks"] == pytest.approx(6.0 - 6.0)


def test_a_window_the_run_never_reached_is_an_error_not_a_figure(round_threads):
    samples = [sample(0.0, 1, 0.0, 0.0, 0.0), sample(1.0, 2, 1.0, 0.0, 0.0)]
    with pytest.raises(ValueError, match="never saw rounds 2 and 5"):
        round_threads.split_round_cpu(samples, [], first=2, last=5)


def test_a_task_off_the_main_thread_is_an_error_not_a_misattributed_figure(round_threads):
    samples = [sample(0.0, 2, 0.0, 0.0, 0.0), sample(10.0, 3, 6.0, 0.0, 0.0)]
    records = [{**task("execute", 1, 2, 1.0), "tid": SITE + 1}]
    with pytest.raises(ValueError, match="off their process's main thread"):
        round_threads.split_round_cpu(samples, records, first=2, last=3)


def test_too_few_rounds_are_refused_before_anything_runs(round_threads, capsys):
    with pytest.raises(SystemExit):
        round_threads.main(["--rounds", "4", "--out", os.devnull])
    assert "--rounds must be at least 5" in capsys.readouterr().err


CHILD = """
import json, sys
from fairfl.flare import executor
cls = executor.FairflExecutor
print(json.dumps({"execute": cls.execute.__qualname__, "_train": cls._train.__qualname__}))
"""


def run_child(env_extra):
    env = {k: v for k, v in os.environ.items() if k != "FAIRFL_TASK_CPU_LOG"}
    env["PYTHONPATH"] = os.pathsep.join([HOOK, os.path.join(REPO, "custom")])
    env.update(env_extra)
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_hook_wraps_the_executors_task_and_training_when_asked(tmp_path):
    names = run_child({"FAIRFL_TASK_CPU_LOG": str(tmp_path)})
    assert names == {"execute": "timed.<locals>.wrapper", "_train": "timed.<locals>.wrapper"}


def test_the_hook_changes_nothing_without_its_log_folder():
    names = run_child({})
    assert names == {"execute": "FairflExecutor.execute", "_train": "FairflExecutor._train"}
