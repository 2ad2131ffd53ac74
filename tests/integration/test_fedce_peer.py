"""The FedCE peer benchmark's NVFlare side (benchmarks/fedce_peer.py, benchmarks/nvflare_fedce_client.py)."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import fedce_peer  # noqa: E402

from fairfl.models import build_model  # noqa: E402


def test_unet_config_rebuilds_the_fairfl_unet():
    """FedCERecipe's dict model config builds the same network as fairfl.models.build_model."""
    from nvflare.fuel.utils.class_utils import instantiate_class

    model = build_model({"channels": [8, 16, 32], "strides": [2, 2]})
    config = fedce_peer.unet_config(model)
    rebuilt = instantiate_class(config["class_path"], config["args"])
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    rebuilt.load_state_dict(model.state_dict())
    x = torch.randn(2, 1, 32, 32)
    assert torch.equal(rebuilt.eval()(x), model.eval()(x))


@pytest.mark.slow
def test_nvflare_side_runs_and_records_weights(tmp_path, cache_dir):
    """FedCERecipe + SimEnv on tiny settings: every round's weights recorded, final Dice from every site."""
    fedce_peer.main(
        [
            "--rounds",
            "2",
            "--seeds",
            "0",
            "--sites",
            "2",
            "--channels",
            "8",
            "16",
            "32",
            "--strides",
            "2",
            "2",
            "--image-size",
            "32",
            "--size-scale",
            "0.5",
            "--sides",
            "nvflare",
            "--out",
            str(tmp_path),
        ]
    )
    info = json.loads((tmp_path / "runs" / "nvflare-seed0.json").read_text())
    results = json.loads(Path(info["results"]).read_text())
    assert [r["round"] for r in results["rounds"]] == [0, 1]
    for record in results["rounds"]:
        assert set(record["weights"]) == {"site-1", "site-2"}
        assert sum(record["weights"].values()) == pytest.approx(1.0)
    assert results["final"]["contributions"] == results["rounds"][-1]["weights"]
    assert all(0.0 <= v["dice"] <= 1.0 for v in results["final"]["per_site"].values())
    # the sites received round 0's weights in round 1 and sent the error of their leave-one-out models
    loo = results["rounds"][1]["leave_one_out"]
    assert {s: v["weight_received"] for s, v in loo.items()} == pytest.approx(results["rounds"][0]["weights"])
    assert all(0.0 <= v["dice"] <= 1.0 and v["score_sent"] == pytest.approx(1 - v["dice"] / 2) for v in loo.values())
