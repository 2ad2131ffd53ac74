"""Classification pieces of FedISM+'s pipeline: the logit-adjusted cross-entropy used for label skew and the
metrics of the paper's tables (accuracy, AUC) plus balanced accuracy, by scikit-learn.

Training uses `fairfl.training.train_local(..., loss_fn=LogitAdjustedCrossEntropy(counts))` (FedAvg-style
local training) or `fairfl.methods.fedism.sharpness.train_salt(..., loss_fn=...)` (SALT).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import accuracy_score, balanced_accuracy_score, roc_auc_score

from fairfl.uncertainty import (
    balanced_accuracy_influence,
    balanced_accuracy_se,
    case_influence_record,
    macro_auc_influence,
    macro_auc_se,
)

ABSENT_CLASS_COUNT = 0.5  # a class a site has no example of counts as half an example (see below)


def class_counts(labels: Iterable[int], num_classes: int) -> list[int]:
    """How many examples of each class, e.g. from a site's training datalist: [e["label"] for e in entries]."""
    counts = np.bincount(np.asarray(list(labels), dtype=np.int64).reshape(-1), minlength=num_classes)
    if counts.size > num_classes:
        raise ValueError(f"labels must lie in [0, {num_classes - 1}], found {counts.size - 1}")
    return [int(c) for c in counts]


def _flat_labels(target: torch.Tensor) -> torch.Tensor:
    """Class indices as a 1-D long tensor: a loader gives [B] or [B, 1]."""
    return target.reshape(-1).long()


class LogitAdjustedCrossEntropy(torch.nn.Module):
    """Cross-entropy on logits shifted by tau log(prior) (Menon et al., ICLR 2021, the logit-adjusted loss;
    FedISM+ Sec. IV-A4 uses it against label skew): loss = CE(z + tau log pi, y), pi the site's class prior.
    At test time the raw logits z are used, which removes the site's prior from the prediction.

    Args:
        counts: the site's training examples per class.
        tau: scale of the adjustment; 1 as in the paper's code, 0 is plain cross-entropy.

    A class absent at a site has prior 0, whose log is -inf (the FFL4MIA code would produce it): here it
    counts as ABSENT_CLASS_COUNT examples, so its adjustment is finite but below every present class's and the
    loss leaves that class's logit almost alone, as -inf would, without infinities or NaN gradients.
    """

    def __init__(self, counts: Sequence[float], tau: float = 1.0):
        super().__init__()
        counts = torch.as_tensor(counts, dtype=torch.float64).reshape(-1)
        if counts.numel() < 2 or bool((counts < 0).any()) or not bool(torch.isfinite(counts).all()):
            raise ValueError(f"counts must be >= 0 for at least two classes, got {counts.tolist()}")
        if not math.isfinite(tau):
            raise ValueError(f"tau must be finite, got {tau}")
        counts = torch.where(counts > 0, counts, torch.full_like(counts, ABSENT_CLASS_COUNT))
        self.register_buffer("adjustment", (tau * torch.log(counts / counts.sum())).float())

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits + self.adjustment.to(logits), _flat_labels(target))


def macro_ovr_auc(labels: np.ndarray, probs: np.ndarray) -> float:
    """Macro one-vs-rest AUC over the classes present in `labels`: the mean over those classes c of the
    binary AUC of probs[:, c] for "label == c". With every class present (and probabilities that sum to 1)
    this is scikit-learn's roc_auc_score(multi_class="ovr", average="macro"), which instead returns NaN when a
    class is missing from the labels; a class with no test example has no AUC, so it is left out. NaN when
    fewer than two classes are present (no negatives or no positives)."""
    return mean_auc(per_class_auc(labels, probs))


def mean_auc(per_class: list[float]) -> float:
    """The macro AUC of `per_class_auc`'s values; NaN when there are none."""
    return float(np.mean(per_class)) if per_class else float("nan")


