"""FedNPR's pieces: balanced softmax, Sinkhorn-Knopp and its balanced rounding, class prototypes, the NPR loss
(against a direct computation) and the feature/head split of the classification networks."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fairfl.classification import class_counts
from fairfl.methods.fednpr.npr import (
    LAYER_NORM_EPS,
    NPR_LOGITS,
    balanced_assignment,
    balanced_softmax_loss,
    class_prototypes,
    extract_features,
    fednpr_objective,
    fednpr_terms,
    npr_loss,
    sinkhorn_knopp,
)
from fairfl.models import build_model, classifier_head, forward_with_features, head_state_keys
from fairfl.training import TrainSettings, train_local

torch.set_num_threads(1)


def unit(n, d, seed=0):
    return F.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


def separated(groups, per_group, d=8, spread=0.05, seed=0):
    """Unit features in `groups` tight bunches around orthogonal directions; (features, group of each)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.eye(d)[:groups]
    group = torch.arange(groups).repeat_interleave(per_group)
    return F.normalize(centres[group] + spread * torch.randn(len(group), d, generator=g), dim=1), group


# --- balanced softmax ----------------------------------------------------------------------------------


def test_balanced_softmax_is_cross_entropy_on_logits_plus_log_prior():
    logits, target = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 1, 1])
    counts = [5, 25, 70]
    expected = F.cross_entropy(logits + torch.log(torch.tensor(counts) / 100.0), target)
    assert float(balanced_softmax_loss(counts)(logits, target)) == pytest.approx(float(expected), rel=1e-6)


def test_balanced_softmax_with_a_missing_class_stays_finite_with_its_gradient():
    logits = (10 * torch.randn(6, 4, generator=torch.Generator().manual_seed(2))).requires_grad_()
    loss = balanced_softmax_loss([30, 0, 10, 0])(logits, torch.tensor([0, 2, 0, 0, 2, 2]))
    loss.backward()
    assert math.isfinite(float(loss.detach())) and bool(torch.isfinite(logits.grad).all())


# --- Sinkhorn-Knopp ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k", [(40, 4), (37, 3), (9, 2)])
def test_sinkhorn_gives_a_transport_plan_with_the_requested_marginals(n, k):
    scores = unit(n, 6) @ unit(k, 6, seed=1).T
    plan = sinkhorn_knopp(scores, epsilon=0.05, iterations=500)
    assert plan.dtype == torch.float64 and bool((plan >= 0).all())
    assert torch.allclose(plan.sum(1), torch.full((n,), 1 / n, dtype=torch.float64), rtol=1e-12)
    assert torch.allclose(plan.sum(0), torch.full((k,), 1 / k, dtype=torch.float64), rtol=1e-6)
    few = sinkhorn_knopp(scores, iterations=3)  # rows exact at once, columns only as far as it went
    assert torch.allclose(few.sum(1), torch.full((n,), 1 / n, dtype=torch.float64), rtol=1e-12)
    assert float((sinkhorn_knopp(scores).sum(0) * k - 1).abs().max()) < 0.05  # the default iterations


def test_sinkhorn_is_stable_for_large_scores_and_checks_its_arguments():
    scores = torch.tensor([[500.0, -500.0], [499.0, -500.0], [-500.0, 500.0], [-500.0, 480.0]])
    plan = sinkhorn_knopp(scores, epsilon=0.01, iterations=50)
    assert bool(torch.isfinite(plan).all()) and float(plan.sum()) == pytest.approx(1.0)
    for bad in (
        dict(scores=torch.zeros(0, 3)),
        dict(scores=torch.zeros(3)),
        dict(scores=scores, epsilon=0.0),
        dict(scores=scores, iterations=0),
    ):
        with pytest.raises(ValueError):
            sinkhorn_knopp(**bad)


def test_hard_assignment_recovers_separated_clusters_in_equal_parts():
    features, group = separated(4, 10)
    order = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    features, group = features[order], group[order]
    assignment = balanced_assignment(sinkhorn_knopp(features @ torch.eye(8)[:4].T))
    assert torch.equal(assignment, group)


