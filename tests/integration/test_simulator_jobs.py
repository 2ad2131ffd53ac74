"""Integration: NVFlare's real simulator runs each job end to end on tiny built-in data (through the recipe API, as
`fairfl run` does; `nvflare simulator` where a test says so)."""

import json
import math
import os
import subprocess

import pytest
from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

from fairfl.flare.components import ALLOW_LIST
from fairfl.jobconfig import CLIENT_CONFIG
from fairfl.progress import outcome_line
from fairfl.report.runs import free_riders
from fairfl.simulate import NVFLARE_SIMULATOR, SIMULATOR_OUTPUT, SIMULATOR_RESULTS, run_simulator
from fairfl.tracking import MLFLOW_EXPERIMENT, mlflow_location

from helpers import check_tracking, make_job, recorded, segmentation_task_meta, tensorboard_scalars

pytestmark = pytest.mark.slow
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: faults.py
SIM_TIMEOUT = 600


FAULTS = "faults.CorruptResult"  # the test's faulty-site filter (tests/faults.py)


def run(job_dir, workspace, n=3, t=3, env=None, **options):
    # the faulty-site filter comes from tests/; keep any PYTHONPATH already set (a checkout's own code first)
    python_path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    if FAULTS in open(os.path.join(job_dir, CLIENT_CONFIG)).read():
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
    return json.loads(open(path).read(), parse_constant=lambda c: pytest.fail(f"bare {c} in {path}"))


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


def test_fedavg_trains_and_reports(tiny_fedavg_run):
    sim = tiny_fedavg_run
    results = load_results(sim)
    check_common(results, "fedavg")
    weights = results["rounds"][-1]["weights"]
    assert sum(weights.values()) == pytest.approx(1.0) and len(weights) == 3
    for record in results["rounds"]:  # where each round's time went (benchmarks/cost.py)
        phases = record["phases"]
        assert set(phases) == {"train_task", "server_step", "evaluation"} and min(phases.values()) >= 0
        assert sum(phases.values()) <= record["seconds"] + 0.01
    assert os.path.exists(os.path.join(os.path.dirname(sim.results_path), "global_model.pt"))
    check_tracking(os.path.dirname(sim.results_path), results, ("site-1", "site-2", "site-3"))
    assert set(recorded(results, "site-1")) >= {"train_loss", "train_seconds", "dice"}
    # while it ran: one progress line per round, in order, each with that round's evaluation; then the outcome
    assert [line.split(" | ")[0] for line in sim.progress_lines] == ["round 1/2", "round 2/2"]
    for line, record in zip(sim.progress_lines, results["rounds"]):
        assert line.endswith(
            f"dice mean {100 * record['mean']:.1f}%, worst {record['worst_site']} {100 * record['worst']:.1f}%"
        )
    final = results["final"]
    assert outcome_line(results, sim.seconds).endswith(
        f"dice mean {100 * final['mean']:.1f}%, worst {final['worst_site']} {100 * final['worst']:.1f}%"
    ) and outcome_line(results, sim.seconds).startswith("finished 2 round(s) in ")


def test_fedlwr_layer_weights_with_fewer_threads_than_sites(tmp_path, cache_dir):
    # -t 1 < -n 2: each client process is restarted per task, so the CKA task must find the local model on disk;
    # through `nvflare simulator JOB -w WS -n 2 -t 1`, the command our users run on jobs/fedlwr. One round: every
    # task (train, cka, validate) of every site starts a process (imports, then NVFlare's 3 s shutdown grace)
    job = make_job("fedlwr", str(tmp_path / "job"), server={"num_rounds": 1})
    results = load_results(run(job, str(tmp_path / "ws"), n=2, t=1, via=NVFLARE_SIMULATOR))
    sites = ("site-1", "site-2")
    check_common(results, "fedlwr", sites, rounds=1)
    assert results["config"]["weighting"] == "uniform"  # the paper's anchor: 1/K (Eq. 1, Algorithm 1 line 7)
    for record in results["rounds"]:
        assert "rejected" not in record
        assert record["anchor_weights"] == pytest.approx({s: 1 / 2 for s in sites})
        assert set(record["cka"]) == set(sites)
        layer_weights = record["layer_weights"]
        assert len(layer_weights) > 5
        for layer, per_site in layer_weights.items():
            assert sum(per_site.values()) == pytest.approx(1.0), layer
            assert all(0.0 <= w <= 1.0 for w in per_site.values())
        for per_layer in record["cka"].values():
            assert set(per_layer) == set(layer_weights)
            assert all(0.0 <= v <= 1.0 for v in per_layer.values())


