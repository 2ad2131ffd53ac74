"""The cost benchmark's floors and CPU accounting (benchmarks/cost_floor.py) and its summary (benchmarks/cost.py),
without a simulator: the balanced split of the sites over the cores (longest first, never worse than site k to
process k % cores), the round of processes that wait for each other, the CPU seconds of a round from sampled (time,
CPU) series, the sampler on a real child process, NVFlare's FedAvg's settings, and the summary with pieces missing."""

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import benchmark_module

# the built-in prostate data at the jobs' size: training images and optimiser steps a round (batch 8, one epoch)
PROSTATE_IMAGES = {"site-1": 142, "site-2": 101, "site-3": 97, "site-4": 73, "site-5": 64, "site-6": 44}
PROSTATE_STEPS = {site: math.ceil(images / 8) for site, images in PROSTATE_IMAGES.items()}


@pytest.fixture(scope="module")
def cost():
    """benchmarks/cost.py (the summary, NVFlare's FedAvg's settings)."""
    return benchmark_module("cost")


@pytest.fixture(scope="module")
def floor(cost):
    """benchmarks/cost_floor.py (the floors, the CPU accounting), as cost.py imports it."""
    return sys.modules["cost_floor"]


def makespan(floor, groups, work):
    return max(floor.loads(groups, work))


# ------------------------------------------------------------------------------------------- the balanced split
def test_the_prostate_sites_split_evenly_where_k_mod_cores_did_not(floor):
    """The issue's example: k % 2 gives sites 1, 3, 5 303 images and 2, 4, 6 218; by steps the split is exact
    (34 and 34), and by images as close as these sizes go."""
    robin = floor.round_robin_groups(list(PROSTATE_IMAGES), 2)
    assert floor.loads(robin, PROSTATE_IMAGES) == [303, 218]
    by_steps = floor.balanced_groups(PROSTATE_STEPS, 2)
    assert floor.loads(by_steps, PROSTATE_STEPS) == [34, 34]
    by_images = floor.balanced_groups(PROSTATE_IMAGES, 2)
    assert sorted(floor.loads(by_images, PROSTATE_IMAGES)) == [259, 262]


def test_the_split_is_never_worse_than_k_mod_cores(floor):
    """Random works of 1 to 9 sites on 1 to 5 cores, integers and floats: the largest load is never above k % cores's;
    and where longest-first alone is (2 3 2 3 2 on two cores: 7 against 6), the result is not."""
    rng = random.Random(0)
    for _ in range(400):
        sites = [f"site-{k + 1}" for k in range(rng.randint(1, 9))]
        work = {s: rng.choice([rng.randint(1, 20), rng.uniform(0.1, 20.0)]) for s in sites}
        cores = rng.randint(1, 5)
        groups = floor.balanced_groups(work, cores)
        assert makespan(floor, groups, work) <= makespan(floor, floor.round_robin_groups(sites, cores), work) + 1e-9
    work = dict(zip(["a", "b", "c", "d", "e"], [2, 3, 2, 3, 2], strict=True))
    assert makespan(floor, floor.balanced_groups(work, 2), work) == 6


def test_the_split_assigns_every_site_once_deterministically(floor):
    rng = random.Random(1)
    work = {f"site-{k + 1}": rng.randint(1, 30) for k in range(11)}
    groups = floor.balanced_groups(work, 3)
    assert sorted(s for g in groups for s in g) == sorted(work)
    assert len(groups) == 3 and all(groups)
    assert all(g == sorted(g, key=list(work).index) for g in groups)  # each process's sites in site order
    assert floor.balanced_groups(dict(work), 3) == groups


def test_more_cores_than_sites_gives_a_process_per_site(floor):
    work = {"site-1": 5, "site-2": 9, "site-3": 1}
    assert sorted(floor.balanced_groups(work, 8)) == [["site-1"], ["site-2"], ["site-3"]]
    assert floor.round_robin_groups(list(work), 8) == [["site-1"], ["site-2"], ["site-3"]]
    assert floor.balanced_groups({}, 2) == []
    assert floor.balanced_groups(work, 1) == [["site-1", "site-2", "site-3"]]
    with pytest.raises(ValueError, match="cores"):
        floor.balanced_groups(work, 0)


def test_steps_per_round_is_what_train_local_takes(floor):
    steps = floor.site_training.steps_per_round
    assert steps(142, 8, 1, 0) == 18 and steps(144, 8, 1, 0) == 18 and steps(1, 8, 2, 0) == 2
    assert steps(142, 8, 1, 5) == 5  # local_steps wins over epochs


