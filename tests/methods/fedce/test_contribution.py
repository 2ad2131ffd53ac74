"""FedCE's contribution terms (Eq. 2-5) and the leave-one-out model, on small inputs computed by hand."""

import json
import math

import numpy as np
import pytest
import torch

from fairfl.aggregation import normalise
from fairfl.methods.fedce.client import leave_one_out_model
from fairfl.methods.fedce.contribution import (
    ContributionState,
    combine,
    flatten,
    gradient_terms,
    leave_one_out_error,
)
from fairfl.models import build_model, initial_state, state_to_torch

from helpers import screened

TINY = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [4, 8], "strides": [2]}


def vec(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_gradient_term_is_one_minus_cosine_with_the_weighted_others():
    updates = {"a": vec(1, 0), "b": vec(0, 1), "c": vec(1, 1)}
    prior = {"a": 0.5, "b": 0.25, "c": 0.25}
    terms = gradient_terms(updates, prior)
    # a: others = 0.25*(0,1) + 0.25*(1,1) = (0.25, 0.5); cos((1,0), .) = 0.25 / sqrt(0.3125)
    assert terms["a"] == pytest.approx(1 - 0.25 / math.sqrt(0.3125))
    # b: others = 0.5*(1,0) + 0.25*(1,1) = (0.75, 0.25); cos((0,1), .) = 0.25 / sqrt(0.625)
    assert terms["b"] == pytest.approx(1 - 0.25 / math.sqrt(0.625))
    # c: others = (0.5, 0.25); cos((1,1), .) = 0.75 / (sqrt(2) sqrt(0.3125))
    assert terms["c"] == pytest.approx(1 - 0.75 / (math.sqrt(2) * math.sqrt(0.3125)))


def test_gradient_term_renormalises_the_prior_over_the_sites_present():
    updates = {"a": vec(1, 0), "b": vec(0, 1)}
    assert gradient_terms(updates, {"a": 0.2, "b": 0.2}) == gradient_terms(updates, {"a": 0.5, "b": 0.5})
    assert gradient_terms(updates, {"a": 0.5, "b": 0.5}) == pytest.approx({"a": 1.0, "b": 1.0})  # orthogonal


def test_gradient_term_zero_update_single_site_and_identical_sites():
    terms = gradient_terms({"a": vec(0, 0), "b": vec(1, 2), "c": vec(2, 1)}, {"a": 1, "b": 1, "c": 1})
    assert terms["a"] == 0.0  # no update: no new direction
    assert all(math.isfinite(v) for v in terms.values())
    assert gradient_terms({"only": vec(3, 4)}, {"only": 1.0}) == {"only": 1.0}  # nothing else to compare with
    same = gradient_terms({s: vec(1, 2, 3) for s in "abc"}, {s: 1 for s in "abc"})
    assert same == pytest.approx({s: 0.0 for s in "abc"}, abs=1e-12)
    assert normalise(same) == pytest.approx({s: 1 / 3 for s in "abc"})  # identical sites: equal shares


def test_opposed_update_gets_the_largest_term():
    terms = gradient_terms({"a": vec(1, 0), "b": vec(1, 0.1), "odd": vec(-1, 0)}, {"a": 1, "b": 1, "odd": 1})
    assert terms["odd"] > 1.5 and max(terms, key=terms.get) == "odd"


def test_normalise_and_combine():
    assert normalise({"a": 1.0, "b": 3.0}) == {"a": 0.25, "b": 0.75}
    assert normalise({"a": 0.0, "b": 0.0}) == {"a": 0.5, "b": 0.5}
    with pytest.raises(ValueError, match="finite"):
        normalise({"a": float("nan"), "b": 1.0})
    with pytest.raises(ValueError):
        normalise({"a": -0.1, "b": 1.0})
    g, d = {"a": 0.25, "b": 0.75}, {"a": 0.5, "b": 0.5}
    assert combine(g, d, "sum") == {"a": 0.75, "b": 1.25}
    assert combine(g, d, "product") == {"a": 0.125, "b": 0.375}
    with pytest.raises(ValueError, match="combine"):
        combine(g, d, "max")
    with pytest.raises(ValueError, match="data terms"):
        combine(g, {"a": 1.0}, "sum")


def test_leave_one_out_error():
    assert leave_one_out_error(0.8) == pytest.approx(0.2)
    assert leave_one_out_error(1.0) == 0.0
    for bad in (float("nan"), 1.5, -0.2):
        with pytest.raises(ValueError):
            leave_one_out_error(bad)


def test_accumulation_over_rounds_follows_eq5():
    state = ContributionState(mode="sum")
    r1 = state.update({"a": 1.0, "b": 3.0}, {"a": 0.2, "b": 0.2})
    assert r1["a"] == {"gradient": 0.25, "data": 0.5, "combined": 0.75}
    assert state.contributions() == pytest.approx({"a": 0.75 / 2, "b": 1.25 / 2})
    state.update({"a": 1.0, "b": 1.0}, {"a": 0.3, "b": 0.1})  # round 2: gradient 0.5/0.5, data 0.75/0.25
    assert state.accumulated == pytest.approx({"a": 0.75 + 1.25, "b": 1.25 + 0.75})
    assert state.contributions() == pytest.approx({"a": 0.5, "b": 0.5})
    assert state.rounds == 2
    shares = state.term_shares()
    assert shares["a"] == pytest.approx({"gradient": 0.375, "data": 0.625})
    assert shares["b"] == pytest.approx({"gradient": 0.625, "data": 0.375})
    # a site absent this round keeps its sum; the aggregation weights renormalise over those present
    state.update({"a": 1.0, "c": 1.0}, {"a": 1.0, "c": 1.0})
    assert state.accumulated["b"] == pytest.approx(2.0)
    assert state.aggregation_weights(["a", "c"]) == pytest.approx({"a": 3.0 / 4.0, "c": 1.0 / 4.0})
    assert sum(state.contributions().values()) == pytest.approx(1.0)


def test_product_mode_and_state_round_trip():
    state = ContributionState(mode="product")
    terms = state.update({"a": 1.0, "b": 3.0}, {"a": 0.3, "b": 0.1})
    assert terms["a"]["combined"] == pytest.approx(0.25 * 0.75)
    assert terms["b"]["combined"] == pytest.approx(0.75 * 0.25)
    state.weights = {"a": 0.5, "b": 0.5}
    restored = ContributionState.from_dict(state.to_dict())
    assert restored == state
    assert restored.update({"a": 2.0, "b": 1.0}, {"a": 0.5, "b": 0.5}) == state.update(
        {"a": 2.0, "b": 1.0}, {"a": 0.5, "b": 0.5}
    )


def test_flatten_orders_by_the_names_given():
    state = {"x": torch.ones(2, 2), "y": torch.zeros(3, dtype=torch.float32)}
    assert flatten(state, ["y", "x"]).tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert flatten(state, ["x"]).dtype == torch.float64


def test_leave_one_out_model_removes_the_sites_share():
    global_params = initial_state(TINY, seed=0)
    previous = state_to_torch(initial_state(TINY, seed=1))
    weight = 0.3
    model = leave_one_out_model(TINY, global_params, previous, weight)
    for name, value in model.state_dict().items():
        expected = (torch.as_tensor(global_params[name]) - weight * previous[name]) / (1 - weight)
        if value.is_floating_point():
            np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    # check by re-aggregation: (1 - p) w^-i + p w_i = w
    rebuilt = {n: (1 - weight) * v + weight * previous[n] for n, v in model.state_dict().items()}
    for name, value in rebuilt.items():
        np.testing.assert_allclose(value.numpy(), global_params[name], rtol=1e-4, atol=1e-5)


def test_leave_one_out_model_when_the_site_is_none_or_all_of_the_global_model():
    global_params = initial_state(TINY, seed=0)
    absent = leave_one_out_model(TINY, global_params, {}, 0.0)
    for name, value in absent.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), global_params[name])
    assert leave_one_out_model(TINY, global_params, state_to_torch(initial_state(TINY, seed=1)), 1.0) is None
    assert isinstance(absent, type(build_model(TINY)))


