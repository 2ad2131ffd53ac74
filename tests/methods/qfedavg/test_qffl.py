"""q-FFL (Li et al., ICLR 2020, Algorithm 2) on state dicts: the paper's formula, its limits, and a toy problem."""

import math

import pytest
import torch

from fairfl.aggregation import weighted_average
from fairfl.methods.qfedavg.qffl import lipschitz_from_lr, qffl_aggregate, qffl_coefficients


def state(*values, counter=0):
    return {"w": torch.tensor(values, dtype=torch.float64), "n": torch.tensor(counter)}


def paper_update(w, locals_, losses, q, lipschitz):
    """Algorithm 2 as written: Delta w_k = L (w - w_k), Delta_k = F^q Delta w_k,
    h_k = q F^(q-1) ||Delta w_k||^2 + L F^q, w_new = w - sum Delta_k / sum h_k."""
    deltas, hs = [], []
    for site, w_k in locals_.items():
        f = losses[site] + 1e-10
        dw = lipschitz * (w - w_k)
        deltas.append(f**q * dw)
        hs.append(q * f ** (q - 1) * float(dw @ dw) + lipschitz * f**q)
    return w - sum(deltas) / sum(hs)


def test_update_is_the_papers_formula():
    w = state(1.0, -2.0, 0.5)
    locals_ = {"a": state(0.8, -1.5, 0.5, counter=7), "b": state(1.5, -2.0, 0.0, counter=9)}
    losses = {"a": 0.7, "b": 2.0}
    for q, lipschitz in [(1.0, 10.0), (2.0, 3.0), (0.5, 100.0)]:
        new, shares = qffl_aggregate(w, locals_, losses, q, lipschitz)
        expected = paper_update(w["w"], {s: v["w"] for s, v in locals_.items()}, losses, q, lipschitz)
        assert torch.allclose(new["w"], expected, atol=1e-12)
        assert sum(shares.values()) == pytest.approx(1.0) and shares["global"] > 0
        assert int(new["n"]) == 7  # integer tensors: the lower median of the global's and the sites' (0, 7, 9)


def test_q_zero_is_fedavg_and_l_zero_is_loss_weighted_fedavg():
    w = state(0.0, 0.0)
    locals_ = {"a": state(1.0, 0.0), "b": state(0.0, 3.0), "c": state(-1.0, 1.0)}
    losses = {"a": 0.5, "b": 1.0, "c": 2.0}
    fedavg = weighted_average(list(locals_.values()), [1, 1, 1])["w"]
    for lipschitz in (0.0, 1.0, 1e4):
        assert torch.allclose(qffl_aggregate(w, locals_, losses, 0.0, lipschitz)[0]["w"], fedavg)
    weighted = weighted_average(list(locals_.values()), [0.5**2, 1.0, 2.0**2])["w"]
    new, shares = qffl_aggregate(w, locals_, losses, 2.0, 0.0)
    assert torch.allclose(new["w"], weighted) and shares["global"] == pytest.approx(0.0, abs=1e-12)


def test_toy_quadratic_sites_direction_and_magnitude():
    """F_k(w) = 0.5 ||w - c_k||^2 + b_k; one local SGD step with lr, so with L = 1/lr, Delta w_k = grad F_k(w)."""
    centres = {
        "near": torch.tensor([1.0, 0.0], dtype=torch.float64),
        "far": torch.tensor([0.0, 4.0], dtype=torch.float64),
    }
    offsets = {"near": 0.1, "far": 0.1}
    w = torch.zeros(2, dtype=torch.float64)
    lr = 0.1

    def loss(site, x):
        return 0.5 * float((x - centres[site]) @ (x - centres[site])) + offsets[site]

    locals_ = {s: {"w": w - lr * (w - c)} for s, c in centres.items()}
    losses = {s: loss(s, w) for s in centres}
    fedavg = weighted_average(list(locals_.values()), [1, 1])["w"]
    new = qffl_aggregate({"w": w}, locals_, losses, q=1.0, lipschitz=lipschitz_from_lr(lr))[0]["w"]
    # direction: towards the site with the higher loss, which gains more than under FedAvg
    assert loss("far", new) < loss("far", fedavg)
    assert float((new - w) @ (centres["far"] - w)) > 0
    # magnitude: q-FedSGD's step sum F_k g_k / sum (q ||g_k||^2 + L F_k), g_k = w - c_k
    grads = {s: w - c for s, c in centres.items()}
    step = sum(losses[s] * grads[s] for s in centres) / sum(
        float(grads[s] @ grads[s]) + (1 / lr) * losses[s] for s in centres
    )
    assert torch.allclose(new, w - step, atol=1e-9)
    # the fairer model: the worst site's loss is lower than after a FedAvg step of the same length
    same_length = w + (fedavg - w) * float((new - w).norm() / (fedavg - w).norm())
    assert max(loss(s, new) for s in centres) < max(loss(s, same_length) for s in centres)