@pytest.mark.parametrize("n,k,seed", [(37, 4, 0), (50, 3, 1), (8, 8, 2), (5, 4, 3), (101, 7, 4)])
def test_hard_assignment_of_random_inputs_is_balanced(n, k, seed):
    for plan in (
        sinkhorn_knopp(unit(n, 5, seed) @ unit(k, 5, seed + 10).T),
        torch.rand(n, k, generator=torch.Generator().manual_seed(seed)),
    ):
        sizes = np.bincount(balanced_assignment(plan).numpy(), minlength=k)
        assert sizes.sum() == n and set(sizes.tolist()) <= {n // k, -(-n // k)}


# --- prototypes ----------------------------------------------------------------------------------------


def test_prototypes_are_unit_norm_and_masked_for_absent_and_tiny_classes():
    features = 3 * torch.randn(31, 6, generator=torch.Generator().manual_seed(4))
    labels = torch.tensor([0] * 25 + [1] * 2 + [3] * 4)
    prototypes, mask = class_prototypes(features, labels, num_classes=4, k=4)
    assert prototypes.shape == (4, 4, 6) and mask.shape == (4, 4)
    assert mask.tolist() == [[True] * 4, [True, True, False, False], [False] * 4, [True] * 4]
    assert torch.allclose(prototypes[mask].norm(dim=1), torch.ones(int(mask.sum())), atol=1e-6)
    assert bool((prototypes[~mask] == 0).all())
    tiny = F.normalize(features[25:27], dim=1)  # fewer samples than K: the samples themselves
    assert torch.allclose(prototypes[1, :2], tiny, atol=1e-6)


def test_k1_is_the_normalised_class_mean():
    features = torch.randn(20, 5, generator=torch.Generator().manual_seed(5))
    labels = torch.tensor([0, 1] * 10)
    prototypes, mask = class_prototypes(features, labels, num_classes=2, k=1)
    assert bool(mask.all())
    for c in range(2):
        mean = F.normalize(F.normalize(features[labels == c], dim=1).mean(0), dim=0)
        assert torch.allclose(prototypes[c, 0], mean, atol=1e-6)


def test_prototypes_find_the_subclusters_of_a_class_and_are_seeded():
    features, group = separated(3, 12, d=6, seed=6)
    labels = torch.zeros(36, dtype=torch.long)
    prototypes, _ = class_prototypes(5 * features, labels, num_classes=1, k=3, seed=7)
    nearest = (prototypes[0] @ torch.eye(6)[:3].T).argmax(0)
    assert sorted(nearest.tolist()) == [0, 1, 2], "one prototype per sub-cluster"
    assert float((prototypes[0] @ torch.eye(6)[:3].T).max(0).values.min()) > 0.95
    again, _ = class_prototypes(5 * features, labels, num_classes=1, k=3, seed=7)
    assert torch.equal(prototypes, again)


# --- the NPR loss ------------------------------------------------------------------------------------


def npr_by_loops(features, target, prototypes, mask, temperature, form):
    """Eq. 3 written out: per sample, per class with a prototype, the largest cosine similarity; with "layernorm"
    those standardised over the sample's classes as torch.nn.LayerNorm(C) does (biased variance, eps inside)."""
    classes = [c for c in range(len(mask)) if mask[c].any()]
    losses = []
    for z, y in zip(features.tolist(), target.tolist(), strict=True):
        if y not in classes:
            continue
        z = np.asarray(z) / np.linalg.norm(z)
        best = {
            c: max(float(z @ prototypes[c, j].numpy()) for j in range(mask.shape[1]) if mask[c, j]) for c in classes
        }
        if form == "layernorm":
            mean = sum(best.values()) / len(best)
            variance = sum((b - mean) ** 2 for b in best.values()) / len(best)
            best = {c: (b - mean) / math.sqrt(variance + LAYER_NORM_EPS) for c, b in best.items()}
        losses.append(-best[y] / temperature + math.log(sum(math.exp(b / temperature) for b in best.values())))
    return sum(losses) / len(losses)


@pytest.mark.parametrize("form", NPR_LOGITS)
@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_npr_loss_against_a_direct_computation(temperature, form):
    g = torch.Generator().manual_seed(8)
    features = torch.randn(7, 5, generator=g, dtype=torch.float64)
    prototypes = F.normalize(torch.randn(4, 3, 5, generator=g, dtype=torch.float64), dim=2)
    mask = torch.tensor([[True, True, True], [True, False, False], [False] * 3, [True, True, False]])
    prototypes[~mask] = 0
    target = torch.tensor([0, 1, 3, 3, 0, 2, 1])  # class 2 has no prototype: that sample is left out
    loss = npr_loss(features, target, prototypes, mask, temperature, form)
    assert float(loss) == pytest.approx(npr_by_loops(features, target, prototypes, mask, temperature, form), rel=1e-10)
    # the samples of a class swapped among themselves (and the batch reordered): the same loss
    order = torch.tensor([4, 6, 3, 2, 0, 5, 1])
    assert float(npr_loss(features[order], target[order], prototypes, mask, temperature, form)) == pytest.approx(
        float(loss), rel=1e-12
    )
    with pytest.raises(ValueError, match="npr_logits"):
        npr_loss(features, target, prototypes, mask, temperature, "softmax")


def test_layernorm_logits_do_not_depend_on_how_far_apart_the_cosines_sit():
    """The LayerNorm form standardises the max-cosines over the classes: cosines 0.06 apart pull as hard as
    cosines 0.6 apart; plain cosines 0.06 apart at T = 1 leave the loss near log C."""
    prototypes = torch.eye(3, dtype=torch.float64).reshape(3, 1, 3)
    mask = torch.ones(3, 1, dtype=torch.bool)
    target = torch.tensor([0])
    near = torch.tensor([[1.0, 0.9, 0.9]], dtype=torch.float64)  # max-cosines 0.06 apart once normalised
    far = torch.tensor([[1.0, 0.3, 0.3]], dtype=torch.float64)
    ln_near, ln_far = (float(npr_loss(f, target, prototypes, mask, npr_form="layernorm")) for f in (near, far))
    assert ln_near == pytest.approx(ln_far, rel=0.02) and ln_near < 0.5 * math.log(3)  # up to LayerNorm's eps
    assert float(npr_loss(near, target, prototypes, mask, npr_form="cosine")) > 0.95 * math.log(3)


def test_npr_loss_gradients_are_finite_and_nothing_left_gives_zero():
    features = torch.randn(4, 5, generator=torch.Generator().manual_seed(9)).requires_grad_()
    prototypes, mask = class_prototypes(features, torch.tensor([0, 0, 1, 1]), num_classes=3, k=2)
    loss = npr_loss(features, torch.tensor([0, 1, 2, 1]), prototypes, mask)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and bool(torch.isfinite(features.grad).all())
    assert float(npr_loss(features, torch.tensor([2, 2]), prototypes, mask).detach()) == 0.0


def test_fednpr_terms_are_bsm_and_lambda_times_npr():
    g = torch.Generator().manual_seed(10)
    logits, features, target = (
        torch.randn(6, 3, generator=g),
        torch.randn(6, 4, generator=g),
        torch.tensor([0, 1, 2] * 2),
    )
    prototypes, mask = class_prototypes(features, target, num_classes=3, k=2)
    bsm = balanced_softmax_loss([10, 0, 5])
    for form in NPR_LOGITS:
        terms = fednpr_terms(logits, features, target, bsm, prototypes, mask, lam=0.1, npr_form=form)
        assert float(terms[0]) == pytest.approx(float(bsm(logits, target)), rel=1e-6)
        assert float(terms[1]) == pytest.approx(
            0.1 * float(npr_loss(features, target, prototypes, mask, npr_form=form))
        )
    assert float(fednpr_terms(logits, features, target, bsm, prototypes, mask, lam=0.0)[1]) == 0.0


def test_gradient_ratio_with_layernorm_far_exceeds_plain_cosines_on_a_networks_features():
    """Features of a real CNN (ReLU, pooled: all cosines high and close, as on the built-in data): at T = 1 the
    plain cosines' NPR barely pulls (the old default, lambda 0.1: a few per cent of BSM's gradient); the LayerNorm
    form at the same lambda pulls tens of times harder, and at the authors' weight 1 harder than BSM."""
    torch.manual_seed(0)
    model = build_model({"name": "cnn", "in_channels": 3, "num_classes": 8, "channels": [16, 32, 64]})
    g = torch.Generator().manual_seed(1)
    loader = [
        {"image": torch.randn(16, 3, 32, 32, generator=g), "label": torch.randint(0, 8, (16,), generator=g)}
        for _ in range(4)
    ]
    features, labels = extract_features(model, loader, "cpu")
    prototypes, mask = class_prototypes(features, labels, 8, k=4)
    counts = class_counts(labels.tolist(), 8)

    def ratio(form, lam, temperature=1.0):
        with fednpr_objective(model, counts, prototypes, mask, lam, temperature, form) as objective:
            for batch in loader:
                objective(model(batch["image"]), batch["label"])
            with torch.no_grad():  # evaluation calls record nothing
                objective(model(loader[0]["image"]), loader[0]["label"])
        assert len(objective.grad_ratios) == len(loader)
        return objective.metrics()["npr_grad_ratio"]

    cosine, layernorm = ratio("cosine", 0.1), ratio("layernorm", 0.1)
    assert cosine < 0.05 and layernorm > 10 * cosine
    assert ratio("layernorm", 1.0) == pytest.approx(10 * layernorm, rel=1e-4) and 10 * layernorm > 1.0
    assert ratio("layernorm", 0.0) == 0.0
    with (
        pytest.raises(ValueError, match="npr_logits"),
        fednpr_objective(model, counts, prototypes, mask, npr_form="LayerNorm"),
    ):
        pass


# --- features and head of the networks ------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,head",
    [({"name": "cnn", "num_classes": 3, "channels": [8, 16]}, "4"), ({"name": "resnet18", "num_classes": 3}, "fc")],
)
def test_feature_head_split_covers_every_parameter_once(spec, head):
    torch.manual_seed(0)
    model = build_model(spec)
    keys = head_state_keys(model)
    assert keys == [f"{head}.weight", f"{head}.bias"] and head_state_keys(spec) == keys
    extractor = [k for k in model.state_dict() if k not in keys]
    assert sorted(extractor + keys) == sorted(model.state_dict()) and len(set(extractor + keys)) == len(extractor) + 2
    parameters = {name for name, _ in model.named_parameters()}
    assert set(keys) <= parameters and parameters - set(keys) == parameters & set(extractor)
    model.eval()
    images = torch.randn(2, 1, 32, 32)
    features, logits = forward_with_features(model, images)
    assert torch.allclose(classifier_head(model)[1](features), logits, atol=1e-5)
    assert torch.allclose(model(images), logits, atol=1e-5), "no hook left behind"
    with pytest.raises(ValueError, match="no linear"):
        classifier_head(torch.nn.Conv2d(1, 1, 1))


