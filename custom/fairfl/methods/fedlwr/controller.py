"""Fed-LWR's server side: layer-wise weights from the sites' CKA reports."""

from __future__ import annotations

from fairfl.flare.engine import FairRoundController
from fairfl.methods.fedlwr.cka import parameter_layers
from fairfl.methods.fedlwr.protocol import (
    CKA,
    CKA_BATCH_SIZE,
    CKA_MAX_POSITIONS,
    CKA_MAX_SAMPLES,
    CKA_SPLIT,
    TASK_CKA,
)
from fairfl.methods.fedlwr.weights import cka_report, layerwise_average, lwr_layer_weights
from fairfl.models import build_model, state_to_numpy, state_to_torch


class FedLWRController(FairRoundController):
    """Fed-LWR (Yan et al., MICCAI 2024): layer-wise re-weighting by CKA to an averaged anchor.

    After local training the server averages an anchor (the uniform mean of the local models, Eq. 1 and
    Algorithm 1 line 7) and sends it with the `cka` task (fairfl.methods.fedlwr.client.AnchorCKA), with the sample to
    measure on; each site returns, per layer (module that owns parameters, matched by name), CKA(local, anchor) on a
    random sample of its data; the server re-aggregates
    every layer with weights (1 - CKA_k) / sum_i (1 - CKA_i) (Eq. 5-6)."""

    method = "fedlwr"
    # Eq. 5 can give one honest site most of a layer in ordinary rounds: a 0.5 cap would rewrite the method, so it
    # is off unless the job sets max_share
    default_max_share = 1.0

    def __init__(self, **arguments):
        """cka_clip and the CKA sample (cka_split, cka_max_samples, cka_batch_size: fairfl.methods.fedlwr.arguments)
        besides the round's arguments (FairRoundController), whose weighting (of the anchor) is uniform here by
        default: 1/K, the paper's and the authors' code."""
        super().__init__(**arguments)
        self.cka_clip = list(self.cka_clip) if self.cka_clip else None
        self._layers = None

    def answer_fields(self, task_name, round_num) -> dict:
        """The `cka` task's answer: CKA(local, anchor) for every layer of the network (`cka_report`)."""
        return {CKA: cka_report(self.layers())} if task_name == TASK_CKA else {}

    def cka_meta(self) -> dict:
        """The `cka` task's meta: every task's, and the sample each site measures CKA on."""
        return {
            **self.task_meta,
            CKA_SPLIT: self.cka_split,
            CKA_MAX_SAMPLES: self.cka_max_samples,
            CKA_BATCH_SIZE: self.cka_batch_size,
            CKA_MAX_POSITIONS: self.cka_max_positions,
        }

    def layers(self) -> dict:
        """{layer: its state keys} of the network (`parameter_layers`): the same every round, mapped once."""
        if self._layers is None:
            self._layers = parameter_layers(build_model(self.model_spec()))
        return self._layers

    def aggregate(self, round_num, global_state, updates, rejected):
        anchor_np, extras = super().aggregate(round_num, global_state, updates, rejected)
        layers = self.layers()
        results = self.ask(round_num, TASK_CKA, self.task_model(round_num, anchor_np, self.cka_meta()), sorted(updates))
        cka = {}
        for result in results:
            site = result.meta.get("client_name", "?")
            problem = self.answer_problem(TASK_CKA, round_num, result.meta)
            if problem:
                self.reject(round_num, site, f"CKA: {problem}", rejected, "CKA")
                continue
            cka[site] = {layer: float(v) for layer, v in result.meta[CKA].items()}
        if not cka:
            self.error(f"round {round_num}: no valid CKA; the anchor (FedAvg) becomes the global model")
            return anchor_np, {**extras, "anchor_only": True}
        cka = dict(sorted(cka.items()))  # answers arrive in any order; results read better sorted by site
        layer_weights = lwr_layer_weights(cka, clip=tuple(self.cka_clip) if self.cka_clip else None)
        layer_weights = {layer: self.bounded(weights) for layer, weights in layer_weights.items()}
        new_state = layerwise_average(
            {s: updates[s].state for s in cka}, layer_weights, layers, state_to_torch(anchor_np)
        )
        return state_to_numpy(new_state), {
            "anchor_weights": extras["weights"],
            "cka": cka,
            "layer_weights": layer_weights,
        }
