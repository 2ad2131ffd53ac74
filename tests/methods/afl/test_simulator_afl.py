"""AFL through NVFlare's real simulator (jobs/afl, tiny: 3 sites, 2 rounds), one site claiming a loss of 1e5 in every
round (below the screen's 1e6, so it is read): every site measures the loss of the model it was sent before training,
the liar's counts as afl_loss_cap medians, its weight stays within its bound, each round's weights are the minimax
step of the round before, and the mixture is written to method_state.json."""

import json
import os

import pytest
from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

from fairfl.methods.afl.minimax import minimax_round, uniform_mixture
from fairfl.simulate import run_simulator

from helpers import make_job

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))  # loss_liar.py
LIAR = "loss_liar.ClaimedLoss"
SITES = ["site-1", "site-2", "site-3"]


def test_a_short_afl_run_steps_lambda_on_the_measured_losses_and_caps_a_site_claiming_a_huge_one(tmp_path, cache_dir):
    liar = {"tasks": ["train"], "filters": [{"path": LIAR, "args": {"site": "site-3", "loss": 1e5}}]}
    job = make_job("afl", str(tmp_path / "job"), client_extra={"task_result_filters": [liar]})
    workspace = tmp_path / "ws"
    (workspace / "local").mkdir(parents=True)  # the sites allow the test's filter, as a hospital lists its own
    (workspace / "local" / "resources.json").write_text(
        json.dumps({"format_version": 2, "class_allow_list": [*DEFAULT_CLASS_ALLOW_LIST, LIAR]})
    )
    python_path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    run = run_simulator(job, str(workspace), 3, 3, env={"PYTHONPATH": python_path}, timeout=600, keep_workspace=True)
    assert run.ok, run.describe_failure()
    with open(run.results_path) as f:  # strict JSON: a bare NaN fails
        results = json.load(f, parse_constant=lambda c: pytest.fail(f"bare {c} in {run.results_path}"))
    assert results["method"] == "afl" and [r["round"] for r in results["rounds"]] == [0, 1]
    config = results["config"]
    alpha, step, cap = config["afl_alpha"], config["afl_step"], config["afl_loss_cap"]
    mixture = uniform_mixture(SITES)
    for record in results["rounds"]:
        assert "rejected" not in record and set(record["weights"]) == set(SITES)
        for site in SITES:  # each site measured the loss of the model it was sent, before it trained
            assert record["train"][site]["probe_seconds"] >= 0.0
        honest = [record["losses"][s] for s in ("site-1", "site-2")]
        assert all(0.0 < loss < 10.0 for loss in honest) and record["losses"]["site-3"] == 1e5
        assert record["capped_losses"] == ["site-3"] and record["loss_signal"]["site-3"] == cap
        # the round's weights: the minimax step from the mixture the previous round left, capped at max_share
        expected = minimax_round(mixture, record["fedavg_weights"], record["losses"], alpha, step, cap)
        assert record["weights"] == pytest.approx(expected.weights)  # 3 sites, none above 0.5 in 2 rounds
        assert record["mixture"] == pytest.approx(expected.mixture)
        fedavg = record["fedavg_weights"]
        assert record["weights"]["site-3"] <= (1 - alpha) * fedavg["site-3"] + alpha
        assert all(record["weights"][s] >= (1 - alpha) * fedavg[s] for s in SITES)
        mixture = record["mixture"]
    first, second = (r["weights"]["site-3"] for r in results["rounds"])
    assert first < second <= first + step * cap  # the liar gains, no faster than the capped step allows
    assert results["final"]["mixture"] == pytest.approx(mixture)
    assert all(0.0 <= m["dice"] <= 1.0 for m in results["final"]["per_site"].values())
    with open(os.path.join(os.path.dirname(run.results_path), "method_state.json")) as f:
        state = json.load(f)
    assert state["method"] == "afl" and state["round"] == 1 and state["state"]["mixture"] == pytest.approx(mixture)
