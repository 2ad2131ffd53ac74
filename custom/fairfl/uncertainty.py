"""Standard errors of a site's test metric: how precisely its own test split measures it.

A site's Dice, balanced accuracy or AUC comes from a few dozen test images, often a handful of patients; a
difference between two methods at one site means little unless it is large against this error. Each function
returns the standard error of the metric as the site reports it, or None when the test split cannot give one
(fewer than two patients; fewer than two classes for AUC), so a result file never holds a NaN for it. With few
patients the error is itself rough: a 95% interval from G patients takes t(G - 1) errors (12.7 with 2, 4.3 with 3).

- `clustered_mean_se`: the mean of per-image values (Dice), or the mean over regions of such means (fundus: disc
  and cup), when images of one patient are correlated: the cluster-robust (sandwich) standard error with patients
  as clusters. Each image contributes u_i = sum_r (x_ir - m_r) / (N_r R) (the linearised mean of region means;
  regions of one image are summed, so their correlation counts), and the variance is G / (G - 1) sum_g
  (sum_{i in g} u_i)^2. With one region and one image per patient it is the plain sd / sqrt(N); it grows as
  slices of one patient agree with each other.
- `balanced_accuracy_se`: the mean recall over the classes present; each recall a binomial proportion with the
  Agresti-Coull adjustment ((x + 2) / (n + 4) over n + 4), so a recall of 0 or 1 from a few images does not
  claim an error of 0; combined as sqrt(sum_c var_c) / C.
- `macro_auc_se`: the mean one-vs-rest AUC; each class's AUC by Hanley and McNeil (Radiology 1982), with the AUC
  kept half a pair away from 0 and 1 (an empirical AUC of 1 from a few images is not certainty); combined as
  sqrt(sum_c se_c^2) / C (classes taken as independent: a slight underestimate).

Comparing two methods on the same test split needs more than each one's error: the same patients score both, so
their errors are correlated. For that each metric also has its per-patient influence (`*_influence`: {patient: e_g},
the linearised effect of patient g on the metric: the metric moves by about sum_g e_g (w_g - 1) when patient g is
drawn w_g times in a resampled test split), which the site sends in patient-sorted order with a fingerprint of the
sorted patient ids (`case_influence_record`), never the ids themselves. The variance of any smooth function of many
such metrics over resampled test splits (a cluster bootstrap) is then sum_g G / (G - 1) (sum of its gradient times
e_g)^2: the infinitesimal jackknife of that bootstrap (fairfl.test_split); for a single metric it is the sandwich
variance above (`cluster_se`).
- Dice: e_g = sum_{i in g} u_i as above.
- Balanced accuracy: image i of class c moves recall_c by (hit_i - recall_c) / n_c, the mean by 1 / C of that.
- Macro AUC: each class's AUC is a two-sample U-statistic; a positive i moves it by (V10_i - AUC) / m, a negative j by
  (V01_j - AUC) / n (DeLong's placements: V10_i the share of negatives ranked below positive i, ties half), the
  macro mean by 1 / C of that.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

import numpy as np


def clustered_mean_se(values, clusters: Sequence | None = None) -> float | None:
    """Standard error of the mean of `values` [N] or of the mean over regions of the per-region means of `values`
    [N, R], observations in the same cluster (patient) correlated; NaN values (nothing to score) are left out, as
    the means leave them out. clusters: one label per row; None = each row its own cluster. None when fewer than two
    clusters remain, or a region has nothing to score."""
    influence = mean_influence(values, clusters)
    return None if influence is None else cluster_se(influence)


def mean_influence(values, clusters: Sequence | None = None) -> dict | None:
    """{cluster: its influence e_g} on the mean over regions of the per-region means of `values` [N] or [N, R] (see
    `clustered_mean_se`; clusters of NaN rows only are left out); None when a region has nothing to score."""
    values = np.asarray(values, dtype=np.float64)
    values = values.reshape(-1, 1) if values.ndim == 1 else values
    clusters = _clusters(clusters, len(values))
    finite = np.isfinite(values)
    counts = finite.sum(axis=0)
    if not len(values) or (counts == 0).any():
        return None
    means = np.nanmean(np.where(finite, values, np.nan), axis=0)
    influence = (np.where(finite, values - means, 0.0) / (counts * values.shape[1])).sum(axis=1)
    return summed_by_cluster(influence, clusters, finite.any(axis=1))


def summed_by_cluster(influence, clusters, used=None) -> dict:
    """{cluster: the sum of its rows' influence} over the `used` rows (default all)."""
    used = np.ones(len(influence), dtype=bool) if used is None else used
    groups: dict = {}
    for u, cluster, keep in zip(influence, clusters, used, strict=True):
        if keep:
            groups[cluster] = groups.get(cluster, 0.0) + float(u)
    return groups


def cluster_se(influence: Mapping) -> float | None:
    """The standard error sqrt(G / (G - 1) sum_g e_g^2) of a metric from its per-cluster influences; None with fewer
    than two clusters."""
    g = len(influence)
    if g < 2:
        return None
    return math.sqrt(g / (g - 1) * sum(e * e for e in influence.values()))


def balanced_accuracy_se(labels, predictions) -> float | None:
    """Standard error of balanced accuracy (mean recall over the classes in `labels`); None without labels."""
    labels, predictions = np.asarray(labels).reshape(-1), np.asarray(predictions).reshape(-1)
    classes = np.unique(labels)
    if classes.size == 0:
        return None
    variance = 0.0
    for c in classes:
        hits = predictions[labels == c] == c
        adjusted = (hits.sum() + 2.0) / (hits.size + 4.0)  # Agresti-Coull
        variance += adjusted * (1.0 - adjusted) / (hits.size + 4.0)
    return math.sqrt(variance) / classes.size


def hanley_mcneil_se(auc: float, positives: int, negatives: int) -> float | None:
    """Hanley and McNeil's standard error of a binary AUC (kept half a pair inside (0, 1)); None with fewer than one
    positive and one negative."""
    if positives < 1 or negatives < 1 or not math.isfinite(auc):
        return None
    half_pair = 0.5 / (positives * negatives)
    auc = min(max(auc, half_pair), 1.0 - half_pair)
    q1, q2 = auc / (2.0 - auc), 2.0 * auc * auc / (1.0 + auc)
    variance = (auc * (1.0 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc)) / (
        positives * negatives
    )
    return math.sqrt(max(variance, 0.0))


def macro_auc_se(labels, per_class_auc: Sequence[float]) -> float | None:
    """Standard error of the macro one-vs-rest AUC over the classes present in `labels`, from each class's AUC
    (`per_class_auc`, in the order of np.unique(labels)); None when fewer than two classes are present."""
    labels = np.asarray(labels).reshape(-1)
    classes = np.unique(labels)
    if classes.size < 2 or len(per_class_auc) != classes.size:
        return None
    errors = [
        hanley_mcneil_se(a, int((labels == c).sum()), int((labels != c).sum()))
        for c, a in zip(classes, per_class_auc, strict=True)
    ]
    if any(e is None for e in errors):
        return None
    return math.sqrt(sum(e * e for e in errors)) / classes.size


def balanced_accuracy_influence(labels, predictions, clusters: Sequence | None = None) -> dict | None:
    """{cluster: influence} on balanced accuracy (mean recall over the classes in `labels`); None without labels.
    clusters: one per image (None: each image its own)."""
    labels, predictions = np.asarray(labels).reshape(-1), np.asarray(predictions).reshape(-1)
    classes = np.unique(labels)
    if classes.size == 0:
        return None
    influence = np.zeros(labels.size)
    for c in classes:
        members = labels == c
        hits = (predictions[members] == c).astype(np.float64)
        influence[members] = (hits - hits.mean()) / (hits.size * classes.size)
    return summed_by_cluster(influence, _clusters(clusters, labels.size))


def macro_auc_influence(labels, probs, clusters: Sequence | None = None) -> dict | None:
    """{cluster: influence} on the macro one-vs-rest AUC over the classes present in `labels` (DeLong's placements,
    ties half); None when fewer than two classes are present."""
    labels, probs = np.asarray(labels).reshape(-1), np.asarray(probs, dtype=np.float64)
    classes = np.unique(labels)
    if classes.size < 2:
        return None
    influence = np.zeros(labels.size)
    for c in classes:
        positive = labels == c
        scores_pos, scores_neg = probs[positive, c], np.sort(probs[~positive, c])
        scores_neg_unsorted = probs[~positive, c]
        scores_pos_sorted = np.sort(scores_pos)
        # V10: the share of negatives each positive outranks (ties half); V01: of positives ranked above each negative
        v10 = (np.searchsorted(scores_neg, scores_pos, "left") + np.searchsorted(scores_neg, scores_pos, "right")) / (
            2.0 * scores_neg.size
        )
        v01 = 1.0 - (
            np.searchsorted(scores_pos_sorted, scores_neg_unsorted, "left")
            + np.searchsorted(scores_pos_sorted, scores_neg_unsorted, "right")
        ) / (2.0 * scores_pos.size)
        auc = v10.mean()
        influence[positive] += (v10 - auc) / (scores_pos.size * classes.size)
        influence[~positive] += (v01 - auc) / (scores_neg.size * classes.size)
    return summed_by_cluster(influence, _clusters(clusters, labels.size))


def _clusters(clusters: Sequence | None, size: int) -> np.ndarray:
    clusters = np.arange(size) if clusters is None else np.asarray(list(clusters), dtype=object)
    if clusters.size != size:
        raise ValueError(f"{size} values but {clusters.size} cluster labels")
    return clusters


# the most patients a site reports influences for: a site's test split is far smaller; a record past it is refused
MAX_CASES = 100_000


def case_fingerprint(clusters) -> str:
    """A short hash of the sorted cluster (patient) ids: two records of one site pair patient by patient only when
    their fingerprints agree (the ids themselves never leave the site)."""
    names = sorted(str(c) for c in clusters)
    return hashlib.sha256("\x00".join(names).encode()).hexdigest()[:16]


def case_influence_record(influence: Mapping | None) -> dict | None:
    """{"cases": fingerprint, "values": [e_g in the order of the sorted ids]}: what a site sends of a metric's
    influences; None without any or past MAX_CASES."""
    if not influence or len(influence) > MAX_CASES:
        return None
    order = sorted(influence, key=str)
    return {"cases": case_fingerprint(order), "values": [float(influence[c]) for c in order]}
