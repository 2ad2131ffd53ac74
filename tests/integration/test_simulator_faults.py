"""Integration: sites that fail, stall or die, through NVFlare's real simulator, and a killed run resumed. A site
whose process dies mid-round is recorded absent and the run goes on; too few sites left end the job with a clear
message; a site failing every round leaves the others' numbers as they are without it; a site failing or stalling
in one round is back in the next; a named run killed mid-run resumes to the result of one that never stopped. The
faults are tests/faults.py's ("fail", "stall", "crash"): each is an event the server sees, never a clock racing
process starts."""

import os

import pytest

from fairfl.simulate import SIMULATOR_RESULTS

from helpers import make_job
from simulator_runs import faulty_chain, load_results, read_json, run

pytestmark = pytest.mark.slow


def crashing_site(site="site-3", round_num=1):
    """site ends its process after training in round round_num, before it answers (tests/faults.py)."""
    return faulty_chain({"site": site, "mode": "crash", "round": round_num})


def test_a_site_that_dies_mid_round_is_recorded_absent_and_a_held_out_site_is_only_evaluated(tmp_path, cache_dir):
    # one run for two behaviours (a run's process starts cost more than its rounds): site-3 ends its process in
    # round 1, before it answers, and the run goes on; site-4 is held out (exclude_sites): it never trains and is
    # evaluated with the global model
    job = make_job(
        "fedavg",
        str(tmp_path / "job"),
        {
            "num_rounds": 3,
            "eval_every": 3,
            "min_clients": 2,
            "straggler_timeout": 10,
            "average_last": 2,
            "exclude_sites": ["site-4"],
        },
        client_extra=crashing_site(),
    )
    sim = run(job, str(tmp_path / "ws"), n=4, t=4)
    assert "no train answer from site-3" in sim.errors.pop("server", "")
    results = load_results(sim)
    first, *later = results["rounds"]
    assert "absent" not in first and set(first["train"]) == set(first["weights"]) == {"site-1", "site-2", "site-3"}
    for record in later:
        assert record["absent"] == ["site-3"] and set(record["train"]) == {"site-1", "site-2"}
        assert set(record["weights"]) == {"site-1", "site-2"} and sum(record["weights"].values()) == pytest.approx(1)
    assert set(results["final"]["per_site"]) == {"site-1", "site-2", "site-4"} and "stopped" not in results
    # average_last 2: round 1 is evaluated too, and the final record holds each site's mean over rounds 1 and 2
    assert [bool(r.get("per_site")) for r in results["rounds"]] == [False, True, True]
    mean_of_last = results["final"]["mean_of_last"]
    assert mean_of_last["rounds"] == [1, 2] and set(mean_of_last["per_site"]) == {"site-1", "site-2", "site-4"}
    for site in ("site-1", "site-2", "site-4"):
        assert mean_of_last["per_site"][site]["dice"] == pytest.approx(
            (results["rounds"][1]["per_site"][site]["dice"] + results["rounds"][2]["per_site"][site]["dice"]) / 2
        )
    # the held-out site: recorded as such, summarised apart from the federation, every site's summary as before
    assert results["config"]["exclude_sites"] == results["held_out_sites"] == ["site-4"]
    final = results["final"]
    assert final["federation"]["sites"] == ["site-1", "site-2"] and final["held_out"]["sites"] == ["site-4"]
    assert final["held_out"]["mean"] == final["per_site"]["site-4"]["dice"] and "global_model" not in final


def failing_site(site, rounds=None):
    """site answers the train tasks of `rounds` (every one when None) with an execution error (tests/faults.py)."""
    return faulty_chain({"site": site, "mode": "fail", "rounds": rounds})


def test_too_few_sites_left_ends_the_job_with_a_clear_message(tmp_path, cache_dir):
    # min_clients "all": the round in which site-2's training fails ends the job. The failure is an answer, so the
    # server knows at once: no timeout races the processes' start (a 25 s task_timeout once did, on a busy machine).
    # Two sites: "all" needs no more, and each site is a process start
    job = make_job(
        "fedavg",
        str(tmp_path / "job"),
        {"num_rounds": 3, "eval_every": 3, "min_clients": "all"},
        client_extra=failing_site("site-2", rounds=[1]),
    )
    sim = run(job, str(tmp_path / "ws"), n=2, t=2)
    assert "fewer than min_clients 2" in sim.errors.get("server", "")
    results = read_json(sim.results_path)
    assert [r["round"] for r in results["rounds"]] == [0, 1] and results["final"] is None
    assert results["rounds"][1]["failed"] == {"site-2": "EXECUTION_EXCEPTION"}
    assert results["stopped"].startswith("round 1: 1 of 2 sites answered")


def numbers(metrics: dict) -> dict:
    """A site's metrics without its timings (which vary from run to run)."""
    return {name: value for name, value in metrics.items() if not name.endswith("_seconds")}


