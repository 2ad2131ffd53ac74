"""FedFloor's server side: Ditto's (FedAvg's global model, personal models with lambda), the mixing grid and, as an
option, AFL's minimax aggregation of the global model."""

from __future__ import annotations

from fairfl.methods.afl.controller import MinimaxAggregation
from fairfl.methods.ditto.controller import DittoController
from fairfl.methods.fedfloor.mixing import check_grid
from fairfl.methods.fedfloor.protocol import MIX_GRID, MIX_GUARD


class FedFloorController(MinimaxAggregation, DittoController):
    """FedFloor (this project's method; docs/methods/fedfloor.md): Ditto's training, FedAvg's global model and each
    site's personal model v_k trained on loss_k(v) + (lambda / 2) ||v - w_t||^2; at evaluation each site scores
    (1 - alpha) w + alpha v_k for every alpha of `mix_grid` on its validation split and is scored with the best.
    A site never deploys what its own data says is worse than the global model or its personal model. A site held
    out of training (a new site) is scored with the global model, which is FedAvg's. With `minimax_aggregation` the
    global model is AFL's instead (MinimaxAggregation: the sites' weights ascend on the losses of the model sent,
    within `afl_alpha` of FedAvg's), recorded as fedfloor_minimax: fairfl's composition of a global model pulled
    toward the worst-served sites with the personal models and the validated mix. With `mix_guard` z > 0 a site
    leaves the global model only for a mix whose validation gain stands z standard errors above 0 (recorded as
    fedfloor_guarded)."""

    method = "fedfloor"
    minimax = False  # set from minimax_aggregation in __init__

    def __init__(self, **arguments):
        """mix_grid, mix_guard, minimax_aggregation and AFL's arguments (arguments.py) besides Ditto's and the
        round's."""
        super().__init__(**arguments)
        self.mix_grid = list(check_grid(self.mix_grid))  # sorted floats
        self.minimax = bool(self.minimax_aggregation)
        if self.mix_grid == [0.0, 1.0]:  # the ablation without interpolation: its own row in reports
            self.method = "fedfloor_pick"
        self.mix_guard = float(self.mix_guard)
        if self.mix_guard > 0.0:  # another choice of the mix: its own row in reports
            if 0.0 not in self.mix_grid:
                raise ValueError(f"mix_guard {self.mix_guard:g} needs 0 (the global model) in mix_grid {self.mix_grid}")
            if self.method != "fedfloor":  # one component changed at a time: each arm is a registered variant
                raise ValueError(f"mix_guard: not with mix_grid {self.mix_grid} ({self.method})")
            self.method = "fedfloor_guarded"
        if self.minimax:  # another global model: its own row in reports
            if self.method != "fedfloor":
                raise ValueError(f"minimax_aggregation: not with {self.method} (mix_grid {self.mix_grid})")
            self.method = "fedfloor_minimax"

    def site_meta(self) -> dict:
        guard = {MIX_GUARD: self.mix_guard} if self.mix_guard > 0.0 else {}  # absent: the unguarded choice
        return {**super().site_meta(), MIX_GRID: self.mix_grid, **guard}
