"""FedNPR's server side: the prototype settings sent with each train task and, for -Per, a global model without
the classifier head."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.methods.fednpr.protocol import NPR, PERSONAL_HEAD
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
    `mu` > 0 adds FedProx's proximal term (FedProx + NPR, the paper's Table VI); the aggregation is FedAvg's.
    `score_local_model` scores each site with its local model of the round, as the authors did."""

    def __init__(self, **arguments):
        """num_subclusters, npr_weight, sinkhorn_epsilon, sinkhorn_iterations, temperature, npr_logits, personal_head,
        score_local_model (arguments.py: FEDNPR) besides FedProx's mu, 0 here (none), and the round's arguments
        (FedProxController)."""
        super().__init__(**arguments)
        if self.task != "classification":
            raise ValueError(f"FedNPR is a classification method; dataset {self.settings.dataset!r} is {self.task}")
        self.npr_weight, self.sinkhorn_epsilon = float(self.npr_weight), float(self.sinkhorn_epsilon)
        self.temperature = float(self.temperature)
        # the authors' protocol: each site scored with the model it trained in the round, as it sent it, and the
        # global model beside it (the engine's scores_global); else the global model (FedNPR-Per: with its head)
        self.evaluate = protocol.FROM_LOCAL if self.score_local_model else protocol.FROM_GLOBAL
        self._head_keys = None

    @property
    def method(self) -> str:
        """fednpr, fednpr_per, fedprox_npr, fedprox_npr_per."""
        return ("fedprox_npr" if self.mu else "fednpr") + ("_per" if self.personal_head else "")

    def site_meta(self) -> dict:
        return {PERSONAL_HEAD: self.personal_head}

    def train_meta(self, round_num) -> dict:
        return {
            **super().train_meta(round_num),
            NPR: {
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
