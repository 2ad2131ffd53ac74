"""Integration: hostile sites and inputs through NVFlare's real simulator. Sites answering like broken or malicious
ones (NaN or mis-shaped weights, string metrics, a huge update, scores of 7, metric names MLflow refuses, CKA out of
range, a NaN leave-one-out error or sharpness, another lr, 10**18 samples; tests/faults.py's result filter) are
rejected every round with the job going on, and the trackers show only the accepted numbers; a site's broken data
ends the job fast, naming the site and the file; an exported job runs only where the sites allow-list fairfl."""

import json
import math
import os
import subprocess

import pytest
from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

from fairfl.flare.components import ALLOW_LIST
from fairfl.report.runs import free_riders
from fairfl.simulate import NVFLARE_SIMULATOR, SIMULATOR_OUTPUT, run_simulator
from fairfl.tracking import MLFLOW_EXPERIMENT, SUMMARY_SOURCE, mlflow_location

from helpers import check_tracking, make_job, recorded, tensorboard_scalars
from simulator_runs import (
    SIM_TIMEOUT,
    check_common,
    check_contributions,
    corrupt,
    faulty,
    load_results,
    read_json,
    run,
    strict_json,
)

pytestmark = pytest.mark.slow


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
    sources = [*sites, SUMMARY_SOURCE]  # the sites' runs and the fairness summary's
    assert mlflow_metrics(run_dir, sources) == {s: recorded(results, s) for s in sources}


def mlflow_metrics(run_dir, sites):
    """{site: {metric: {step: value}}} of the run's MLflow store (one finished MLflow run per site or source), read with
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
    state = read_json(os.path.join(os.path.dirname(sim.results_path), "method_state.json"))
    assert state["round"] == 2 and state["state"]["rounds"] == 2
    assert state["state"]["weights"]["site-2"] == 0.0


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
    with open(os.path.join(refused.workspace, SIMULATOR_OUTPUT)) as f:
        output = f.read()
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
    # a missing file or other header-level problems fail earlier, in load_datalist (tests/core/test_bad_data_files.py)
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
        for report in record["sharpness"].values():
            assert report["sharpness"] == pytest.approx(report["perturbed_loss"] - report["loss"], abs=1e-9)
        for site in sites:  # every site trained with SALT at the round's rho
            assert record["train"][site]["rho"] == pytest.approx(record["rho"])
    state = read_json(os.path.join(os.path.dirname(sim.results_path), "method_state.json"))
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
