"""SALT (GSAM local steps at rho(t)) and the sharpness measurement, against direct computations on tiny models."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fairfl.methods.fedism.sharpness import (
    dataset_loss,
    frozen_norm_statistics,
    gsam_step,
    measure_sharpness,
    search_distance,
    train_salt,
)
from fairfl.training import TrainSettings

torch.set_num_threads(1)


def tiny_model(seed=0, batch_norm=False):
    torch.manual_seed(seed)
    layers = (
        [torch.nn.Linear(3, 4)]
        + ([torch.nn.BatchNorm1d(4)] if batch_norm else [])
        + [torch.nn.Tanh(), torch.nn.Linear(4, 3)]
    )
    return torch.nn.Sequential(*layers).double()


def toy_batches(sizes=(5, 3), seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        {"image": torch.randn(n, 3, generator=g, dtype=torch.float64), "label": torch.randint(0, 3, (n,), generator=g)}
        for n in sizes
    ]


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def loss_and_grad(model, params, batch):
    """CE of the model with parameters `params` ({name: tensor}) on a batch, and its gradient (flattened)."""
    params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    loss = F.cross_entropy(functional_call(model, params, (batch["image"],)), batch["label"])
    grads = torch.autograd.grad(loss, list(params.values()))
    return float(loss.detach()), flat(grads)


def unflatten(vector, like):
    out, i = {}, 0
    for k, v in like.items():
        out[k] = vector[i : i + v.numel()].reshape(v.shape)
        i += v.numel()
    return out


def test_search_distance_follows_eq12():
    assert search_distance(100, 100) == pytest.approx(0.1)  # the last round searches at rho_max
    assert search_distance(25, 100) == pytest.approx(0.1 * 0.5)  # (1/4)^0.5
    assert search_distance(0, 100) == 0.0
    assert search_distance(8, 10, rho_max=0.05, tau=2.0) == pytest.approx(0.05 * 0.64)
    # FLARE's round r (from 0) is t = r + 1: the FFL4MIA code's rho_max * ((r + 1) / T)^tau
    code = [0.1 * ((r + 1) / 4) ** 0.5 for r in range(4)]
    assert [search_distance(r + 1, 4) for r in range(4)] == pytest.approx(code)
    assert all(search_distance(t, 7, tau=0.0) == pytest.approx(0.1) for t in range(8))  # tau 0: FedISM's fixed rho
    values = [search_distance(t, 30) for t in range(1, 31)]
    assert values == sorted(values)  # grows from ~0 to rho_max
    for bad in [(11, 10), (-1, 10), (1, 0)]:
        with pytest.raises(ValueError):
            search_distance(*bad)
    with pytest.raises(ValueError):
        search_distance(1, 10, rho_max=-0.1)


@pytest.mark.parametrize("rho, alpha", [(0.05, 0.1), (0.3, 0.5), (0.05, 0.0), (0.0, 0.1)])
def test_gsam_step_matches_the_direct_computation(rho, alpha):
    model = tiny_model()
    batch = toy_batches((6,))[0]
    w = {k: v.detach().clone() for k, v in model.named_parameters()}
    lr = 0.1
    # GSAM (Zhuang et al. 2022, Algorithm 1) by hand on flat vectors
    _, g = loss_and_grad(model, w, batch)
    w_adv = flat(w.values()) + rho * g / g.norm()
    _, g_p = loss_and_grad(model, unflatten(w_adv, w), batch)
    g_perp = g - (g @ g_p) / (g_p @ g_p) * g_p
    assert abs(float(g_perp @ g_p)) < 1e-12  # the decomposition is orthogonal
    expected = flat(w.values()) - lr * (g_p - alpha * g_perp)

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = gsam_step(model, lambda: F.cross_entropy(model(batch["image"]), batch["label"]), optimizer, rho, alpha)
    assert torch.allclose(flat(p.detach() for p in model.parameters()), expected, atol=1e-12)
    loss_w, _ = loss_and_grad(model, w, batch)
    loss_adv, _ = loss_and_grad(model, unflatten(w_adv, w), batch)
    assert losses["loss"] == pytest.approx(loss_w)
    assert losses["perturbed_loss"] == pytest.approx(loss_adv)


def test_gsam_second_pass_does_not_update_batch_norm_statistics():
    model = tiny_model(batch_norm=True).train()
    batch = toy_batches((8,))[0]
    reference = copy.deepcopy(model)
    reference(batch["image"])  # one forward at w: what the running statistics should see
    gsam_step(
        model,
        lambda: F.cross_entropy(model(batch["image"]), batch["label"]),
        torch.optim.SGD(model.parameters(), lr=0.0),
        rho=0.5,
    )
    bn, ref = model[1], reference[1]
    assert torch.allclose(bn.running_mean, ref.running_mean) and torch.allclose(bn.running_var, ref.running_var)
    assert int(bn.num_batches_tracked) == 1
    assert bn.track_running_stats  # restored
    with frozen_norm_statistics(model):
        model(batch["image"])
    assert int(bn.num_batches_tracked) == 1


def test_train_salt_lowers_the_loss_and_counts_steps():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 3, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    data = [{"image": x[i : i + 8], "label": y[i : i + 8]} for i in range(0, 48, 8)]
    model = tiny_model()
    settings = TrainSettings(lr=3e-2, weight_decay=5e-4)
    before = dataset_loss(model.eval(), data, F.cross_entropy, "cpu")
    first = train_salt(model, data, settings, "cpu", F.cross_entropy, rho=0.05)
    for _ in range(10):
        last = train_salt(model, data, settings, "cpu", F.cross_entropy, rho=0.05)
    assert first["steps"] == len(data) and first["rho"] == 0.05
    assert last["train_loss"] < first["train_loss"]
    assert dataset_loss(model.eval(), data, F.cross_entropy, "cpu") < 0.8 * before
    assert last["train_perturbed_loss"] >= last["train_loss"] - 1e-3  # ascent: the perturbed loss is higher
    assert train_salt(model, data, TrainSettings(local_steps=9), "cpu", F.cross_entropy, rho=0.1)["steps"] == 9
    assert train_salt(model, [], TrainSettings(local_steps=3), "cpu", F.cross_entropy, rho=0.1)["steps"] == 0


def test_measure_sharpness_matches_the_direct_computation_over_the_whole_set():
    model = tiny_model()
    data = toy_batches((5, 3, 4))
    rho = 0.2
    w = {k: v.detach().clone() for k, v in model.named_parameters()}
    whole = {"image": torch.cat([b["image"] for b in data]), "label": torch.cat([b["label"] for b in data])}
    loss, g = loss_and_grad(model, w, whole)  # the full set's mean loss and its gradient (Eq. 9 over D_k)
    perturbed, _ = loss_and_grad(model, unflatten(flat(w.values()) + rho * g / g.norm(), w), whole)

    model.train()
    result = measure_sharpness(model, data, F.cross_entropy, rho, "cpu")
    assert result["loss"] == pytest.approx(loss)
    assert result["perturbed_loss"] == pytest.approx(perturbed)
    assert result["sharpness"] == pytest.approx(perturbed - loss)
    assert result["grad_norm"] == pytest.approx(float(g.norm()))
    assert result["samples"] == 12 and result["rho"] == rho
    # the model is left as it was: weights, mode, no gradients
    assert all(torch.equal(p, w[k]) for k, p in model.named_parameters())
    assert model.training and all(p.grad is None for p in model.parameters())
    # first order: S(rho) ~ rho ||g|| for small rho
    small = measure_sharpness(model, data, F.cross_entropy, 1e-4, "cpu")
    assert small["sharpness"] == pytest.approx(1e-4 * small["grad_norm"], rel=1e-2)
    zero = measure_sharpness(model, data, F.cross_entropy, 0.0, "cpu")
    assert zero["sharpness"] == 0.0 and zero["perturbed_loss"] == zero["loss"] == pytest.approx(loss)


def test_measure_sharpness_uses_eval_mode_and_keeps_running_statistics():
    model = tiny_model(batch_norm=True).train()
    data = toy_batches((6, 6))
    model(data[0]["image"])  # some running statistics
    stats = {k: v.clone() for k, v in model.state_dict().items()}
    expected = dataset_loss(copy.deepcopy(model).eval(), data, F.cross_entropy, "cpu")
    result = measure_sharpness(model, data, F.cross_entropy, 0.1, "cpu")
    assert result["loss"] == pytest.approx(expected)  # eval mode: running statistics, not the batch's
    assert result["sharpness"] > 0
    assert all(torch.equal(v, stats[k]) for k, v in model.state_dict().items())
    assert model.training
    with pytest.raises(ValueError, match="empty"):
        measure_sharpness(model, [], F.cross_entropy, 0.1, "cpu")
