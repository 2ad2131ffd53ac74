"""FedProx's proximal term (mu / 2) ||w - w_ref||^2 over every parameter tensor, as one autograd node.

The value and gradient are NVFlare's `PTFedProxLoss`'s (tests/methods/fedprox/test_proximal.py compares both, and the
gradient to the bit), but computed with one multi-tensor op per pass instead of five small ops per parameter tensor
in the forward pass and as many again backward (the default U-Net has 49; docs/benchmarks/cost.md has the cost).
The gradient mu (w - w_ref) is the one autograd takes through
sum((w - w_ref) ** 2)."""

from __future__ import annotations

import torch


class _SquaredDistance(torch.autograd.Function):
    """(mu / 2) sum_k ||weights_k - references_k||^2; the gradient mu (weights_k - references_k) for each weight."""

    @staticmethod
    def forward(ctx, mu: float, references: list, *weights: torch.Tensor) -> torch.Tensor:
        differences = torch._foreach_sub(list(weights), references)
        ctx.mu = mu
        ctx.save_for_backward(*differences)
        value = torch.zeros((), device=differences[0].device) if differences else torch.zeros(())
        for difference in differences:  # summed one tensor after another, as PTFedProxLoss sums: the same value
            value = value + (mu / 2) * torch.sum(difference**2)
        return value

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        differences = list(ctx.saved_tensors)
        # (grad * (mu / 2)) * 2 d, as autograd takes it through (mu / 2) * sum(d ** 2): the same float rounding
        scale = grad_output * (ctx.mu / 2)
        return (None, None, *torch._foreach_mul(torch._foreach_mul(differences, 2.0), scale))


class ProximalDistance:
    """(mu / 2) ||w - w_ref||^2 over `model`'s parameters paired by name with `reference`'s (which takes no gradient),
    each time it is called. The pairs are found once: walking a U-Net's modules for its parameters cost more than the
    term itself at every step. The model's parameters are updated in place by its optimiser (and kept by `.to`), so
    the pairs hold; the reference follows the model to its device. ValueError when the two do not have the same
    parameters."""

    def __init__(self, model: torch.nn.Module, reference: torch.nn.Module, mu: float):
        weights = dict(model.named_parameters())
        references = dict(reference.named_parameters())
        if list(weights) != list(references):
            raise ValueError("the proximal term's reference model does not have the model's parameters")
        self.mu, self.weights = mu, list(weights.values())
        self.references = [r.detach() for r in references.values()]

    def __call__(self) -> torch.Tensor:
        if any(r.device != w.device for r, w in zip(self.references, self.weights, strict=True)):
            self.references = [r.to(w.device) for r, w in zip(self.references, self.weights, strict=True)]
        return _SquaredDistance.apply(self.mu, self.references, *self.weights)
