"""Integration: a tiny FedAvg job with DP-SGD (`dp_epsilon` 8) and NVFlare's exclude-variables filter
(`privacy_filter`) through NVFlare's real simulator: every site states in results.json, round by round, the epsilon it
has spent, which is the accountant's for its own sampling rate and steps, and within the budget at the last round; the
report lists it. The filter runs on the private update in the site's process: the block it keeps at the sites is the
round-0 model's to the bit in the final global model, every other trained tensor moved (sites send differences, which
the server adds back to what it sent)."""

import math
import os

import pytest
import torch

from fairfl.models import initial_state
from fairfl.privacy.accountant import epsilon_spent, noise_multiplier
from fairfl.report.document import make_report

from helpers import make_job
from simulator_runs import load_results, run

pytestmark = pytest.mark.slow
BATCH, EPSILON, DELTA = 8, 8.0, 1e-5
KEPT_AT_SITES = {"name": "exclude_vars", "exclude_vars": r"^model\.0\."}  # the U-Net's first block


def test_a_private_filtered_fedavg_run_records_each_site_s_budget_and_keeps_the_filtered_block(tmp_path, cache_dir):
    job = make_job(
        "fedavg", str(tmp_path / "job"), {"dp_epsilon": EPSILON}, {"batch_size": BATCH, "privacy_filter": KEPT_AT_SITES}
    )
    sim = run(job, str(tmp_path / "ws"), n=2, t=2)
    results = load_results(sim)
    assert all(not record.get("rejected") for record in results["rounds"])
    check_the_filtered_block_stayed(results, os.path.join(os.path.dirname(sim.results_path), "global_model.pt"))
    assert results["config"]["dp_epsilon"] == EPSILON and results["config"]["dp_delta"] == DELTA
    rounds = results["config"]["num_rounds"]
    for site in ("site-1", "site-2"):
        stated = [record["train"][site] for record in results["rounds"]]
        rate = stated[0]["dp_sample_rate"]
        items = round(BATCH / rate)  # q = batch / N
        assert rate == pytest.approx(BATCH / items) and "train_loss" not in stated[0]
        steps = math.ceil(items / BATCH)  # one local epoch
        sigma = noise_multiplier(EPSILON, DELTA, rate, rounds * steps)
        for r, metrics in enumerate(stated):
            assert metrics["dp_noise_multiplier"] == pytest.approx(sigma)
            assert metrics["dp_epsilon"] == pytest.approx(epsilon_spent(sigma, rate, (r + 1) * steps, DELTA))
        assert stated[0]["dp_epsilon"] < stated[-1]["dp_epsilon"] <= EPSILON
    made = make_report([sim.results_path], tmp_path / "report")
    section = made["report"].read_text().split("## Differential privacy")[1].split("\n## ")[0]
    assert len(made["privacy"]) == 1
    stated = next(iter(made["privacy"].values()))
    for site in ("site-1", "site-2"):
        epsilon = results["rounds"][-1]["train"][site]["dp_epsilon"]
        assert stated[site]["epsilon"] == epsilon and f"| {site} | {epsilon:.3g} of 8 | 1e-05 | 1 |" in section


def check_the_filtered_block_stayed(results, global_model_path):
    final = torch.load(global_model_path, weights_only=True)
    config = results["config"]
    spec = {"name": "unet", "in_channels": 1, "num_classes": 2}
    start = initial_state(
        {**spec, "channels": config["model_channels"], "strides": config["model_strides"]}, config["seed"]
    )
    assert {k: tuple(v.shape) for k, v in final.items()} == {k: tuple(v.shape) for k, v in start.items()}
    kept = [k for k in final if k.startswith("model.0.")]
    assert kept
    for key, value in final.items():
        unchanged = torch.equal(value, torch.as_tensor(start[key]))
        if key in kept:  # never left the sites: the server's round-0 values
            assert unchanged, key
        elif value.is_floating_point():  # trained, noised, sent and added back
            assert not unchanged, key
