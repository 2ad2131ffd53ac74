"""FedISM / FedISM+'s server side: SALT's radius per round and SAGA's sharpness-aware weights."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.methods.fedism.protocol import SALT_ALPHA, SALT_RHO, SHARPNESS, SHARPNESS_RHO
from fairfl.methods.fedism.saga import SHARPNESS_REPORT, SagaState
from fairfl.methods.fedism.sharpness import search_distance


class FedISMController(FairRoundController):
    """FedISM+ (Wu et al., 2025) and FedISM (Wu et al., IJCAI 2024): sharpness-aware local training (SALT) and
    sharpness-aware aggregation (SAGA).

    Round r (t = r + 1 of T = num_rounds): the search distance is rho(t) = rho_max (t / T)^tau (Eq. 12; tau = 0:
    FedISM's fixed rho = rho_max). The `train` task carries rho: each site first measures, on the global model it
    received, its loss L(w), perturbed loss L(w + eps*(rho)) and sharpness S = L(w + eps*) - L(w) over its whole
    training set (eval mode, no augmentation; Eq. 9-11), then trains with GSAM over Adam at rho (SALT, Eq. 14).
    The server weights the local models by S^q (variant "S", Eq. 16) or L^q (variant "L", Eq. 17), smoothed by
    w_t = beta w~_t + (1 - beta) w_{t-1} (Eq. 18; round 1 raw). A site whose report is missing, NaN/Inf or
    absurd is left out of that round (logged, under `rejected`); a negative value is clipped to 0 and the site
    keeps its moving-average share. Every field of the report is checked before (`answer_fields`). The moving
    average lives in
    `method_state.json` after every round; `load_method_state` resumes it."""

    def __init__(self, **arguments):
        """rho_max, tau, variant, q, beta, gsam_alpha, saga (arguments.py: FEDISM) besides the round's arguments
        (FairRoundController)."""
        super().__init__(**arguments)
        self.rho_max, self.tau = float(self.rho_max), float(self.tau)
        self.q, self.beta, self.gsam_alpha = float(self.q), float(self.beta), float(self.gsam_alpha)
        self.saga_state = SagaState(variant=self.variant, q=self.q, beta=self.beta)

    @property
    def method(self) -> str:
        """fedism (fixed rho, sharpness weights: the published FedISM), fedism_l, fedismplus_s, fedismplus_l; salt
        (SALT with FedAvg weights and FedISM+'s growing rho), salt_fixed_rho (the same at FedISM's fixed rho)."""
        if not self.saga:
            return "salt" if self.tau else "salt_fixed_rho"
        if self.tau == 0:
            return "fedism" if self.variant == "S" else "fedism_l"
        return f"fedismplus_{self.variant.lower()}"

    def rho(self, round_num: int) -> float:
        return search_distance(round_num + 1, self.settings.num_rounds, self.rho_max, self.tau)

    def train_meta(self, round_num) -> dict:
        rho = self.rho(round_num)
        probe = {SHARPNESS_RHO: rho} if self.saga else {}
        return {SALT_RHO: rho, SALT_ALPHA: self.gsam_alpha, **probe}

    def answer_fields(self, task_name, round_num) -> dict:
        """SAGA reads the whole sharpness report of every train answer (every field checked, not only the variant's)."""
        return {SHARPNESS: SHARPNESS_REPORT} if self.saga and task_name == protocol.TASK_TRAIN else {}

    def aggregate(self, round_num, global_state, updates, rejected):
        if not self.saga:  # the SALT-only ablation: FedAvg's aggregation
            new_state, extras = super().aggregate(round_num, global_state, updates, rejected)
            return new_state, {**extras, "rho": self.rho(round_num)}
        reports = {s: updates[s].meta[SHARPNESS] for s in sorted(updates)}  # checked: answer_fields
        if not reports:
            return global_state, {"rho": self.rho(round_num)}
        saga = self.saga_state.update(reports)
        weights = self.bounded({s: v["weight"] for s, v in saga.items()})
        self.saga_state.weights.update(weights)  # Eq. 18's w_{t-1} next round: the weights used
        keys = ("loss", "perturbed_loss", "sharpness", "grad_norm")
        return self.average_updates(updates, weights), {
            "weights": weights,
            "rho": self.rho(round_num),
            "raw_weights": {s: v["raw"] for s, v in saga.items()},
            "sharpness": {s: {k: float(reports[s][k]) for k in keys if k in reports[s]} for s in sorted(reports)},
        }

    def method_state(self) -> dict:
        return self.saga_state.to_dict()

    def load_method_state(self, state: dict) -> None:
        self.saga_state = SagaState.from_dict(state)
