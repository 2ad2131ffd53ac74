"""Integration: a hospital's own model and data through NVFlare's real simulator. Fed-LWR (the method with a site
task of its own: CKA per layer) trains MONAI's SegResNet on the built-in 3-D volumes, patches in training and whole
volumes scored by sliding window; the repository's tiny MONAI bundle runs as a FedAvg job. Every other method on
networks it was not written for runs in one process in tests/core/test_any_network_federation.py."""

import math
import os

import pytest
import torch

from fairfl.bundle import read_bundle
from fairfl.models import build_model

from helpers import REPO, make_job
from simulator_runs import check_common, load_results, run

pytestmark = pytest.mark.slow
TINY_BUNDLE = os.path.join(REPO, "tests", "fixtures", "tiny_bundle")


def test_fedlwr_trains_a_3d_segresnet_on_volumes(tmp_path, cache_dir):
    server = {
        "dataset": "prostate3d",
        "model": "SegResNet",
        "model_args": {
            "init_filters": 4,
            "norm": ["group", {"num_groups": 2}],
            "blocks_down": [1, 1],
            "blocks_up": [1],
        },
        "num_rounds": 1,
        "cka_max_samples": 8,
        "cka_batch_size": 4,
        "cka_max_positions": 256,
    }
    client = {"patch_size": [16, 16, 16], "batch_size": 2, "synthetic_size_scale": 0.1}
    job = make_job("fedlwr", str(tmp_path / "job"), server=server, client=client)
    results = load_results(run(job, str(tmp_path / "ws"), n=2, t=2))
    sites = ("site-1", "site-2")
    check_common(results, "fedlwr", sites, rounds=1)
    record = results["rounds"][-1]
    assert set(record["cka"]) == set(sites) and "rejected" not in record
    model = build_model(
        {"name": "SegResNet", "in_channels": 1, "num_classes": 2, "spatial_dims": 3, "args": server["model_args"]}
    )
    weighted = {name for per_site in record["cka"].values() for name in per_site}
    assert weighted <= {name for name, _ in model.named_modules()} and len(weighted) > 5  # per module, by name
    for site, metrics in results["final"]["per_site"].items():
        assert 0 <= metrics["dice"] <= 1 and 0 <= metrics["surface_dice"] <= 1, (site, metrics)
        assert math.isfinite(metrics["hd95"]) and metrics["hd95"] >= 0, (site, metrics)


def test_a_monai_bundle_runs_as_a_job(tmp_path, cache_dir):
    job = make_job("fedavg", str(tmp_path / "job"), server={"bundle": TINY_BUNDLE, "num_rounds": 1})
    sim = run(job, str(tmp_path / "ws"), n=2, t=2)
    results = load_results(sim)
    check_common(results, "fedavg", ("site-1", "site-2"), rounds=1)
    assert results["config"]["bundle"] == TINY_BUNDLE
    trained = torch.load(os.path.join(os.path.dirname(sim.results_path), "global_model.pt"), weights_only=True)
    bundle = build_model(read_bundle(TINY_BUNDLE).network).state_dict()
    assert {k: v.shape for k, v in trained.items()} == {k: v.shape for k, v in bundle.items()}  # the bundle's network