def test_solo_evaluates_own_models_on_a_data_root(tmp_path, cache_dir):
    data_root = tmp_path / "data"
    subprocess.run(
        ["fairfl", "prepare-data", "--out", str(data_root), "--image-size", "32", "--num-sites", "3"],
        check=True,
        capture_output=True,
    )
    job = make_job("solo", str(tmp_path / "job"), {"cross_site_eval": True})
    sim = run(job, str(tmp_path / "ws"), env={"FAIRFL_DATA_ROOT": str(data_root)})
    results = load_results(sim)
    check_common(results, "solo")
    assert "weights" not in results["rounds"][-1]
    # cross-site evaluation: every site's own model scored on every site's test split; the diagonal is the final score
    cross, sites = results["cross_site"], results["sites"]
    assert cross["models"] == cross["sites"] == sites and cross["round"] == 1 and "rejected" not in cross
    assert all(0.0 <= cross["matrix"][m][s] <= 1.0 for m in sites for s in sites)
    assert cross["own"] == pytest.approx({s: results["final"]["per_site"][s]["dice"] for s in sites}, abs=1e-6)


def test_faulty_sites_are_rejected_every_round_and_the_global_model_stays_finite(tmp_path, cache_dir):
    # one run, four broken or malicious sites among honest site-1 and site-6: site-2 sends NaN weights, site-3
    # string metrics (train and validate), site-4 a tensor of the wrong shape, site-5 a finite but huge update and
    # evaluation scores of 7; site-2's evaluations also carry metric names MLflow refuses (../x), after which NVFlare's
    # MLflow receiver used to drop every later site's records. MLflow is on: what it and TensorBoard record is checked
    # against results.json
    broken = {"site-2": "nan", "site-3": "string_metric", "site-4": "shape", "site-5": "huge_update"}
    fault = {
        "task_result_filters": [
            {"tasks": ["train"], "filters": [corrupt(site, mode) for site, mode in broken.items()]},
            {
                "tasks": ["validate"],
                "filters": [
                    corrupt("site-2", "path_metric"),
                    corrupt("site-3", "string_metric"),
                    corrupt("site-5", "out_of_range"),
                ],
            },
        ]
    }
    job = make_job("fedavg", str(tmp_path / "job"), client_extra=fault, mlflow=True)
    sim = run(job, str(tmp_path / "ws"), n=6, t=6)
    # the server logs the rejections as errors; those are the expected ones
    server_errors = sim.errors.pop("server", "")
    assert all(site in server_errors for site in broken)
    results = load_results(sim)
    assert len(results["rounds"]) == 2 and "stopped" not in results
    for record in results["rounds"]:  # every round is evaluated (eval_every 1)
        assert set(record["rejected"]) == set(broken)
        assert "metric train_" in record["rejected"]["site-3"]
        assert "times the round's median" in record["rejected"]["site-5"]
        assert all("evaluation: " in record["rejected"][site] for site in ("site-2", "site-3", "site-5"))
        assert "metric name '../x'" in record["rejected"]["site-2"]
        assert set(record["weights"]) == {"site-1", "site-6"}
        assert set(record["train"]["site-3"]) == set()  # a string is not a metric
        assert set(record["train"]["site-5"]) == {"train_loss", "train_seconds"}
    final = results["final"]
    assert set(final["per_site"]) == {"site-1", "site-4", "site-6"}  # a string, a Dice of 7 or a path is no score
    assert all(math.isfinite(v["dice"]) for v in final["per_site"].values())
    # the trackers show the accepted numbers: site-5's training metrics, never its scores; nothing of site-3
    run_dir, sites = os.path.dirname(sim.results_path), tuple(f"site-{k}" for k in range(1, 7))
    check_tracking(run_dir, results, sites)
    assert "dice" not in tensorboard_scalars(run_dir, "site-5") and not tensorboard_scalars(run_dir, "site-3")
    assert mlflow_metrics(run_dir, sites) == {s: recorded(results, s) for s in sites}


