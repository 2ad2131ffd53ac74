"""Server side of the collaborative-fairness baselines CFFL and CGSV: every site gets its own model.

The server keeps one model per site (round 0: the initial global model). A round: each site trains from its own
model and returns it; the server takes each accepted site's update delta_i = trained_i - w_i, computes the
method's reputations and the aggregated update U, and gives site i the top fraction q_i of U's entries by
magnitude per tensor: w_i <- w_i + mask(U, q_i) (`fairfl.methods.rewards.reward`). A site's own update reaches its
model only
through U, as in both papers' code. A site that is rejected (NaN, wrong shape, no usable report) or absent keeps
its model and its reputation for the round. Evaluation sends each site its own model, so the results' per-site
metrics are those of the rewarded models. The reported global model (global_model.pt) is w_g <- w_g + U; the
sites' models are written to site_models.pt beside it after every round.

Reputations, reward fractions and the removed sites live in method_state.json; the sites' models go into the
named run's checkpoint (`method_tensors`)."""

from __future__ import annotations

import os

import numpy as np

from fairfl.aggregation import normalise, robust_average
from fairfl.files import save_atomic
from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.kinds import Real
from fairfl.methods.rewards.protocol import VAL_METRIC, VALIDATE_TRAINED
from fairfl.methods.rewards.reward import (
    apply_threshold,
    cffl_reputations,
    cgsv_values,
    normalised_update,
    reward_fractions,
    reward_states,
    state_delta,
    update_norm,
    update_reputation,
    weighted_update,
)
from fairfl.models import state_to_numpy, state_to_torch

SITE_MODELS_FILE = "site_models.pt"


class RewardController(FairRoundController):
    """The per-site-model round of CFFL and CGSV; subclasses compute the reputations and the aggregated update."""

    def __init__(self, **arguments):
        super().__init__(**arguments)
        self.reputations, self.fractions = {}, {}
        self.site_models = {}  # {site: numpy state}: what each site trains from and is evaluated with

    def models_for(self, round_num, global_state, sites) -> dict:
        return {s: self.site_models.get(s, global_state) for s in sites}

    def aggregate(self, round_num, global_state, updates, rejected):
        start = {s: state_to_torch(self.site_models.get(s, global_state)) for s in self.trainers}
        deltas = {s: state_delta(updates[s].state, start[s]) for s in sorted(updates)}
        result = self.reward(round_num, deltas, updates, rejected) if deltas else None
        if result is None:  # nobody to reward: every model stays
            return global_state, {}
        update, weights, extras = result
        self.fractions = reward_fractions({s: self.reputations[s] for s in weights}, self.beta)
        trained = {s: updates[s].state for s in self.fractions}
        new_models = reward_states(start, update, self.fractions, trained)
        self.site_models.update({s: state_to_numpy(m) for s, m in new_models.items()})
        save_atomic(new_models, os.path.join(self.get_run_dir(), SITE_MODELS_FILE))
        new_global = reward_states({"global": state_to_torch(global_state)}, update, {"global": 1.0}, {})["global"]
        contributions = dict(sorted(self.reputations.items()))
        return state_to_numpy(new_global), {
            "weights": weights,
            "reputations": contributions,
            "contributions": contributions,
            "reward_fractions": dict(self.fractions),
            **extras,
        }

    def combine(self, deltas: dict, weights: dict) -> dict:
        """U = sum_i weights_i delta_i, or with `robust_aggregation` the coordinate-wise median or trimmed mean."""
        settings = self.settings
        if settings.robust_aggregation != "none":
            ordered = [deltas[s] for s in sorted(weights)]
            return robust_average(ordered, settings.robust_aggregation, settings.trim_fraction)
        return weighted_update(deltas, weights)

    def reward(self, round_num, deltas, updates, rejected):
        """(aggregated update U, {site: its weight in U}, extra results fields) for the sites in `deltas`, updating
        self.reputations; None when no site is left."""
        raise NotImplementedError

    def final_extras(self) -> dict:
        return {"contributions": dict(sorted(self.reputations.items()))} if self.reputations else {}

    def method_state(self) -> dict:
        return {"reputations": self.reputations, "reward_fractions": self.fractions}

    def load_method_state(self, state: dict) -> None:
        self.reputations = dict(state["reputations"])
        self.fractions = dict(state["reward_fractions"])

    def method_tensors(self) -> dict:
        return {s: state_to_torch(m) for s, m in self.site_models.items()}

    def load_method_tensors(self, tensors: dict) -> None:
        self.site_models = {s: state_to_numpy(m) for s, m in tensors.items()}


