"""FedCE contribution estimation (Jiang et al., CVPR 2023, Eq. 2-5), as plain functions on tensors and dicts.

Per round k and site i:
- gradient term (Eq. 2): 1 - cos(update_i, aggregated update without i), where the aggregate uses the
  weights p that built the model the sites trained from: (sum_j p_j u_j - p_i u_i) / (1 - p_i);
- data term (Eq. 3): error (1 - Dice) of the leave-one-out model on the site's validation split, measured
  by the site (the leave-one-out model itself is built on the site, from the global model and its own
  previous local model: w^-i = (w - p_i w_i) / (1 - p_i));
- each term normalised to sum 1 over the sites of the round, combined by sum or product (Eq. 4),
  accumulated over rounds, and normalised into the aggregation weights (Eq. 5).

Eq. 5 writes the normaliser as Z_k = k * sum_i sum_k Gamma; the extra factor k would make the weights sum
to 1/k, so we normalise to sum 1 as the sentence after Eq. 5 requires."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from fairfl.aggregation import normalise

COMBINE_MODES = ("sum", "product")


def flatten(state: Mapping[str, torch.Tensor], names) -> torch.Tensor:
    """The tensors `names` of a state dict as one float64 vector (float64: cosines of long vectors)."""
    return torch.cat([state[name].detach().reshape(-1).to(device="cpu", dtype=torch.float64) for name in names])


def gradient_terms(updates: dict, prior: dict) -> dict:
    """{site: 1 - cos(u_i, u_-i)} for flattened updates u (local model - global model), Eq. 2.

    prior: the sites' weights p in the model they trained from; renormalised over `updates`.
    A site whose update is zero adds no direction: its term is 0. When the others' aggregate is zero (a single
    site, or all others zero) nothing points anywhere else and the term is 1 (orthogonal)."""
    sites = sorted(updates)
    p = normalise({s: prior[s] for s in sites})
    total = sum(p[s] * updates[s] for s in sites)
    terms = {}
    for s in sites:
        rest = total - p[s] * updates[s]  # the 1 / (1 - p_i) of Eq. 2 does not change a cosine
        if float(updates[s].norm()) == 0.0:
            terms[s] = 0.0
        elif float(rest.norm()) <= 1e-12 * float(updates[s].norm()):
            terms[s] = 1.0
        else:
            # a cosine's rounding may exceed 1 for parallel updates (1 - cos = -2e-16): clamped into [0, 2]
            cosine = float(torch.nn.functional.cosine_similarity(updates[s], rest, dim=0))
            terms[s] = min(max(1.0 - cosine, 0.0), 2.0)
    return terms


def combine(gradient: dict, data: dict, mode: str) -> dict:
    """Eq. 4 on normalised terms: Gamma^s = gradient + data, Gamma^m = gradient * data."""
    if mode not in COMBINE_MODES:
        raise ValueError(f"combine must be one of {COMBINE_MODES}, got {mode!r}")
    if set(gradient) != set(data):
        raise ValueError(f"gradient terms for {sorted(gradient)} but data terms for {sorted(data)}")
    if mode == "sum":
        return {s: gradient[s] + data[s] for s in gradient}
    return {s: gradient[s] * data[s] for s in gradient}


def leave_one_out_error(dice: float) -> float:
    """The data term's raw value: error = 1 - Dice (the paper: "the full performance score 1 minus ...")."""
    if not (math.isfinite(dice) and -1e-6 <= dice <= 1 + 1e-6):
        raise ValueError(f"leave-one-out Dice must be in [0, 1], got {dice!r}")
    return min(max(1.0 - dice, 0.0), 1.0)


@dataclass
class ContributionState:
    """What the server carries across rounds: per-site sums of the combined and of each normalised term, and
    the weights that built the current global model (the p of the next round's leave-one-out). JSON-safe, so
    it is saved to disk after every round and survives a server restart."""

    mode: str = "sum"
    accumulated: dict = field(default_factory=dict)  # site -> sum over rounds of Gamma (Eq. 5's numerator)
    gradient_sums: dict = field(default_factory=dict)
    data_sums: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)  # site -> weight in the current global model (0 if not in it)
    rounds: int = 0  # rounds that have contributed terms

    def update(self, gradient: dict, data: dict) -> dict:
        """Add one round's raw terms (gradient: 1 - cos, data: leave-one-out error) of the sites accepted this
        round; return the round's normalised and combined terms per site."""
        g, d = normalise(gradient), normalise(data)
        combined = combine(g, d, self.mode)
        for s in combined:
            self.accumulated[s] = self.accumulated.get(s, 0.0) + combined[s]
            self.gradient_sums[s] = self.gradient_sums.get(s, 0.0) + g[s]
            self.data_sums[s] = self.data_sums.get(s, 0.0) + d[s]
        self.rounds += 1
        return {s: {"gradient": g[s], "data": d[s], "combined": combined[s]} for s in sorted(combined)}

    def contributions(self) -> dict:
        """Eq. 5: accumulated contributions normalised over every site seen so far."""
        return normalise(self.accumulated) if self.accumulated else {}

    def aggregation_weights(self, sites) -> dict:
        """Eq. 5 restricted to the sites aggregated this round (a rejected site's share is renormalised away)."""
        return normalise({s: self.accumulated.get(s, 0.0) for s in sites})

    def term_shares(self) -> dict:
        """Each term accumulated over rounds and normalised: which space a site's contribution comes from."""
        g, d = normalise(self.gradient_sums), normalise(self.data_sums)
        return {s: {"gradient": g[s], "data": d[s]} for s in sorted(g)}

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "accumulated": self.accumulated,
            "gradient_sums": self.gradient_sums,
            "data_sums": self.data_sums,
            "weights": self.weights,
            "rounds": self.rounds,
        }

    @classmethod
    def from_dict(cls, data: dict) -> ContributionState:
        return cls(**{k: data[k] for k in ("mode", "accumulated", "gradient_sums", "data_sums", "weights", "rounds")})
