"""FedCE's server side: contribution estimates in gradient and data space as aggregation weights."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.kinds import Real
from fairfl.methods.fedce.contribution import (
    ContributionState,
    flatten,
    gradient_terms,
)
from fairfl.methods.fedce.protocol import LOO_ERROR, LOO_WEIGHTS
from fairfl.models import state_to_torch, trainable_names


class FedCEController(FairRoundController):
    """FedCE (Jiang et al., CVPR 2023): aggregation weights are the sites' accumulated contributions.

    Round k: the `train` task carries each site's weight p_i in the global model w_k it receives. Before
    training, the site builds the leave-one-out model w^-i = (w_k - p_i w_{k-1,i}) / (1 - p_i) from its own
    previous local model (kept on disk) and returns its error on its validation split (data term, Eq. 3).
    The server computes 1 - cos(update_i, aggregated update without i) (gradient term, Eq. 2), normalises
    both terms over the round's sites, combines them by sum or product (Eq. 4), accumulates them over rounds
    and aggregates with the accumulated contributions normalised to sum 1 (Eq. 5).

    Round 0: no site has a previous local model, so no leave-one-out model exists; the round is a FedAvg
    round (weights by `weighting`), and contributions accumulate from round 1. The accumulated state is
    written to `method_state.json` in the run folder after every round."""

    def __init__(self, **arguments):
        """combine (arguments.py: FEDCE) besides the round's arguments (FairRoundController)."""
        super().__init__(**arguments)
        self.contribution = ContributionState(mode=self.combine)
        self._trainable = None

    @property
    def method(self) -> str:
        return f"fedce_{self.combine}"

    def train_meta(self, round_num) -> dict:
        if not self.contribution.weights:
            return {}  # round 0: nothing to leave out of
        return {LOO_WEIGHTS: dict(self.contribution.weights)}

    def answer_fields(self, task_name, round_num) -> dict:
        """From round 1 on, every train answer carries the leave-one-out error, a number in [0, 1]."""
        if task_name == protocol.TASK_TRAIN and self.contribution.weights:
            return {LOO_ERROR: Real(0.0, 1.0)}
        return {}

    def aggregate(self, round_num, global_state, updates, rejected):
        if self._trainable is None:  # Eq. 2 is about parameters, not normalisation statistics
            self._trainable = trainable_names(self.model_spec())
        if not self.contribution.weights:  # round 0 (or nothing aggregated yet): FedAvg
            weights = self.site_weights({s: updates[s].num_samples for s in sorted(updates)})
            self.contribution.weights = dict(weights)
            return self.average_updates(updates, weights), {"weights": weights}
        errors = {s: float(updates[s].meta[LOO_ERROR]) for s in sorted(updates)}  # checked: answer_fields
        if not errors:
            self.contribution.weights = {}
            return global_state, {}
        start = flatten(state_to_torch(global_state), self._trainable)  # the model every site trained from
        vectors = {s: flatten(updates[s].state, self._trainable) - start for s in errors}
        prior = {s: self.contribution.weights.get(s, 0.0) for s in errors}
        gradient = gradient_terms(vectors, prior)
        terms = self.contribution.update(gradient, errors)
        weights = self.bounded(self.contribution.aggregation_weights(sorted(errors)))
        # what the next round's leave-one-out models need: each site's share of the new global model
        self.contribution.weights = {s: weights.get(s, 0.0) for s in self.trainers}
        for s in terms:
            terms[s].update(cosine=1.0 - gradient[s], error=errors[s])
        return self.average_updates(updates, weights), {
            "weights": weights,
            "contributions": self.contribution.contributions(),
            "contribution_terms": terms,
        }

    def final_extras(self) -> dict:
        if not self.contribution.accumulated:
            return {}
        return {
            "contributions": self.contribution.contributions(),
            "contribution_terms": self.contribution.term_shares(),
        }

    def method_state(self) -> dict:
        return self.contribution.to_dict()

    def load_method_state(self, state: dict) -> None:
        self.contribution = ContributionState.from_dict(state)