def test_extract_features_and_the_objective_inside_train_local():
    torch.manual_seed(1)
    model = build_model({"name": "cnn", "num_classes": 3, "channels": [8, 16]})
    g = torch.Generator().manual_seed(11)
    loader = [
        {"image": torch.randn(4, 1, 16, 16, generator=g), "label": torch.tensor([[0], [1], [1], [0]])} for _ in range(2)
    ]
    features, labels = extract_features(model, loader, "cpu")
    assert features.shape == (8, 16) and labels.tolist() == [0, 1, 1, 0] * 2 and model.training
    prototypes, mask = class_prototypes(features, labels, num_classes=3, k=2)
    calls = []
    with fednpr_objective(model, [4, 4, 0], prototypes, mask, lam=0.5) as loss_fn:
        image, label = loader[0]["image"], loader[0]["label"]
        direct_features, logits = forward_with_features(model, image)
        expected = sum(
            fednpr_terms(logits, direct_features, label, balanced_softmax_loss([4, 4, 0]), prototypes, mask, 0.5)
        )
        assert float(loss_fn(model(image), label).detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
        stats = train_local(
            model, loader, TrainSettings(lr=1e-3), "cpu", loss_fn=lambda out, y: calls.append(1) or loss_fn(out, y)
        )
    assert len(calls) == 2 and math.isfinite(stats["train_loss"])
    assert len(loss_fn.grad_ratios) == 3 and loss_fn.metrics()["npr_grad_ratio"] > 0