def mlflow_metrics(run_dir, sites):
    """{site: {metric: {step: value}}} of the run's MLflow store (one finished MLflow run per site), read with
    MLflow's own client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_location(run_dir, True))
    runs = client.search_runs([client.get_experiment_by_name(MLFLOW_EXPERIMENT).experiment_id])
    assert len(runs) == len(sites) and all(r.info.status == "FINISHED" for r in runs)
    found = {}
    for r in runs:
        site = next(s for s in sites if r.info.run_name.startswith(f"{s}-"))
        found[site] = {
            name: {m.step: m.value for m in client.get_metric_history(r.info.run_id, name)} for name in r.data.metrics
        }
    return found


def test_fedlwr_rejects_out_of_range_cka(tmp_path, cache_dir):
    fault = {"task_result_filters": [faulty("site-3", "cka", ("cka",))]}
    sim = run(make_job("fedlwr", str(tmp_path / "job"), client_extra=fault), str(tmp_path / "ws"))
    assert "site-3" in sim.errors.pop("server", "")
    results = load_results(sim)
    for record in results["rounds"]:
        assert set(record["rejected"]) == {"site-3"} and record["rejected"]["site-3"].startswith("CKA")
        assert set(record["cka"]) == {"site-1", "site-2"}
        for per_site in record["layer_weights"].values():
            assert set(per_site) == {"site-1", "site-2"} and sum(per_site.values()) == pytest.approx(1.0)
    assert all(math.isfinite(v["dice"]) for v in results["final"]["per_site"].values())


def check_contributions(record, sites):
    contributions = record["contributions"]
    assert set(contributions) == set(sites)
    assert all(math.isfinite(v) and v >= 0 for v in contributions.values())
    assert sum(contributions.values()) == pytest.approx(1.0)


def test_fedce_contributions_free_rider_and_a_site_with_a_bad_leave_one_out_error(tmp_path, cache_dir):
    fault = {"task_result_filters": [faulty("site-2", "loo")]}
    # site-4 is a free rider by its own setting (its environment): neither the job nor the server's task can make
    # a site one
    job = make_job("fedce", str(tmp_path / "job"), server={"num_rounds": 3, "combine": "product"}, client_extra=fault)
    sim = run(job, str(tmp_path / "ws"), n=4, t=4, env={"FAIRFL_FREE_RIDERS": "site-4"})
    assert "site-2" in sim.errors.pop("server", "")
    results = load_results(sim)
    sites = ["site-1", "site-2", "site-3", "site-4"]
    assert results["method"] == "fedce_product" and free_riders(results) == ["site-4"]
    assert all(record["train"]["site-4"]["free_rider"] == 1.0 for record in results["rounds"])
    first, *later = results["rounds"]
    assert "contributions" not in first and set(first["weights"]) == set(sites)  # round 0 is FedAvg
    for record in later:  # site-2's NaN leave-one-out error keeps it out of rounds 1 and 2
        assert set(record["rejected"]) == {"site-2"} and "loo_error" in record["rejected"]["site-2"]
        check_contributions(record, ["site-1", "site-3", "site-4"])
        assert set(record["weights"]) == {"site-1", "site-3", "site-4"}
        for terms in record["contribution_terms"].values():
            assert terms["combined"] == pytest.approx(terms["gradient"] * terms["data"])
            assert 0.0 <= terms["error"] <= 1.0 and -1.0 <= terms["cosine"] <= 1.0
    check_contributions(results["final"], ["site-1", "site-3", "site-4"])
    assert set(results["final"]["per_site"]) == set(sites)  # the free rider is evaluated like everyone
    state = json.load(open(os.path.join(os.path.dirname(sim.results_path), "method_state.json")))
    assert state["round"] == 2 and state["state"]["rounds"] == 2
    assert state["state"]["weights"]["site-2"] == 0.0


def test_fedce_on_fundus_with_restarted_sites_builds_every_leave_one_out_model(tmp_path, cache_dir):
    # -t 1 < -n 2: every task starts a new client process, so the previous local model must come from disk;
    # the fundus data (RGB, background / disc rim / cup) runs through loss, Dice per region and results
    # (evaluated at the end only: each task of each site is a process start)
    job = make_job("fedce", str(tmp_path / "job"), server={"dataset": "fundus", "eval_every": 2})
    results = load_results(run(job, str(tmp_path / "ws"), n=2, t=1))
    check_common(results, "fedce_sum", ("site-1", "site-2"), eval_every=2)
    assert results["config"]["num_classes"] == 3 and results["config"]["in_channels"] == 3
    for record in results["rounds"][1:]:
        assert "rejected" not in record
        check_contributions(record, ["site-1", "site-2"])
        assert all(0.0 <= t["error"] <= 1.0 for t in record["contribution_terms"].values())
    for scores in results["final"]["per_site"].values():
        assert {"dice", "dice_disc", "dice_cup"} <= set(scores)
        assert scores["dice"] == pytest.approx((scores["dice_disc"] + scores["dice_cup"]) / 2)


def test_exported_job_runs_only_where_sites_allow_list_fairfl(tmp_path, cache_dir):
    exported = str(tmp_path / "exported")
    subprocess.run(
        ["fairfl", "export-job", make_job("fedavg", str(tmp_path / "job"), server={"num_rounds": 1}), exported],
        check=True,
        capture_output=True,
    )
    assert not os.path.exists(os.path.join(exported, "app", "custom"))

    # no allow-list entry: every site refuses our classes (`nvflare simulator` takes the workspace's list as it is;
    # the recipe would add our classes to it)
    refused = run(exported, str(tmp_path / "ws_refused"), n=2, t=2, via=NVFLARE_SIMULATOR)
    assert not refused.ok
    output = open(os.path.join(refused.workspace, SIMULATOR_OUTPUT)).read()
    assert "not in allow_list" in "".join(refused.errors.values()) + output

    # the production path: the site's local/resources.json allow-lists our component classes
    workspace = tmp_path / "ws_allowed"
    (workspace / "local").mkdir(parents=True)
    resources = {"format_version": 2, "class_allow_list": list(DEFAULT_CLASS_ALLOW_LIST) + list(ALLOW_LIST)}
    (workspace / "local" / "resources.json").write_text(json.dumps(resources))
    sim = run_simulator(
        exported, str(workspace), n_clients=2, timeout=SIM_TIMEOUT, keep_workspace=True, via=NVFLARE_SIMULATOR
    )
    results = load_results(sim)
    check_common(results, "fedavg", sites=("site-1", "site-2"), rounds=1)


def test_bad_data_fails_fast_naming_site_and_file(tmp_path, cache_dir):
    import nibabel as nib
    import numpy as np

    data_root = tmp_path / "data"
    subprocess.run(
        ["fairfl", "prepare-data", "--out", str(data_root), "--image-size", "32", "--num-sites", "2"],
        check=True,
        capture_output=True,
    )
    # a NaN pixel in site-2's last training image: only decoding shows it (the loader's first read, in the client);
    # a missing file or other header-level problems fail earlier, in load_datalist (tests/core/test_bad_inputs.py)
    nan_image = data_root / json.loads((data_root / "site-2.json").read_text())["training"][-1]["image"]
    volume = nib.load(nan_image)
    pixels = np.asarray(volume.dataobj, dtype=np.float32)
    pixels.flat[5] = np.nan
    nib.save(nib.Nifti1Image(pixels, volume.affine), nan_image)
    sim = run(
        make_job("fedavg", str(tmp_path / "job")),
        str(tmp_path / "ws"),
        n=2,
        t=2,
        env={"FAIRFL_DATA_ROOT": str(data_root)},
    )
    assert not sim.ok
    assert "site-2" in sim.errors and f"[site-2] {nan_image}: the image holds NaN" in sim.errors["site-2"]
    assert "site-1" not in sim.errors
    assert sim.seconds < 120  # the job ends; it does not wait for the broken site
    results = strict_json(sim.results_path)  # and says why, naming the failed site (not as absent)
    assert results["rounds"][0]["failed"] == {"site-2": "BAD_TASK_DATA"} and "absent" not in results["rounds"][0]
    assert "failed: site-2 (BAD_TASK_DATA)" in results["stopped"]


# ---------------------------------------------------------------- classification under quality shift (FedISM+)
TINY_CLASSIFICATION = {"synthetic_size_scale": 0.2, "batch_size": 16}  # 400 skin images of 32x32 over the sites
CLASSIFICATION_METRICS = ("accuracy", "balanced_accuracy", "auc")


def check_classification(results, method, sites, rounds=2):
    assert results["schema"] == 1 and results["method"] == method
    assert (results["task"], results["metric"]) == ("classification", "auc")
    assert results["sites"] == list(sites) and [r["round"] for r in results["rounds"]] == list(range(rounds))
    final = results["final"]
    assert set(final["per_site"]) == set(sites)
    for scores in final["per_site"].values():
        # each metric with its standard error on the site's test split, where the split gives one
        metrics = {
            *CLASSIFICATION_METRICS,
            *(f"{q}_{m}" for m in CLASSIFICATION_METRICS for q in ("clean", "corrupted")),
        }
        assert set(scores) - {f"{m}_se" for m in metrics} == {*metrics, "corrupted_site"}
        assert {"auc_se", "balanced_accuracy_se"} <= set(scores)
        assert all(0.0 <= v <= 1.0 for v in scores.values())
    # the last of the sites (20%, rounded) has corrupted images and is scored on the corrupted test set
    assert [final["per_site"][s]["corrupted_site"] for s in sites] == [0.0] * (len(sites) - 1) + [1.0]
    auc = [final["per_site"][s]["auc"] for s in sites]
    assert final["mean"] == pytest.approx(sum(auc) / len(auc)) and final["worst"] == pytest.approx(min(auc))


def test_fedism_plus_on_skin_with_a_site_sending_nan_sharpness(tmp_path, cache_dir):
    fault = {"task_result_filters": [faulty("site-2", "sharpness")]}
    job = make_job("fedism_plus", str(tmp_path / "job"), client=TINY_CLASSIFICATION, client_extra=fault)
    sim = run(job, str(tmp_path / "ws"), n=4, t=4)
    assert "site-2" in sim.errors.pop("server", "")
    results = load_results(sim)
    sites = ["site-1", "site-2", "site-3", "site-4"]
    check_classification(results, "fedismplus_s", sites)
    for round_num, record in enumerate(results["rounds"]):
        assert record["rho"] == pytest.approx(0.1 * ((round_num + 1) / 2) ** 0.5)
        assert set(record["rejected"]) == {"site-2"} and record["rejected"]["site-2"].startswith("sharpness ")
        assert set(record["weights"]) == set(record["sharpness"]) == {"site-1", "site-3", "site-4"}
        assert sum(record["weights"].values()) == pytest.approx(1.0)
        for site, report in record["sharpness"].items():
            assert report["sharpness"] == pytest.approx(report["perturbed_loss"] - report["loss"], abs=1e-9)
        for site in sites:  # every site trained with SALT at the round's rho
            assert record["train"][site]["rho"] == pytest.approx(record["rho"])
    state = json.load(open(os.path.join(os.path.dirname(sim.results_path), "method_state.json")))
    assert state["method"] == "fedismplus_s" and state["state"]["rounds"] == 2
    assert set(state["state"]["weights"]) == {"site-1", "site-3", "site-4"}


def test_qfedavg_on_the_classification_data_rejects_a_wrong_lr_and_a_claim_of_huge_data(tmp_path, cache_dir):
    # site-2 reports another lr than the others (q-FedAvg's L = 1 / lr); site-3 claims 10**18 training samples
    # (all the weight, were it unchecked): each site is rejected, not the job
    fault = {"tasks": ["train"], "filters": [corrupt("site-2", "lr"), corrupt("site-3", "huge_samples")]}
    job = make_job(
        "qfedavg",
        str(tmp_path / "job"),
        server={"num_rounds": 1},
        client=TINY_CLASSIFICATION,
        client_extra={"task_result_filters": [fault]},
    )
    sim = run(job, str(tmp_path / "ws"), n=4, t=4)
    server_errors = sim.errors.pop("server", "")
    assert "site-2" in server_errors and "site-3" in server_errors
    results = load_results(sim)
    sites = ["site-1", "site-2", "site-3", "site-4"]
    check_classification(results, "qfedavg", sites, rounds=1)
    record = results["rounds"][0]
    assert set(record["rejected"]) == {"site-2", "site-3"}
    assert "differs from the round's lr" in record["rejected"]["site-2"]
    assert "max_samples" in record["rejected"]["site-3"]
    assert set(record["losses"]) == {"site-1", "site-4"} and record["lipschitz"] == pytest.approx(1 / 3e-4)
    assert 0.0 <= record["global_share"] < 1.0
    assert set(record["weights"]) == {"site-1", "site-4"}
    assert sum(record["weights"].values()) + record["global_share"] == pytest.approx(1.0)


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


def faulty_chain(*filters):
    return {"task_result_filters": [{"tasks": ["train"], "filters": [{"path": FAULTS, "args": f} for f in filters]}]}


def test_too_few_sites_left_ends_the_job_with_a_clear_message(tmp_path, cache_dir):
    # min_clients "all": the round in which site-3's training fails ends the job. The failure is an answer, so the
    # server knows at once: no timeout races the processes' start (a 25 s task_timeout once did, on a busy machine)
    job = make_job(
        "fedavg",
        str(tmp_path / "job"),
        {"num_rounds": 3, "eval_every": 3, "min_clients": "all"},
        client_extra=failing_site("site-3", rounds=[1]),
    )
    sim = run(job, str(tmp_path / "ws"))
    assert "fewer than min_clients 3" in sim.errors.get("server", "")
    results = json.load(open(sim.results_path))
    assert [r["round"] for r in results["rounds"]] == [0, 1] and results["final"] is None
    assert results["rounds"][1]["failed"] == {"site-3": "EXECUTION_EXCEPTION"}
    assert results["stopped"].startswith("round 1: 2 of 3 sites answered")


def numbers(metrics: dict) -> dict:
    """A site's metrics without its timings (which vary from run to run)."""
    return {name: value for name, value in metrics.items() if not name.endswith("_seconds")}


