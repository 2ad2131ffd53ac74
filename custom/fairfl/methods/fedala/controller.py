"""FedALA's server side: FedAvg's global model; the sites learn how much of it to take into their start."""

from __future__ import annotations

import torch

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.kinds import Integer
from fairfl.methods.fedala.adaptive import top_parameter_names
from fairfl.methods.fedala.arguments import FEDALA
from fairfl.models import build_model


class FedALAController(FairRoundController):
    """FedALA (Zhang et al., AAAI 2023): the global model is FedAvg's (every site sends the model it trained, as its
    difference from the model sent; the server averages by training-set size, or uniformly). Each site starts its
    training not from the model sent, theta, but from theta_hat = theta_i + (theta - theta_i) W on the network's top
    `fedala_layers` parameter tensors (theta below), theta_i the model it trained last round, W element-wise weights in
    [0, 1] it learns first on `fedala_rand_percent` % of its training items at step size `fedala_eta` (the first time
    until the loss settles: `fedala_threshold`, `fedala_window`, at most `fedala_max_passes` passes; then one pass a
    round). Neither W nor theta_i leaves the site; each site is scored with the theta_hat it would start its next round
    from (`personal_model` 1.0 and `fedala_weight_mean` in its metrics) and, in the same task, with the global model
    alone (`global_dice`, ...); `fedala_passes` and `fedala_weight_mean` are among its training metrics. A site held
    out of training (`exclude_sites`) is scored with the global model alone. W lives in the site's state dir
    (fairfl.methods.fedala.protocol.WEIGHTS_FILE, with the previous round's) beside its local model, so a named run
    (run_name) resumes with them, a repeated round included. The server keeps nothing of its own between rounds but
    the global model; global_model.pt is FedAvg's."""

    method = "fedala"
    evaluate = protocol.FROM_PERSONAL

    def __init__(self, **arguments):
        """The arguments of arguments.py (FEDALA) besides the round's (FairRoundController); `fedala_layers` above the
        network's number of parameter tensors is refused here, before any site starts."""
        super().__init__(**arguments)
        for argument in FEDALA:  # checked against their kinds: as plain ints and floats
            value = getattr(self, argument.name)
            setattr(self, argument.name, int(value) if isinstance(argument.kind, Integer) else float(value))
        with torch.device("meta"):  # counted without allocating the network
            network = build_model(self.model_spec())
        try:
            top_parameter_names(network, self.fedala_layers)
        except ValueError as e:
            raise ValueError(f"{type(self).__name__}: {e}") from e

    def site_meta(self) -> dict:
        """Every argument of arguments.py's FEDALA, under its own name: the sites' task fields (protocol.py)."""
        return {**super().site_meta(), **{argument.name: getattr(self, argument.name) for argument in FEDALA}}
