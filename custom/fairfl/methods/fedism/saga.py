"""FedISM+'s sharpness-aware global aggregation (SAGA, Wu et al. 2025, Eq. 16-18), as plain functions on dicts.

Each site reports, for the global model it received, its sharpness S and perturbed loss L over its whole
training set (`fairfl.methods.fedism.sharpness.measure_sharpness`). The server:
- checks each report (`check_report`, every field: `SHARPNESS_REPORT`): a site whose loss, perturbed loss,
  sharpness or gradient norm is missing, not a number, NaN/Inf or absurd (|value| above MAX_REPORTED) is rejected
  for the round, with the reason as the error to log;
- clips a negative value to 0, as the authors' code does (it floors sharpness at 1e-10): a sharpness is the
  difference of two float32 mean losses, and a flat site, or one whose ascent step overshoots, reports a value
  a little below 0. Such a site gets raw weight 0 but keeps its moving-average share (Eq. 18), so one noisy
  round does not drop it from the aggregate;
- turns the values into raw weights proportional to S^q (variant "S", Eq. 16) or L^q (variant "L", Eq. 17)
  (`saga_weights`);
- smooths them with the previous round's weights, w_t = beta w~_t + (1 - beta) w_{t-1}, w_1 = w~_1
  (`moving_average`, Eq. 18), keeping the per-site weights in `SagaState`, which is JSON-safe so the
  server saves it after each round and a restarted server goes on with the same moving average.

The FFL4MIA code (sharpness variant only, which we extend with L) floors sharpness at 1e-10, normalises,
adds 1e-10 and raises to q; up to those 1e-10s that is S^q / sum S^q, which is what we compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fairfl.aggregation import normalise
from fairfl.kinds import Real, Record
from fairfl.site_checks import MAX_REPORTED, MAX_SAMPLES

VARIANTS = {"S": "sharpness", "L": "perturbed_loss"}  # the report key each variant weights by
Q = 2.0  # the paper's defaults (the authors' code uses q = 1)
BETA = 0.5


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"SAGA variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    return variant


# every field of a site's sharpness report (`fairfl.methods.fedism.sharpness.measure_sharpness`) that the server reads
# or records: each a real finite number of magnitude at most MAX_REPORTED; a sharpness may be a little below 0
SHARPNESS_REPORT = Record(
    fields={
        "loss": Real(0.0, MAX_REPORTED),
        "perturbed_loss": Real(0.0, MAX_REPORTED),
        "sharpness": Real(-MAX_REPORTED, MAX_REPORTED),
        "grad_norm": Real(0.0, MAX_REPORTED),
    },
    optional={"rho": Real(0.0, MAX_REPORTED), "samples": Real(0.0, float(MAX_SAMPLES))},
)


def check_report(report, variant: str) -> str | None:
    """Why a site's sharpness report cannot be used, or None if it can: every field the server reads is present and
    a real finite number of magnitude at most MAX_REPORTED (`SHARPNESS_REPORT`; before, only the variant's value was
    checked and a string in another field ended the job). A negative sharpness is accepted and counts as 0 (see
    `saga_weights`)."""
    check_variant(variant)
    problem = SHARPNESS_REPORT.problem(report)
    return f"sharpness report {problem}" if problem else None


def saga_weights(values: dict, q: float = Q) -> dict:
    """Eq. 16/17: w~_k = max(v_k, 0)^q / sum_i max(v_i, 0)^q over the sites of `values` ({site: S or L}).

    A negative value is clipped to 0, as the authors' code floors it (NaN/Inf: ValueError); a site with value 0
    gets weight 0. When every value is 0 no site is distinguishable and the weights are equal."""
    if not values:
        raise ValueError("saga_weights: no sites")
    if not (math.isfinite(q) and q > 0):
        raise ValueError(f"q must be a finite number > 0 (Eq. 16), got {q}")
    bad = {s: v for s, v in values.items() if not math.isfinite(v)}
    if bad:
        raise ValueError(f"saga_weights: values must be finite, got {bad}")
    # normalise first (as the FFL4MIA code does) so that v^q cannot overflow or underflow for large q
    shares = normalise({s: max(float(v), 0.0) for s, v in values.items()})
    return normalise({s: v**q for s, v in shares.items()})


def moving_average(raw: dict, previous: dict, beta: float = BETA) -> dict:
    """Eq. 18: w_t = beta w~_t + (1 - beta) w_{t-1}, over the sites of `raw` (this round's), summing to 1.

    previous: {site: w_{t-1}}. Empty: the first round, w_1 = w~_1. Sites can change between rounds (a site
    rejected or late): w_{t-1} is restricted to this round's sites and renormalised; a site with no previous
    weight uses its raw weight in its place, so that it is neither favoured nor penalised for its absence."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if not previous:
        return dict(raw)
    before = normalise({s: previous.get(s, raw[s]) for s in raw})
    return normalise({s: beta * raw[s] + (1.0 - beta) * before[s] for s in raw})


@dataclass
class SagaState:
    """What the server carries across rounds: the variant and hyper-parameters it was started with, and each
    site's weight in the last round it was aggregated (the w_{t-1} of Eq. 18). JSON-safe (`to_dict`)."""

    variant: str = "S"
    q: float = Q
    beta: float = BETA
    weights: dict = field(default_factory=dict)  # site -> its weight in the last round it was aggregated
    rounds: int = 0  # rounds aggregated so far; 0: the next round uses the raw weights

    def __post_init__(self):
        check_variant(self.variant)

    def update(self, reports: dict) -> dict:
        """One round: {site: report} of the sites accepted this round (see `check_report`) -> {site: {"value",
        "raw", "weight"}}, the variant's value, the raw weight (Eq. 16/17) and the aggregation weight (Eq. 18).
        The weights are stored for the next round. A report `check_report` refuses raises ValueError: the
        controller rejects such a site before."""
        for site, report in reports.items():
            reason = check_report(report, self.variant)
            if reason:
                raise ValueError(f"SAGA: {site}: {reason}")
        key = VARIANTS[self.variant]
        values = {s: float(r[key]) for s, r in reports.items()}
        raw = saga_weights(values, self.q)
        weights = moving_average(raw, self.weights if self.rounds else {}, self.beta)
        self.weights.update(weights)
        self.rounds += 1
        return {s: {"value": values[s], "raw": raw[s], "weight": weights[s]} for s in sorted(weights)}

    def to_dict(self) -> dict:
        return {"variant": self.variant, "q": self.q, "beta": self.beta, "weights": self.weights, "rounds": self.rounds}

    @classmethod
    def from_dict(cls, data: dict) -> SagaState:
        return cls(**{k: data[k] for k in ("variant", "q", "beta", "weights", "rounds")})
