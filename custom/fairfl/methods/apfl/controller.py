"""APFL's server side: FedAvg's global model; the sites learn their personal models and mixing weights."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.methods.apfl.protocol import APFL_ALPHA_INIT, APFL_ALPHA_LR


class APFLController(FairRoundController):
    """APFL (Deng, Kamani and Mahdavi, 2020): the global model is FedAvg's (every site trains the model sent with its
    usual loss and optimiser; the server averages the results by training-set size, or uniformly); besides, every site
    keeps a personal model v and a mixing weight alpha, which start as the first model it receives and
    `apfl_alpha_init`, and every local step take a gradient step on the loss of alpha v + (1 - alpha) w (alpha's
    projected onto [0, 1], at `apfl_alpha_lr`, null = the site's lr). Neither leaves the site; each site is scored
    with its mix of its personal model and the global model it is sent (`apfl_alpha` and `personal_model` 1.0 in its
    metrics, `apfl_alpha` in its training metrics too) and, in the same task, with the global model alone
    (`global_dice`, ...). A site held out of training (`exclude_sites`) is scored with the global model alone. They
    live in the site's state dir (fairfl.methods.apfl.protocol.PERSONAL_MODEL_FILE, with the previous round's), so a
    named run (run_name) resumes with them, a repeated round included. The server keeps nothing of its own between
    rounds but the global model; global_model.pt is FedAvg's."""

    method = "apfl"
    evaluate = protocol.FROM_PERSONAL

    def __init__(self, **arguments):
        """apfl_alpha_init and apfl_alpha_lr (arguments.py: APFL) besides the round's arguments
        (FairRoundController)."""
        super().__init__(**arguments)
        self.apfl_alpha_init = float(self.apfl_alpha_init)
        self.apfl_alpha_lr = None if self.apfl_alpha_lr is None else float(self.apfl_alpha_lr)

    def train_meta(self, round_num) -> dict:
        return {} if self.apfl_alpha_lr is None else {APFL_ALPHA_LR: self.apfl_alpha_lr}

    def site_meta(self) -> dict:
        return {**super().site_meta(), APFL_ALPHA_INIT: self.apfl_alpha_init}
