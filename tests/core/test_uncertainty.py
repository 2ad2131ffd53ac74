"""Standard errors of a site's test metric (fairfl.uncertainty): against hand computations, against the spread of
the metric over simulated test sets, invariant to the order of a site's images, not fooled by slices of one
patient, and never NaN in a result."""

import math

import numpy as np
import pytest
import torch

from fairfl.classification import classification_metrics
from fairfl.report.runs import region_metrics
from fairfl.training import evaluate_dice
from fairfl.uncertainty import balanced_accuracy_se, clustered_mean_se, hanley_mcneil_se, macro_auc_se


def test_with_one_image_per_patient_it_is_the_plain_standard_error():
    values = np.random.default_rng(0).uniform(0.4, 0.9, 12)
    assert clustered_mean_se(values) == pytest.approx(values.std(ddof=1) / math.sqrt(values.size))


def test_slices_of_one_patient_do_not_shrink_it():
    """Repeating every patient's value over 6 slices is no new evidence: the clustered error stays the per-patient
    one, where the naive sd / sqrt(N) would shrink by sqrt(6)."""
    patients = np.random.default_rng(1).uniform(0.4, 0.9, 5)
    slices, cases = np.repeat(patients, 6), np.repeat(np.arange(5), 6)
    assert clustered_mean_se(slices, cases) == pytest.approx(clustered_mean_se(patients))
    assert slices.std(ddof=1) / math.sqrt(slices.size) < 0.5 * clustered_mean_se(slices, cases)


def test_two_regions_that_always_agree_are_no_more_precise_than_one():
    """Fundus scores disc and cup; when they move together per patient, averaging them is no new evidence: the
    joint error stays the single region's, where combining the two as independent would divide it by sqrt(2)."""
    rng = np.random.default_rng(6)
    disc, cases = rng.uniform(0.5, 0.9, 12), np.repeat(np.arange(4), 3)
    one = clustered_mean_se(disc, cases)
    assert clustered_mean_se(np.c_[disc, disc], cases) == pytest.approx(one)
    assert clustered_mean_se(np.c_[disc, disc - 0.1], cases) == pytest.approx(one)  # a shift changes nothing
    cup = rng.uniform(0.2, 0.6, 12)
    cup[0] = np.nan  # an image with no cup to score
    joint = clustered_mean_se(np.c_[disc, cup], cases)
    assert joint is not None and joint != pytest.approx(math.hypot(one, clustered_mean_se(cup, cases)) / 2)
    assert clustered_mean_se(np.c_[disc, np.full(12, np.nan)], cases) is None  # a region with nothing scored


def test_it_does_not_depend_on_the_order_of_the_images_and_skips_nan():
    rng = np.random.default_rng(2)
    values, cases = rng.uniform(size=20), rng.integers(0, 6, 20)
    order = rng.permutation(20)
    assert clustered_mean_se(values[order], cases[order]) == pytest.approx(clustered_mean_se(values, cases))
    with_nan = np.append(values, np.nan)
    assert clustered_mean_se(with_nan, np.append(cases, 0)) == pytest.approx(clustered_mean_se(values, cases))
    assert clustered_mean_se([0.5, 0.7, 0.9], ["a", "a", "a"]) is None  # one patient: no error to give
    with pytest.raises(ValueError):
        clustered_mean_se([0.5, 0.7], ["a"])


def test_balanced_accuracy_se_by_hand_and_against_simulated_test_sets():
    labels = np.array([0] * 10 + [1] * 4)
    predictions = np.array([0] * 8 + [1] * 2 + [1] * 3 + [0])  # 8 of 10 and 3 of 4: Agresti-Coull 10/14, 5/8
    assert balanced_accuracy_se(labels, predictions) == pytest.approx(
        math.sqrt((10 / 14) * (4 / 14) / 14 + (5 / 8) * (3 / 8) / 8) / 2
    )
    # with enough images the spread of bACC over many test sets drawn with these recalls is what it says
    labels = np.array([0] * 200 + [1] * 120)
    predictions = np.r_[np.zeros(160), np.ones(40), np.ones(90), np.zeros(30)]  # recalls 0.8 and 0.75
    rng = np.random.default_rng(3)
    draws = [(rng.binomial(200, 0.8) / 200 + rng.binomial(120, 0.75) / 120) / 2 for _ in range(20000)]
    assert np.std(draws) == pytest.approx(balanced_accuracy_se(labels, predictions), rel=0.05)
    assert balanced_accuracy_se([], []) is None


