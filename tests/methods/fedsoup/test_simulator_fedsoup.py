"""FedSoup through NVFlare's real simulator (jobs/fedsoup, tiny: 3 sites, 2 rounds, the soup from round 1 at the
job's fedsoup_start 0.75), a named run holding out site-3: each training site keeps no soup in round 0 and is scored
with its local model; in round 1 it offers the global model to its soup (kept in its state dir) and reports it with its
training metrics and its scores, and its final score is the score of its local model patched with its soup,
re-computed in-process from the run's kept local model, soup and final global model; site-3 is scored with the global
model alone."""

import json
import os

import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask
from fairfl.methods.fedsoup.controller import FedSoupController
from fairfl.methods.fedsoup.protocol import PREVIOUS_SOUP_FILE, SOUP_FILE
from fairfl.models import state_to_numpy
from fairfl.simulate import run_simulator

from helpers import make_job, segmentation_task_meta

pytestmark = pytest.mark.slow


def test_fedsoup_scores_each_site_with_its_patched_model_and_a_held_out_site_with_the_global_model(tmp_path, cache_dir):
    state_root = tmp_path / "state"
    job = make_job("fedsoup", str(tmp_path / "job"), {"run_name": "trial", "exclude_sites": ["site-3"]})
    sim = run_simulator(job, str(tmp_path / "ws"), 3, 3, env={"FAIRFL_STATE_ROOT": str(state_root)}, timeout=600)
    assert sim.ok, sim.describe_failure()
    with open(sim.results_path) as f:  # strict JSON: a bare NaN fails
        results = json.load(f, parse_constant=lambda c: pytest.fail(f"bare {c} in {sim.results_path}"))
    assert results["method"] == "fedsoup" and results["held_out_sites"] == ["site-3"]
    assert [r["round"] for r in results["rounds"]] == [0, 1] and results["config"]["fedsoup_start"] == 0.75
    assert all(0.0 <= m["dice"] <= 1.0 for m in results["final"]["per_site"].values())
    sites = ["site-1", "site-2"]
    first, second = results["rounds"]
    for s in sites:
        assert first["train"][s]["fedsoup_soup_size"] == 0.0 and "fedsoup_added" not in first["train"][s]
        trained = second["train"][s]
        assert trained["fedsoup_added"] in (0.0, 1.0) and trained["fedsoup_scored"] == 1.0
        assert trained["fedsoup_soup_size"] == trained["fedsoup_added"]  # round 1 is the soup's first
        assert set(first["weights"]) == set(second["weights"]) == set(sites)
        assert first["per_site"][s]["fedsoup_local_share"] == 1.0  # before the soup: the local model alone
        assert second["per_site"][s]["fedsoup_local_share"] == 1.0 / (1.0 + trained["fedsoup_soup_size"])
        for record in (first, second):
            assert record["per_site"][s]["personal_model"] == 1.0 and "global_dice" in record["per_site"][s]
        assert set(first["per_site"]["site-3"]) <= {"dice", "dice_se"}  # the global model alone
    global_state = state_to_numpy(torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt")))
    controller = FedSoupController(
        **{k: results["config"][k] for k in ("model_channels", "model_strides", "num_rounds")}
    )
    meta = {
        **segmentation_task_meta(controller.model_spec()),
        **controller.site_meta(),
        protocol.EVALUATE: protocol.FROM_PERSONAL,
    }
    assert not (state_root / "site-3" / "trial" / SOUP_FILE).exists()
    for s in sites:
        state_dir = state_root / s / "trial"
        saved = torch.load(state_dir / SOUP_FILE)
        assert saved["round"] == 1 and not (state_dir / PREVIOUS_SOUP_FILE).exists()
        assert saved["ingredients"] == ([1] if second["train"][s]["fedsoup_added"] else [])
        # the final evaluation again, of round 1: the kept local model patched with the kept soup
        task = SiteTask.of(s, FLModel(params_type=ParamsType.FULL, params=global_state, current_round=1, meta=meta))
        scores = FairflExecutor(image_size=32, batch_size=8, synthetic_size_scale=0.5)._validate(task, str(state_dir))
        final = results["final"]["per_site"][s]
        assert final["dice"] == pytest.approx(scores.metrics["dice"], abs=1e-6)
        assert final["fedsoup_local_share"] == scores.metrics["fedsoup_local_share"]
