"""Leave-one-out marginal values on hand-made results, the loo.json file, and the (simulator-free) runner loop."""

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from fairfl import loo, simulate
from fairfl.results import SIMULATOR_RESULTS

from helpers import REPO

SITES = ["site-1", "site-2", "site-3"]
CONFIG = {"controller": "FedAvgController", "num_rounds": 2, "seed": 0, "dataset": "prostate", "free_riders": []}
# final Dice per site of the run with every site, and of the run without each site (the left-out one still evaluated)
FULL = [0.80, 0.90, 0.70]  # mean 0.80
WITHOUT = {
    "site-1": [0.60, 0.90, 0.69],  # mean 0.73: site-1 is worth 7 points
    "site-2": [0.80, 0.84, 0.70],  # mean 0.78: 2 points
    "site-3": [0.82, 0.91, 0.70],
}  # mean 0.81: the federation is better off without it


def results(values, exclude=(), method="fedavg", **config):
    return {
        "method": method,
        "sites": SITES,
        "config": {**CONFIG, "exclude_sites": list(exclude), **config},
        "final": {"per_site": {s: {"dice": v, "dice_cup": 0.5} for s, v in zip(SITES, values, strict=True)}},
    }


def without_runs(**config):
    return {site: results(values, [site], **config) for site, values in WITHOUT.items()}


def test_marginal_values_by_hand():
    out = loo.marginal_values(results(FULL), without_runs())
    assert out["sites"] == SITES and out["metric"] == "dice"
    assert out["full"] == {"mean": pytest.approx(0.80), "per_site": dict(zip(SITES, FULL, strict=True))}
    assert out["without"]["site-1"]["mean"] == pytest.approx(0.73)
    assert out["without"]["site-1"]["per_site"]["site-1"] == 0.60  # the left-out site counts in the mean
    assert out["marginal"] == pytest.approx({"site-1": 0.07, "site-2": 0.02, "site-3": -0.01})
    assert loo.marginal_values(results(FULL), without_runs(), metric="dice_cup")["marginal"] == pytest.approx(
        {s: 0.0 for s in SITES}
    )


def test_marginal_values_use_the_runs_main_metric():
    def auc_run(values, exclude=()):
        run = results(values, exclude)
        run["metric"] = "auc"
        run["final"]["per_site"] = {s: {"auc": v} for s, v in zip(SITES, values, strict=True)}
        return run

    out = loo.marginal_values(auc_run(FULL), {s: auc_run(v, [s]) for s, v in WITHOUT.items()})
    assert out["metric"] == "auc" and out["marginal"]["site-1"] == pytest.approx(0.07)


def test_marginal_values_for_some_sites_only():
    out = loo.marginal_values(results(FULL), {"site-2": without_runs()["site-2"]})
    assert list(out["marginal"]) == ["site-2"] and out["sites"] == SITES


def test_marginal_values_refuses_runs_that_are_not_comparable():
    with pytest.raises(ValueError, match="full run left out"):
        loo.marginal_values(results(FULL, ["site-1"]), without_runs())
    wrong = without_runs()
    wrong["site-2"] = results(WITHOUT["site-2"], ["site-3"])
    with pytest.raises(ValueError, match="without site-2 records exclude_sites=\\['site-3'\\]"):
        loo.marginal_values(results(FULL), wrong)
    with pytest.raises(ValueError, match="without site-1 differs from the full run in \\['num_rounds'\\]"):
        loo.marginal_values(results(FULL), without_runs(num_rounds=5))
    with pytest.raises(ValueError, match="differs from the full run in \\['method'\\]"):
        loo.marginal_values(results(FULL), without_runs(method="fedlwr"))
    unevaluated = without_runs()
    del unevaluated["site-3"]["final"]["per_site"]["site-3"]
    with pytest.raises(ValueError, match="without site-3: no final dice for site-3"):
        loo.marginal_values(results(FULL), unevaluated)
    unfinished = results(FULL)
    unfinished["final"] = None
    with pytest.raises(ValueError, match="full run: no final dice .*did not finish"):
        loo.marginal_values(unfinished, without_runs())


