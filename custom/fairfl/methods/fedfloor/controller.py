"""FedFloor's server side: Ditto's (FedAvg's global model, personal models with lambda) and the mixing grid."""

from __future__ import annotations

from fairfl.methods.ditto.controller import DittoController
from fairfl.methods.fedfloor.mixing import check_grid
from fairfl.methods.fedfloor.protocol import MIX_GRID


class FedFloorController(DittoController):
    """FedFloor (this project's method; docs/methods/fedfloor.md): Ditto's training, FedAvg's global model and each
    site's personal model v_k trained on loss_k(v) + (lambda / 2) ||v - w_t||^2; at evaluation each site scores
    (1 - alpha) w + alpha v_k for every alpha of `mix_grid` on its validation split and is scored with the best.
    A site never deploys what its own data says is worse than the global model or its personal model. A site held
    out of training (a new site) is scored with the global model, which is FedAvg's."""

    method = "fedfloor"

    def __init__(self, **arguments):
        """mix_grid (arguments.py: FEDFLOOR) besides Ditto's and the round's arguments (DittoController)."""
        super().__init__(**arguments)
        self.mix_grid = list(check_grid(self.mix_grid))  # sorted floats
        if self.mix_grid == [0.0, 1.0]:  # the ablation without interpolation: its own row in reports
            self.method = "fedfloor_pick"

    def site_meta(self) -> dict:
        return {**super().site_meta(), MIX_GRID: self.mix_grid}
