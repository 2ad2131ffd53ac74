"""Standard errors of a site's test metric: how precisely its own test split measures it.

A site's Dice, balanced accuracy or AUC comes from a few dozen test images, often a handful of patients; a
difference between two methods at one site means little unless it is large against this error. Each function
returns the standard error of the metric as the site reports it, or None when the test split cannot give one
(fewer than two patients, or a class with a single example), so a result file never holds a NaN for it.

- `clustered_mean_se`: the mean of per-image values (Dice) when images of one patient are correlated: the
  cluster-robust (sandwich) standard error with patients as clusters, G / (G - 1) * sum_g (sum_{i in g} (x_i -
  mean))^2 / N^2, which is the plain sd / sqrt(N) when every image is its own patient and grows as slices of
  one patient agree with each other.
- `balanced_accuracy_se`: the mean recall over the classes present; each recall is a binomial proportion,
  sqrt(sum_c r_c (1 - r_c) / n_c) / C.
- `macro_auc_se`: the mean one-vs-rest AUC; each class's AUC by Hanley and McNeil (Radiology 1982),
  combined as sqrt(sum_c se_c^2) / C (classes taken as independent: a slight underestimate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def clustered_mean_se(values: Sequence[float], clusters: Sequence | None = None) -> float | None:
    """Standard error of mean(values), observations in the same cluster (patient) correlated; NaN values (an image
    with nothing to score) are left out, as the mean leaves them out. clusters: one label per value; None = each
    value its own cluster. None when fewer than two clusters remain."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    clusters = np.arange(values.size) if clusters is None else np.asarray(list(clusters), dtype=object)
    if clusters.size != values.size:
        raise ValueError(f"{values.size} values but {clusters.size} cluster labels")
    keep = np.isfinite(values)
    values, clusters = values[keep], clusters[keep]
    groups = {}
    for value, cluster in zip(values - values.mean() if values.size else values, clusters):
        groups[cluster] = groups.get(cluster, 0.0) + value
    g = len(groups)
    if g < 2:
        return None
    return math.sqrt(g / (g - 1) * sum(s * s for s in groups.values())) / values.size


def balanced_accuracy_se(labels, predictions) -> float | None:
    """Standard error of balanced accuracy (mean recall over the classes in `labels`); None without labels."""
    labels, predictions = np.asarray(labels).reshape(-1), np.asarray(predictions).reshape(-1)
    classes = np.unique(labels)
    if classes.size == 0:
        return None
    variance = 0.0
    for c in classes:
        hits = predictions[labels == c] == c
        recall = hits.mean()
        variance += recall * (1.0 - recall) / hits.size
    return math.sqrt(variance) / classes.size


def hanley_mcneil_se(auc: float, positives: int, negatives: int) -> float | None:
    """Hanley and McNeil's standard error of a binary AUC; None with fewer than one positive and one negative."""
    if positives < 1 or negatives < 1 or not math.isfinite(auc):
        return None
    q1, q2 = auc / (2.0 - auc), 2.0 * auc * auc / (1.0 + auc)
    variance = (auc * (1.0 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc)) \
        / (positives * negatives)
    return math.sqrt(max(variance, 0.0))


def macro_auc_se(labels, per_class_auc: Sequence[float]) -> float | None:
    """Standard error of the macro one-vs-rest AUC over the classes present in `labels`, from each class's AUC
    (`per_class_auc`, in the order of np.unique(labels)); None when fewer than two classes are present."""
    labels = np.asarray(labels).reshape(-1)
    classes = np.unique(labels)
    if classes.size < 2 or len(per_class_auc) != classes.size:
        return None
    errors = [hanley_mcneil_se(a, int((labels == c).sum()), int((labels != c).sum()))
              for c, a in zip(classes, per_class_auc)]
    if any(e is None for e in errors):
        return None
    return math.sqrt(sum(e * e for e in errors)) / classes.size
