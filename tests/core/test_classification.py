"""Logit-adjusted cross-entropy, classification metrics against scikit-learn, and the classification networks."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from monai.networks.nets import UNet
from sklearn.metrics import accuracy_score, balanced_accuracy_score, roc_auc_score

from fairfl.classification import (
    LogitAdjustedCrossEntropy,
    class_counts,
    classification_metrics,
    evaluate_classification,
    macro_ovr_auc,
)
from fairfl.models import build_model
from fairfl.training import TrainSettings, train_local

torch.set_num_threads(1)


def random_probs(n, c, seed=0):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(c), size=n), rng


def test_logit_adjusted_loss_is_cross_entropy_on_shifted_logits():
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(6, 3, generator=g), torch.tensor([0, 1, 2, 2, 1, 0])
    counts = [10, 30, 60]
    prior = torch.tensor(counts, dtype=torch.float32) / 100
    expected = F.cross_entropy(logits + torch.log(prior), target)
    assert float(LogitAdjustedCrossEntropy(counts)(logits, target)) == pytest.approx(float(expected), rel=1e-6)
    half = F.cross_entropy(logits + 0.5 * torch.log(prior), target)
    assert float(LogitAdjustedCrossEntropy(counts, tau=0.5)(logits, target)) == pytest.approx(float(half), rel=1e-6)
    assert float(LogitAdjustedCrossEntropy(counts, tau=0.0)(logits, target.reshape(-1, 1))) == pytest.approx(
        float(F.cross_entropy(logits, target)), rel=1e-6
    )  # tau 0: plain CE; [B, 1] labels as a loader gives
    balanced = LogitAdjustedCrossEntropy([5, 5, 5])(logits, target)
    assert float(balanced) == pytest.approx(float(F.cross_entropy(logits, target)), rel=1e-6)  # uniform prior


def test_class_absent_at_a_site_gives_finite_loss_and_gradients():
    logits = torch.zeros(4, 3, requires_grad=True)
    loss_fn = LogitAdjustedCrossEntropy([20, 0, 20])
    loss = loss_fn(logits, torch.tensor([0, 2, 0, 2]))
    loss.backward()
    assert math.isfinite(float(loss.detach())) and bool(torch.isfinite(logits.grad).all())
    # the absent class's logit is barely pushed down; present classes get the usual gradient
    assert float(logits.grad[:, 1].abs().max()) < 0.05 * float(logits.grad[:, 0].abs().max())
    assert float(loss_fn.adjustment[1]) == pytest.approx(math.log(0.5 / 40.5), rel=1e-6)
    for bad in ([1], [1, -1], [1, float("nan")]):
        with pytest.raises(ValueError):
            LogitAdjustedCrossEntropy(bad)


def test_class_counts():
    assert class_counts([0, 2, 2, 1, 2], 4) == [1, 1, 3, 0]
    with pytest.raises(ValueError):
        class_counts([0, 5], 3)


@pytest.mark.parametrize("num_classes", [2, 3, 5])
def test_metrics_match_scikit_learn(num_classes):
    probs, rng = random_probs(60, num_classes)
    labels = rng.integers(0, num_classes, size=60)
    labels[:num_classes] = np.arange(num_classes)  # every class present
    probs[labels == 0, 0] += 0.5  # some signal
    probs /= probs.sum(axis=1, keepdims=True)
    metrics = classification_metrics(labels, probs)
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, probs.argmax(1)))
    assert metrics["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, probs.argmax(1)))
    if num_classes == 2:
        assert metrics["auc"] == pytest.approx(roc_auc_score(labels, probs[:, 1]))
    else:
        assert metrics["auc"] == pytest.approx(roc_auc_score(labels, probs, multi_class="ovr", average="macro"))


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_auc_over_the_classes_present_when_a_class_is_missing():
    probs, rng = random_probs(40, 4, seed=1)
    labels = rng.choice([0, 1, 3], size=40)  # class 2 has no test example
    with pytest.warns(UserWarning):  # scikit-learn's macro OvR has no value here
        assert math.isnan(roc_auc_score(labels, probs, multi_class="ovr", average="macro", labels=[0, 1, 2, 3]))
    expected = np.mean([roc_auc_score(labels == c, probs[:, c]) for c in (0, 1, 3)])
    metrics = classification_metrics(labels, probs)
    assert metrics["auc"] == pytest.approx(expected)
    assert metrics["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, probs.argmax(1)))
    single = classification_metrics(np.zeros(5, dtype=int), random_probs(5, 3)[0])
    assert math.isnan(single["auc"]) and 0 <= single["accuracy"] <= 1  # one class: no AUC
    assert math.isnan(macro_ovr_auc(np.array([]), np.zeros((0, 3))))
    assert all(math.isnan(v) for v in classification_metrics([], np.zeros((0, 3))).values())
    with pytest.raises(ValueError):
        classification_metrics([0, 4], random_probs(2, 3)[0])


def test_evaluate_classification_on_a_loader():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    g = torch.Generator().manual_seed(0)
    loader = [
        {"image": torch.randn(5, 1, 2, 2, generator=g), "label": torch.randint(0, 3, (5, 1), generator=g)}
        for _ in range(3)
    ]
    images = torch.cat([b["image"] for b in loader])
    labels = torch.cat([b["label"] for b in loader]).reshape(-1).numpy()
    with torch.no_grad():
        probs = torch.softmax(model(images), dim=1).numpy()
    assert evaluate_classification(model.train(), loader, 3, "cpu") == pytest.approx(
        classification_metrics(labels, probs)
    )
    assert not model.training
    with pytest.raises(ValueError, match="classes"):
        evaluate_classification(model, loader, 4, "cpu")


def blobs(n=64, seed=0):
    """Two classes told apart by which half of an 8x8 image is bright (a pattern that normalisation keeps);
    about 3:1 class imbalance."""
    g = torch.Generator().manual_seed(seed)
    label = (torch.rand(n, generator=g) < 0.25).long()
    image = torch.randn(n, 1, 8, 8, generator=g)
    image[label == 1, :, :4] += 1.5
    image[label == 0, :, 4:] += 1.5
    return [{"image": image[i : i + 16], "label": label[i : i + 16]} for i in range(0, n, 16)], label


def test_small_cnn_learns_with_train_local_and_the_adjusted_loss():
    torch.manual_seed(0)
    data, labels = blobs()
    model = build_model({"name": "cnn", "channels": [4, 8], "norm": "group"})
    loss_fn = LogitAdjustedCrossEntropy(class_counts(labels.tolist(), 2))
    before = evaluate_classification(model, data, 2, "cpu")
    for _ in range(8):
        train_local(model, data, TrainSettings(lr=1e-2, weight_decay=5e-4, batch_size=16), "cpu", loss_fn=loss_fn)
    after = evaluate_classification(model, data, 2, "cpu")
    assert after["auc"] > 0.95 and after["balanced_accuracy"] > max(0.9, before["balanced_accuracy"])


@pytest.mark.parametrize(
    "norm, layer",
    [("batch", torch.nn.BatchNorm2d), ("group", torch.nn.GroupNorm), ("instance", torch.nn.InstanceNorm2d)],
)
def test_classification_networks_and_their_norm(norm, layer):
    cnn = build_model({"name": "cnn", "channels": [4, 6], "norm": norm, "in_channels": 3, "num_classes": 5})
    assert cnn(torch.randn(2, 3, 16, 16)).shape == (2, 5)
    resnet = build_model({"name": "resnet18", "norm": norm, "num_classes": 4})
    assert resnet(torch.randn(2, 1, 64, 64)).shape == (2, 4)  # instance norm needs >= 2x2 in the last stage
    for net in (cnn, resnet):  # MONAI's ResNet alone would keep batch norm in its blocks
        norms = {
            type(m) for m in net.modules() if isinstance(m, (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm))
        }
        assert norms == {layer}
        assert all(m.weight is not None for m in net.modules() if isinstance(m, layer))  # learnable, as BN's
    assert sum(p.numel() for p in resnet.parameters()) == pytest.approx(11.17e6, rel=0.01)  # ResNet-18
    groups = [m.num_groups for m in cnn.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert norm != "group" or groups == [4]  # gcd(channels, norm_groups = 8); none in the last block
    with pytest.raises(ValueError, match="norm"):
        build_model({"name": "cnn", "norm": "layer"})
    with pytest.raises(ValueError, match="unknown model"):
        build_model({"name": "vgg"})
    assert isinstance(build_model({"channels": [4, 8], "strides": [2]}), UNet)  # no name: the U-Net as before
