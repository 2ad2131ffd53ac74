"""Integration: a job's NVFlare privacy filter (`privacy_filter`) on what the sites' training sends, through NVFlare's
real simulator: the sites send differences, the filter runs on them in the site's process, the server adds what
arrives back to the model it sent."""

import os

import pytest
import torch

from fairfl.models import initial_state

from helpers import make_job
from simulator_runs import load_results, run

pytestmark = pytest.mark.slow
EXCLUDED = r"^model\.0\."  # the U-Net's first block: these tensors never leave a site


def test_tensors_a_filter_keeps_on_the_sites_stay_as_the_server_began_them(tmp_path, cache_dir):
    job = make_job(
        "fedavg",
        str(tmp_path / "job"),
        server={"num_rounds": 2, "eval_every": 2},
        client={"privacy_filter": {"name": "exclude_vars", "exclude_vars": EXCLUDED}},
    )
    sim = run(job, str(tmp_path / "ws"), n=2, t=2)
    results = load_results(sim)
    assert all(not record.get("rejected") for record in results["rounds"])
    assert set(results["final"]["per_site"]) == {"site-1", "site-2"}
    final = torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt"), weights_only=True)
    config = results["config"]
    spec = {
        "name": "unet",
        "in_channels": 1,
        "num_classes": 2,
        "channels": config["model_channels"],
        "strides": config["model_strides"],
    }
    start = initial_state(spec, config["seed"])
    assert {k: tuple(v.shape) for k, v in final.items()} == {k: tuple(v.shape) for k, v in start.items()}
    excluded = [k for k in final if k.startswith("model.0.")]
    assert excluded
    for key, value in final.items():
        unchanged = torch.equal(value, torch.as_tensor(start[key]))
        if key in excluded:  # the round-0 model's to the bit
            assert unchanged, key
        elif value.is_floating_point():  # every other trained tensor moved
            assert not unchanged, key
