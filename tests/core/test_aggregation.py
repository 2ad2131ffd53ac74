"""FedAvg and Fed-LWR aggregation (Eq. 1, 5, 6) and the checks that reject a site's report."""

import copy
import math

import pytest
import torch
from torch import nn

from fairfl.aggregation import weighted_average
from fairfl.methods.fedlwr.cka import parameter_layers
from fairfl.methods.fedlwr.weights import check_cka, layerwise_average, lwr_layer_weights
from fairfl.site_checks import check_site_state

AUTHORS_CLIP = (1e-4, 0.99)


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))


def _states(n=3):
    states = []
    for i in range(n):
        state = _model(i).state_dict()
        state["1.num_batches_tracked"] = torch.tensor(10 * (i + 1))
        states.append(state)
    return states


# --- weighted_average ---------------------------------------------------------------------------


def test_weighted_average_of_identical_states_is_identity():
    state = _states(1)[0]
    state["half"] = torch.randn(5).half()
    out = weighted_average([copy.deepcopy(state) for _ in range(3)], [1.0, 2.0, 3.5])
    assert list(out) == list(state)
    for key, value in state.items():
        assert out[key].dtype == value.dtype
        assert torch.equal(out[key], value), key


def test_weighted_average_values_and_integer_buffers():
    states = _states(2)
    out = weighted_average(states, [2.0, 6.0])  # normalised to 0.25, 0.75
    expected = 0.25 * states[0]["0.weight"].double() + 0.75 * states[1]["0.weight"].double()
    assert torch.allclose(out["0.weight"].double(), expected, atol=1e-7)
    assert out["1.num_batches_tracked"].item() == 10  # from the first state, never averaged
    assert out["1.num_batches_tracked"].dtype == torch.int64
    assert out["0.weight"] is not states[0]["0.weight"]


def test_weighted_average_rejects_bad_input():
    states = _states(2)
    with pytest.raises(ValueError):
        weighted_average(states, [1.0])
    with pytest.raises(ValueError):
        weighted_average(states, [1.0, -1.0])
    with pytest.raises(ValueError):
        weighted_average(states, [0.0, 0.0])
    with pytest.raises(ValueError):
        weighted_average(states, [1.0, float("nan")])
    del states[1]["0.bias"]
    with pytest.raises(ValueError, match="0.bias"):
        weighted_average(states, [1.0, 1.0])


# --- lwr_layer_weights (Eq. 5) ------------------------------------------------------------------


def test_layer_weights_follow_eq5():
    cka = {"s1": {"a": 0.9, "b": 0.5}, "s2": {"a": 0.6, "b": 0.5}, "s3": {"a": 0.5, "b": 0.99}}
    w = lwr_layer_weights(cka)
    assert w["a"] == pytest.approx({"s1": 0.1 / 1.0, "s2": 0.4 / 1.0, "s3": 0.5 / 1.0})
    assert w["b"] == pytest.approx({"s1": 0.5 / 1.01, "s2": 0.5 / 1.01, "s3": 0.01 / 1.01})
    for layer in w:
        assert math.fsum(w[layer].values()) == pytest.approx(1.0, abs=1e-15)
    assert w["a"]["s3"] > w["a"]["s2"] > w["a"]["s1"]  # lower CKA, higher weight


def test_layer_weights_degenerate_and_clip():
    sites = [f"site-{i}" for i in range(1, 5)]
    ones = {s: {"a": 1.0, "b": 1.0} for s in sites}
    assert lwr_layer_weights(ones) == {layer: {s: 0.25 for s in sites} for layer in ("a", "b")}
    high = {s: {"a": 0.991 + 0.002 * i, "b": 1.0} for i, s in enumerate(sites)}
    clipped = lwr_layer_weights(high, clip=AUTHORS_CLIP)
    for layer in clipped:
        assert len(set(clipped[layer].values())) == 1  # exactly uniform: every delta clipped to 0.99
        assert math.fsum(clipped[layer].values()) == pytest.approx(1.0, abs=1e-15)
    unclipped = lwr_layer_weights(high)  # the paper's Eq. 5 without a clip moves the weights a lot
    assert unclipped["a"] == pytest.approx({"site-1": 0.375, "site-2": 0.875 / 3, "site-3": 0.625 / 3, "site-4": 0.125})
    low = lwr_layer_weights({"s1": {"a": 0.0}, "s2": {"a": -0.5}}, clip=AUTHORS_CLIP)
    assert low["a"] == pytest.approx({"s1": 0.5, "s2": 0.5})


def test_layer_weights_always_finite_and_validated():
    w = lwr_layer_weights({"s1": {"a": 1.0000005}, "s2": {"a": 1.0}})  # rounding above 1
    assert w["a"] == {"s1": 0.5, "s2": 0.5}
    w = lwr_layer_weights({"s1": {"a": 1.0 - 1e-300}, "s2": {"a": 1.0}})
    assert all(math.isfinite(v) for v in w["a"].values()) and sum(w["a"].values()) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        lwr_layer_weights({"s1": {"a": float("nan")}})
    with pytest.raises(ValueError):
        lwr_layer_weights({"s1": {"a": 0.5}, "s2": {"b": 0.5}})
    with pytest.raises(ValueError):
        lwr_layer_weights({"s1": {"a": 0.5}}, clip=(0.9, 0.1))
    with pytest.raises(ValueError):
        lwr_layer_weights({})


