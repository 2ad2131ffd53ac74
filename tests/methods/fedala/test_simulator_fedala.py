"""FedALA through NVFlare's real simulator (jobs/fedala, tiny: 3 sites, 2 rounds, a short start phase), a named run
holding out site-3: each training site trains round 0 as FedAvg (no local model yet) and learns its aggregation
weights in round 1 (kept in its state dir), reports them with its training metrics and its scores, and its final score
is the score of theta_hat, re-computed in-process from the run's kept local model, weights and final global model;
site-3 is scored with the global model alone."""

import json
import os

import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask
from fairfl.methods.fedala.controller import FedALAController
from fairfl.methods.fedala.protocol import PREVIOUS_WEIGHTS_FILE, WEIGHTS_FILE
from fairfl.models import state_to_numpy
from fairfl.simulate import run_simulator

from helpers import make_job, segmentation_task_meta

pytestmark = pytest.mark.slow
FAST = {"fedala_window": 2, "fedala_max_passes": 3}


def test_fedala_scores_each_site_with_its_adaptive_start_and_a_held_out_site_with_the_global_model(tmp_path, cache_dir):
    state_root = tmp_path / "state"
    job = make_job("fedala", str(tmp_path / "job"), {"run_name": "trial", "exclude_sites": ["site-3"], **FAST})
    sim = run_simulator(job, str(tmp_path / "ws"), 3, 3, env={"FAIRFL_STATE_ROOT": str(state_root)}, timeout=600)
    assert sim.ok, sim.describe_failure()
    with open(sim.results_path) as f:  # strict JSON: a bare NaN fails
        results = json.load(f, parse_constant=lambda c: pytest.fail(f"bare {c} in {sim.results_path}"))
    assert results["method"] == "fedala" and results["held_out_sites"] == ["site-3"]
    assert [r["round"] for r in results["rounds"]] == [0, 1]
    assert all(0.0 <= m["dice"] <= 1.0 for m in results["final"]["per_site"].values())
    sites = ["site-1", "site-2"]
    assert results["config"]["fedala_layers"] == 2 and results["config"]["fedala_max_passes"] == 3
    first, second = results["rounds"]
    for s in sites:
        assert first["train"][s]["fedala_passes"] == 0.0  # round 0: no local model, FedAvg's start
        assert second["train"][s]["fedala_passes"] in (2.0, 3.0)  # round 1: the start phase
        assert 0.0 <= second["train"][s]["fedala_weight_mean"] <= 1.0
        for record in (first, second):
            assert set(record["weights"]) == set(sites)
            scores = record["per_site"][s]
            assert (
                scores["personal_model"] == 1.0 and "global_dice" in scores and 0 <= scores["fedala_weight_mean"] <= 1
            )
        assert set(first["per_site"]["site-3"]) <= {"dice", "dice_se"}  # the global model alone
    global_state = state_to_numpy(torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt")))
    controller = FedALAController(**{k: results["config"][k] for k in ("model_channels", "model_strides")}, **FAST)
    meta = {
        **segmentation_task_meta(controller.model_spec()),
        **controller.site_meta(),
        protocol.EVALUATE: protocol.FROM_PERSONAL,
    }
    assert not (state_root / "site-3" / "trial" / WEIGHTS_FILE).exists()
    for s in sites:
        state_dir = state_root / s / "trial"
        assert torch.load(state_dir / WEIGHTS_FILE)["round"] == 1 and not (state_dir / PREVIOUS_WEIGHTS_FILE).exists()
        # the final evaluation again, of round 1: theta_hat from the kept local model and W, as round 2 would start
        task = SiteTask.of(s, FLModel(params_type=ParamsType.FULL, params=global_state, current_round=1, meta=meta))
        scores = FairflExecutor(image_size=32, batch_size=8, synthetic_size_scale=0.5)._validate(task, str(state_dir))
        final = results["final"]["per_site"][s]
        assert final["dice"] == pytest.approx(scores.metrics["dice"], abs=1e-6)
        assert final["fedala_weight_mean"] == pytest.approx(scores.metrics["fedala_weight_mean"], abs=1e-9)