class CFFLController(RewardController):
    """CFFL (Lyu et al., "Collaborative Fairness in Federated Learning", 2020): validation-based reputations.

    Each site trains from its own model and reports the validation metric v_i of its trained model on its own
    validation split (Dice; classification: balanced accuracy); the server holds no data, so this is the
    FedCE paper's reading of CFFL ("evaluating local participant's validation accuracy"), not the paper's server-side
    validation set. Round reputations sinh(alpha v_i) / sum_j sinh(alpha v_j) are smoothed,
    r_i = 0.5 r_i + 0.5 r~_i and renormalised (first round: raw); a site below `reputation_threshold` is removed
    for good (reputation 0, it receives nothing). U = sum_i r_i delta_i (r renormalised over the round's sites);
    q_i = r_i / max_j r_j."""

    method = "cffl"
    beta = None  # reward fractions linear in the reputations

    def __init__(self, **arguments):
        """alpha, reputation_threshold (arguments.py: CFFL) besides the round's arguments (FairRoundController).
        The paper grid-searches the threshold (2/3 of 1/(number of sites left) in one version); 0, the default,
        removes nobody, since a hospital removed by a badly tuned threshold loses the federation for good."""
        super().__init__(**arguments)
        self.alpha, self.reputation_threshold = float(self.alpha), float(self.reputation_threshold)
        self.removed = []

    def train_meta(self, round_num) -> dict:
        return {VALIDATE_TRAINED: True}

    def answer_fields(self, task_name, round_num) -> dict:
        """Every train answer carries the trained model's validation score, a number in [0, 1]."""
        return {VAL_METRIC: Real(0.0, 1.0)} if task_name == protocol.TASK_TRAIN else {}

    def reward(self, round_num, deltas, updates, rejected):
        metrics = {s: float(updates[s].meta[VAL_METRIC]) for s in sorted(updates) if s not in self.removed}
        if not metrics:
            return None
        round_reputations = cffl_reputations(metrics, self.alpha)
        reputations = update_reputation(self.reputations, round_reputations, keep=0.5)
        self.reputations, self.removed = apply_threshold(reputations, self.reputation_threshold, self.removed)
        weights = self.bounded(normalise({s: self.reputations[s] for s in metrics}))  # over this round's sites
        return self.combine(deltas, weights), weights, {"val_metric": metrics, "removed": list(self.removed)}

    def method_state(self) -> dict:
        return {**super().method_state(), "removed": self.removed}

    def load_method_state(self, state: dict) -> None:
        super().load_method_state(state)
        self.removed = list(state["removed"])


class CGSVController(RewardController):
    """CGSV (Xu et al., "Gradient-Driven Rewards to Guarantee Fairness in Collaborative Machine Learning", NeurIPS
    2021, Algorithm 1): cosine-gradient Shapley values.

    Each site's update is normalised, u_i = Gamma delta_i / ||delta_i||; u_N = sum_i r_i u_i with the reputations of
    the previous round, renormalised over the round's sites (round 0: `weighting`, FedAvg's sample shares by
    default, as in the authors' code);
    psi_i = cos(u_i, u_N); r_i <- alpha r_i + (1 - alpha) psi_i (first round: psi_i), negative reputations clipped
    to 0, renormalised to sum 1; q_i = tanh(beta r_i) / max_j tanh(beta r_j); site i gets mask(u_N, q_i)."""

    method = "cgsv"

    def __init__(self, **arguments):
        """alpha, beta, gamma (arguments.py: CGSV) besides the round's arguments (FairRoundController). The paper
        fixes gamma per dataset (0.5 MNIST, 0.15 CIFAR-10, 1 text); null, the default, takes the median norm of the
        round's raw updates, which keeps the step at the scale of these networks' updates (one site's huge update
        cannot set it)."""
        super().__init__(**arguments)
        self.alpha, self.beta = float(self.alpha), float(self.beta)

    def reward(self, round_num, deltas, updates, rejected):
        gamma = self.gamma or float(np.median([update_norm(d) for d in deltas.values()]))
        uploads = {s: normalised_update(d, gamma) for s, d in deltas.items()}
        weights = {s: self.reputations.get(s, 0.0) for s in uploads}
        if sum(weights.values()) > 0.0:
            weights = self.bounded(normalise(weights))  # over this round's sites
        else:  # round 0, or every past reputation 0: the run's first-round weights
            weights = self.site_weights({s: updates[s].num_samples for s in uploads})
        aggregate = self.combine(uploads, weights)
        values = cgsv_values(uploads, aggregate)
        self.reputations = update_reputation(self.reputations, values, keep=self.alpha)
        return aggregate, weights, {"cgsv": values, "gamma": gamma}
