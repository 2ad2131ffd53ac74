"""FedProx's client side: the proximal term added to the site's local loss."""

from __future__ import annotations

import copy

from fairfl.kinds import Real
from fairfl.methods.fedprox.arguments import MAX_PROXIMAL_WEIGHT
from fairfl.methods.fedprox.protocol import PROX_MU
from fairfl.methods.fedprox.proximal import ProximalDistance
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.privacy.dp_sgd import SeparableLoss


def with_proximal_term(loss_fn, model, mu: float, reference=None):
    """FedProx (Li et al., MLSys 2020): loss_fn plus the proximal term (mu / 2) ||w - w_ref||^2 (NVFlare's
    PTFedProxLoss's value and gradient, fused: fairfl.methods.fedprox.proximal) against a frozen copy of `reference`,
    by default of the model as it is now (as received)."""
    reference = copy.deepcopy(model if reference is None else reference).requires_grad_(False)
    distance = ProximalDistance(model, reference, mu)
    # a term of the weights alone: DP-SGD adds it outside the items' clipped gradients
    return SeparableLoss(loss_fn, lambda device: distance())


class ProximalTerm(ClientStep):
    """Adds (mu / 2) ||w - w_sent||^2, mu = meta[PROX_MU], to whatever the local loss is (FedNPR's as well)."""

    fields = {PROX_MU: Real(0.0, MAX_PROXIMAL_WEIGHT)}
    private_loss = True  # its term reads the weights alone (fairfl.privacy.settings.step_refusal)

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return bool(meta.get(PROX_MU))

    def loss(self, ctx: StepContext, loss_fn, model, stack):
        return with_proximal_term(loss_fn, model, float(ctx.meta[PROX_MU]))
