"""APFL's math (fairfl.methods.apfl.mixing) against the paper's formulas written out: the gradient of alpha,
<v - w, grad f(v_bar)>, against autograd and a finite difference; one step of v, alpha and w by hand; alpha kept in
[0, 1]; its limits (alpha 0 and 1 held fixed; the global copy always FedAvg's); the order of a batch's items."""

import copy

import pytest
import torch

from fairfl.methods.apfl.mixing import check_alpha, mixed_network, mixed_parameters, mixed_state, train_apfl
from fairfl.models import build_model
from fairfl.training import TrainSettings, train_local

CPU = torch.device("cpu")


def mse(prediction, target):
    return ((prediction - target) ** 2).mean()


def problem(dtype=torch.float32, items=8):
    """A least-squares problem on a 3 -> 1 linear model (with bias): v (personal) and w (global) differ."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(items, 3, generator=generator, dtype=dtype)
    y = torch.randn(items, 1, generator=generator, dtype=dtype)
    v, w = torch.nn.Linear(3, 1).to(dtype), torch.nn.Linear(3, 1).to(dtype)
    with torch.no_grad():
        v.weight.copy_(torch.tensor([[0.5, -1.0, 2.0]]))
        v.bias.fill_(0.3)
        w.weight.copy_(torch.tensor([[-0.5, 1.0, 1.5]]))
        w.bias.fill_(-0.2)
    return x, y, v, w


def mixed_loss(v, w, alpha, x, y):
    return mse(mixed_network(v, w, alpha)(x), y)


def gradient_at(parameters: dict, x, y) -> dict:
    """grad f at the model with `parameters` (a fresh linear model holding them), {name: gradient}."""
    model = torch.nn.Linear(3, 1).to(parameters["weight"].dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(parameters[name])
    mse(model(x), y).backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_alpha_and_v_gradients_are_the_paper_s_and_match_a_finite_difference():
    x, y, v, w = problem(torch.float64)
    alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    mixed_loss(v, w, alpha, x, y).backward()
    v_bar = {
        name: 0.3 * p.detach() + 0.7 * dict(w.named_parameters())[name].detach() for name, p in v.named_parameters()
    }
    g = gradient_at(v_bar, x, y)
    # the paper's: grad_alpha f(v_bar) = <v - w, grad f(v_bar)>, grad_v f(v_bar) = alpha grad f(v_bar)
    paper = sum(float(((p - dict(w.named_parameters())[n]).detach() * g[n]).sum()) for n, p in v.named_parameters())
    assert float(alpha.grad) == pytest.approx(paper, rel=1e-10)
    for name, p in v.named_parameters():
        torch.testing.assert_close(p.grad, 0.3 * g[name], rtol=1e-10, atol=1e-12)
    assert all(p.grad is None for p in w.parameters())  # w is a constant of the mix
    h = 1e-6
    with torch.no_grad():
        up = mixed_loss(v, w, torch.tensor(0.3 + h, dtype=torch.float64), x, y)
        down = mixed_loss(v, w, torch.tensor(0.3 - h, dtype=torch.float64), x, y)
    assert float(alpha.grad) == pytest.approx(float((up - down) / (2 * h)), rel=1e-6)
    assert abs(paper) > 0.1  # the check sees a gradient


def test_one_step_of_v_alpha_and_w_is_the_paper_s_written_out():
    """Local SGD, one batch: v1 = v0 - lr alpha0 g, alpha1 = alpha0 - lr_a <v0 - w0, g> (g = grad f(v_bar0)) and
    w1 = w0 - lr grad f(w0), every one from the state before the step."""
    x, y, v, w = problem(torch.float64)
    lr, alpha_lr, alpha = 0.1, 0.05, 0.4
    w0 = {n: p.detach().clone() for n, p in w.named_parameters()}
    v0 = {n: p.detach().clone() for n, p in v.named_parameters()}
    g = gradient_at({n: alpha * v0[n] + (1 - alpha) * w0[n] for n in v0}, x, y)
    g_w = gradient_at(w0, x, y)
    settings = TrainSettings(lr=lr, weight_decay=0.0, local_steps=1, optimizer="sgd")
    stats = train_apfl(w, v, alpha, [{"image": x, "label": y}], settings, CPU, mse, mse, alpha_lr=alpha_lr)
    expected_alpha = alpha - alpha_lr * sum(float(((v0[n] - w0[n]) * g[n]).sum()) for n in v0)
    assert stats["alpha"] == pytest.approx(expected_alpha, rel=1e-6) and stats["steps"] == 1
    for n, p in v.named_parameters():
        torch.testing.assert_close(p.detach(), v0[n] - lr * alpha * g[n])
    for n, p in w.named_parameters():
        torch.testing.assert_close(p.detach(), w0[n] - lr * g_w[n])


@pytest.mark.parametrize("end", [1.0, 0.0])
def test_alpha_stays_in_zero_one_however_large_its_steps(end):
    """A huge step throws alpha past an end of [0, 1]: it is projected back onto it. With v the solution and w far
    off, the first step pushes alpha up (to 1); with the roles swapped, down (to 0). Later steps may swing it from
    end to end (the step is absurd on purpose), never out of [0, 1]."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, generator=generator)
    truth = torch.nn.Linear(3, 1)
    y = truth(x).detach()
    good, bad = copy.deepcopy(truth), torch.nn.Linear(3, 1)
    with torch.no_grad():
        bad.weight.mul_(-20.0)
    v, w = (good, bad) if end == 1.0 else (bad, good)
    settings = TrainSettings(lr=1e-3, weight_decay=0.0, local_steps=1)
    alpha, seen = 0.5, []
    for start in range(0, 32, 8):
        batch = [{"image": x[start : start + 8], "label": y[start : start + 8]}]
        alpha = train_apfl(w, v, alpha, batch, settings, CPU, mse, mse, alpha_lr=1e4)["alpha"]
        seen.append(alpha)
    assert seen[0] == end and all(0.0 <= a <= 1.0 for a in seen), seen


