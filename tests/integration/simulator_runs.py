"""Helpers of the simulator tests (test_simulator_*.py): a job run through NVFlare's real simulator with the test's
faulty-site filter allowed, its results read strictly, the filters that make a site answer like a broken or
malicious one (tests/faults.py), and the checks every run's results get."""

import json
import math
import os

import pytest
from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

from fairfl.jobconfig import CLIENT_CONFIG
from fairfl.simulate import run_simulator

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: faults.py
SIM_TIMEOUT = 600


FAULTS = "faults.CorruptResult"  # the test's faulty-site filter (tests/faults.py)


def run(job_dir, workspace, n=3, t=3, env=None, **options):
    # the faulty-site filter comes from tests/; keep any PYTHONPATH already set (a checkout's own code first)
    python_path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    with open(os.path.join(job_dir, CLIENT_CONFIG)) as f:
        client_config = f.read()
    if FAULTS in client_config:
        # the sites refuse any class their allow-list does not name, so they list the test's filter, as a
        # hospital would list a filter of its own (our classes are added to the list as for every run)
        local = os.path.join(workspace, "local")
        os.makedirs(local, exist_ok=True)
        with open(os.path.join(local, "resources.json"), "w") as f:
            json.dump({"format_version": 2, "class_allow_list": [*DEFAULT_CLASS_ALLOW_LIST, FAULTS]}, f)
        options.setdefault("keep_workspace", True)
    return run_simulator(
        job_dir,
        workspace,
        n_clients=n,
        threads=t,
        timeout=SIM_TIMEOUT,
        env={"PYTHONPATH": python_path, **(env or {})},
        **options,
    )


def load_results(sim):
    assert sim.ok, sim.describe_failure()
    return strict_json(sim.results_path)


def strict_json(path):
    """The file as JSON, failing on a bare NaN or Infinity (not JSON: other readers refuse the file)."""
    with open(path) as f:
        return json.load(f, parse_constant=lambda c: pytest.fail(f"bare {c} in {path}"))


def read_json(path):
    """The file as JSON, as it is (a run's saved state, a results file the run left unfinished)."""
    with open(path) as f:
        return json.load(f)


def corrupt(site, mode):
    """A task-result filter that makes `site` answer like a broken or malicious site (tests/faults.py)."""
    return {"path": FAULTS, "args": {"site": site, "mode": mode}}


def faulty(site, mode, tasks=("train",)):
    """The filter chain of `tasks` (NVFlare allows one chain per task) with `corrupt(site, mode)`."""
    return {"tasks": list(tasks), "filters": [corrupt(site, mode)]}


def check_common(results, method, sites=("site-1", "site-2", "site-3"), rounds=2, eval_every=1, held_out=()):
    assert results["schema"] == 1 and results["method"] == method
    assert results["sites"] == list(sites)
    assert [r["round"] for r in results["rounds"]] == list(range(rounds))
    final = results["final"]
    assert set(final["per_site"]) == set(sites)
    dice = [final["per_site"][s]["dice"] for s in sites]
    assert all(0.0 <= d <= 1.0 for d in dice)
    mean = sum(dice) / len(dice)
    assert final["mean"] == pytest.approx(mean)
    assert final["std"] == pytest.approx(math.sqrt(sum((d - mean) ** 2 for d in dice) / len(dice)))
    assert final["worst"] == pytest.approx(min(dice))
    # every site but the held-out ones trained in every round; every eval_every-th round was evaluated at every site
    for record in results["rounds"]:
        evaluated = (record["round"] + 1) % eval_every == 0
        assert set(record.get("per_site") or ()) == (set(sites) if evaluated else set())
        assert set(record["train"]) == set(sites) - set(held_out)


def check_contributions(record, sites):
    contributions = record["contributions"]
    assert set(contributions) == set(sites)
    assert all(math.isfinite(v) and v >= 0 for v in contributions.values())
    assert sum(contributions.values()) == pytest.approx(1.0)


def faulty_chain(*filters):
    return {"task_result_filters": [{"tasks": ["train"], "filters": [{"path": FAULTS, "args": f} for f in filters]}]}
