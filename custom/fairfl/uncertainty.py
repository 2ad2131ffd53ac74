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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def clustered_mean_se(values, clusters: Sequence | None = None) -> float | None:
    """Standard error of the mean of `values` [N] or of the mean over regions of the per-region means of `values`
    [N, R], observations in the same cluster (patient) correlated; NaN values (nothing to score) are left out, as
    the means leave them out. clusters: one label per row; None = each row its own cluster. None when fewer than two
    clusters remain, or a region has nothing to score."""
    values = np.asarray(values, dtype=np.float64)
    values = values.reshape(-1, 1) if values.ndim == 1 else values
    clusters = np.arange(len(values)) if clusters is None else np.asarray(list(clusters), dtype=object)
    if clusters.size != len(values):
        raise ValueError(f"{len(values)} values but {clusters.size} cluster labels")
    finite = np.isfinite(values)
    counts = finite.sum(axis=0)
    if not len(values) or (counts == 0).any():
        return None
    means = np.nanmean(np.where(finite, values, np.nan), axis=0)
    influence = (np.where(finite, values - means, 0.0) / (counts * values.shape[1])).sum(axis=1)
    groups = {}
    for u, cluster, used in zip(influence, clusters, finite.any(axis=1), strict=True):
        if used:
            groups[cluster] = groups.get(cluster, 0.0) + u
    g = len(groups)
    if g < 2:
        return None
    return math.sqrt(g / (g - 1) * sum(e * e for e in groups.values()))


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
