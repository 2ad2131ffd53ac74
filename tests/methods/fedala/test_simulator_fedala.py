"""FedALA through NVFlare's real simulator (jobs/fedala, tiny: 3 sites, 2 rounds, a short start phase), a named run
holding out site-3: each training site trains round 0 as FedAvg (no local model yet) and learns its aggregation
weights in round 1 (kept in its state dir), reports them with its training metrics and its scores, and its final score
is the score of theta_hat, re-computed in-process from the run's kept local model, weights and final global model;
site-3 is scored with the global model alone."""

import pytest
import torch

from fairfl.methods.fedala.controller import FedALAController
from fairfl.methods.fedala.protocol import PREVIOUS_WEIGHTS_FILE, WEIGHTS_FILE

import helpers

pytestmark = pytest.mark.slow
FAST = {"fedala_window": 2, "fedala_max_passes": 3}


def test_fedala_scores_each_site_with_its_adaptive_start_and_a_held_out_site_with_the_global_model(tmp_path, cache_dir):
    results, state_root, global_state = helpers.held_out_personal_run("fedala", tmp_path, **FAST)
    sites = ["site-1", "site-2"]
    assert results["config"]["fedala_layers"] == 2 and results["config"]["fedala_max_passes"] == 3
    first, second = results["rounds"]
    for s in sites:
        assert first["train"][s]["fedala_passes"] == 0.0  # round 0: no local model, FedAvg's start
        assert second["train"][s]["fedala_passes"] in (2.0, 3.0)  # round 1: the start phase
        assert 0.0 <= second["train"][s]["fedala_weight_mean"] <= 1.0
        assert all(0 <= record["per_site"][s]["fedala_weight_mean"] <= 1 for record in (first, second))
    meta = helpers.unit_meta(
        FedALAController(**{k: results["config"][k] for k in ("model_channels", "model_strides")}, **FAST)
    )
    assert not (state_root / "site-3" / "trial" / WEIGHTS_FILE).exists()
    for s in sites:
        state_dir = state_root / s / "trial"
        assert torch.load(state_dir / WEIGHTS_FILE)["round"] == 1 and not (state_dir / PREVIOUS_WEIGHTS_FILE).exists()
        # the final evaluation again, of round 1: theta_hat from the kept local model and W, as round 2 would start
        scores, final = helpers.rescored_final(results, meta, global_state, state_dir, s)
        assert final["fedala_weight_mean"] == pytest.approx(scores["fedala_weight_mean"], abs=1e-9)