def test_a_site_failing_every_round_leaves_the_other_sites_numbers_as_without_it(tmp_path, tiny_fedavg_run):
    # the default quorum (a majority: 3 of 4) goes on without site-4, whose training fails in every round; FedAvg
    # then gives site-1..3 exactly the numbers of the same job run with only them (tiny_fedavg_run)
    job = make_job("fedavg", str(tmp_path / "job"), client_extra=failing_site("site-4"))
    sim = run(job, str(tmp_path / "ws"), n=4, t=4)
    assert "site-4 failed its task" in sim.errors.pop("server", "")
    sim.errors.pop("site-4", None)
    results = load_results(sim)
    reference = load_results(tiny_fedavg_run)
    assert results["config"]["min_clients"] is None and "stopped" not in results
    for ours, theirs in zip(results["rounds"], reference["rounds"], strict=True):
        assert ours["failed"] == {"site-4": "EXECUTION_EXCEPTION"} and ours["weights"] == theirs["weights"]
        assert {s: numbers(ours["train"][s]) for s in theirs["train"]} == {
            s: numbers(m) for s, m in theirs["train"].items()
        }
        assert {s: ours["per_site"][s] for s in theirs["per_site"]} == theirs["per_site"]
    assert set(results["final"]["per_site"]) == {"site-1", "site-2", "site-3", "site-4"}  # site-4 is still scored


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
    assert killed.returncode != 0 and json.load(open(killed.results_path))["final"] is None
    assert os.path.exists(tmp_path / "state" / "server" / "trial" / "checkpoint.pt")
    site_state = tmp_path / "state" / "site-1" / "trial"  # FedCE's previous model: the current or the previous file
    assert any(os.path.exists(site_state / name) for name in ("local_model.pt", "local_model_previous.pt"))
    resumed = load_results(run(job, str(tmp_path / "ws"), env=env, **sites))
    # the checkpoint of round 1, of round 0 if killed before writing it, or of round 2 if round 2 (about a second
    # of a tiny job on a busy machine) ended before the kill landed: any of them must resume to the same result
    assert resumed["resumed"] in (1, 2, 3)
    assert [r["round"] for r in resumed["rounds"]] == [0, 1, 2, 3]
    for ours, theirs in zip(resumed["rounds"][2:], reference["rounds"][2:]):
        assert ours["weights"] == pytest.approx(theirs["weights"], abs=1e-9)
        assert ours["contributions"] == pytest.approx(theirs["contributions"], abs=1e-9)
        for site in theirs["train"]:
            assert ours["train"][site]["train_loss"] == pytest.approx(theirs["train"][site]["train_loss"], abs=1e-9)
    for site, metrics in reference["final"]["per_site"].items():
        assert resumed["final"]["per_site"][site]["dice"] == pytest.approx(metrics["dice"], abs=1e-9)