def per_class_auc(labels: np.ndarray, probs: np.ndarray) -> list[float]:
    """The binary AUC of probs[:, c] for "label == c", for each class c present in `labels` (np.unique order);
    [] when fewer than two classes are present."""
    present = np.unique(labels)
    if present.size < 2:
        return []
    return [float(roc_auc_score(labels == c, probs[:, c])) for c in present]


def classification_metrics(labels, probs) -> dict:
    """{"accuracy", "balanced_accuracy", "auc"} of predicted class probabilities [N, C] against labels [N].

    Prediction: argmax of probs. Balanced accuracy is scikit-learn's (mean recall over the classes present in
    the labels; a predicted class with no test example only lowers the recall of the true classes). AUC:
    `macro_ovr_auc`. Every value NaN with no samples.

    These are FedNPR's per-site metrics as they stand: bACC (mean per-class accuracy, i.e. recall) is
    "balanced_accuracy" and bAUC (mean per-class AUC) is "auc"; on a site's own test set both average over
    the classes that test set has, so a class the site lacks neither counts nor yields NaN. Their standard
    errors (`fairfl.uncertainty`) come as "balanced_accuracy_se" and "auc_se" where the test set gives one."""
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if labels.size == 0:
        return {"accuracy": float("nan"), "balanced_accuracy": float("nan"), "auc": float("nan")}
    if probs.ndim != 2 or probs.shape[0] != labels.size:
        raise ValueError(f"probs must be [N, C] with N = {labels.size}, got {probs.shape}")
    if labels.min() < 0 or labels.max() >= probs.shape[1]:
        raise ValueError(f"labels must lie in [0, {probs.shape[1] - 1}]")
    predictions = probs.argmax(axis=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="y_pred contains classes not in y_true")
        balanced = balanced_accuracy_score(labels, predictions)
    per_class = per_class_auc(labels, probs)
    errors = {
        "balanced_accuracy_se": balanced_accuracy_se(labels, predictions),
        "auc_se": macro_auc_se(labels, per_class),
    }
    return {
        "accuracy": float(accuracy_score(labels, predictions)),
        "balanced_accuracy": float(balanced),
        "auc": mean_auc(per_class),
        **{k: v for k, v in errors.items() if v is not None},
    }


@torch.no_grad()
def predict_probabilities(model, loader, device) -> tuple[np.ndarray, np.ndarray]:
    """(labels [N], softmax probabilities [N, C]) of `model` in eval mode over `loader`."""
    model.to(device).eval()
    labels, probs = [], []
    for batch in loader:
        logits = model(batch["image"].to(device))
        probs.append(torch.softmax(logits.float(), dim=1).cpu().numpy())
        labels.append(_flat_labels(batch["label"]).cpu().numpy())
    if not labels:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 0))
    return np.concatenate(labels), np.concatenate(probs)


def evaluate_classification(model, loader, num_classes: int, device, case_influence=None) -> dict:
    """Accuracy, balanced accuracy and macro one-vs-rest AUC of `model` (eval mode) on `loader`
    (see `classification_metrics`); the counterpart of `fairfl.training.evaluate_dice`. `case_influence` (a dict):
    filled with each image's influence on "balanced_accuracy" and "auc" as a site sends it
    (`classification_influence`)."""
    labels, probs = predict_probabilities(model, loader, device)
    if labels.size and probs.shape[1] != num_classes:
        raise ValueError(f"the model gives {probs.shape[1]} classes, expected {num_classes}")
    if case_influence is not None:
        case_influence.update(classification_influence(labels, probs))
    return classification_metrics(labels, probs)


def classification_influence(labels, probs) -> dict:
    """{"balanced_accuracy": record, "auc": record} of each test image's influence on the two metrics (images in the
    loader's order are the clusters: fairfl.uncertainty.case_influence_record); a metric without one left out."""
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if not labels.size:
        return {}
    records = {
        "balanced_accuracy": case_influence_record(balanced_accuracy_influence(labels, probs.argmax(axis=1))),
        "auc": case_influence_record(macro_auc_influence(labels, probs)),
    }
    return {name: record for name, record in records.items() if record is not None}
