"""Fixtures of the report's tests (test_report*.py): the synthetic results files of report_runs.py, written once per
test."""

import pytest

from report_runs import write_fedce_runs, write_runs


@pytest.fixture
def runs_dir(tmp_path):
    """Simulator-shaped workspaces, one per run of Solo, FedAvg and Fed-LWR, plus a Fed-LWR run that never finished."""
    return write_runs(tmp_path)


@pytest.fixture
def fedce_dir(tmp_path, runs_dir):
    """runs_dir (Solo, FedAvg, Fed-LWR) plus FedAvg with weights and two seeds of FedCE with a free rider; the
    leave-one-out file is tmp_path / "loo.json"."""
    return write_fedce_runs(runs_dir, tmp_path / "loo.json")