def fake_round(global_state, seed, errors):
    """SiteUpdates as the FedCE controller receives them: a trained model per site and its LOO error."""
    from fairfl.flare.engine import SiteUpdate
    from fairfl.models import state_to_torch

    generator = torch.Generator().manual_seed(seed)
    updates = {}
    for i, site in enumerate(sorted(errors)):
        state = {
            k: v + 0.01 * (i + 1) * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in state_to_torch(global_state).items()
        }
        meta = {} if errors[site] is None else {"loo_error": errors[site]}
        updates[site] = SiteUpdate(state, 10 + i, meta)
    return updates


def test_fedce_controller_state_on_disk_gives_the_same_next_round_as_staying_up():
    from fairfl.methods.fedce.controller import FedCEController

    def controller():
        c = FedCEController(combine="sum", model_channels=[4, 8], model_strides=[2])
        c.trainers = ["site-1", "site-2", "site-3"]
        return c

    errors = {"site-1": 0.3, "site-2": 0.5, "site-3": 0.2}
    state0 = initial_state(controller().model_spec(), seed=0)
    up = controller()
    state1, extras0 = up.aggregate(0, state0, fake_round(state0, 0, errors), {})
    assert "contributions" not in extras0 and up.train_meta(1)["loo_weights"] == extras0["weights"]
    state2, _ = up.aggregate(1, state1, fake_round(state1, 1, errors), {})
    saved = json.loads(json.dumps(up.method_state()))  # what method_state.json holds after round 1

    restarted = controller()
    restarted.load_method_state(saved)
    assert restarted.train_meta(2) == up.train_meta(2)
    updates = fake_round(state2, 2, errors)
    new_up, extras_up = up.aggregate(2, state2, updates, {})
    new_restarted, extras_restarted = restarted.aggregate(2, state2, updates, {})
    assert extras_restarted["weights"] == extras_up["weights"]
    assert extras_restarted["contributions"] == extras_up["contributions"]
    for name in new_up:
        np.testing.assert_array_equal(new_up[name], new_restarted[name])


