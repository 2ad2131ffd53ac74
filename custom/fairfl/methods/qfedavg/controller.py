"""q-FedAvg's server side: the q-FFL update from the sites' losses."""

from __future__ import annotations

from fairfl.arguments import MIN_LR
from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.kinds import Real
from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS, GLOBAL_LOSS_KIND, MEASURE_LOSS
from fairfl.methods.qfedavg.qffl import lipschitz_from_lr, qffl_aggregate, round_lr
from fairfl.models import state_to_numpy, state_to_torch, trainable_names


class QFedAvgController(FairRoundController):
    """q-FedAvg (Li, Sanjabi, Beirami and Smith, ICLR 2020, Algorithm 2): q-FFL's loss-reweighted update.

    Each site measures, before training, the loss F_k of the global model on its training set (eval mode, no
    augmentation) and sends it with its trained model. The server computes (`fairfl.methods.qfedavg.qffl`)
    w_new = w - sum_k F_k^q (w - w_k) / sum_k (F_k^q + q L F_k^(q-1) ||w - w_k||^2), ||.|| over the trainable
    parameters. L (`lipschitz`): null = 1 / lr, the authors' choice (the sites report their lr), faithful for
    local SGD, but with Adam (FedISM+'s setting) the curvature term dominates and the model barely moves
    (on prostate it ends near 8 Dice); 0 = FedAvg weighted by F_k^q / sum F^q, what the FFL4MIA code (FedISM+'s
    comparison) runs as "q-FedAvg". A site whose loss is missing, NaN/Inf or negative is left out of the round."""

    method = "qfedavg"

    def __init__(self, **arguments):
        """q, lipschitz (arguments.py: QFEDAVG) besides the round's arguments (FairRoundController)."""
        super().__init__(**arguments)
        self.q = float(self.q)
        if self.settings.robust_aggregation != "none":
            raise ValueError(
                "q-FedAvg's step is not an average of the sites' models: robust_aggregation must be 'none'"
            )
        if self.lipschitz == 0:  # a different aggregation rule: its own row in reports
            self.method = "qfedavg_lossweighted"
        self._trainable = None

    def train_meta(self, round_num) -> dict:
        return {MEASURE_LOSS: True}

    def answer_fields(self, task_name, round_num) -> dict:
        """Every train answer carries the loss of the model sent and, when L = 1 / lr, the site's learning rate."""
        if task_name != protocol.TASK_TRAIN:
            return {}
        loss = {GLOBAL_LOSS: GLOBAL_LOSS_KIND}
        return {**loss, protocol.LR: Real(MIN_LR, 1e6)} if self.lipschitz is None else loss

    def aggregate(self, round_num, global_state, updates, rejected):
        losses = {s: float(updates[s].meta[GLOBAL_LOSS]) for s in sorted(updates)}  # checked: answer_fields
        lipschitz = self.lipschitz
        if lipschitz is None and losses:  # L = 1 / lr
            rates = {s: float(updates[s].meta[protocol.LR]) for s in losses}
            reference, outvoted = round_lr(rates)
            for site in outvoted:
                self.reject(
                    round_num,
                    site,
                    f"lr {rates[site]!r} differs from the round's lr {reference!r} (most sites')",
                    rejected,
                )
            losses = {s: v for s, v in losses.items() if s not in outvoted}
            lipschitz = lipschitz_from_lr(reference)
        if not losses:
            return global_state, {}
        if self._trainable is None:  # ||w - w_k|| is about parameters, not normalisation statistics
            self._trainable = trainable_names(self.model_spec())
        new_state, shares = qffl_aggregate(
            state_to_torch(global_state),
            {s: updates[s].state for s in losses},
            losses,
            self.q,
            lipschitz,
            keys=self._trainable,
            bound=self.bounded,
        )
        return state_to_numpy(new_state), {
            "weights": {s: shares[s] for s in losses},
            "global_share": shares["global"],
            "losses": losses,
            "lipschitz": lipschitz,
        }
