"""How tables, figures and the papers' claims name a metric: "dice" -> "Dice", "dice_cup" -> "Dice (cup)".

Only fairfl.text below it, so the method specs (a claim's text), the report and the benchmark all read it without
importing one another."""

from __future__ import annotations

from fairfl.text import markdown_text

METRIC_LABEL = {
    "dice": "Dice",
    "auc": "AUC",
    "acc": "Accuracy",
    "accuracy": "Accuracy",
    "balanced_accuracy": "Balanced accuracy",
    "corrupted_auc": "AUC (corrupted)",
    "corrupted_accuracy": "Accuracy (corrupted)",
    "corrupted_balanced_accuracy": "Balanced accuracy (corrupted)",
    "clean_auc": "AUC (clean)",
    "clean_accuracy": "Accuracy (clean)",
    "clean_balanced_accuracy": "Balanced accuracy (clean)",
}


def metric_label(metric: str) -> str:
    """ "dice" -> "Dice", "dice_cup" -> "Dice (cup)", as text (figures); an unknown metric as it is."""
    base, _, region = metric.partition("_")
    if metric not in METRIC_LABEL and region and base in METRIC_LABEL:
        return f"{METRIC_LABEL[base]} ({region})"
    return METRIC_LABEL.get(metric, metric)


def metric_label_markdown(metric: str) -> str:
    """`metric_label` as markdown (`markdown_text`: the metric may come from another centre's file)."""
    return markdown_text(metric_label(metric))
