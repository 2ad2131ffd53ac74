"""APFL through NVFlare's real simulator (jobs/apfl, tiny: 3 sites, 2 rounds), a named run holding out site-3: each
training site reports the alpha it learned, with its training metrics and its scores, and its final score is the
score of its mix, re-computed in-process from the run's kept personal models and final global model; site-3 is
scored with the global model alone."""

import pytest
import torch

from fairfl.methods.apfl.controller import APFLController
from fairfl.methods.apfl.protocol import PERSONAL_MODEL_FILE, PREVIOUS_PERSONAL_MODEL_FILE

import helpers

pytestmark = pytest.mark.slow


def test_apfl_scores_each_site_with_its_learned_mix_and_a_held_out_site_with_the_global_model(tmp_path, cache_dir):
    results, state_root, global_state = helpers.held_out_personal_run("apfl", tmp_path)
    sites = ["site-1", "site-2"]
    assert results["config"]["apfl_alpha_init"] == 0.5 and results["config"]["apfl_alpha_lr"] is None
    for record in results["rounds"]:
        for s in sites:
            learned = record["train"][s]["apfl_alpha"]
            assert 0.0 <= learned <= 1.0 and record["per_site"][s]["apfl_alpha"] == learned  # scored with that alpha
    meta = helpers.unit_meta(APFLController(**{k: results["config"][k] for k in ("model_channels", "model_strides")}))
    assert not (state_root / "site-3" / "trial" / PERSONAL_MODEL_FILE).exists()
    for s in sites:
        state_dir = state_root / s / "trial"
        kept = torch.load(state_dir / PERSONAL_MODEL_FILE)
        assert kept["round"] == 1 and torch.load(state_dir / PREVIOUS_PERSONAL_MODEL_FILE)["round"] == 0
        # the final evaluation again, of round 1: the kept personal model mixed with the final global model
        scores, final = helpers.rescored_final(results, meta, global_state, state_dir, s)
        assert final["apfl_alpha"] == scores["apfl_alpha"] == kept["alpha"]
