"""The benchmark's statistics over runs (fairfl.benchmark.run_statistics: test-split errors, mean weights, training
diagnostics) and the benchmarks/ scripts' own (fairness.py's seed-paired target cells, cost.py's round costs and
ratios), against hand computations."""

import json
import os

import pytest

from helpers import REPO


def test_test_split_errors_average_each_sites_error_over_runs_and_skip_runs_without_one():
    from fairfl.benchmark.run_statistics import test_split_errors

    def run(se2, se10):
        per_site = {
            "site-2": {"dice": 0.7, **({"dice_se": se2} if se2 is not None else {})},
            "site-10": {"dice": 0.6, "dice_se": se10},
        }
        return {"final": {"per_site": per_site}}

    errors = test_split_errors({"fedavg": [run(0.02, 0.10), run(None, 0.20)], "ditto": [run(0.04, 0.30)]}, "dice")
    assert list(errors) == ["site-2", "site-10"]  # natural site order
    assert errors["site-2"] == pytest.approx(3.0) and errors["site-10"] == pytest.approx(20.0)
    assert test_split_errors({"fedavg": [{"final": None}]}, "dice") == {}


def test_the_benchmark_scripts_judge_targets_on_seed_paired_intervals(tmp_path):
    """benchmarks/fairness.py (and fedce, fedism, fednpr through it): a target cell is the paired per-seed difference
    with its 95% interval, not a difference of means; pairing cancels what the seed shifts in both methods."""
    import sys

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from fairness import per_seed_final, target_cell
    finally:
        sys.path.pop(0)

    def write(name, seed, dice):
        path = tmp_path / f"{name}{seed}.json"
        path.write_text(
            json.dumps(
                {"seed": seed, "final": {"per_site": {f"site-{i + 1}": {"dice": d} for i, d in enumerate(dice)}}}
            )
        )
        return str(path)

    # the seed moves both methods by a lot; the method is always 2 points better on average
    base = [write("a", s, [0.5 + 0.1 * s, 0.6 + 0.1 * s]) for s in range(3)]
    better = [write("b", s, [0.52 + 0.1 * s, 0.62 + 0.1 * s]) for s in range(3)]
    a = {"per_seed": {"dice_avg": per_seed_final(base, "dice", "avg")}}
    b = {"per_seed": {"dice_avg": per_seed_final(better, "dice", "avg")}}
    assert a["per_seed"]["dice_avg"] == pytest.approx({0: 55.0, 1: 65.0, 2: 75.0})
    assert target_cell(b, a, "dice_avg") == "+2.00 [+2.00, +2.00] (3 seeds)"
    assert target_cell(b, {"per_seed": {}}, "dice_avg") == "–"


def test_mean_weights_average_layers_then_rounds_then_runs():
    from fairfl.benchmark.run_statistics import mean_weights

    lwr = {
        "rounds": [
            {"layer_weights": {"a": {"site-1": 0.2, "site-2": 0.8}, "b": {"site-1": 0.4, "site-2": 0.6}}},
            {"layer_weights": {"a": {"site-1": 0.5, "site-2": 0.5}}},
            {},
        ]
    }
    assert mean_weights([lwr]) == pytest.approx({"site-1": 0.4, "site-2": 0.6})  # (0.3 + 0.5) / 2
    avg = [
        {"rounds": [{"weights": {"site-1": 0.25, "site-10": 0.75}}]},
        {"rounds": [{"weights": {"site-1": 0.35, "site-10": 0.65}}, {"rejected": {"site-1": "NaN"}}]},
    ]
    assert list(mean_weights(avg)) == ["site-1", "site-10"]
    assert mean_weights(avg) == pytest.approx({"site-1": 0.3, "site-10": 0.7})
    assert mean_weights([{"rounds": [{"weights": None}]}]) == {}


def test_train_diagnostics_are_medians_over_sites_rounds_and_runs():
    from fairfl.benchmark.run_statistics import train_diagnostics

    runs = [
        {
            "rounds": [
                {"train": {"site-1": {"npr_grad_ratio": 1.0}, "site-2": {"npr_grad_ratio": 9.0}}},
                {"train": {"site-1": {"train_loss": 0.3}}},
            ]
        },
        {"rounds": [{"train": {"site-1": {"npr_grad_ratio": 2.0}}}, {"train": None}]},
    ]
    assert train_diagnostics(runs) == {"npr_grad_ratio": 2.0}
    assert train_diagnostics([{"rounds": [{"train": {"site-1": {"train_loss": 0.3}}}]}]) == {}