def test_a_perfect_or_hopeless_small_site_does_not_claim_an_error_of_zero():
    """3 and 1 test images all right (or all wrong) is not a certain bACC of 1 (or 0); nor is an AUC of 1 from 4
    images a certain AUC."""
    labels = np.array([0, 0, 0, 1])
    assert balanced_accuracy_se(labels, labels) > 0.1
    assert balanced_accuracy_se(labels, 1 - labels) > 0.1
    assert hanley_mcneil_se(1.0, 1, 3) > 0.1 and hanley_mcneil_se(0.0, 1, 3) > 0.1


def test_hanley_mcneil_by_hand_and_against_simulated_test_sets():
    assert hanley_mcneil_se(0.5, 10, 10) == pytest.approx(math.sqrt(0.0175))
    assert hanley_mcneil_se(0.9, 0, 5) is None
    # binormal scores with AUC about 0.84: the spread of the empirical AUC over test sets of 30 + 60
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(4)
    aucs = []
    for _ in range(3000):
        positives, negatives = rng.normal(1.4, 1, 30), rng.normal(0, 1, 60)
        aucs.append(roc_auc_score(np.r_[np.ones(30), np.zeros(60)], np.r_[positives, negatives]))
    assert np.std(aucs) == pytest.approx(hanley_mcneil_se(float(np.mean(aucs)), 30, 60), rel=0.15)
    assert macro_auc_se([0, 1, 1], [0.5]) is None  # one AUC for two classes: refused, not guessed
    assert macro_auc_se([0, 0, 0], []) is None


def test_classification_metrics_carry_their_errors_and_never_nan():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 3, 60)
    probs = rng.dirichlet(np.ones(3), 60)
    metrics = classification_metrics(labels, probs)
    assert 0 < metrics["balanced_accuracy_se"] < 0.5 and 0 < metrics["auc_se"] < 0.5
    one_class = classification_metrics(np.zeros(5, dtype=int), probs[:5])
    assert "auc_se" not in one_class and all(v == v for k, v in one_class.items() if k.endswith("_se"))


class _Constant(torch.nn.Module):
    """Predicts a fixed mask, so Dice per image is known."""

    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, image):
        logits = torch.stack([1 - self.mask, self.mask]).float()
        return logits.unsqueeze(0).repeat(image.shape[0], 1, 1, 1)


def test_evaluate_dice_reports_the_patient_clustered_error_and_leaves_it_out_for_one_patient():
    mask = torch.zeros(8, 8)
    mask[2:6, 2:6] = 1
    labels = [mask, mask, torch.zeros(8, 8), mask.roll(2, 0)]
    labels[2][2:6, 4:8] = 1
    batch = {
        "image": torch.zeros(4, 1, 8, 8),
        "label": torch.stack(labels).unsqueeze(1).long(),
        "case": ["a", "a", "b", "b"],
    }
    result = evaluate_dice(_Constant(mask), [batch], 2, torch.device("cpu"))
    per_image = [1.0, 1.0, 0.5, 0.5]  # overlaps of 16, 16, 8 and 8 pixels out of 16 + 16
    assert result["dice"] == pytest.approx(np.mean(per_image))
    assert result["dice_se"] == pytest.approx(clustered_mean_se(per_image, ["a", "a", "b", "b"]))
    alone = evaluate_dice(_Constant(mask), [{**batch, "case": ["a"] * 4}], 2, torch.device("cpu"))
    assert alone["dice"] == result["dice"] and "dice_se" not in alone
    no_cases = evaluate_dice(_Constant(mask), [{k: v for k, v in batch.items() if k != "case"}], 2, torch.device("cpu"))
    assert no_cases["dice_se"] == pytest.approx(clustered_mean_se(per_image))
    # integer patient ids (a datalist may use them) arrive collated into a tensor: still grouped by patient
    numbered = evaluate_dice(_Constant(mask), [{**batch, "case": torch.tensor([1, 1, 2, 2])}], 2, torch.device("cpu"))
    assert numbered["dice_se"] == pytest.approx(result["dice_se"])


def test_the_report_does_not_mistake_an_error_for_a_region():
    runs = [{"final": {"per_site": {"site-1": {"dice": 0.8, "dice_se": 0.05, "dice_cup": 0.7}}}}]
    assert region_metrics(runs, "dice") == ["dice_cup"]