def test_load_loo_and_marginal_table(tmp_path):
    data = loo.marginal_values(results(FULL), without_runs())
    (tmp_path / "loo.json").write_text(json.dumps({"job": "jobs/fedavg", **data}))
    loaded = loo.load_loo(tmp_path)  # a folder means its loo.json
    assert loaded["marginal"] == data["marginal"] and loaded["file"] == str(tmp_path / "loo.json")
    table = loo.marginal_table(loaded).splitlines()
    assert table[0] == "Full federation: mean dice 80.00% over 3 sites."
    assert "| marginal value (points) | +7.00 | +2.00 | -1.00 |" in table
    assert "| normalised: marginal / sum of absolute marginals | +0.700 | +0.200 | -0.100 |" in table
    (tmp_path / "bad.json").write_text(json.dumps({"sites": SITES}))
    with pytest.raises(ValueError, match="bad.json: leave-one-out file lacks metric, full, without, marginal"):
        loo.load_loo(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="missing.json"):
        loo.load_loo(tmp_path / "missing.json")


@pytest.fixture
def fake_simulator(monkeypatch):
    """run_simulator replaced by one that writes the results a run with the job's exclude_sites would have."""
    calls = []

    def run(job, workspace, n_clients, threads=None, env=None, on_round=None, echo=None):
        config = json.loads(Path(job, "app", "config", "config_fed_server.json").read_text())
        args = next(w["args"] for w in config["workflows"] if w["path"].startswith("fairfl."))
        excluded = args["exclude_sites"]
        calls.append(excluded)
        values = WITHOUT[excluded[0]] if excluded else FULL
        data = results(values, excluded, num_rounds=args["num_rounds"])
        path = os.path.join(workspace, SIMULATOR_RESULTS)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(data, f)
        for record in [{"round": r, "seconds": 1.0} for r in range(args["num_rounds"])] if on_round else []:
            on_round(record, {**data, "rounds": [record]}, 2.0)
        return SimpleNamespace(ok=True, seconds=1.0, errors={})

    monkeypatch.setattr(simulate, "run_simulator", run)
    return calls


BAD_LOO_FILES = [
    ({"marginal": {"site-1": "0.1"}}, "marginal ['site-1'] is '0.1', expected a finite number in [-1, 1]"),
    ({"marginal": [0.1]}, "marginal is [0.1], expected an object of site names"),
    ({"full": {"mean": None}}, "full lacks mean"),
    ({"without": {"site-1": {"mean": 7}}}, "without ['site-1'] mean is 7, expected a finite number in [0, 1]"),
    ({"sites": "site-1"}, "sites is 'site-1', expected a list"),
    ({"metric": ["dice"]}, "metric is ['dice'], expected a string"),
    ({"marginal": {"site-9": 0.1}}, "marginal names sites without a run left out: 'site-9'"),
    ({"marginal": {}, "without": {}}, "marginal names no site"),
]


@pytest.mark.parametrize("change, problem", BAD_LOO_FILES)
def test_a_leave_one_out_file_of_another_centre_is_checked_field_by_field(tmp_path, change, problem):
    # it used to end in a traceback in the middle of the report (a string marginal, a list, a missing mean)
    data = {**loo.marginal_values(results(FULL), without_runs()), **change}
    (tmp_path / "loo.json").write_text(json.dumps(data))
    with pytest.raises(ValueError) as error:
        loo.load_loo(tmp_path)
    assert str(error.value) == f"{tmp_path / 'loo.json'}: {problem}" or problem in str(error.value), str(error.value)


def test_a_leave_one_out_file_nested_too_deep_is_an_error_naming_it(tmp_path):
    (tmp_path / "loo.json").write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError in the parser, before
    with pytest.raises(ValueError, match="loo.json: not a readable leave-one-out file .*nested too deeply"):
        loo.load_loo(tmp_path)


