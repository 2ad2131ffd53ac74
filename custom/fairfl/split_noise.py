"""The noise of the test splits in a paired comparison of two methods over seeds.

Every seed of every method is scored on the same few test patients per site, so the seed-to-seed spread of a paired
difference says nothing about how those patients were drawn: with 2 to 6 patients a site, that noise is as large as
the differences judged, and it does not average out over seeds. This module measures it.

The difference judged is D = mean over paired seeds s of [S(x_A,s) - S(x_B,s)], where S is a statistic of the
per-site scores x (the mean over sites, their spread, the worst site, one site) and A, B the two methods. A cluster
bootstrap redraws each site's test patients (sites independent, patients the clusters, the same redraw for every run
scored on that split; where every site is scored on one shared test set, `ScoredRun.shared_test`, one redraw of it for
every site and run) and recomputes D. Each site's score is redrawn through its patients' influences (fairfl.
uncertainty: the score moves by sum_g e_g (w_g - 1) when patient g is drawn w_g times, exact to first order for a mean
of per-image values); the statistic S itself (a spread, a minimum) is computed exactly on the redrawn scores, so its
curvature counts. The redraws' deviations are scaled by sqrt(G / (G - 1)), so that for a single score the variance is
the sandwich variance the sites' standard errors use. `split_noise` returns the variance of D over DRAWS redraws (a
fixed random stream: the same inputs give the same number).

Patients of one site pair across runs only when the runs' records carry the same fingerprint of the patient ids;
records with another fingerprint (a split made anew) are redrawn independently.

The interval of D then adds the two sources: var = s^2 / n (the paired seeds' sample variance) + the split noise,
with the seeds' n - 1 degrees of freedom (fairfl.paired.mean_interval).

No FLARE, no torch."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

STATISTICS = ("avg", "std", "worst")  # and "site:<name>": one site's score


def statistic_value(scores: Mapping[str, float], statistic: str) -> float:
    """The statistic of per-site scores: "avg" (mean over sites), "std" (population std across sites, as the papers
    report it), "worst" (lowest site), "site:<name>"."""
    sites = list(scores)
    return float(statistic_columns(np.array([[scores[s] for s in sites]], dtype=np.float64), sites, statistic)[0])


def _site(statistic: str) -> str:
    if not statistic.startswith("site:"):
        raise ValueError(f"statistic must be one of {STATISTICS} or 'site:<name>', not {statistic!r}")
    return statistic[len("site:") :]


@dataclass(frozen=True)
class ScoredRun:
    """One run's final per-site scores (any unit) and each site's test-patient influences on them (in the metric's
    own unit: `scale` converts, 100 for percent): {site: {"cases": fingerprint, "values": [...]}}."""

    scores: Mapping[str, float]
    influences: Mapping[str, Mapping]
    scale: float = 100.0
    # every site scored on the same test patients in the same order (the built-in quality-shift data's one shared
    # test set, clean or corrupted): one redraw moves every site's score, so the sites' noise is not independent
    shared_test: bool = False


@dataclass(frozen=True)
class SplitNoise:
    """The test splits' variance of a paired difference of means."""

    variance: float

    @property
    def se(self) -> float:
        return math.sqrt(self.variance)


DRAWS = 4000  # redraws of the test patients: the variance's own Monte Carlo error is about 2%


SHARED_TEST = ""  # the patient group of a shared test set, in place of a site's name (no site is named "")


def _patients(run: ScoredRun, site: str, record: Mapping) -> tuple[str, str]:
    """The group of test patients `site`'s record was scored on: its own split's, or the run's shared test set's."""
    return (SHARED_TEST if run.shared_test else site, record["cases"])


def statistic_columns(scores, sites: list, statistic: str):
    """`statistic_value` of each row of `scores` [draws, sites]."""
    if statistic == "avg":
        return scores.mean(axis=1)
    if statistic == "std":
        return scores.std(axis=1)
    if statistic == "worst":
        return scores.min(axis=1)
    site = _site(statistic)
    if site not in sites:
        raise ValueError(f"no site {site!r} among {sorted(sites)}")
    return scores[:, sites.index(site)]


def split_noise(method: Mapping, baseline: Mapping, statistic: str, seeds: Iterable) -> SplitNoise | None:
    """The test-split variance of mean over `seeds` of [statistic(method[s]) - statistic(baseline[s])] (method,
    baseline: {seed: ScoredRun}); None when it cannot be told: a site the statistic depends on has no influences in
    a run, a patient group has a single patient, or one fingerprint comes with two numbers of patients."""
    seeds = list(seeds)
    runs = [(sign, run) for seed in seeds for sign, run in ((1.0, method[seed]), (-1.0, baseline[seed]))]
    if not runs:
        return None
    groups: dict[tuple[str, str], int] = {}

    def needed(run: ScoredRun) -> list[str]:  # the sites the statistic reads: only their records are checked and used
        return list(run.scores) if statistic in STATISTICS else [_site(statistic)]

    for _, run in runs:
        for site in needed(run):
            record = run.influences.get(site)
            if not record or site not in run.scores:
                return None
            key, size = _patients(run, site, record), len(record["values"])
            if size < 2 or groups.setdefault(key, size) != size:
                return None
    rng = np.random.default_rng(0)
    deviations = {
        key: (rng.multinomial(size, np.full(size, 1.0 / size), size=DRAWS) - 1.0) * math.sqrt(size / (size - 1))
        for key, size in sorted(groups.items())
    }
    total = np.zeros(DRAWS)
    for sign, run in runs:
        sites = list(run.scores)
        redrawn = np.tile(np.array([run.scores[s] for s in sites], dtype=np.float64), (DRAWS, 1))
        for j, site in enumerate(sites):
            record = run.influences.get(site) if site in needed(run) else None
            key = _patients(run, site, record) if record else None
            if key in deviations:
                redrawn[:, j] += run.scale * (deviations[key] @ np.asarray(record["values"], dtype=np.float64))
        total += sign * statistic_columns(redrawn, sites, statistic)
    total /= len(seeds)
    return SplitNoise(float(total.var()))
