"""FedProx's fused proximal term against NVFlare's PTFedProxLoss, its reference: the same value and the same gradient
to the bit on the networks the sites train (2-D and 3-D) and on one no job ships, a numerical gradient check, and the
refusals."""

import copy

import pytest
import torch
from nvflare.app_opt.pt.fedproxloss import PTFedProxLoss

from fairfl.methods.fedprox.client import with_proximal_term
from fairfl.methods.fedprox.proximal import ProximalDistance
from fairfl.models import build_model


def moved_pair(model: torch.nn.Module, seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(model after a random move of every weight, a frozen copy of it before the move)."""
    reference = copy.deepcopy(model).requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model, reference


def value_and_grads(term) -> tuple[torch.Tensor, dict]:
    model, value = term()
    model.zero_grad(set_to_none=True)
    value.backward()
    return value.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


NETWORKS = {
    # the sites' U-Net (the default prostate spec's shape, narrower) in 2-D and 3-D
    "unet_2d": {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [8, 16, 32], "strides": [2, 2]},
    "unet_3d": {
        "name": "unet",
        "in_channels": 1,
        "num_classes": 3,
        "spatial_dims": 3,
        "channels": [4, 8],
        "strides": [2],
    },
    "cnn": {"name": "cnn", "in_channels": 3, "num_classes": 4, "channels": [4, 8]},
}


@pytest.mark.parametrize("network", sorted(NETWORKS))
@pytest.mark.parametrize("mu", [0.01, 0.5, 3.7])
def test_value_and_gradient_are_ptfedproxloss_bit_for_bit(network, mu):
    torch.manual_seed(0)
    model, reference = moved_pair(build_model(NETWORKS[network]), seed=1)
    ours = value_and_grads(lambda: (model, ProximalDistance(model, reference, mu)()))
    nvflare = value_and_grads(lambda: (model, PTFedProxLoss(mu=mu)(model, reference)))
    assert torch.equal(ours[0], nvflare[0].reshape(ours[0].shape))
    assert ours[1].keys() == nvflare[1].keys()
    for name, grad in ours[1].items():
        assert torch.equal(grad, nvflare[1][name]), name


def test_an_unseen_network_with_a_frozen_layer():
    """A network no job ships (LayerNorm, a frozen embedding): frozen weights count in the value, take no gradient."""
    model = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 2))
    model, reference = moved_pair(model, seed=2)
    model[0].weight.requires_grad_(False)
    ours = value_and_grads(lambda: (model, ProximalDistance(model, reference, 0.3)()))
    nvflare = value_and_grads(lambda: (model, PTFedProxLoss(mu=0.3)(model, reference)))
    assert torch.equal(ours[0], nvflare[0])
    assert ours[1]["0.weight"] is None and nvflare[1]["0.weight"] is None
    for name in ("1.weight", "1.bias", "2.weight", "2.bias"):
        assert torch.equal(ours[1][name], nvflare[1][name]), name


def test_the_gradient_scales_with_the_loss_above_it():
    """Inside a larger loss (a data term, a loss scale as mixed precision's): the gradient is scale * mu (w - w_ref)
    plus the data term's."""
    model, reference = moved_pair(torch.nn.Linear(3, 2), seed=3)
    x = torch.randn(4, 3)
    loss = 1024.0 * (model(x).square().mean() + ProximalDistance(model, reference, 0.2)())
    loss.backward()
    data = torch.nn.Linear(3, 2)
    data.load_state_dict(model.state_dict())
    (1024.0 * data(x).square().mean()).backward()
    for (name, p), q, r in zip(model.named_parameters(), data.parameters(), reference.parameters(), strict=True):
        expected = q.grad + 1024.0 * 0.2 * (p.detach() - r)
        torch.testing.assert_close(p.grad, expected, rtol=1e-6, atol=1e-6, msg=name)


def test_numerical_gradient_in_double():
    model, reference = moved_pair(torch.nn.Linear(4, 3).double(), seed=4)
    refs = [r.detach() for r in reference.parameters()]

    def term(weight, bias):
        from fairfl.methods.fedprox.proximal import _SquaredDistance

        return _SquaredDistance.apply(0.7, refs, weight, bias)

    assert torch.autograd.gradcheck(
        term, (model.weight.detach().requires_grad_(), model.bias.detach().requires_grad_())
    )


def test_a_reference_of_another_network_is_refused():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="reference model"):
        ProximalDistance(model, torch.nn.Sequential(torch.nn.Linear(3, 2)), 0.1)


def test_with_proximal_term_trains_toward_the_reference():
    """FedProx's loss through the client step's function: with only the term, steps move w back toward w_sent."""
    model, reference = moved_pair(torch.nn.Linear(3, 2), seed=5)
    loss_fn = with_proximal_term(lambda logits, target: torch.zeros(()), model, mu=1.0, reference=reference)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)

    def squared_gap() -> float:
        with torch.no_grad():
            return float(
                sum(((p - r) ** 2).sum() for p, r in zip(model.parameters(), reference.parameters(), strict=True))
            )

    gap = [squared_gap()]
    for _ in range(3):
        optimiser.zero_grad()
        loss_fn(torch.zeros(1, 2), torch.zeros(1)).backward()
        optimiser.step()
        gap.append(squared_gap())
    assert gap[1] == pytest.approx(0.25 * gap[0], rel=1e-5)  # w - r shrinks by (1 - lr mu) = 0.5 a step
    assert gap[3] < gap[2] < gap[1]
