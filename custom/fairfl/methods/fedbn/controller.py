"""FedBN's server side: FedAvg over everything but the normalisation layers, which stay on the sites."""

from __future__ import annotations

from fairfl.flare.engine import FairRoundController
from fairfl.methods.fedbn.protocol import LOCAL_NORM
from fairfl.models import norm_state_keys


class FedBNController(FairRoundController):
    """FedBN (Li et al., ICLR 2021, Algorithm 1): the sites' models are averaged with FedAvg's weights except for their
    normalisation layers (affine weights and biases, and batch norm's running statistics), which each site keeps,
    trains and is evaluated with. The global model's normalisation layers stay at their initial values: the model a
    new site would receive has no site's statistics. A network without such layers is refused (FedBN would be
    FedAvg)."""

    method = "fedbn"

    def __init__(self, **arguments):
        """The round's arguments (FairRoundController); the job sets model_norm "batch"."""
        super().__init__(**arguments)
        self._norm_keys = norm_state_keys(self.model_spec())
        if not self._norm_keys:
            raise ValueError(
                f"FedBN keeps the normalisation layers local, and the network {self.model_spec()} has none with "
                f"parameters: set model_norm to 'batch'"
            )

    def local_keys(self) -> list:
        return self._norm_keys

    def site_meta(self) -> dict:
        return {LOCAL_NORM: True}