def test_nvflares_fedavg_gets_the_jobs_intervals_arguments_and_model(cost):
    """NVFlare's FedAvg runs with jobs/fedavg's task intervals, its script's arguments survive NVFlare's split at
    whitespace or are refused, and its model config reaches the server as fairfl's spec or is refused."""
    training = cost.site_training
    assert training.job_intervals(cost.JOBS) == {"task_request_interval": 0.2, "task_check_period": 0.1}
    args = training.train_args("/r/jobs", "skin", 6, "/tmp/s")
    assert args.split() == ["--jobs-dir", "/r/jobs", "--dataset", "skin", "--num-sites", "6", "--state-dir", "/tmp/s"]
    assert vars(training.parse_args(args.split())) == {
        "jobs_dir": "/r/jobs",
        "dataset": "skin",
        "num_sites": 6,
        "state_dir": "/tmp/s",
    }
    with pytest.raises(ValueError, match="whitespace"):
        training.train_args("/my jobs", "skin", 6, "/tmp/s")
    spec = {"name": "cnn", "in_channels": 3, "num_classes": 8, "channels": [16, 32, 64]}
    assert training.model_config(spec) == {"class_path": "nvflare_fedavg_client.network", "args": spec}
    for bad in ({"model_args": {"name": "x"}}, {"name": "{x}"}):
        with pytest.raises(ValueError, match="NVFlare"):
            training.model_config({**spec, **bad})


# --------------------------------------------------------------------------------------------- the barrier round
def test_a_barrier_round_runs_from_the_common_start_to_the_last_end(floor):
    fast = [{"start": 10.0, "end": 11.0, "cpu": 0.9}, {"start": 13.0, "end": 13.5, "cpu": 0.5}]
    slow = [{"start": 10.01, "end": 12.9, "cpu": 2.8}, {"start": 13.02, "end": 16.0, "cpu": 2.9}]
    assert floor.barrier_rounds([fast, slow]) == [{"seconds": 2.9, "cpu": 3.7}, {"seconds": 3.0, "cpu": 3.4}]
    assert floor.barrier_rounds([fast]) == [{"seconds": 1.0, "cpu": 0.9}, {"seconds": 0.5, "cpu": 0.5}]
    assert floor.barrier_rounds([]) == []
    with pytest.raises(ValueError):  # a process that reported fewer rounds
        floor.barrier_rounds([fast, slow[:1]])


# ---------------------------------------------------------------------------------------------- CPU per round
def test_cpu_per_round_is_the_cpu_between_round_ends(floor):
    samples = [(t / 10, 2.0 * t / 10) for t in range(101)]  # two cores busy for 10 s
    ends = [1.0, 3.0, 3.5, 9.0]
    assert floor.cpu_per_round(samples, ends) == [None, 4.0, 1.0, 11.0]
    assert floor.cpu_at(floor.clean_series(samples), 0.05) == pytest.approx(0.1)  # between two samples
    assert floor.round_periods(ends) == [None, 2.0, 0.5, 5.5]
    assert floor.round_periods([]) == [] and floor.round_periods([1.0, None, 2.0]) == [None, None, None]


def test_cpu_per_round_survives_a_hostile_series(floor):
    """Samples out of order, repeated times (the last counts), NaN, text, short tuples and a fall (a process's CPU
    leaving the sum: held at the running maximum) give numbers, never negatives; a boundary outside the samples, an
    unknown one or one before its predecessor gives None."""
    samples = [
        (3.0, 30.0),
        (0.0, 0.0),
        (1.0, 5.0),
        (1.0, 10.0),
        (2.0, float("nan")),
        ("x", 1.0),
        (2.5,),
        None,
        (float("inf"), 99.0),
        (2.0, 20.0),
        (4.0, 25.0),  # a fall: 30 -> 25 is held at 30
        (5.0, 40.0),
    ]
    series = floor.clean_series(samples)
    assert series == [(0.0, 0.0), (1.0, 10.0), (2.0, 20.0), (3.0, 30.0), (4.0, 30.0), (5.0, 40.0)]
    per_round = floor.cpu_per_round(samples, [1.0, 3.0, 4.0, 5.0, 6.0, None, 5.5])
    assert per_round == [None, 20.0, 0.0, 10.0, None, None, None]
    assert all(v is None or v >= 0 for v in per_round)
    assert floor.cpu_per_round(samples, [4.0, 2.0]) == [None, None]  # ends out of order
    assert floor.cpu_per_round([], [0.0, 1.0]) == [None, None]
    assert floor.cpu_per_round([(1.0, 3.0)], [1.0, 1.0]) == [None, 0.0]  # one sample: zero-length round only
    assert floor.cpu_at(series, float("nan")) is None


