"""FedNPR's server side: the prototype settings sent with each train task and, for -Per, a global model without
the classifier head."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.methods.fednpr.npr import (
    EPSILON,
    NPR_LOGITS,
    NPR_WEIGHT,
    NUM_SUBCLUSTERS,
    SINKHORN_ITERATIONS,
    TEMPERATURE,
)
from fairfl.methods.fedprox.controller import FedProxController
from fairfl.models import head_state_keys


class FedNPRController(FedProxController):
    """FedNPR and FedNPR-Per (Wicaksana et al., 2024): each site trains with balanced softmax over its own class
    prior plus lambda * NPR, the cross-entropy over classes of the largest cosine similarity of a sample's
    features to each class's K prototypes (Eq. 3-5), normalised over the classes by a LayerNorm as the authors
    ran it (fairfl.methods.fednpr.npr); the prototypes are Sinkhorn-Knopp sub-cluster centres of the features of
    the model the site received, recomputed every round and never sent. Sites report npr_grad_ratio, how hard NPR
    pulls. FedNPR-Per
    (`personal_head`) does not aggregate the classifier head: every site trains and is evaluated with its own.
    `mu` > 0 adds FedProx's proximal term (FedProx + NPR, the paper's Table VI); the aggregation is FedAvg's."""

    def __init__(
        self,
        num_subclusters: int = NUM_SUBCLUSTERS,
        npr_weight: float = NPR_WEIGHT,
        sinkhorn_epsilon: float = EPSILON,
        sinkhorn_iterations: int = SINKHORN_ITERATIONS,
        temperature: float = TEMPERATURE,
        npr_logits: str = NPR_LOGITS[0],
        personal_head: bool = False,
        mu: float = 0.0,
        **kwargs,
    ):
        """
        Args:
            num_subclusters: K prototypes per class (the paper: 4 on skin lesions, 2 on ICH; 1 = the class mean).
            npr_weight: lambda of Eq. 5, multiplying NPR. Default 1: the authors' code adds lambda instead, so
                their runs trained with weight 1 whatever lambda they give (the paper: 0.1 on skin, 0.05 on ICH).
            sinkhorn_epsilon, sinkhorn_iterations: Sinkhorn-Knopp's entropic regularisation and iterations.
            temperature: divides NPR's logits (Eq. 3 has none: 1).
            npr_logits: "layernorm" (the authors' training loop: the per-class max cosines through a LayerNorm
                over the classes) or "cosine" (Eq. 3 as printed: the max cosines themselves).
            personal_head: FedNPR-Per: every site keeps its own classifier head.
            mu: FedProx's proximal weight; 0 = none.
            **kwargs: see FairRoundController.
        """
        super().__init__(mu=mu, **kwargs)
        if self.task != "classification":
            raise ValueError(f"FedNPR is a classification method; dataset {self.dataset!r} is {self.task}")
        if int(num_subclusters) < 1 or not npr_weight >= 0 or not temperature > 0 or npr_logits not in NPR_LOGITS:
            raise ValueError(
                f"need num_subclusters >= 1, npr_weight >= 0, temperature > 0 and npr_logits in "
                f"{NPR_LOGITS}; got {num_subclusters}, {npr_weight}, {temperature}, {npr_logits!r}"
            )
        self.num_subclusters, self.npr_weight = int(num_subclusters), float(npr_weight)
        self.sinkhorn_epsilon, self.sinkhorn_iterations = float(sinkhorn_epsilon), int(sinkhorn_iterations)
        self.temperature, self.npr_logits = float(temperature), npr_logits
        self.personal_head = bool(personal_head)
        self._head_keys = None

    @property
    def method(self) -> str:
        """fednpr, fednpr_per, fedprox_npr, fedprox_npr_per."""
        return ("fedprox_npr" if self.mu else "fednpr") + ("_per" if self.personal_head else "")

    def site_meta(self) -> dict:
        return {protocol.PERSONAL_HEAD: self.personal_head}

    def train_meta(self, round_num) -> dict:
        return {
            **super().train_meta(round_num),
            protocol.NPR: {
                "k": self.num_subclusters,
                "weight": self.npr_weight,
                "epsilon": self.sinkhorn_epsilon,
                "iterations": self.sinkhorn_iterations,
                "temperature": self.temperature,
                "logits": self.npr_logits,
            },
        }

    def local_keys(self) -> list:
        """FedNPR-Per: the classifier head stays on the sites; it is never sent nor averaged."""
        if not self.personal_head:
            return []
        self._head_keys = self._head_keys or head_state_keys(self.model_spec())
        return self._head_keys