def test_cost_benchmark_counts_only_training_rounds_and_pairs_each_method_with_its_own_fedavg_runs():
    """benchmarks/cost.py: round 0 (the sites start) and evaluated rounds are not a round's cost; a site's own
    method work is its probe, prototype and personal-training seconds; a method's ratio pairs its runs with the
    FedAvg runs of the same repeat, never with another method's."""
    import sys

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from cost import round_costs, summarize
    finally:
        sys.path.pop(0)

    def record(r, seconds, per_site=None, stopped=None):
        train = {"site-1": {"train_seconds": 1.0, "probe_seconds": 0.5}, "site-2": {"train_seconds": 2.0}}
        phases = {"train_task": seconds - 0.5, "server_step": 0.5}
        return {
            "round": r,
            "seconds": seconds,
            "train": train,
            "phases": phases,
            "per_site": per_site,
            "stopped": stopped,
        }

    results = {"rounds": [record(0, 30.0), record(1, 3.0), record(2, 5.0), record(3, 4.0, stopped="x")]}
    results["rounds"].append(record(4, 99.0, per_site={"site-1": {"dice": 0.5}}))
    costs = round_costs(results)
    assert costs["rounds"] == 2 and costs["round"] == pytest.approx(4.0) and costs["train_task"] == pytest.approx(3.5)
    assert costs["slowest_site_training"] == 2.0 and costs["all_sites_training"] == 3.0
    assert costs["all_sites_method_work"] == 0.5
    assert round_costs({"rounds": [record(0, 1.0), {"round": 1, "seconds": 2.0}]})["train_task"] is None  # old file

    def run(seconds, dataset="prostate"):
        return {"round": seconds, **{k: 0.0 for k in costs if k not in ("rounds", "round")}, "dataset": dataset}

    runs = {"fedavg@fedprox#0": run(2.0), "fedprox@fedprox#0": run(2.2), "fedavg@fedprox#1": run(4.0)}
    runs.update({"fedprox@fedprox#1": run(4.8), "fedavg@ditto#0": run(1.0), "ditto@ditto#0": run(3.0)})
    runs["ditto@ditto#1"] = run(9.0)  # its FedAvg run has not run yet: no pair
    floors = {"prostate#per_core_balanced#0": {"round": 1.0}, "prostate#per_core_balanced#1": {"round": 2.0}}
    summary, text = summarize(runs, {**floors, "prostate#per_site_barrier#0": {"round": 2.5}})
    assert summary["methods"]["fedprox"]["ratios"] == [1.1, 1.2] and summary["methods"]["ditto"]["ratio"] == 3.0
    assert "| fedprox | 3.50 | 3.00 | 1.15 [1.1, 1.2] | 1.05 |" in text
    assert "| prostate | FedAvg (jobs/fedavg) | 3 | 2.00 | – | 1.33 | – | 0.80 | – |" in text  # over each floor


def test_fedfloors_goal_is_not_judged_below_three_paired_seeds(tmp_path):
    """benchmarks/fedfloor_goal.py: two seeds whose spread ratio and mean would meet both goals read "not judged"."""
    import sys

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from fedfloor_goal import goal, tables
    finally:
        sys.path.pop(0)

    def rows(method, seed, sites):
        values = {**sites, "mean": sum(sites.values()) / 2, "std": abs(sites["site-1"] - sites["site-2"]) / 2}
        values["worst"] = min(sites.values())
        return [f"{method},,{seed},{site},dice,{v},missing.json" for site, v in values.items()]

    (tmp_path / "dice").mkdir()
    lines = ["method,variant,seed,site,metric,percent,file"]
    for seed in (0, 1):
        lines += rows("fedavg", seed, {"site-1": 80.0 + seed, "site-2": 60.0})
        lines += rows("fedfloor", seed, {"site-1": 75.0 + seed, "site-2": 70.0})
    (tmp_path / "dice" / "results.csv").write_text("\n".join(lines) + "\n")
    summary = {"dataset": "prostate", "metrics": ["dice"], "round_seconds": {"fedfloor": 2.0, "fedavg": 1.0}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    found = goal(str(tmp_path))
    assert found["seeds"] == [0, 1] and found["std_over_fedavg_mean_interval"][0] < 0.6  # would be met
    assert found["spread_goal_met"] is None and found["mean_goal_met"] is None
    table = tables([{**found, "folder": "x"}])
    assert "| not judged | +" in table and "| met |" not in table


def test_the_suite_cpu_plugin_counts_a_tests_waited_child_and_ranks_its_file_first(tmp_path):
    """benchmarks/suite_cpu.py in a real pytest session: a test whose child burns 1.1 CPU seconds is counted with
    them (and as one that waited for processes), one that only sleeps uses almost none, the summary ranks their file
    above a file of a test doing nothing, and a second session into the same folder is refused."""
    import subprocess
    import sys

    from helpers import benchmark_module

    suite_cpu = benchmark_module("suite_cpu")
    (tmp_path / "test_inner.py").write_text(
        "import subprocess, sys, time\n"
        "def test_child():\n"
        "    burn = 'import time\\nwhile time.process_time() < 1.1: pass'\n"
        "    subprocess.run([sys.executable, '-S', '-c', burn], check=True)\n"
        "def test_sleep():\n"
        "    time.sleep(0.2)\n"
    )
    (tmp_path / "test_other.py").write_text("def test_nothing():\n    pass\n")
    folder = tmp_path / "cpu"
    env = {
        **os.environ,
        "PYTHONPATH": os.path.join(REPO, "benchmarks"),
        suite_cpu.FOLDER_ENV: str(folder),
    }
    inner = [sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu", "-p", "no:cacheprovider", "-p", "no:xdist"]
    files = [str(tmp_path / "test_other.py"), str(tmp_path / "test_inner.py")]
    done = subprocess.run([*inner, *files], cwd=tmp_path, env=env, capture_output=True)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    records = {r["test"].split("::")[1]: r for r in suite_cpu.load(str(folder))}
    assert records["test_child"]["children"] >= 1.0 and records["test_sleep"]["children"] < 0.05
    assert records["test_sleep"]["wall"] >= 0.2 and records["test_sleep"]["own"] < 0.15
    text = suite_cpu.summary(list(records.values()))
    assert "3 tests" in text and "; 1 waited for processes" in text
    assert text.splitlines()[-2:][0].endswith("test_inner.py") and text.splitlines()[-1].endswith("test_other.py")
    assert "0 CPU seconds" in suite_cpu.summary([{**r, "own": 0, "children": 0} for r in records.values()])
    with pytest.raises(SystemExit, match="no records"):
        suite_cpu.load(str(tmp_path / "empty"))
    done = subprocess.run([*inner, files[0]], cwd=tmp_path, env=env, capture_output=True)  # a second session
    assert done.returncode == 0
    with pytest.raises(SystemExit, match="1 tests recorded more than once .*test_nothing"):
        suite_cpu.load(str(folder))