def test_a_site_failing_every_round_leaves_the_other_sites_numbers_as_without_it(tmp_path, tiny_fedavg_run):
    # the default quorum (a majority: 2 of 3) goes on without site-3, whose training fails in every round; FedAvg
    # then gives site-1 and site-2 exactly the numbers of the same job run with only them (tiny_fedavg_run)
    job = make_job("fedavg", str(tmp_path / "job"), client_extra=failing_site("site-3"))
    sim = run(job, str(tmp_path / "ws"), n=3, t=3)
    assert "site-3 failed its task" in sim.errors.pop("server", "")
    sim.errors.pop("site-3", None)
    results = load_results(sim)
    reference = load_results(tiny_fedavg_run)
    assert results["config"]["min_clients"] is None and "stopped" not in results
    for ours, theirs in zip(results["rounds"], reference["rounds"], strict=True):
        assert ours["failed"] == {"site-3": "EXECUTION_EXCEPTION"} and ours["weights"] == theirs["weights"]
        assert {s: numbers(ours["train"][s]) for s in theirs["train"]} == {
            s: numbers(m) for s, m in theirs["train"].items()
        }
        assert {s: ours["per_site"][s] for s in theirs["per_site"]} == theirs["per_site"]
    assert set(results["final"]["per_site"]) == {"site-1", "site-2", "site-3"}  # site-3 is still scored


def test_a_site_that_fails_or_stalls_in_one_round_is_left_out_of_it_and_back_in_the_next(tmp_path, cache_dir):
    # FedCE (its leave-one-out model needs the site's last local model; each is given a weight of 0 in the round it
    # missed): site-2's training fails in round 1; site-3 holds its round-2 answer until the server has recorded
    # round 2 without it (the straggler deadline after the quorum's 3 answers, not task_timeout), then answers late.
    # Both train again in the next round and every site is in the final record.
    workspace = tmp_path / "ws"
    release = str(workspace / SIMULATOR_RESULTS)
    job = make_job(
        "fedce",
        str(tmp_path / "job"),
        {"num_rounds": 4, "eval_every": 4, "straggler_timeout": 5},
        client_extra=faulty_chain(
            {"site": "site-2", "mode": "fail", "rounds": [1]},
            {"site": "site-3", "mode": "stall", "round": 2, "release": release},
        ),
    )
    sim = run(job, str(workspace), n=4, t=4)
    server_errors = sim.errors.pop("server", "")
    assert "site-2 failed its task" in server_errors and "no train answer from site-3" in server_errors
    for site in ("site-2", "site-3"):
        sim.errors.pop(site, None)
    results = load_results(sim)
    rounds = results["rounds"]
    assert rounds[1]["failed"] == {"site-2": "EXECUTION_EXCEPTION"} and "absent" not in rounds[1]
    assert rounds[2]["absent"] == ["site-3"] and "failed" not in rounds[2]
    everyone = {"site-1", "site-2", "site-3", "site-4"}
    assert set(rounds[1]["train"]) == everyone - {"site-2"} and set(rounds[2]["train"]) == everyone - {"site-3"}
    assert set(rounds[0]["train"]) == set(rounds[3]["train"]) == set(rounds[3]["weights"]) == everyone
    assert set(rounds[2]["weights"]) == everyone - {"site-3"} and "site-2" in rounds[2]["weights"]
    assert set(results["final"]["per_site"]) == everyone and "stopped" not in results


def test_a_named_run_killed_mid_run_resumes_and_matches_one_that_never_stopped(tmp_path, cache_dir):
    job = make_job("fedce", str(tmp_path / "job"), {"num_rounds": 4, "eval_every": 2, "run_name": "trial"})
    sites = {"n": 2, "t": 2}  # FedCE's leave-one-out models need two; each more is a process start in all 3 runs
    reference = load_results(
        run(job, str(tmp_path / "reference"), env={"FAIRFL_STATE_ROOT": str(tmp_path / "s0")}, **sites)
    )
    env = {"FAIRFL_STATE_ROOT": str(tmp_path / "state")}
    killed = run(job, str(tmp_path / "ws"), env=env, kill_after_round=1, **sites)  # the server dies after round 2 of 4
    assert killed.returncode != 0 and read_json(killed.results_path)["final"] is None
    assert os.path.exists(tmp_path / "state" / "server" / "trial" / "checkpoint.pt")
    site_state = tmp_path / "state" / "site-1" / "trial"  # FedCE's previous model: the current or the previous file
    assert any(os.path.exists(site_state / name) for name in ("local_model.pt", "local_model_previous.pt"))
    resumed = load_results(run(job, str(tmp_path / "ws"), env=env, **sites))
    # the checkpoint of round 1, of round 0 if killed before writing it, or of round 2 if round 2 (about a second
    # of a tiny job on a busy machine) ended before the kill landed: any of them must resume to the same result
    assert resumed["resumed"] in (1, 2, 3)
    assert [r["round"] for r in resumed["rounds"]] == [0, 1, 2, 3]
    for ours, theirs in zip(resumed["rounds"][2:], reference["rounds"][2:], strict=True):
        assert ours["weights"] == pytest.approx(theirs["weights"], abs=1e-9)
        assert ours["contributions"] == pytest.approx(theirs["contributions"], abs=1e-9)
        for site in theirs["train"]:
            assert ours["train"][site]["train_loss"] == pytest.approx(theirs["train"][site]["train_loss"], abs=1e-9)
    for site, metrics in reference["final"]["per_site"].items():
        assert resumed["final"]["per_site"][site]["dice"] == pytest.approx(metrics["dice"], abs=1e-9)
