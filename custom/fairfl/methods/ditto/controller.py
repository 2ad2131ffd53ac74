"""Ditto's server side: FedAvg's global model; sites train their personal models with lambda."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.methods.ditto.protocol import DITTO_LAMBDA


class DittoController(FairRoundController):
    """Ditto (Li, Hu, Beirami and Smith, ICML 2021): the global model is FedAvg's (every site trains the model sent
    with its usual loss and the server averages the results by training-set size, or uniformly); besides, every
    site keeps a personal model v_k, which starts as the first global model it receives and each round trains for
    the same local epochs/steps on loss_k(v) + (lambda / 2) ||v - w_t||^2, w_t the global model sent that round
    (not the site's freshly trained copy). Personal models never leave the sites; each site is evaluated with its
    own (`personal_model` 1.0 in its metrics; 0.0 for a site that has not trained yet, scored with the global model)
    and, in the same task, with the global model it received (`global_dice`, ...). A site held out of training
    (`exclude_sites`) is scored with the global model alone. They live in the site's state dir
    (fairfl.methods.ditto.protocol.PERSONAL_MODEL_FILE, with the previous round's), so a named run (run_name) resumes
    with them, a repeated round included. The global_model.pt saved is FedAvg's global model."""

    method = "ditto"
    evaluate = protocol.FROM_PERSONAL

    def __init__(self, **arguments):
        """ditto_lambda (arguments.py: DITTO) besides the round's arguments (FairRoundController)."""
        super().__init__(**arguments)
        self.ditto_lambda = float(self.ditto_lambda)

    def train_meta(self, round_num) -> dict:
        return {DITTO_LAMBDA: self.ditto_lambda}
