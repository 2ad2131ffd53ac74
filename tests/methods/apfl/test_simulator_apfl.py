"""APFL through NVFlare's real simulator (jobs/apfl, tiny: 3 sites, 2 rounds), a named run holding out site-3: each
training site reports the alpha it learned, with its training metrics and its scores, and its final score is the
score of its mix, re-computed in-process from the run's kept personal models and final global model; site-3 is
scored with the global model alone."""

import json
import os

import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask
from fairfl.methods.apfl.controller import APFLController
from fairfl.methods.apfl.protocol import APFL_ALPHA_INIT, PERSONAL_MODEL_FILE, PREVIOUS_PERSONAL_MODEL_FILE
from fairfl.models import state_to_numpy
from fairfl.simulate import run_simulator

from helpers import make_job, segmentation_task_meta

pytestmark = pytest.mark.slow


def test_apfl_scores_each_site_with_its_learned_mix_and_a_held_out_site_with_the_global_model(tmp_path, cache_dir):
    state_root = tmp_path / "state"
    job = make_job("apfl", str(tmp_path / "job"), {"run_name": "trial", "exclude_sites": ["site-3"]})
    sim = run_simulator(job, str(tmp_path / "ws"), 3, 3, env={"FAIRFL_STATE_ROOT": str(state_root)}, timeout=600)
    assert sim.ok, sim.describe_failure()
    with open(sim.results_path) as f:  # strict JSON: a bare NaN fails
        results = json.load(f, parse_constant=lambda c: pytest.fail(f"bare {c} in {sim.results_path}"))
    assert results["method"] == "apfl" and results["held_out_sites"] == ["site-3"]
    assert [r["round"] for r in results["rounds"]] == [0, 1]
    assert all(0.0 <= m["dice"] <= 1.0 for m in results["final"]["per_site"].values())
    sites = ["site-1", "site-2"]
    assert results["config"]["apfl_alpha_init"] == 0.5 and results["config"]["apfl_alpha_lr"] is None
    for record in results["rounds"]:
        assert set(record["weights"]) == set(sites)
        for s in sites:
            learned = record["train"][s]["apfl_alpha"]
            assert 0.0 <= learned <= 1.0 and record["per_site"][s]["apfl_alpha"] == learned  # scored with that alpha
            assert record["per_site"][s]["personal_model"] == 1.0 and "global_dice" in record["per_site"][s]
        assert set(record["per_site"]["site-3"]) <= {"dice", "dice_se"}  # the global model alone
    global_state = state_to_numpy(torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt")))
    spec = APFLController(**{k: results["config"][k] for k in ("model_channels", "model_strides")}).model_spec()
    meta = {**segmentation_task_meta(spec), protocol.EVALUATE: protocol.FROM_PERSONAL, APFL_ALPHA_INIT: 0.5}
    assert not (state_root / "site-3" / "trial" / PERSONAL_MODEL_FILE).exists()
    for s in sites:
        state_dir = state_root / s / "trial"
        kept = torch.load(state_dir / PERSONAL_MODEL_FILE)
        assert kept["round"] == 1 and torch.load(state_dir / PREVIOUS_PERSONAL_MODEL_FILE)["round"] == 0
        task = SiteTask.of(s, FLModel(params_type=ParamsType.FULL, params=global_state, meta=meta))
        scores = FairflExecutor(image_size=32, batch_size=8, synthetic_size_scale=0.5)._validate(task, str(state_dir))
        final = results["final"]["per_site"][s]
        assert final["dice"] == pytest.approx(scores.metrics["dice"], abs=1e-6)
        assert final["apfl_alpha"] == scores.metrics["apfl_alpha"] == kept["alpha"]
