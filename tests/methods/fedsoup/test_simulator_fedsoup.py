"""FedSoup through NVFlare's real simulator (jobs/fedsoup, tiny: 3 sites, 2 rounds, the soup from round 1 at the
job's fedsoup_start 0.75), a named run holding out site-3: each training site keeps no soup in round 0 and is scored
with its local model; in round 1 it offers the global model to its soup (kept in its state dir) and reports it with its
training metrics and its scores, and its final score is the score of its local model patched with its soup,
re-computed in-process from the run's kept local model, soup and final global model; site-3 is scored with the global
model alone."""

import pytest
import torch

from fairfl.methods.fedsoup.controller import FedSoupController
from fairfl.methods.fedsoup.protocol import PREVIOUS_SOUP_FILE, SOUP_FILE

import helpers

pytestmark = pytest.mark.slow


def test_fedsoup_scores_each_site_with_its_patched_model_and_a_held_out_site_with_the_global_model(tmp_path, cache_dir):
    results, state_root, global_state = helpers.held_out_personal_run("fedsoup", tmp_path)
    assert results["config"]["fedsoup_start"] == 0.75
    sites = ["site-1", "site-2"]
    first, second = results["rounds"]
    for s in sites:
        assert first["train"][s]["fedsoup_soup_size"] == 0.0 and "fedsoup_added" not in first["train"][s]
        trained = second["train"][s]
        assert trained["fedsoup_added"] in (0.0, 1.0) and trained["fedsoup_scored"] == 1.0
        assert trained["fedsoup_soup_size"] == trained["fedsoup_added"]  # round 1 is the soup's first
        assert first["per_site"][s]["fedsoup_local_share"] == 1.0  # before the soup: the local model alone
        assert second["per_site"][s]["fedsoup_local_share"] == 1.0 / (1.0 + trained["fedsoup_soup_size"])
    meta = helpers.unit_meta(
        FedSoupController(**{k: results["config"][k] for k in ("model_channels", "model_strides", "num_rounds")})
    )
    assert not (state_root / "site-3" / "trial" / SOUP_FILE).exists()
    for s in sites:
        state_dir = state_root / s / "trial"
        saved = torch.load(state_dir / SOUP_FILE)
        assert saved["round"] == 1 and not (state_dir / PREVIOUS_SOUP_FILE).exists()
        assert saved["ingredients"] == ([1] if second["train"][s]["fedsoup_added"] else [])
        # the final evaluation again, of round 1: the kept local model patched with the kept soup
        scores, final = helpers.rescored_final(results, meta, global_state, state_dir, s)
        assert final["fedsoup_local_share"] == scores["fedsoup_local_share"]