# --- layerwise_average (Eq. 6) ------------------------------------------------------------------


def test_layerwise_average_one_hot_weights_pick_each_sites_layer():
    states = dict(zip(["s0", "s1", "s2"], _states(3), strict=True))
    layers = parameter_layers(_model(0))
    anchor = weighted_average(list(states.values()), [1, 1, 1])
    anchor["1.num_batches_tracked"] = torch.tensor(99)
    picks = {"0": "s1", "1": "s2", "3": "s0"}
    weights = {layer: {s: float(s == picks[layer]) for s in states} for layer in layers}
    out = layerwise_average(states, weights, layers, anchor)
    assert list(out) == list(anchor)
    for layer, keys in layers.items():
        for key in keys:
            if key.endswith("num_batches_tracked"):
                assert out[key].item() == 99  # integer buffers come from the anchor
            else:
                assert torch.equal(out[key], states[picks[layer]][key]), key


def test_layerwise_average_uniform_weights_equal_fedavg():
    states = dict(zip(["s0", "s1", "s2"], _states(3), strict=True))
    layers = parameter_layers(_model(0))
    anchor = weighted_average(list(states.values()), [1, 1, 1])
    uniform = {layer: {s: 1 / 3 for s in states} for layer in layers}
    out = layerwise_average(states, uniform, layers, anchor)
    for key in anchor:
        assert torch.allclose(out[key].double(), anchor[key].double(), atol=1e-7), key


def test_layerwise_average_rejects_unmapped_keys_and_bad_weights():
    states = dict(zip(["s0", "s1"], _states(2), strict=True))
    layers = parameter_layers(_model(0))
    anchor = states["s0"]
    weights = {layer: {"s0": 0.5, "s1": 0.5} for layer in layers}
    partial = {k: v for k, v in layers.items() if k != "1"}
    with pytest.raises(ValueError, match="no layer"):
        layerwise_average(states, {k: weights[k] for k in partial}, partial, anchor)
    with pytest.raises(ValueError):
        layerwise_average(states, {**weights, "0": {"s0": 1.0}}, layers, anchor)  # site missing
    with pytest.raises(ValueError):
        layerwise_average(states, {k: v for k, v in weights.items() if k != "3"}, layers, anchor)
    overlapping = {**layers, "extra": ["0.weight"]}
    with pytest.raises(ValueError, match="0.weight"):
        layerwise_average(states, {**weights, "extra": {"s0": 1, "s1": 1}}, overlapping, anchor)


# --- check_site_state and check_cka -------------------------------------------------------------


def test_check_site_state_catches_bad_updates():
    reference = _states(1)[0]
    assert check_site_state(copy.deepcopy(reference), reference) is None

    bad = copy.deepcopy(reference)
    bad["3.weight"][0, 0, 0, 0] = float("nan")
    assert check_site_state(bad, reference) == "NaN in 3.weight"

    bad = copy.deepcopy(reference)
    bad["1.running_var"][2] = float("inf")
    assert check_site_state(bad, reference) == "Inf in 1.running_var"

    bad = copy.deepcopy(reference)
    del bad["0.bias"]
    assert "missing" in check_site_state(bad, reference) and "0.bias" in check_site_state(bad, reference)

    bad = copy.deepcopy(reference)
    bad["surprise"] = torch.zeros(1)
    assert "unexpected" in check_site_state(bad, reference)

    bad = copy.deepcopy(reference)
    bad["0.weight"] = torch.zeros(4, 1, 5, 5)
    reason = check_site_state(bad, reference)
    assert "0.weight" in reason and "(4, 1, 5, 5)" in reason and "(4, 1, 3, 3)" in reason

    bad = copy.deepcopy(reference)
    bad["1.num_batches_tracked"] = torch.tensor(1.5)
    assert "dtype" in check_site_state(bad, reference)

    bad = copy.deepcopy(reference)
    bad["0.bias"] = [0.0] * 4
    assert "not a tensor" in check_site_state(bad, reference)


def test_check_cka_catches_bad_reports():
    layers = parameter_layers(_model(0))
    good = {layer: 0.5 for layer in layers}
    assert check_cka(good, layers) is None
    assert check_cka({**good, "0": 1.0 + 1e-7}, layers) is None  # rounding is tolerated
    assert check_cka({**good, "0": -1e-7}, layers) is None
    assert check_cka({**good, "0": 1.1}, layers) == "CKA 0 is 1.1, expected a finite number in [-1e-06, 1]"
    assert "CKA 3 is -0.2, expected" in check_cka({**good, "3": -0.2}, layers)
    assert "CKA 1 is nan, expected" in check_cka({**good, "1": float("nan")}, layers)
    assert "CKA 1 is inf, expected" in check_cka({**good, "1": float("inf")}, layers)
    missing = {k: v for k, v in good.items() if k != "3"}
    assert check_cka(missing, layers) == "CKA lacks 3"
    assert "unknown fields: 9" in check_cka({**good, "9": 0.5}, layers)
    assert "CKA 0 is 'high', expected" in check_cka({**good, "0": "high"}, layers)
    assert check_cka([0.5, 0.5, 0.5], layers) is not None
