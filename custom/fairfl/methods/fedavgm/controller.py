"""FedAvgM's server side: FedAvg's average, then a momentum step from the global model towards it."""

from __future__ import annotations

from fairfl.flare.engine import FairRoundController
from fairfl.methods.fedavgm.momentum import momentum_step
from fairfl.models import state_to_numpy, state_to_torch


class FedAvgMController(FairRoundController):
    """FedAvgM (Hsu et al., 2019): the round's weighted mean of the local models (FedAvg's, or the job's robust
    aggregation) defines the pseudo-gradient w_t - mean; the server keeps its momentum and steps along it
    (fairfl.methods.fedavgm.momentum). The velocity is the method's state: kept in a named run's checkpoint
    (`method_tensors`), so a resumed run steps as the uninterrupted one would."""

    method = "fedavgm"
    server_momentum: float  # its own arguments (arguments.py), set from the job by FairRoundController
    server_lr: float

    def __init__(self, **arguments) -> None:
        """server_momentum, server_lr (fairfl.methods.fedavgm.arguments) besides the round's arguments."""
        super().__init__(**arguments)
        self.server_momentum, self.server_lr = float(self.server_momentum), float(self.server_lr)
        self.velocity: dict | None = None  # numpy arrays of the floating-point tensors; None before the first step

    def aggregate(self, round_num, global_state, updates, rejected):
        average, extras = super().aggregate(round_num, global_state, updates, rejected)
        new_state, self.velocity = momentum_step(
            global_state, average, self.velocity, self.server_momentum, self.server_lr
        )
        return new_state, extras

    def method_tensors(self) -> dict | None:
        return None if self.velocity is None else {"velocity": state_to_torch(self.velocity)}

    def load_method_tensors(self, tensors: dict) -> None:
        self.velocity = state_to_numpy(tensors["velocity"])
