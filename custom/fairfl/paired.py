"""Paired comparisons over seeds: a method against a baseline run with the same seeds, judged on the per-seed
differences (method - baseline, same seed) and the Student t interval of their mean (n - 1 degrees of freedom).

Seeds shared by both are paired; a seed missing or not finite (NaN, inf, None) on either side is left out. With no
paired seed the interval is undefined (NaN), with one it is unbounded: neither can decide a claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOLDS, FAILS, INCONCLUSIVE = "holds", "fails", "inconclusive"


@dataclass(frozen=True)
class Interval:
    """Mean of the paired differences and its two-sided `confidence` interval [low, high]; n paired seeds; split_se:
    the test splits' share of its standard error (fairfl.split_noise), None where it was not counted."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    split_se: float | None = None

    def text(self, digits: int = 2) -> str:
        """e.g. "+2.40 [+1.16, +3.64]"; "+2.40 (1 seed)"; "–" with no paired seed."""
        if self.n == 0:
            return "–"
        if self.n == 1:
            return f"{self.mean:+.{digits}f} (1 seed)"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def as_json(self) -> dict:
        """JSON-safe (no NaN or infinity: None instead)."""
        finite = lambda v: v if math.isfinite(v) else None  # noqa: E731
        return {
            "mean": finite(self.mean),
            "low": finite(self.low),
            "high": finite(self.high),
            "n": self.n,
            "confidence": self.confidence,
            **({"split_se": self.split_se} if self.split_se is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> Interval:
        """The inverse of as_json (None: NaN for the mean, the unbounded side for low and high)."""
        value = lambda key, default: default if data[key] is None else float(data[key])  # noqa: E731
        return cls(
            value("mean", math.nan),
            value("low", -math.inf if data["n"] == 1 else math.nan),
            value("high", math.inf if data["n"] == 1 else math.nan),
            int(data["n"]),
            float(data.get("confidence", 0.95)),
            None if data.get("split_se") is None else float(data["split_se"]),
        )


def _number(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def paired_differences(values: dict, baseline: dict) -> dict:
    """{seed: values[seed] - baseline[seed]} over the seeds both have with finite values, in seed order."""
    pairs = {seed: (_number(values[seed]), _number(baseline[seed])) for seed in values if seed in baseline}
    return {seed: a - b for seed, (a, b) in sorted(pairs.items()) if a is not None and b is not None}


def mean_interval(differences, confidence: float = 0.95, split=None) -> Interval:
    """The mean of the differences and its Student t interval (sample sd, n - 1 dof); non-finite values left out.
    split (a fairfl.split_noise.SplitNoise of the same mean): the test splits' variance is added to the seeds' s^2 / n,
    still with the seeds' n - 1 degrees of freedom, so that counting the splits never narrows an interval (the
    Satterthwaite degrees of freedom of the sum would be larger, and could)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence!r}")
    values = [v for v in map(_number, differences) if v is not None]
    n = len(values)
    split_se = None if split is None else split.se
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, confidence, split_se)
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(mean, -math.inf, math.inf, 1, confidence, split_se)
    from scipy.stats import t

    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    quantile = float(t.ppf((1 + confidence) / 2, n - 1))
    if split is None or split.variance == 0.0:
        half = quantile * sd / math.sqrt(n)
    else:
        half = quantile * math.sqrt(sd * sd / n + split.variance)
    return Interval(mean, mean - half, mean + half, n, confidence, split_se)


def paired_interval(values: dict, baseline: dict, confidence: float = 0.95) -> Interval:
    """The interval of the paired per-seed differences of `values` ({seed: value}) against `baseline`'s."""
    return mean_interval(paired_differences(values, baseline).values(), confidence)


def verdict(interval: Interval, bound: float = 0.0, above: bool = True, strict: bool = False) -> str:
    """Judge the claim "difference >= bound" (above; > if strict) or "difference <= bound" (not above; < if strict)
    on the interval: it holds when every value of the interval satisfies it, fails when none does, and is
    inconclusive otherwise, always with fewer than two paired seeds."""
    if interval.n < 2:
        return INCONCLUSIVE

    def satisfied(d):
        if above:
            return d > bound if strict else d >= bound
        return d < bound if strict else d <= bound

    worst, best = (interval.low, interval.high) if above else (interval.high, interval.low)
    if satisfied(worst):
        return HOLDS
    return INCONCLUSIVE if satisfied(best) else FAILS