def test_site_names_and_the_metric_of_a_leave_one_out_file_are_text_in_markdown(tmp_path):
    data = loo.marginal_values(results(FULL), without_runs())
    hostile = {"site-1": "<img src=x onerror=alert(1)>", "site-2": "a|b", "site-3": "[x](javascript:alert(1))"}
    data = {
        **data,
        "metric": "dice<script>",
        "sites": [hostile[s] for s in data["sites"]],
        "without": {hostile[s]: v for s, v in data["without"].items()},
        "marginal": {hostile[s]: v for s, v in data["marginal"].items()},
    }
    (tmp_path / "loo.json").write_text(json.dumps(data))
    table = loo.marginal_table(loo.load_loo(tmp_path))
    assert "<img" not in table and "<script>" not in table and not re.search(r"(?<!\\)\[", table)  # no link
    assert "&lt;img src=x onerror=alert(1)&gt;" in table and "a\\|b" in table and "\\[x\\](javascript" in table
    assert len(table.splitlines()[2].split(" | ")) == 4  # the header row: one cell per site, none split


def test_run_leave_one_out_resumes(tmp_path, fake_simulator):
    job = os.path.join(REPO, "jobs", "fedavg")
    path = loo.run_leave_one_out(job, tmp_path / "loo", 3, {"num_rounds": 2})
    assert fake_simulator == [[], ["site-1"], ["site-2"], ["site-3"]]
    data = json.loads(path.read_text())
    assert path == tmp_path / "loo" / "loo.json" and data["overrides"] == {"num_rounds": 2}
    assert data["marginal"] == pytest.approx({"site-1": 0.07, "site-2": 0.02, "site-3": -0.01})
    assert data["workspaces"]["site-2"] == str(tmp_path / "loo" / "runs" / "without-site-2")
    # a second call keeps the finished runs; a changed setting must not be mixed with them
    loo.run_leave_one_out(job, tmp_path / "loo", 3, {"num_rounds": 2}, sites=["site-2"])
    assert len(fake_simulator) == 4
    with pytest.raises(ValueError, match="other settings \\(num_rounds\\)"):
        loo.run_leave_one_out(job, tmp_path / "loo", 3, {"num_rounds": 5})
    # a site's argument (the learning rate) counts too: the job copy beside each run holds it
    with pytest.raises(ValueError, match="other settings \\(lr\\)"):
        loo.run_leave_one_out(job, tmp_path / "loo", 3, {"num_rounds": 2, "lr": 0.5})
    with pytest.raises(ValueError, match="site-9"):
        loo.run_leave_one_out(job, tmp_path / "loo", 3, sites=["site-9"])


def test_run_leave_one_out_stops_at_a_failed_run(tmp_path, monkeypatch):
    monkeypatch.setattr(
        simulate, "run_simulator", lambda job, ws, *args, **kwargs: simulate.SimulatorRun(ws, 1, 0.0, {})
    )
    job = os.path.join(REPO, "jobs", "fedavg")
    with pytest.raises(RuntimeError, match="full failed:\nsimulator exit code 1"):
        loo.run_leave_one_out(job, tmp_path / "loo", 3)
    assert not (tmp_path / "loo" / "loo.json").exists()


def test_command_line(tmp_path, fake_simulator, capsys):
    from fairfl import cli

    job = os.path.join(REPO, "jobs", "fedavg")
    out = tmp_path / "loo"
    assert (
        cli.main(
            ["leave-one-out", job, "-n", "3", "-o", str(out), "--set", "num_rounds=2", "--sites", "site-1", "site-3"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert fake_simulator == [[], ["site-1"], ["site-3"]]
    # a progress line per round of each run, named by its workspace, and each run's outcome
    for run in ("full", "without-site-1", "without-site-3"):
        assert f"  {run}: round 2/2 | elapsed 0:02 | left ~0:00 | not evaluated yet\n" in printed
        assert f"  {run}: finished 0 round(s) in 0:01\n" in printed
    quiet = [
        "leave-one-out",
        job,
        "-n",
        "3",
        "-o",
        str(tmp_path / "quiet"),
        "--set",
        "num_rounds=2",
        "--sites",
        "site-1",
    ]
    assert cli.main([*quiet, "--quiet"]) == 0
    assert "round 2/2" not in capsys.readouterr().out
    assert "| marginal value (points) | +7.00 | -1.00 |" in printed and f"--loo {out / 'loo.json'}" in printed
    assert cli.main(["leave-one-out", job, "-n", "3", "-o", str(out), "--set", "num_rounds=3"]) == 1
    assert "other settings (num_rounds)" in capsys.readouterr().err
