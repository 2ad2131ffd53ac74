"""Integration: NVFlare's real simulator runs each method's job end to end on tiny built-in data (through the recipe
API, as `fairfl run` does; `nvflare simulator` where a test says so): FedAvg with its trackers and progress lines,
Fed-LWR (on a 3-D SegResNet and the built-in volumes) and FedCE with fewer threads than sites, Solo on a data root
with a MONAI bundle as its model, FedNPR-Per, CFFL and CGSV, Ditto and FedFloor
with a held-out site. Sites answering like broken or malicious ones are in test_simulator_hostile_sites.py; sites
that fail, stall or die, and a killed run resumed, in test_simulator_faults.py."""

import math
import os
import subprocess

import pytest
import torch

from fairfl.bundle import read_bundle
from fairfl.methods.fedlwr.cka import parameter_layers
from fairfl.models import build_model
from fairfl.progress import outcome_line
from fairfl.simulate import NVFLARE_SIMULATOR

from helpers import REPO, check_tracking, make_job, recorded, segmentation_task_meta
from simulator_runs import check_common, check_contributions, load_results, read_json, run

pytestmark = pytest.mark.slow
TINY_BUNDLE = os.path.join(REPO, "tests", "fixtures", "tiny_bundle")  # a MONAI bundle written in the repository
SEGRESNET = {"init_filters": 4, "norm": ["group", {"num_groups": 2}], "blocks_down": [1, 1], "blocks_up": [1]}


def test_fedavg_trains_and_reports(tiny_fedavg_run):
    sim = tiny_fedavg_run
    results = load_results(sim)
    sites = ("site-1", "site-2")
    check_common(results, "fedavg", sites)
    weights = results["rounds"][-1]["weights"]
    assert sum(weights.values()) == pytest.approx(1.0) and len(weights) == 2
    for record in results["rounds"]:  # where each round's time went (benchmarks/cost.py)
        phases = record["phases"]
        assert set(phases) == {"train_task", "server_step", "evaluation"} and min(phases.values()) >= 0
        assert sum(phases.values()) <= record["seconds"] + 0.01
    assert os.path.exists(os.path.join(os.path.dirname(sim.results_path), "global_model.pt"))
    check_tracking(os.path.dirname(sim.results_path), results, sites)
    assert set(recorded(results, "site-1")) >= {"train_loss", "train_seconds", "dice"}
    # while it ran: one progress line per round, in order, each with that round's evaluation; then the outcome
    assert [line.split(" | ")[0] for line in sim.progress_lines] == ["round 1/2", "round 2/2"]
    for line, record in zip(sim.progress_lines, results["rounds"], strict=True):
        assert line.endswith(
            f"dice mean {100 * record['mean']:.1f}%, worst {record['worst_site']} {100 * record['worst']:.1f}%"
        )
    final = results["final"]
    assert outcome_line(results, sim.seconds).endswith(
        f"dice mean {100 * final['mean']:.1f}%, worst {final['worst_site']} {100 * final['worst']:.1f}%"
    ) and outcome_line(results, sim.seconds).startswith("finished 2 round(s) in ")


def test_fedlwr_layer_weights_of_a_3d_segresnet_with_fewer_threads_than_sites(tmp_path, cache_dir):
    # -t 1 < -n 2: each client process is restarted per task, so the CKA task must find the local model on disk;
    # through `nvflare simulator JOB -w WS -n 2 -t 1`, the command our users run on jobs/fedlwr. One round: every
    # task (train, cka, validate) of every site starts a process (imports, then NVFlare's 3 s shutdown grace). On a
    # network fairfl does not ship and the built-in volumes: patches in training and CKA, whole test volumes scored by
    # sliding window, CKA per module of SegResNet by name, each 3-D layer read at cka_max_positions voxels
    server = {
        "num_rounds": 1,
        "dataset": "prostate3d",
        "model": "SegResNet",
        "model_args": SEGRESNET,
        "cka_max_samples": 8,
        "cka_batch_size": 4,
        "cka_max_positions": 256,
    }
    client = {"patch_size": [16, 16, 16], "batch_size": 2, "synthetic_size_scale": 0.1}
    job = make_job("fedlwr", str(tmp_path / "job"), server=server, client=client)
    results = load_results(run(job, str(tmp_path / "ws"), n=2, t=1, via=NVFLARE_SIMULATOR))
    sites = ("site-1", "site-2")
    check_common(results, "fedlwr", sites, rounds=1)
    segresnet = build_model(
        {"name": "SegResNet", "in_channels": 1, "num_classes": 2, "spatial_dims": 3, "args": SEGRESNET}
    )
    assert set(results["rounds"][-1]["layer_weights"]) == set(parameter_layers(segresnet))  # every layer, by name
    for site, metrics in results["final"]["per_site"].items():  # volumes: surfaces too, in mm
        assert 0 <= metrics["surface_dice"] <= 1 and math.isfinite(metrics["hd95"]) and metrics["hd95"] >= 0, site
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


def test_solo_evaluates_own_models_of_a_monai_bundle_on_a_data_root(tmp_path, cache_dir):
    # the hospital's way in: its data root, and its model as a MONAI bundle (the repository's tiny one: its network,
    # its preprocessing at the sites, its weights as the start). Two sites: a cross-site matrix needs no more, and each
    # site is a process start
    data_root = tmp_path / "data"
    subprocess.run(
        ["fairfl", "prepare-data", "--out", str(data_root), "--image-size", "32", "--num-sites", "2"],
        check=True,
        capture_output=True,
    )
    job = make_job("solo", str(tmp_path / "job"), {"cross_site_eval": True, "bundle": TINY_BUNDLE})
    sim = run(job, str(tmp_path / "ws"), n=2, t=2, env={"FAIRFL_DATA_ROOT": str(data_root)})
    results = load_results(sim)
    check_common(results, "solo", ("site-1", "site-2"))
    assert results["config"]["bundle"] == TINY_BUNDLE
    kept_file = os.path.join(str(tmp_path / "ws"), "site-1", "simulate_job", "fairfl_site", "local_model.pt")
    kept = torch.load(kept_file, weights_only=True)
    bundle = build_model(read_bundle(TINY_BUNDLE).network).state_dict()
    assert {k: v.shape for k, v in kept["model"].items()} == {k: v.shape for k, v in bundle.items()}
    assert "weights" not in results["rounds"][-1]
    # cross-site evaluation: every site's own model scored on every site's test split; the diagonal is the final score
    cross, sites = results["cross_site"], results["sites"]
    assert cross["models"] == cross["sites"] == sites and cross["round"] == 1 and "rejected" not in cross
    assert all(0.0 <= cross["matrix"][m][s] <= 1.0 for m in sites for s in sites)
    assert cross["own"] == pytest.approx({s: results["final"]["per_site"][s]["dice"] for s in sites}, abs=1e-6)


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
    state = read_json(os.path.join(run_dir, "method_state.json"))
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