def test_fednpr_per_trains_with_prototypes_and_keeps_the_heads_on_the_sites(tmp_path, cache_dir):
    import torch

    from fairfl.models import head_state_keys, initial_state

    sim = run(make_job("fednpr_per", str(tmp_path / "job"), {"model_channels": [8, 16]}), str(tmp_path / "ws"))
    results = load_results(sim)
    assert results["method"] == "fednpr_per" and results["task"] == "classification"
    assert results["config"]["npr_logits"] == "layernorm" and results["config"]["npr_weight"] == 1.0
    for record in results["rounds"]:
        assert set(record["train"]) == {"site-1", "site-2", "site-3"}
        assert all(m["prototype_seconds"] > 0 for m in record["train"].values())
        assert all(math.isfinite(m["npr_grad_ratio"]) and m["npr_grad_ratio"] > 0 for m in record["train"].values())
        assert all(0.0 <= v["balanced_accuracy"] <= 1.0 for v in record["per_site"].values())
        # each site scored with its own head and with the global model as it is (the untrained head it started with)
        assert all(0.0 <= v["global_auc"] <= 1.0 and "global_clean_auc" in v for v in record["per_site"].values())
        assert record["global_model"]["sites"] == ["site-1", "site-2", "site-3"]
    spec = {"name": "cnn", "in_channels": 3, "num_classes": 8, "channels": [8, 16]}
    start = initial_state(spec, 0)
    final = torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt"))
    head = head_state_keys(spec)
    assert all(torch.equal(final[k], torch.as_tensor(start[k])) for k in head)  # never aggregated
    assert not all(torch.equal(final[k], torch.as_tensor(start[k])) for k in start if k not in head)