def test_the_global_copy_is_fedavgs_bit_for_bit():
    x, y, v, w = problem()
    plain = copy.deepcopy(w)
    batches = [{"image": x[:4], "label": y[:4]}, {"image": x[4:], "label": y[4:]}]
    settings = TrainSettings(lr=0.05, weight_decay=1e-4, local_steps=5)  # Adam, cycling over the batches
    stats = train_apfl(w, v, 0.5, batches, settings, CPU, mse, mse)
    plain_stats = train_local(plain, batches, settings, CPU, loss_fn=mse)
    assert all(torch.equal(a, b) for a, b in zip(w.parameters(), plain.parameters(), strict=True))
    assert stats["train_loss"] == plain_stats["train_loss"] and stats["steps"] == plain_stats["steps"] == 5
    assert stats["alpha"] != 0.5  # alpha did move (at the model's lr, the paper's default)


def test_alpha_one_held_fixed_trains_the_personal_model_alone_and_zero_scores_the_global_model():
    x, y, v, w = problem()
    batches = [{"image": x[:4], "label": y[:4]}, {"image": x[4:], "label": y[4:]}]
    settings = TrainSettings(lr=0.05, weight_decay=1e-4, local_epochs=2)
    local = copy.deepcopy(v)
    stats = train_apfl(copy.deepcopy(w), v, 1.0, batches, settings, CPU, mse, mse, alpha_lr=0.0)
    train_local(local, batches, settings, CPU, loss_fn=mse)
    assert stats["alpha"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(v.parameters(), local.parameters(), strict=True))  # Solo's model
    # alpha 0: the mixed model is w itself at every step, so its loss is w's
    x, y, v, w = problem()
    stats = train_apfl(w, v, 0.0, batches, settings, CPU, mse, mse, alpha_lr=0.0)
    assert stats["alpha"] == 0.0 and stats["mixed_loss"] == stats["train_loss"]


def test_the_scored_mix_is_exactly_either_model_at_its_ends_buffers_included():
    torch.manual_seed(0)
    spec = {"name": "unet", "channels": [4, 8], "strides": [2], "norm": "batch"}
    w, v = build_model(spec).state_dict(), build_model(spec).state_dict()
    for value in v.values():
        value.add_(1) if value.is_floating_point() else value.fill_(7)
    assert all(torch.equal(mixed_state(w, v, 0.0)[k], w[k]) for k in w)
    assert all(torch.equal(mixed_state(w, v, 1.0)[k], v[k]) for k in w)
    running = next(k for k in w if k.endswith("running_mean"))
    torch.testing.assert_close(mixed_state(w, v, 0.25)[running], 0.75 * w[running] + 0.25 * v[running])


def test_batch_norm_statistics_of_the_mix_are_the_personal_model_s():
    """v_bar runs with v's buffers: training updates v's running statistics, never w's."""
    spec = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [4, 8], "strides": [2], "norm": "batch"}
    torch.manual_seed(0)
    w, v = build_model(spec), build_model(spec)
    w_buffers = {k: b.clone() for k, b in w.named_buffers()}
    v_buffers = {k: b.clone() for k, b in v.named_buffers()}
    image = torch.randn(2, 1, 16, 16)
    mixed_network(v.train(), w.train(), torch.tensor(0.5))(image)
    assert all(torch.equal(b, w_buffers[k]) for k, b in w.named_buffers())
    assert any(not torch.equal(b, v_buffers[k]) for k, b in v.named_buffers())


def test_the_order_of_a_batch_s_items_changes_the_gradients_only_by_rounding():
    x, y, v, w = problem(items=16)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(3))
    grads = []
    for xs, ys in ((x, y), (x[order], y[order])):
        vv, alpha = copy.deepcopy(v), torch.tensor(0.6, requires_grad=True)
        mixed_loss(vv, w, alpha, xs, ys).backward()
        grads.append([alpha.grad.clone(), *(p.grad.clone() for p in vv.parameters())])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_mixed_parameters_follow_v_and_alpha_only():
    _, _, v, w = problem()
    alpha = torch.tensor(0.25, requires_grad=True)
    mixed = mixed_parameters(v, w, alpha)
    torch.testing.assert_close(mixed["weight"], 0.25 * v.weight + 0.75 * w.weight)
    assert mixed["weight"].requires_grad and set(mixed) == {"weight", "bias"}


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.5", None, True])
def test_a_bad_alpha_is_refused(bad):
    with pytest.raises(ValueError, match="alpha must be a number in"):
        check_alpha(bad)
    x, y, v, w = problem()
    with pytest.raises(ValueError):
        train_apfl(w, v, bad, [{"image": x, "label": y}], TrainSettings(), CPU, mse, mse)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_alpha_step_size_is_refused(bad):
    x, y, v, w = problem()
    with pytest.raises(ValueError, match="alpha_lr"):
        train_apfl(w, v, 0.5, [{"image": x, "label": y}], TrainSettings(), CPU, mse, mse, alpha_lr=bad)
