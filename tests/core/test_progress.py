"""fairfl.progress: the line per round and the outcome `fairfl run` prints, from a results file that the server is
still writing and that holds what the sites sent: hostile files never crash the run or the printer."""

import json
import math
import os
import sys

import pytest

from fairfl import cli, simulate
from fairfl.progress import finished_rounds, outcome_line, progress_line, read_results
from fairfl.results import SIMULATOR_RESULTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def evaluated(round_num, mean, worst, worst_site, seconds=10.0, **extras):
    return {"round": round_num, "seconds": seconds, "mean": mean, "worst": worst, "worst_site": worst_site, **extras}


RUN = {
    "metric": "dice",
    "config": {"num_rounds": 10},
    "rounds": [
        evaluated(0, 0.5, 0.25, "site-3", seconds=10.0),
        {"round": 1, "seconds": 30.0, "absent": ["site-2"], "failed": {"site-3": "BAD_TASK_DATA"}},
        evaluated(2, 0.8123, 0.7, "site-6", seconds=20.0, rejected={"site-1": "NaN in model.0.weight"}),
    ],
}


def test_a_line_per_round_with_time_left_from_the_mean_round_and_the_last_evaluation():
    first, second, third = (
        progress_line(r, RUN, elapsed) for r, elapsed in zip(RUN["rounds"], (12, 45, 65.4), strict=True)
    )
    # 9 rounds left at 10 s a round
    assert first == "round 1/10 | elapsed 0:12 | left ~1:30 | dice mean 50.0%, worst site-3 25.0%"
    # not evaluated: the last evaluation, marked with its round; the first round (the sites' start) left out:
    # 30 s a round, 8 left
    assert second == (
        "round 2/10 | elapsed 0:45 | left ~4:00 | dice mean 50.0%, worst site-3 25.0% (round 1) | "
        "absent site-2; failed site-3 (BAD_TASK_DATA)"
    )
    assert third == (
        "round 3/10 | elapsed 1:05 | left ~2:55 | dice mean 81.2%, worst site-6 70.0% | "
        "rejected site-1 (NaN in model.0.weight)"
    )
    # the time left only counts the rounds up to this one, even when later rounds are in the file already
    assert "left ~1:30" in progress_line(RUN["rounds"][0], RUN, 12)


def test_the_outcome_finished_stopped_with_its_reason_or_failed():
    final = {"mean": 0.9, "worst": 0.85, "worst_site": "site-2"}
    assert outcome_line({**RUN, "final": final}, 3725) == (
        "finished 3 round(s) in 1:02:05: dice mean 90.0%, worst site-2 85.0%"
    )
    reason = "round 3: 1 of 3 sites answered, fewer than min_clients 3"
    assert outcome_line({**RUN, "final": None, "stopped": reason}, 70) == (
        f"stopped after 1:10 (3 round(s) recorded): {reason}"
    )
    assert (
        outcome_line({}, 5, "simulator exit code 1") == "failed after 0:05 (0 round(s) recorded): simulator exit code 1"
    )
    assert outcome_line(RUN, 5) == "failed after 0:05 (3 round(s) recorded): no final results"


HOSTILE = {
    "not an object": [1, 2],
    "no rounds": {"metric": "dice"},
    "rounds not a list": {"rounds": {"round": 0}},
    "records without rounds": {"rounds": [None, "x", 3, {}, {"round": "1"}, {"round": True}, {"round": 1.5}]},
    "config and metric of the wrong type": {"config": "x", "metric": ["dice"], "rounds": [{"round": 0}]},
    "num_rounds not a number": {"config": {"num_rounds": "20"}, "rounds": [{"round": 0, "seconds": "long"}]},
    "num_rounds negative": {"config": {"num_rounds": -3}, "rounds": [{"round": 0, "seconds": 1.0}]},
    "NaN and infinities": {
        "config": {"num_rounds": 3},
        "rounds": [{"round": 0, "seconds": math.nan, "mean": math.nan, "worst": math.inf, "worst_site": None}],
        "final": {"mean": math.nan},
    },
    "numbers as text and bools": {
        "config": {"num_rounds": True},
        "rounds": [{"round": 0, "seconds": -5, "mean": "0.9", "worst": True}],
        "final": "done",
    },
    "past the last round": {"config": {"num_rounds": 2}, "rounds": [{"round": 7, "seconds": 1.0, "mean": 2.0}]},
    "site lists of the wrong type": {
        "rounds": [{"round": 0, "absent": "site-2", "failed": 7, "rejected": [["site-1"]], "mean": 0.5, "worst": 0.1}]
    },
    "a terminal escape in a site name": {
        "rounds": [{"round": 0, "mean": 0.5, "worst": 0.4, "worst_site": "\x1b[2Jsite-1", "absent": ["a\nb"]}],
        "stopped": "x" * 10_000,
    },
}