@pytest.mark.parametrize("job", ["cffl", "cgsv"])
def test_reward_jobs_give_each_site_its_own_model(tmp_path, cache_dir, job):
    import torch

    sim = run(make_job(job, str(tmp_path / "job")), str(tmp_path / "ws"))
    results = load_results(sim)
    check_common(results, job)
    sites = ["site-1", "site-2", "site-3"]
    for record in results["rounds"]:
        assert "rejected" not in record and "absent" not in record
        assert sum(record["reputations"].values()) == pytest.approx(1.0)
        check_contributions(record, sites)
        assert set(record["reward_fractions"]) == set(sites) and max(record["reward_fractions"].values()) == 1.0
        if job == "cffl":
            assert all(0.0 <= v <= 1.0 for v in record["val_metric"].values())
    check_contributions(results["final"], sites)
    run_dir = os.path.dirname(sim.results_path)
    models = torch.load(os.path.join(run_dir, "site_models.pt"))
    assert set(models) == set(sites) and os.path.exists(os.path.join(run_dir, "global_model.pt"))
    fractions = results["rounds"][-1]["reward_fractions"]
    low, top = min(fractions, key=fractions.get), max(fractions, key=fractions.get)
    if fractions[low] < 1.0:
        assert any(not torch.equal(models[low][k], models[top][k]) for k in models[top])
    state = json.load(open(os.path.join(run_dir, "method_state.json")))
    assert state["method"] == job and state["state"]["reputations"] == results["final"]["contributions"]


