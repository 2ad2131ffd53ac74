"""The plain checks of a site's answer (fairfl.site_checks: numbers, sample counts, metrics and their names
against MLflow's own rule, tensors, update norms) and the server's bounds on a site's influence (cap_shares,
robust_average, robust aggregation as a controller's setting)."""

import numpy as np
import pytest
import torch

from fairfl.aggregation import cap_shares, robust_average
from fairfl.flare.engine import FairRoundController
from fairfl.methods.qfedavg.controller import QFedAvgController
from fairfl.models import initial_state
from fairfl.site_checks import metrics_problem, norm_outliers, number_problem, samples_problem, tensor_state

from site_answers import SEG, hostile, huge_update, make, train_round


def test_number_samples_and_metrics_problems():
    assert number_problem(np.float32(0.5), "x") is None and number_problem(np.int64(3), "x") is None
    for bad in (None, True, np.bool_(True), "0.5", float("nan"), float("inf"), -1.0, [0.5], {"v": 0.5}):
        assert number_problem(bad, "x") is not None
    assert samples_problem(10, None, 100) is None and samples_problem(np.int64(10), 20, 100) is None
    assert "first round" in samples_problem(30, 20, 100) and "max_samples" in samples_problem(101, None, 100)
    assert metrics_problem(None) is None and metrics_problem({"a": 1.0, "b": 2}) is None
    assert "x" * 80 not in metrics_problem({"m": "x" * 10_000})  # a reason stays short
    state, problem = tensor_state({"w": np.zeros(3, dtype=object)})
    assert state is None or problem is None  # an object array of numbers may convert; strings never do
    assert tensor_state({"w": np.array(["a"])})[1] and tensor_state([1, 2])[1] and tensor_state({1: np.zeros(1)})[1]


def test_norm_outliers_uses_the_lower_median():
    assert norm_outliers({"a": 1.0, "b": 1e6}, 10) == {"b": norm_outliers({"a": 1.0, "b": 1e6}, 10)["b"]}
    assert norm_outliers({"a": 1.0, "b": 3.0, "c": 9.0}, 10) == {}
    assert norm_outliers({"a": 1.0, "b": 1e6}, 0) == {} and norm_outliers({"a": 0.0, "b": 1.0, "c": 0.0}, 10) == {}


def test_cap_shares():
    assert cap_shares({"a": 0.4, "b": 0.3, "c": 0.3}, 0.5) == {"a": 0.4, "b": 0.3, "c": 0.3}  # below: unchanged
    assert cap_shares({"a": 0.9, "b": 0.1}, 0.5) == {"a": 0.9, "b": 0.1}  # two sites: no majority to protect
    capped = cap_shares({"a": 97.0, "b": 2.0, "c": 1.0}, 0.5)
    assert capped == pytest.approx({"a": 50.0, "b": 100 / 3, "c": 50 / 3})  # total kept, the rest in proportion
    capped = cap_shares({"a": 0.45, "b": 0.45, "c": 0.05, "d": 0.05}, 0.3)
    assert max(capped.values()) <= 0.3 + 1e-12 and sum(capped.values()) == pytest.approx(1.0)
    assert cap_shares({"a": 1.0, "b": 0.0, "c": 0.0}, 0.2) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})


def test_robust_average_resists_one_site():
    honest = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)} for _ in range(4)]
    hostile = {"w": torch.tensor([1e9, -1e9]), "n": torch.tensor(7)}
    states = honest[:2] + [hostile] + honest[2:]
    for mode in ("median", "trimmed_mean"):
        out = robust_average(states, mode, 0.2)
        assert torch.equal(out["w"], torch.tensor([1.0, 2.0])) and int(out["n"]) == 3
    out = robust_average([{"w": torch.tensor([float(v)])} for v in (1, 2, 3, 10)], "median")
    assert float(out["w"]) == 2.5
    out = robust_average([{"w": torch.tensor([float(v)])} for v in (1, 2, 3, 10)], "trimmed_mean", 0.25)
    assert float(out["w"]) == 2.5
    assert (
        float(robust_average([{"w": torch.tensor([float(v)])} for v in (1, 2, 3, 10)], "trimmed_mean", 0.0)["w"]) == 2.5
    )  # floor(0.2 * 4) = 0, but a trimmed mean of 3 or more values drops at least one at each end
    assert float(robust_average([{"w": torch.tensor([float(v)])} for v in (1, 10)], "trimmed_mean")["w"]) == 5.5
    with pytest.raises(ValueError):
        robust_average(states, "mean")


def test_robust_aggregation_is_selectable_and_refused_where_it_has_no_meaning():
    controller = make(robust_aggregation="median")
    state0 = initial_state(controller.model_spec(), 0)
    updates, rejected, _ = train_round(controller, state0, hostile(state0, 2, params=huge_update))
    new, _ = controller.aggregate(0, state0, updates, rejected)
    expected = robust_average([updates[s].state for s in sorted(updates)], "median")
    assert all(np.array_equal(new[k], expected[k].numpy()) for k in new)
    assert controller.config()["robust_aggregation"] == "median"
    with pytest.raises(ValueError, match="robust_aggregation"):
        QFedAvgController(robust_aggregation="median", **SEG)
    for bad in (
        {"robust_aggregation": "mean"},
        {"trim_fraction": 0.5},
        {"max_share": 0},
        {"max_samples": 0},
        {"max_update_ratio": -1},
    ):
        with pytest.raises(ValueError):
            FairRoundController(**SEG, **bad)


def test_every_metric_name_the_server_accepts_is_one_mlflow_accepts_and_the_real_receiver_keeps_every_site():
    # the rule must agree with MLflow's own validator (a name it refuses makes NVFlare's MLflow receiver drop the
    # records of every site after the one that sent it): tried on names built from MLflow's alphabet and the
    # path pieces that normalise differently
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_metric_name

    pieces = ["a", "loss", ".", "..", "/", "//", " ", "-", "_", ":", "x.y", "a/b"]
    rng = np.random.default_rng(0)
    names = {"".join(rng.choice(pieces, size=rng.integers(1, 5))) for _ in range(3000)}
    accepted = 0
    for name in sorted(names):
        ours = metrics_problem({name: 0.5}) is None
        try:
            _validate_metric_name(name)
            theirs = True
        except MlflowException:
            theirs = False
        assert ours <= theirs, f"the server accepts {name!r}, MLflow refuses it"
        accepted += ours
    assert accepted > 100  # the rule is not simply refusing everything