def test_round_ends_are_the_first_time_the_results_file_held_each_round(floor):
    changes = [(7.0, [0, 1, 2]), (1.0, []), (3.0, [0]), (5.0, [0, 1]), (5.5, [0, 1]), (9.0, [0, 1, 2, "3", 4, -1])]
    assert floor.round_ends(changes, 4) == [3.0, 5.0, 7.0, None]
    assert floor.round_ends([], 2) == [None, None]


def test_the_sampler_counts_a_child_process_and_its_results_file(floor, tmp_path):
    """A child that burns 0.1 CPU seconds and ends: its CPU stays in the sum after it ended (the sampler keeps each
    process's last value); the watched file's rewrites are recorded with the rounds each held."""
    results = tmp_path / "results.json"
    burn = "import time\nwhile time.process_time() < 0.1: pass\n"
    with floor.TreeCPU(watch=str(results), interval=0.01, rescan=(0.01, 0.04)) as tree:
        subprocess.run([sys.executable, "-S", "-c", burn], check=True)
        for rounds in ([0], [0, 1]):
            (tmp_path / "tmp.json").write_text(json.dumps({"rounds": [{"round": r, "seconds": 1.0} for r in rounds]}))
            os.replace(tmp_path / "tmp.json", results)
            deadline = time.time() + 30  # until the sampler saw this rewrite: a loaded machine delays its thread
            while len(tree.changes) < len(rounds) and time.time() < deadline:
                time.sleep(0.01)
    assert tree.samples[-1][1] >= 0.08
    assert [rounds for _, rounds in tree.changes] == [[0], [0, 1]]
    assert tree.own_cpu >= 0


# ------------------------------------------------------------------------------------------------- the summary
def run(dataset, round_, cpu=None, **phases):
    record = {"dataset": dataset, "round": round_, "rounds": 4, **phases}
    if cpu is not None:
        record["cpu"] = cpu
    return record


def test_the_summary_renders_with_pieces_missing(cost):
    """Old runs without CPU, a method without its FedAvg partner, a dataset without floors, a floor without runs,
    NVFlare's FedAvg beside FedAvg: every cell there is shows, every one missing is a dash."""
    runs = {
        "fedavg@fedprox#0": run("prostate", 3.0, cpu=6.0, all_sites_training=9.0),
        "fedprox@fedprox#0": run("prostate", 3.3, cpu=6.6, train_task=3.2),
        "nvflare_fedavg@fedprox#0": run("prostate", 3.6, cpu=7.2),
        "ditto@ditto#0": run("prostate", 6.0),  # its FedAvg run never finished
        "fedavg@fednpr#0": run("skin_imbalanced", 1.0),  # recorded before CPU was
        "fednpr@fednpr#0": run("skin_imbalanced", 2.0),
    }
    floors = {
        "prostate#per_core_balanced#0": {
            "round": 2.5,
            "cpu": 5.0,
            "processes": 2,
            "split": [{"sites": ["site-1", "site-4"], "steps": 34}, {"sites": ["site-2"], "steps": 34}],
            "round_robin_split": [{"sites": ["site-1"], "steps": 39}, {"sites": ["site-2"], "steps": 29}],
        },
        "prostate#per_site_barrier#0": {"round": 3.0, "cpu": None, "processes": 6},
        "prostate#per_core#0": {"round": 1.0},  # the old, unbalanced floor: not shown
        "skin#per_site_barrier#0": {"round": 1.5, "cpu": 3.0},
    }
    summary, text = cost.summarize(runs, floors, "python benchmarks/cost.py", "versions")
    methods = summary["methods"]
    assert set(methods) == {"fedprox", "fednpr"}
    assert methods["fedprox"]["ratio"] == 1.1 and methods["fedprox"]["cpu_ratio"] == 1.1
    assert methods["fednpr"]["cpu"] is None and methods["fednpr"]["cpu_ratio"] is None
    prostate = summary["floor_table"]["prostate"]
    assert list(prostate) == ["fedavg", "nvflare_fedavg", "per_core_balanced", "per_site_barrier"]
    assert prostate["fedavg"]["round_over_per_core_balanced"] == 1.2
    assert prostate["fedavg"]["cpu_over_per_core_balanced"] == 1.2
    assert prostate["nvflare_fedavg"]["round_over_per_site_barrier"] == 1.2
    assert prostate["fedavg"]["cpu_over_per_site_barrier"] is None  # the floor has no CPU
    assert prostate["per_core_balanced"]["round_over_per_core_balanced"] is None  # not against itself
    assert prostate["per_site_barrier"]["round_over_per_core_balanced"] == 1.2
    assert set(summary["floor_table"]) == {"prostate", "skin", "skin_imbalanced"}
    assert list(summary["floor_table"]["skin"]) == ["per_site_barrier"]
    assert "| prostate | FedAvg (jobs/fedavg) | 1 | 3.00 | 6.00 | 1.20 | 1.20 | 1.00 | – |" in text
    assert "| prostate | NVFlare FedAvg (Client API) | 1 | 3.60 | 7.20 | 1.44 | 1.44 | 1.20 | – |" in text
    assert "| skin_imbalanced | FedAvg (jobs/fedavg) | 1 | 1.00 | – | – | – | – | – |" in text
    assert "| fednpr | 2.00 | 1.00 | 2.00 [2.0] | – | – | – | – |" in text
    assert "site-1+site-4 (34 steps) | site-2 (34 steps); site k to process k % cores: 39 | 29 steps" in text
    assert "per_core#" not in text and "1.05" in text
    empty, text = cost.summarize({}, {})
    assert empty["methods"] == {} and empty["floor_table"] == {} and "| dataset | run |" in text


