"""FedAvg's server side: the engine's sample-weighted mean, unchanged."""

from __future__ import annotations

from fairfl.flare.engine import FairRoundController


class FedAvgController(FairRoundController):
    """FedAvg (McMahan et al., 2017): the global model is the size-weighted mean of the local models."""