def test_ditto_scores_sites_with_personal_and_global_models_and_a_held_out_site_with_the_global_one(
    tmp_path, cache_dir
):
    """One named Ditto run holding out site-3: site-1 and site-2 are scored with their personal models (kept in the
    named run's state) and with the global model in the same task; site-3 with the global model alone."""
    import torch
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    from fairfl.flare import protocol
    from fairfl.flare.executor import FairflExecutor
    from fairfl.flare.site_task import SiteTask
    from fairfl.methods.ditto.controller import DittoController
    from fairfl.methods.ditto.protocol import PERSONAL_MODEL_FILE, PREVIOUS_PERSONAL_MODEL_FILE
    from fairfl.models import state_to_numpy

    state_root = tmp_path / "state"
    job = make_job(
        "ditto", str(tmp_path / "job"), {"run_name": "trial", "exclude_sites": ["site-3"], "cross_site_eval": True}
    )
    sim = run(job, str(tmp_path / "ws"), env={"FAIRFL_STATE_ROOT": str(state_root)})
    results = load_results(sim)
    check_common(results, "ditto", held_out=["site-3"])
    sites = ["site-1", "site-2"]
    assert results["config"]["ditto_lambda"] == 0.1 and results["held_out_sites"] == ["site-3"]
    for record in results["rounds"]:
        assert set(record["weights"]) == set(sites) and sum(record["weights"].values()) == pytest.approx(1.0)
        assert all(record["per_site"][s]["personal_model"] == 1.0 for s in sites)
        assert all(math.isfinite(record["train"][s]["personal_train_loss"]) for s in sites)
        assert set(record["per_site"]["site-3"]) <= {"dice", "dice_se"}  # the global model alone: no global_ copy
        assert record["global_model"]["sites"] == record["federation"]["sites"] == sites
        assert record["held_out"]["sites"] == ["site-3"]
        assert record["global_model"]["mean"] == pytest.approx(
            sum(record["per_site"][s]["global_dice"] for s in sites) / 2
        )
    # cross-site evaluation: the federation's personal models on every site's test split, the held-out one included
    cross = results["cross_site"]
    assert cross["models"] == sites and cross["sites"] == results["sites"] and "rejected" not in cross
    assert cross["own"] == pytest.approx({s: results["final"]["per_site"][s]["dice"] for s in sites}, abs=1e-6)
    # Re-score each site in-process with its personal model (from the named run's state, where a resumed run finds
    # it) and with the final global model: the reported Dice is the personal model's, and it is not the global's.
    global_state = state_to_numpy(torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt")))
    spec = DittoController(**{k: results["config"][k] for k in ("model_channels", "model_strides")}).model_spec()
    meta = {
        protocol.MODEL_SPEC: spec,
        protocol.DATASET: "prostate",
        protocol.TASK: "segmentation",
        protocol.NUM_SITES: 3,
        protocol.DATA_SEED: 0,
    }
    assert not (state_root / "site-3" / "trial" / PERSONAL_MODEL_FILE).exists()
    held_out = FairflExecutor(image_size=32, batch_size=8, synthetic_size_scale=0.5)._validate(
        SiteTask.of(
            "site-3",
            FLModel(params_type=ParamsType.FULL, params=global_state, meta={**meta, protocol.EVALUATE: "global"}),
        ),
        str(tmp_path / "none"),
    )
    assert results["final"]["per_site"]["site-3"]["dice"] == pytest.approx(held_out.metrics["dice"], abs=1e-6)
    differs = []
    for site in sites:
        state_dir = state_root / site / "trial"
        assert torch.load(state_dir / PERSONAL_MODEL_FILE)["round"] == 1
        assert torch.load(state_dir / PREVIOUS_PERSONAL_MODEL_FILE)["round"] == 0
        executor = FairflExecutor(image_size=32, batch_size=8, synthetic_size_scale=0.5)
        scores = {
            choice: executor._validate(
                SiteTask.of(
                    site,
                    FLModel(params_type=ParamsType.FULL, params=global_state, meta={**meta, protocol.EVALUATE: choice}),
                ),
                str(state_dir),
            ).metrics["dice"]
            for choice in (protocol.FROM_PERSONAL, protocol.FROM_GLOBAL)
        }
        reported = results["final"]["per_site"][site]["dice"]
        assert reported == pytest.approx(scores[protocol.FROM_PERSONAL], abs=1e-6)
        global_dice = results["final"]["per_site"][site]["global_dice"]
        assert global_dice == pytest.approx(scores[protocol.FROM_GLOBAL], abs=1e-6)
        differs.append(abs(reported - scores[protocol.FROM_GLOBAL]) > 1e-4)
    assert any(differs), "every site scored exactly as the global model: not evaluated with personal models"


def test_fedfloor_scores_each_site_with_the_mix_it_validated_and_a_held_out_site_with_the_global_model(
    tmp_path, cache_dir
):
    """FedFloor, a named run holding out site-3: each training site reports the alpha it chose on its validation
    split, and its final score is the score of that mix, re-computed in-process from the run's personal models and
    global model; site-3 is scored with the global model alone."""
    import torch
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

    from fairfl.flare import protocol
    from fairfl.flare.executor import FairflExecutor
    from fairfl.flare.site_task import SiteTask
    from fairfl.methods.fedfloor.controller import FedFloorController
    from fairfl.methods.fedfloor.mixing import DEFAULT_GRID
    from fairfl.methods.fedfloor.protocol import MIX_GRID
    from fairfl.models import state_to_numpy

    state_root = tmp_path / "state"
    job = make_job("fedfloor", str(tmp_path / "job"), {"run_name": "trial", "exclude_sites": ["site-3"]})
    sim = run(job, str(tmp_path / "ws"), env={"FAIRFL_STATE_ROOT": str(state_root)})
    results = load_results(sim)
    check_common(results, "fedfloor", held_out=["site-3"])
    sites = ["site-1", "site-2"]
    assert results["config"]["mix_grid"] == list(DEFAULT_GRID)
    for record in results["rounds"]:
        assert all(record["per_site"][s]["mix_alpha"] in DEFAULT_GRID for s in sites)
        assert all(record["per_site"][s]["personal_model"] == 1.0 for s in sites)
        assert set(record["per_site"]["site-3"]) <= {"dice", "dice_se"}
    global_state = state_to_numpy(torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt")))
    spec = FedFloorController(**{k: results["config"][k] for k in ("model_channels", "model_strides")}).model_spec()
    meta = {
        **segmentation_task_meta(spec),
        protocol.EVALUATE: protocol.FROM_PERSONAL,
        MIX_GRID: list(DEFAULT_GRID),
    }
    for site in sites:
        scores = (
            FairflExecutor(image_size=32, batch_size=8, synthetic_size_scale=0.5)
            ._validate(
                SiteTask.of(site, FLModel(params_type=ParamsType.FULL, params=global_state, meta=meta)),
                str(state_root / site / "trial"),
            )
            .metrics
        )
        final = results["final"]["per_site"][site]
        assert final["dice"] == pytest.approx(scores["dice"], abs=1e-6) and final["mix_alpha"] == scores["mix_alpha"]