def test_a_variant_runs_as_its_job_with_its_arguments_and_gets_its_own_row(cost, tmp_path, monkeypatch):
    """`--methods fedfloor_minimax`: jobs/fedfloor with minimax_aggregation on, the round count and dataset asked for;
    its row beside FedFloor's (the same job, another variant) and none for FedAvg itself."""
    from fairfl.jobconfig import SERVER_CONFIG

    measured = []
    monkeypatch.setattr(cost, "measure_job", lambda job, workspace, sites, name: measured.append(job) or {})
    cost.run_job("fedfloor_minimax", "fundus", 5, 6, str(tmp_path))

    def controller_args(job):
        return json.loads(Path(job, SERVER_CONFIG).read_text())["workflows"][0]["args"]

    controller = controller_args(measured[0])
    assert controller["minimax_aggregation"] is True and controller["dataset"] == "fundus"
    assert controller["num_rounds"] == 5 and controller["eval_every"] == 5
    cost.run_job("fedfloor", "prostate", 5, 6, str(tmp_path))
    assert not controller_args(measured[1]).get("minimax_aggregation")
    runs = {
        "fedavg@fedfloor_minimax#0": run("prostate", 2.0, cpu=4.0),
        "fedfloor_minimax@fedfloor_minimax#0": run("prostate", 3.0, cpu=7.0),
        "fedavg@fedfloor#0": run("prostate", 2.0, cpu=4.0),
        "fedfloor@fedfloor#0": run("prostate", 2.5, cpu=5.0),
        "fedavg@fedavg#0": run("prostate", 2.0, cpu=4.0),
    }
    methods = cost.summarize(runs, {})[0]["methods"]
    assert list(methods) == ["fedfloor", "fedfloor_minimax"]  # the default methods first, then the variants
    assert methods["fedfloor_minimax"]["ratio"] == 1.5 and methods["fedfloor_minimax"]["cpu_ratio"] == 1.75
    assert methods["fedfloor_minimax"]["dataset"] == "prostate"