def test_adam_like_updates_barely_move_the_model_with_l_one_over_lr():
    """With Adam the local update is ~lr per parameter and step, so ||w - w_k||^2 grows with the
    number of parameters and the q ||Delta w_k||^2 term of h_k dominates: the global step is a few percent of
    FedAvg's with L = 1/lr; L = 0 (loss-weighted FedAvg) moves as far as FedAvg when the losses are equal."""
    generator = torch.Generator().manual_seed(0)
    params, lr, steps = 10_000, 3e-4, 10
    w = {"w": torch.randn(params, generator=generator, dtype=torch.float64)}
    locals_ = {
        s: {"w": w["w"] - lr * steps * torch.sign(torch.randn(params, generator=generator, dtype=torch.float64))}
        for s in "abcd"
    }
    losses = {s: 1.0 for s in locals_}
    fedavg_step = float((weighted_average(list(locals_.values()), [1] * 4)["w"] - w["w"]).norm())
    paper = float((qffl_aggregate(w, locals_, losses, 1.0, lipschitz_from_lr(lr))[0]["w"] - w["w"]).norm())
    weighted = float((qffl_aggregate(w, locals_, losses, 1.0, 0.0)[0]["w"] - w["w"]).norm())
    assert paper / fedavg_step < 0.01
    # the predicted ratio F / (F + q L ||w - w_k||^2) with ||w - w_k||^2 = (lr steps)^2 P
    assert paper / fedavg_step == pytest.approx(1.0 / (1.0 + (lr * steps) ** 2 * params / lr), rel=1e-6)
    assert weighted == pytest.approx(fedavg_step)


def test_norm_keys_and_validation():
    w = {"weight": torch.zeros(2, dtype=torch.float64), "running_var": torch.ones(2, dtype=torch.float64)}
    locals_ = {
        "a": {
            "weight": torch.tensor([0.1, 0.0], dtype=torch.float64),
            "running_var": torch.tensor([50.0, 50.0], dtype=torch.float64),
        }
    }
    only_weight = qffl_coefficients(w, locals_, {"a": 1.0}, 1.0, 10.0, keys=["weight"])
    everything = qffl_coefficients(w, locals_, {"a": 1.0}, 1.0, 10.0)
    assert only_weight["a"] == pytest.approx(1.0 / (1.0 + 10.0 * 0.01), rel=1e-6)
    assert everything["a"] < only_weight["a"]  # the running statistics' change would count as a gradient
    for kwargs in ({"q": -1.0}, {"lipschitz": -1.0}, {"q": math.nan}):
        with pytest.raises(ValueError):
            qffl_coefficients(w, locals_, {"a": 1.0}, **{"q": 1.0, "lipschitz": 1.0, **kwargs})
    for losses in ({"a": math.nan}, {"a": -0.5}, {"b": 1.0}):
        with pytest.raises(ValueError):
            qffl_coefficients(w, locals_, losses, 1.0, 1.0)
    with pytest.raises(ValueError):
        lipschitz_from_lr(0.0)
    assert lipschitz_from_lr(0.01) == pytest.approx(100.0)


def test_the_rounds_lr_never_depends_on_the_order_of_the_sites():
    from fairfl.methods.qfedavg.qffl import round_lr

    # two sites that disagree: before, the first site's lr won and the honest second site was rejected
    for rates in ({"site-1": 1e-9, "site-2": 1e-3}, {"site-2": 1e-3, "site-1": 1e-9}):
        assert round_lr(rates) == (1e-9, [])  # no leader: the most cautious step, nobody outvoted
    assert round_lr({"a": 1e-3, "b": 1e-3, "c": 5.0}) == (1e-3, ["c"])
    assert round_lr({"c": 5.0, "b": 1e-3, "a": 1e-3}) == (1e-3, ["c"])
    assert round_lr({"a": 1e-3, "b": 2e-3, "c": 1e-3, "d": 2e-3}) == (1e-3, [])
    assert round_lr({"a": 3e-4}) == (3e-4, [])
