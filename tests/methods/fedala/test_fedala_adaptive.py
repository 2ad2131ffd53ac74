"""FedALA's math (fairfl.methods.fedala.adaptive) against the paper's formulas written out: theta_hat at its limits
(W 1: the global model, W 0: the local model, on the top layers; the lower layers and buffers always the global
model's); one step of W against the gradient computed by hand on a tiny linear network; the clip to [0, 1]; the
start phase's convergence rule and its cap; the sample, seeded and independent of the order of the site's items; and
hostile settings and weights."""

import copy
import math

import numpy as np
import pytest
import torch

from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import load_datalist
from fairfl.data.loaders import make_loader
from fairfl.methods.fedala.adaptive import (
    Convergence,
    blend,
    check_weights,
    clip_weights,
    initial_weights,
    learn_weights,
    personalised_state,
    sample_size,
    top_parameter_names,
    weights_problem,
)
from fairfl.models import build_model

CPU = torch.device("cpu")
ONE_PASS = Convergence(window=10, threshold=0.01, max_passes=20)


def mse(prediction, target):
    return ((prediction - target) ** 2).mean()


def network(dtype=torch.float64, seed=0) -> torch.nn.Module:
    """3 -> 2 -> 1, linear, with a batch norm between (a buffer): its top 2 parameter tensors are 2.weight, 2.bias."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2, affine=False), torch.nn.Linear(2, 1)).to(
        dtype
    )


def models():
    """(theta, theta_i) state dicts of `network` that differ in every tensor, buffers included."""
    global_, local = network(seed=0).state_dict(), network(seed=1).state_dict()
    global_["1.running_mean"].fill_(0.5)
    local["1.running_mean"].fill_(-3.0)
    return global_, local


def top_reference(state, layers=2) -> dict:
    names = top_parameter_names(network(), layers)
    return {name: state[name] for name in names}


def learn(weights, passes, eta=1.0, start_phase=False, convergence=ONE_PASS):
    """learn_weights on `network` between the two `models`, with the mean squared error."""
    global_, local = models()
    return learn_weights(
        network(), global_, local, weights, passes, mse, eta, CPU, start_phase=start_phase, convergence=convergence
    )


def ones():
    return initial_weights(top_reference(models()[0]))


def test_the_top_tensors_are_the_last_parameter_tensors_in_the_network_s_order():
    assert top_parameter_names(network(), 1) == ["2.bias"]
    assert top_parameter_names(network(), 2) == ["2.weight", "2.bias"]
    assert top_parameter_names(network(), 4) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # every layer
    spec = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [4, 8], "strides": [2]}
    assert top_parameter_names(build_model(spec), 2)[0].endswith("conv.weight")  # U-Net: its output convolution


def test_w_one_is_the_global_model_w_zero_the_local_one_on_the_top_layers_the_lower_layers_always_global():
    global_, local = models()
    before = copy.deepcopy((global_, local))
    top = top_reference(global_)
    ones, zeros = initial_weights(top), {k: torch.zeros_like(v) for k, v in top.items()}
    assert all(torch.equal(w, torch.ones_like(top[k])) for k, w in ones.items())
    at_one, at_zero = personalised_state(global_, local, ones), personalised_state(global_, local, zeros)
    assert all(torch.equal(at_one[k], global_[k]) for k in global_)  # exactly FedAvg's start
    for key in global_:
        assert torch.equal(at_zero[key], local[key] if key in top else global_[key]), key
    # any W: the lower layers and the buffers are the global model's, the top the element-wise interpolation
    half = {k: torch.rand_like(v) for k, v in top.items()}
    mixed = personalised_state(global_, local, half)
    for key in global_:
        expected = local[key] + (global_[key] - local[key]) * half[key] if key in top else global_[key]
        torch.testing.assert_close(mixed[key], expected, rtol=1e-12, atol=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(before[0].values(), global_.values(), strict=True))  # untouched
    assert all(torch.equal(a, b) for a, b in zip(before[1].values(), local.values(), strict=True))


def test_the_clip_keeps_w_in_zero_one_and_refuses_nan():
    w = torch.tensor([-0.5, 0.0, 0.3, 1.0, 7.0])
    assert torch.equal(clip_weights(w), torch.tensor([0.0, 0.0, 0.3, 1.0, 1.0]))
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="NaN or Inf"):
            clip_weights(torch.tensor([0.5, bad]))


def one_batch(items=6, seed=2):
    generator = torch.Generator().manual_seed(seed)
    return {
        "image": torch.randn(items, 3, generator=generator, dtype=torch.float64),
        "label": torch.randn(items, 1, generator=generator, dtype=torch.float64),
    }


def test_one_step_of_w_is_the_gradient_written_out_by_hand():
    """W <- clip(W - eta * dL/dtheta_hat * (theta - theta_i)); L the mean squared error of theta_hat's output
    y = v . h + c, h the lower layers' output with the global model's weights (batch norm on the batch):
    dL/dv = 2/n sum (y - t) h, dL/dc = 2/n sum (y - t)."""
    global_, local = models()
    batch = one_batch()
    w0 = {
        "2.weight": torch.tensor([[0.3, 0.8]], dtype=torch.float64),
        "2.bias": torch.tensor([0.6], dtype=torch.float64),
    }
    eta = 0.7
    learned, losses = learn_weights(
        network(), global_, local, w0, lambda: [batch], mse, eta, CPU, start_phase=False, convergence=ONE_PASS
    )
    # by hand
    x, t = batch["image"], batch["label"]
    z = x @ global_["0.weight"].T + global_["0.bias"]  # the lower layer: the global model's, never the local one's
    h = (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + 1e-5)  # batch norm in training mode
    v = local["2.weight"] + (global_["2.weight"] - local["2.weight"]) * w0["2.weight"]
    c = local["2.bias"] + (global_["2.bias"] - local["2.bias"]) * w0["2.bias"]
    y = h @ v.T + c
    residual = 2 * (y - t) / len(x)
    grad_v, grad_c = residual.T @ h, residual.sum(0)
    assert losses == [pytest.approx(float(((y - t) ** 2).mean()), rel=1e-12)]
    expected_v = (w0["2.weight"] - eta * grad_v * (global_["2.weight"] - local["2.weight"])).clamp(0, 1)
    expected_c = (w0["2.bias"] - eta * grad_c * (global_["2.bias"] - local["2.bias"])).clamp(0, 1)
    torch.testing.assert_close(learned["2.weight"], expected_v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(learned["2.bias"], expected_c, rtol=1e-10, atol=1e-12)
    assert not torch.equal(learned["2.weight"], w0["2.weight"])  # the check sees a step
    assert torch.equal(w0["2.bias"], torch.tensor([0.6], dtype=torch.float64))  # the W given is not changed


def test_a_huge_step_is_clipped_to_zero_or_one_and_eta_zero_keeps_w():
    top = top_reference(models()[0])
    start = {k: torch.full_like(v, 0.5) for k, v in top.items()}
    learned, _ = learn(start, lambda: [one_batch()], eta=1000.0)
    values = torch.cat([w.flatten() for w in learned.values()])
    assert bool(((values == 0) | (values == 1)).all())  # thrown past an end, clipped back onto it
    kept, losses = learn(start, lambda: [one_batch()], eta=0.0, start_phase=True)
    assert losses == [] and all(torch.equal(kept[k], start[k]) for k in start)  # W cannot move: no pass is made


def counting(batches):
    """A `passes` callable that counts its passes."""
    calls = []

    def passes():
        calls.append(1)
        return batches

    return passes, calls


def test_the_start_phase_runs_until_the_loss_settles_or_its_cap_and_a_later_round_one_pass():
    batches = [one_batch(seed=s) for s in range(3)]
    # a threshold no loss sequence can meet: the cap stops it
    passes, calls = counting(batches)
    _, losses = learn(ones(), passes, start_phase=True, convergence=Convergence(3, 0.0, 7))
    assert len(losses) == len(calls) == 7
    # a threshold every window meets: it stops as soon as a whole window is there
    passes, calls = counting(batches)
    _, losses = learn(ones(), passes, start_phase=True, convergence=Convergence(3, 100.0, 7))
    assert len(losses) == len(calls) == 3
    # after the start phase: one pass, whatever the rule
    passes, calls = counting(batches)
    _, losses = learn(ones(), passes, start_phase=False, convergence=Convergence(3, 0.0, 7))
    assert len(losses) == len(calls) == 1


def test_the_convergence_rule_is_the_std_of_the_last_window_of_losses():
    rule = Convergence(window=3, threshold=0.01, max_passes=50)
    assert not rule.done([], start_phase=True) and not rule.done([], start_phase=False)
    assert rule.done([5.0], start_phase=False)
    assert not rule.done([1.0, 1.0], start_phase=True)  # no whole window yet
    assert rule.done([9.0, 1.0, 1.0, 1.0], start_phase=True)  # the last three agree
    assert not rule.done([1.0, 1.0, 1.1], start_phase=True)  # std 0.047
    assert rule.done([1.0, 1.005, 1.01], start_phase=True)  # std 0.004
    assert rule.done([float(i) for i in range(50)], start_phase=True)  # the cap


@pytest.fixture(scope="module")
def prostate(cache_dir):
    """site-2's training entries of the built-in prostate data (tiny), in the datalist's order."""
    root = ensure_builtin("prostate", image_size=32, seed=0, num_sites=3, size_scale=0.5)
    return load_datalist(root, "site-2", num_classes=2)["training"]


def sample(entries, seed, size):
    """The image files of one pass over the sample, in the order the loader reads them."""
    loader = make_loader(entries, 32, 2, 8, train=False, seed=seed, max_samples=size)
    return loader, [loader.dataset.data[i]["image"] for i in loader.sampler]


def test_the_sample_is_seeded_and_does_not_depend_on_the_order_of_the_site_s_items(prostate):
    size = sample_size(len(prostate), 80)
    assert size == len(prostate) * 80 // 100 and 1 <= size < len(prostate)
    _, drawn = sample(prostate, 5, size)
    assert len(set(drawn)) == size and drawn == sample(prostate, 5, size)[1]  # seeded, no item twice
    assert drawn != sample(prostate, 6, size)[1]  # another round, another sample
    shuffled = [prostate[i] for i in np.random.default_rng(0).permutation(len(prostate))]
    assert shuffled != prostate and sample(shuffled, 5, size)[1] == drawn
    # and so W: learned on either order, the same bit for bit
    spec = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [4, 8], "strides": [2]}
    torch.manual_seed(0)
    global_, local = build_model(spec).state_dict(), build_model(spec).state_dict()
    learned = []
    for entries in (prostate, shuffled):
        net = build_model(spec)
        top = {name: dict(net.named_parameters())[name].detach() for name in top_parameter_names(net, 2)}
        passes = lambda e=entries: sample(e, 5, size)[0]  # noqa: E731
        weights, _ = learn_weights(
            net, global_, local, initial_weights(top), passes, mse_of_logits, 1.0, CPU, False, ONE_PASS
        )
        learned.append(weights)
    assert all(torch.equal(learned[0][k], learned[1][k]) for k in learned[0])
    assert any(not torch.equal(w, torch.ones_like(w)) for w in learned[0].values())  # W moved


def mse_of_logits(output, label):
    """A differentiable loss of a segmentation output (one-hot labels as targets)."""
    onehot = torch.nn.functional.one_hot(label[:, 0].long(), output.shape[1]).movedim(-1, 1).to(output.dtype)
    return mse(output, onehot)


@pytest.mark.parametrize("items, percent, size", [(10, 80, 8), (10, 100, 10), (3, 1, 1), (1, 80, 1), (27, 80, 21)])
def test_the_sample_size_is_s_percent_rounded_down_at_least_one(items, percent, size):
    assert sample_size(items, percent) == size


@pytest.mark.parametrize("percent", [0, 101, -5, 50.5, True, None, "80", math.nan])
def test_a_rand_percent_outside_one_to_a_hundred_is_refused(percent):
    with pytest.raises(ValueError, match="fedala_rand_percent"):
        sample_size(10, percent)


def test_a_site_without_training_items_is_refused():
    with pytest.raises(ValueError, match="at least one training item"):
        sample_size(0, 80)


@pytest.mark.parametrize("layers", [0, -1, 5, 10**6, True, 1.0, None])
def test_more_layers_than_the_network_has_or_none_are_refused(layers):
    with pytest.raises(ValueError, match="fedala_layers"):
        top_parameter_names(network(), layers)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("nan", "NaN in 2.weight"),
        ("inf", "Inf in 2.bias"),
        ("shape", "shape mismatch for 2.weight"),
        ("missing", "missing keys"),
        ("extra", "unexpected keys"),
        ("dtype", "dtype mismatch"),
        ("above", "outside [0, 1] in 2.bias"),
        ("below", "outside [0, 1] in 2.weight"),
        ("list", "not a dict of tensors"),
        ("not_tensor", "2.bias is a float, not a tensor"),
    ],
)
def test_hostile_weights_are_refused_naming_the_tensor(damage, message):
    global_, local = models()
    top = top_reference(global_)
    weights = initial_weights(top)
    if damage == "nan":
        weights["2.weight"][0, 0] = math.nan
    elif damage == "inf":
        weights["2.bias"][0] = math.inf
    elif damage == "shape":
        weights["2.weight"] = torch.ones(2, 2, dtype=torch.float64)
    elif damage == "missing":
        del weights["2.bias"]
    elif damage == "extra":
        weights["0.weight"] = torch.ones_like(global_["0.weight"])
    elif damage == "dtype":
        weights["2.weight"] = weights["2.weight"].float()
    elif damage == "above":
        weights["2.bias"][0] = 1.5
    elif damage == "below":
        weights["2.weight"][0, 1] = -0.1
    elif damage == "list":
        weights = list(weights.values())
    else:
        weights["2.bias"] = 0.5
    assert message in weights_problem(weights, top)
    with pytest.raises(ValueError, match="aggregation weights"):
        check_weights(weights, top)
    if isinstance(weights, dict) and damage not in ("missing", "extra"):
        with pytest.raises(ValueError):
            learn(weights, lambda: [one_batch()])


def test_weights_for_a_tensor_the_network_lacks_or_of_another_shape_are_refused_when_mixing():
    global_, local = models()
    with pytest.raises(ValueError, match="tensors the network lacks"):
        personalised_state(global_, local, {"3.weight": torch.ones(1)})
    with pytest.raises(ValueError, match="tensors the network lacks"):
        learn({"3.weight": torch.ones(1)}, lambda: [one_batch()])
    with pytest.raises(ValueError, match="2.bias: .*differ in shape"):
        personalised_state(global_, local, {"2.bias": torch.ones(2, dtype=torch.float64)})
    with pytest.raises(ValueError, match="differ in shape"):
        blend(torch.zeros(2), torch.zeros(3), torch.ones(3))


@pytest.mark.parametrize(
    "settings, name",
    [
        ({"window": 1, "threshold": 0.01, "max_passes": 5}, "fedala_window"),
        ({"window": 3, "threshold": -0.1, "max_passes": 5}, "fedala_threshold"),
        ({"window": 3, "threshold": math.nan, "max_passes": 5}, "fedala_threshold"),
        ({"window": 3, "threshold": 0.01, "max_passes": 0}, "fedala_max_passes"),
        ({"window": 3, "threshold": 0.01, "max_passes": 2.5}, "fedala_max_passes"),
    ],
)
def test_a_bad_convergence_rule_is_refused(settings, name):
    with pytest.raises(ValueError, match=name):
        Convergence(**settings)


@pytest.mark.parametrize("eta", [-1.0, math.nan, math.inf, 1e9, True])
def test_a_bad_step_size_is_refused(eta):
    with pytest.raises(ValueError, match="fedala_eta"):
        learn(ones(), lambda: [one_batch()], eta=eta)


def test_a_loss_gone_non_finite_is_an_error_never_clipped_into_range():
    batch = one_batch()
    batch["label"][0, 0] = math.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        learn(ones(), lambda: [batch])


def test_an_empty_sample_is_an_error_not_a_silent_w():
    with pytest.raises(ValueError, match="sample .* is empty"):
        learn(ones(), lambda: [], start_phase=True)