def test_dataset_reaches_the_job_with_the_variants_arguments_for_that_dataset(cost, tmp_path, monkeypatch):
    """`--dataset ich_imbalanced --methods fedprox_npr`: the job gets the variant's per-dataset arguments for ICH (K=2,
    not skin's 4), its own (mu) and the dataset, as `fairfl benchmark` would run it; FedAvg, its partner, gets the
    dataset and no FedNPR argument."""
    from fairfl.jobconfig import CLIENT_CONFIG, SERVER_CONFIG

    measured = []
    monkeypatch.setattr(cost, "measure_job", lambda job, workspace, sites, name: measured.append(job) or {})

    def arguments(job):  # the controller's arguments and the executor's, as the job folder holds them
        server = json.loads(Path(job, SERVER_CONFIG).read_text())["workflows"][0]["args"]
        client = json.loads(Path(job, CLIENT_CONFIG).read_text())["executors"][0]["executor"]["args"]
        return {**client, **server}

    for dataset, k in (("ich_imbalanced", 2), ("skin_imbalanced", 4)):
        cost.run_job("fedprox_npr", dataset, 3, 10, str(tmp_path))
        job = arguments(measured[-1])
        assert (job["dataset"], job["num_subclusters"], job["mu"]) == (dataset, k, 0.01)
    cost.run_job("fedavg", "ich_imbalanced", 3, 10, str(tmp_path))
    fedavg = arguments(measured[-1])
    assert fedavg["dataset"] == "ich_imbalanced" and "num_subclusters" not in fedavg


def test_dataset_runs_every_method_and_fedavg_there_and_refuses_what_cannot_run_or_mixes_datasets(
    cost, tmp_path, monkeypatch, capsys
):
    ran = []
    monkeypatch.setattr(cost, "run_job", lambda job, dataset, *rest: ran.append((job, dataset)) or {"round": 1.0})
    out = str(tmp_path / "ich")
    common = ["--fedavg-only", "--repeats", "1", "--rounds", "3", "--out", out]
    assert cost.main(["--methods", "fedfloor", "ditto", "--dataset", "ich_imbalanced", "--sites", "10", *common]) == 0
    assert ran == [("fedavg", "ich_imbalanced"), ("fedfloor", "ich_imbalanced")] + [
        ("fedavg", "ich_imbalanced"),
        ("ditto", "ich_imbalanced"),
    ]
    summary = json.loads(Path(out, "summary.json").read_text())["methods"]
    assert {row["dataset"] for row in summary.values()} == {"ich_imbalanced"}
    for argv, message in (
        (["--methods", "fedce", "--dataset", "fundus"], "fedce is a job, not a variant"),
        (["--methods", "fedce_sum", "--dataset", "skin_imbalanced"], "does not run on the imbalanced family"),
        (["--methods", "fedfloor", "--dataset", "ich_imbalanced", "--sites", "6"], "needs --sites 10 or more"),
        (["--methods", "fedfloor", "--dataset", "nowhere"], "invalid choice"),
    ):
        with pytest.raises(SystemExit):
            cost.main([*argv, *common])
        assert message in capsys.readouterr().err
    ran.clear()  # the same folder on another dataset, whichever method comes first: refused before anything runs
    for methods in (["fedfloor"], ["ditto", "fedfloor"], ["apfl"]):
        with pytest.raises(SystemExit, match="ran on ich_imbalanced, not ich: give these runs their own --out"):
            cost.main(["--methods", *methods, "--dataset", "ich", "--sites", "10", *common])
    with pytest.raises(SystemExit, match="ran on ich_imbalanced, not prostate"):  # the job's own dataset, kept key
        cost.main(["--methods", "fedfloor", "--sites", "10", *common])
    for methods in (["fedfloor"], ["apfl"]):  # other sites: refused even where no kept run is this call's
        with pytest.raises(SystemExit, match="ran with 10 sites, not 12"):
            cost.main(["--methods", *methods, "--dataset", "ich_imbalanced", "--sites", "12", *common])
    assert ran == []
    assert {row["sites"] for row in summary.values()} == {10}


def test_a_reused_workspace_does_not_hand_its_old_rounds_to_the_cpu_sampler(cost, tmp_path, monkeypatch):
    """Every FedAvg run of a dataset uses one workspace: the sampler, watching the results file, must not start on
    the previous run's file (its rounds would all end at once: no CPU a round, as the first runs here recorded)."""
    from fairfl.results import SIMULATOR_RESULTS

    workspace = tmp_path / "fedavg-prostate-ws"
    stale = workspace / SIMULATOR_RESULTS
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps({"rounds": [{"round": 0}, {"round": 1}]}))
    seen = []

    class Sampler:
        def __init__(self, watch):
            seen.append(os.path.exists(watch))

        def __enter__(self):
            raise RuntimeError("stop here")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(cost, "TreeCPU", Sampler)
    with pytest.raises(RuntimeError, match="stop here"):
        cost.measure_job(str(tmp_path / "job"), str(workspace), 2, "fedavg on prostate")
    assert seen == [False]
