"""benchmarks/gpu_round.py, the summary of the GPU round benchmark: which rounds it counts, the round over its slowest
site's training, and the GPU's samples taken inside each run's marks only (a sample it cannot read is skipped)."""

import json
import os
import sys

import pytest

from helpers import REPO


@pytest.fixture(scope="module")
def gpu_round():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import gpu_round

        yield gpu_round
    finally:
        sys.path.pop(0)


def _round(number, seconds, trainings, evaluated=False, phases=None):
    record = {
        "round": number,
        "seconds": seconds,
        "train": {f"site-{k + 1}": {"train_seconds": t} for k, t in enumerate(trainings)},
        "phases": phases or {"train_task": seconds - 0.5, "server_step": 0.5},
    }
    if evaluated:
        record["per_site"] = {"site-1": {"dice": 0.5}}
    return record


def test_rounds_after_the_first_without_evaluation_are_counted_against_their_slowest_site(gpu_round):
    results = {
        "rounds": [
            _round(0, 30.0, [20.0, 5.0]),  # start-up: not counted
            _round(1, 3.0, [1.0, 2.0]),
            _round(2, 4.0, [2.0, 0.5]),
            _round(3, 9.0, [1.0, 1.0], evaluated=True),  # evaluates: not counted
            _round(4, 5.0, [2.5, 1.0]),
        ]
    }
    figures = gpu_round.round_figures(results)
    assert figures["rounds_finished"] == 5 and figures["rounds_counted"] == 3
    assert figures["round"] == 4.0 and figures["slowest_site_training"] == 2.0
    assert figures["round_over_training"] == 2.0  # medians of 3/2, 4/2, 5/2.5 per round, not of the medians' ratio
    assert gpu_round.round_figures({"rounds": [_round(0, 1.0, [1.0])]})["round"] is None


def test_gpu_samples_count_only_inside_a_run_s_marks(gpu_round, tmp_path):
    (tmp_path / "marks.txt").write_text(
        "2026/11/27 10:00:01.000 start fedavg\n2026/11/27 10:00:03.000 end fedavg\nnot a mark\n"
        "2026/11/27 10:00:04.000 start fedlwr\n"  # never ended: no span
    )
    (tmp_path / "utilization.csv").write_text(
        "2026/11/27 10:00:00.500, 90, 100\n"  # before the run
        "2026/11/27 10:00:01.500, 40, 2000\n"
        "2026/11/27 10:00:02.000, 0, 2100\n"
        "garbage line\n"
        "2026/11/27 10:00:02.500, [N/A], 2100\n"
        "2026/11/27 10:00:05.000, 100, 5000\n"  # after it
    )
    (tmp_path / "fedavg_results.json").write_text(json.dumps({"rounds": [_round(0, 9, [1]), _round(1, 3, [2])]}))
    (tmp_path / "fedlwr_results.json").write_text(json.dumps({"rounds": [_round(0, 9, [1])]}))
    summary, text = gpu_round.summarize(tmp_path)
    gpu = summary["runs"]["fedavg"]["gpu"]
    assert gpu == {
        "samples": 2,
        "utilisation_mean": 20.0,
        "utilisation_median": 20.0,
        "busy_share": 0.5,
        "memory_peak_mib": 2100.0,
    }
    assert summary["runs"]["fedlwr"]["gpu"] == {"samples": 0}
    assert "| fedavg | 2 (1) | 3.00 |" in text and "| fedlwr | 1 (0) | – |" in text
