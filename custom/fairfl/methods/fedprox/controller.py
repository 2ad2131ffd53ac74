"""FedProx's server side: FedAvg's aggregation; sites get mu with each train task."""

from __future__ import annotations

from fairfl.flare.engine import FairRoundController
from fairfl.methods.fedprox.protocol import PROX_MU


class FedProxController(FairRoundController):
    """FedProx (Li et al., MLSys 2020): FedAvg aggregation; each site adds the proximal term (mu / 2) ||w - w_t||^2
    to its local loss (NVFlare's PTFedProxLoss)."""

    def __init__(self, **arguments):
        """mu (arguments.py: FEDPROX) besides the round's arguments (FairRoundController)."""
        super().__init__(**arguments)
        self.mu = float(self.mu)

    @property
    def method(self) -> str:
        """A property, not a class attribute: FedNPR's controller, built on this one, names its variants by its
        arguments."""
        return "fedprox"

    def train_meta(self, round_num) -> dict:
        return {PROX_MU: self.mu} if self.mu else {}