@pytest.mark.parametrize("results", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_results_give_lines_never_an_error(results):
    for record in finished_rounds(results) or [{"round": 0}, None, {"round": "0"}]:
        line = progress_line(record, results, 3.0)
        assert line.startswith("round ") and "elapsed 0:03" in line and line.isprintable()
        assert "nan" not in line.lower() and "inf" not in line.lower()
    outcome = outcome_line(results, 3.0)
    assert outcome.split()[0] in ("stopped", "failed", "finished") and outcome.isprintable() and len(outcome) < 600


def test_hostile_values_in_detail():
    nan = HOSTILE["NaN and infinities"]
    assert progress_line(nan["rounds"][0], nan, 3.0) == "round 1/3 | elapsed 0:03 | left ~0:06 | not evaluated yet"
    assert outcome_line(nan, 3.0) == "finished 1 round(s) in 0:03"  # a final without a usable score
    assert outcome_line(HOSTILE["numbers as text and bools"], 3.0).startswith("failed")  # final is no object
    text = HOSTILE["numbers as text and bools"]
    assert progress_line(text["rounds"][0], text, 3.0) == "round 1 | elapsed 0:03 | not evaluated yet"
    negative = HOSTILE["num_rounds negative"]
    assert progress_line(negative["rounds"][0], negative, 3.0) == "round 1 | elapsed 0:03 | not evaluated yet"
    past = HOSTILE["past the last round"]
    assert progress_line(past["rounds"][0], past, 3.0) == "round 8/2 | elapsed 0:03 | left ~0:00 | score mean 200.0%"
    odd = HOSTILE["site lists of the wrong type"]
    assert progress_line(odd["rounds"][0], odd, 3.0).endswith("absent site-2; failed 7; rejected ['site-1']")
    escape = HOSTILE["a terminal escape in a site name"]
    assert "worst ?[2Jsite-1 40.0%" in progress_line(escape["rounds"][0], escape, 3.0)


@pytest.mark.parametrize(
    "content",
    [b"", b'{"rounds": [{"round": 0, "seco', b"[1, 2]", b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000, b"nul\x00l"],
    ids=["empty", "half written", "a list", "not UTF-8", "absurd nesting", "a NUL byte"],
)
def test_a_results_file_being_written_or_broken_reads_as_no_rounds(tmp_path, content):
    path = tmp_path / "results.json"
    path.write_bytes(content)
    assert read_results(str(path)) == {} and finished_rounds(read_results(str(path))) == []
    assert read_results(str(tmp_path / "missing.json")) == {}
    path.write_text('{"rounds": [{"round": 0, "mean": NaN}]}')  # a bare NaN: Python reads it, the lines skip it
    assert math.isnan(read_results(str(path))["rounds"][0]["mean"])


def fake_simulator(results_by_round, final=None, stopped=None, ok=True):
    """run_simulator as `fairfl run` calls it, without a simulator: writes each round's results file and calls
    on_round as the real watch does."""

    def run(job, workspace, n_clients, threads=None, env=None, gpu=None, on_round=None, echo=None):
        path = os.path.join(workspace, SIMULATOR_RESULTS)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        results = {"metric": "dice", "config": {"num_rounds": len(results_by_round)}, "rounds": [], "final": None}
        for record in results_by_round:
            results["rounds"].append(record)
            with open(path, "w") as f:
                json.dump(results, f)
            if on_round:
                on_round(record, results, 1.0 + record["round"])
        results.update(final=final, **({"stopped": stopped} if stopped else {}))
        with open(path, "w") as f:
            json.dump(results, f)
        return simulate.SimulatorRun(workspace, 0 if ok else 1, 4.0, {} if ok else {"server": "boom"})

    return run


def test_fairfl_run_prints_a_line_per_round_then_the_outcome_and_paths(tmp_path, monkeypatch, capsys):
    rounds = [evaluated(0, 0.5, 0.25, "site-3"), evaluated(1, 0.8, 0.7, "site-1")]
    final = {"per_site": {"site-1": {"dice": 0.7}}, "mean": 0.8, "worst": 0.7, "worst_site": "site-1"}
    monkeypatch.setattr(simulate, "run_simulator", fake_simulator(rounds, final))
    monkeypatch.setattr(
        "fairfl.report.document.make_report", lambda paths, out: {"report": os.path.join(out, "report.md")}
    )
    job, workspace = os.path.join(REPO, "jobs", "fedavg"), str(tmp_path / "ws")
    assert cli.main(["run", job, "-n", "2", "-w", workspace]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in out if line.startswith("round ")] == ["round 1/2", "round 2/2"]
    outcome = out.index("finished 2 round(s) in 0:04: dice mean 80.0%, worst site-1 70.0%")
    assert [line.split(":")[0] for line in out[outcome + 1 :]] == ["results", "report", "tensorboard", "logs"]

    assert cli.main(["run", job, "-n", "2", "-w", workspace, "--force", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "round " not in out and "running" not in out and out.lstrip().startswith("finished 2 round(s)")
    with pytest.raises(SystemExit):
        cli.main(["run", job, "-w", workspace, "--quiet", "--verbose"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_fairfl_run_prints_why_a_run_stopped_or_failed_and_exits_1(tmp_path, monkeypatch, capsys):
    job, workspace = os.path.join(REPO, "jobs", "fedavg"), str(tmp_path / "ws")
    reason = "round 1: 1 of 2 sites answered, fewer than min_clients 2"
    stopped = [evaluated(0, 0.5, 0.25, "site-2"), {"round": 1, "seconds": 1.0, "stopped": reason, "absent": ["site-2"]}]
    monkeypatch.setattr(simulate, "run_simulator", fake_simulator(stopped, stopped=reason, ok=False))
    assert cli.main(["run", job, "-n", "2", "-w", workspace]) == 1
    captured = capsys.readouterr()
    assert "round 2/2 | elapsed 0:02 | left ~0:00 | dice mean 50.0%, worst site-2 25.0% (round 1) | absent site-2" in (
        captured.out
    )
    assert f"stopped after 0:04 (2 round(s) recorded): {reason}" in captured.out and "report:" not in captured.out
    assert "boom" in captured.err

    monkeypatch.setattr(simulate, "run_simulator", fake_simulator([], ok=False))
    assert cli.main(["run", job, "-n", "2", "-w", workspace, "--force", "-q"]) == 1
    assert "failed after 0:04 (0 round(s) recorded): the simulator's errors follow" in capsys.readouterr().out


def test_fairfl_run_interrupted_says_so_and_where_the_recorded_rounds_are(tmp_path, monkeypatch, capsys):
    """Ctrl-C or SIGTERM (run_simulator raises KeyboardInterrupt once it has stopped the simulator): a line saying so
    and exit code 130 or 143 (128 + the signal's number, as a shell reports them), not a traceback."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("signal 15")

    monkeypatch.setattr(simulate, "run_simulator", interrupted)
    workspace = str(tmp_path / "ws")
    assert cli.main(["run", os.path.join(REPO, "jobs", "fedavg"), "-n", "2", "-w", workspace, "-q"]) == 130
    err = capsys.readouterr().err
    assert "interrupted; the simulator was stopped" in err and workspace in err and "Traceback" not in err

    def terminated(*args, **kwargs):
        raise simulate.Terminated("signal 15")

    monkeypatch.setattr(simulate, "run_simulator", terminated)
    assert cli.main(["run", os.path.join(REPO, "jobs", "fedavg"), "-n", "2", "-w", workspace, "-q", "--force"]) == 143


def test_the_flags_choose_what_run_simulator_is_given(capsys):
    from fairfl.progress import PROGRESS, QUIET, VERBOSE

    assert simulate.watch_options(QUIET) == {}
    progress, verbose = simulate.watch_options(PROGRESS, "  full: "), simulate.watch_options(VERBOSE)
    assert set(progress) == {"on_round"} and verbose["echo"] is sys.stdout
    progress["on_round"](RUN["rounds"][0], RUN, 12)
    assert (
        capsys.readouterr().out
        == "  full: round 1/10 | elapsed 0:12 | left ~1:30 | dice mean 50.0%, worst site-3 25.0%\n"
    )
    args = cli.build_parser().parse_args
    assert [cli.verbosity(args(["run", "jobs/fedavg", *flag])) for flag in ([], ["-q"], ["-v"])] == [
        PROGRESS,
        QUIET,
        VERBOSE,
    ]


def test_fairfl_run_with_mlflow_runs_a_job_copy_with_nvflares_receiver_and_prints_where_it_writes(
    tmp_path, monkeypatch, capsys
):
    rounds = [evaluated(0, 0.8, 0.7, "site-1")]
    final = {"per_site": {"site-1": {"dice": 0.7}}, "mean": 0.8, "worst": 0.7, "worst_site": "site-1"}
    ran = []
    fake = fake_simulator(rounds, final)
    monkeypatch.setattr(simulate, "run_simulator", lambda job, *a, **k: ran.append(job) or fake(job, *a, **k))
    monkeypatch.setattr(
        "fairfl.report.document.make_report", lambda paths, out: {"report": os.path.join(out, "report.md")}
    )
    logged = []  # the report goes to the job's MLflow runs (fairfl.tracking.log_report)
    monkeypatch.setattr("fairfl.tracking.log_report", lambda *args: logged.append(args))
    job, workspace = os.path.join(REPO, "jobs", "fedavg"), str(tmp_path / "ws")
    assert cli.main(["run", job, "-n", "2", "-w", workspace, "--quiet", "--mlflow"]) == 0
    out = capsys.readouterr().out.splitlines()
    run_dir = os.path.join(workspace, "server", "simulate_job")
    assert logged == [(f"sqlite:///{run_dir}/mlflow.db", run_dir, os.path.join(workspace, "report"))]
    assert [line for line in out if line.startswith(("tensorboard:", "mlflow:"))] == [
        f"tensorboard: tensorboard --logdir {run_dir}/tb_events",
        f"mlflow:      mlflow ui --backend-store-uri sqlite:///{run_dir}/mlflow.db",
    ]
    with open(os.path.join(ran[0], "app", "config", "config_fed_server.json")) as f:
        components = json.load(f)["components"]
    assert ran[0] == workspace + "_job" and [(c["path"], c["args"].get("tracking_uri", "-")) for c in components] == [
        ("nvflare.app_opt.tracking.tb.tb_receiver.TBAnalyticsReceiver", "-"),
        ("fairfl.flare.mlflow_receiver.CheckedMLflowReceiver", None),
    ]
    # a tracking server's URI instead; an empty one is refused before anything runs
    argv = ["run", job, "-w", workspace, "--force", "--quiet", "--mlflow", "http://127.0.0.1:5000"]
    assert cli.main(argv) == 0
    assert "mlflow:      mlflow ui --backend-store-uri http://127.0.0.1:5000" in capsys.readouterr().out
    assert cli.main(["run", job, "-w", workspace, "--force", "--mlflow", " "]) == 2
    assert "error: mlflow: true (a store in the run folder) or a tracking URI, got ' '" in capsys.readouterr().err
    assert len(ran) == 2