def test_fedce_controller_rejects_a_site_without_a_leave_one_out_error():
    from fairfl.methods.fedce.controller import FedCEController

    c = FedCEController(model_channels=[4, 8], model_strides=[2])
    c.trainers = ["site-1", "site-2", "site-3"]
    state0 = initial_state(c.model_spec(), seed=0)
    state1, _ = c.aggregate(0, state0, fake_round(state0, 0, {"site-1": None, "site-2": None, "site-3": None}), {})
    rejected = {}
    updates = screened(c, 1, fake_round(state1, 1, {"site-1": 0.4, "site-2": None, "site-3": 0.1}), rejected)
    _, extras = c.aggregate(1, state1, updates, rejected)
    assert set(rejected) == {"site-2"} and "no loo_error" in rejected["site-2"]
    assert set(extras["weights"]) == {"site-1", "site-3"} and c.contribution.weights["site-2"] == 0.0
    assert sum(extras["contributions"].values()) == pytest.approx(1.0)


def test_identical_updates_give_gradient_terms_of_zero_never_below():
    # parallel updates (identical data or training): 1 - cos rounded to -2e-16 ended the job in normalise
    update = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float32) * 1e-3  # -1.2e-7
    terms = gradient_terms({s: update.clone() for s in ("a", "b", "c")}, {"a": 1.0, "b": 1.0, "c": 1.0})
    assert all(0.0 <= t <= 1e-6 for t in terms.values()), terms
    assert sum(normalise(terms).values()) == pytest.approx(1.0)
