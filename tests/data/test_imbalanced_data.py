"""FedNPR's imbalanced benchmarks: the ISIC-like natural split (Table I) and the ICH-like Dirichlet split with
removed classes (Table II), their datalists and the built-in registry entries."""

import json

import numpy as np
import pytest

from fairfl.data.builtin import builtin_dataset, ensure_builtin
from fairfl.data.classification_sites import SETTINGS
from fairfl.data.datalist import SPLITS, load_datalist
from fairfl.data.imbalanced import (
    ICH_IMAGES,
    ISIC_SOURCES,
    SKIN_IMAGES,
    generate_ich_imbalanced_sites,
    ich_like_counts,
    isic_like_counts,
)

from helpers import generated_at_test_scales


def site_counts(root, site, num_classes):
    lists = load_datalist(root, site, task="classification", num_classes=num_classes)
    return lists, np.bincount([e["label"] for s in SPLITS for e in lists[s]], minlength=num_classes)


def test_isic_like_counts_keep_table_one_shape():
    table = np.asarray([c for _, c in ISIC_SOURCES])
    counts = isic_like_counts(1.0)
    sizes = counts.sum(1)
    assert counts.shape == (6, 8) and ((counts > 0) == (table > 0)).all(), "absent classes stay absent, others not"
    assert sizes.max() / sizes.min() > 10 and sizes.argmax() == 1, "BCN is the largest, >10x the smallest"
    assert abs(sizes.sum() - SKIN_IMAGES) < 0.05 * SKIN_IMAGES
    assert abs(isic_like_counts(0.5).sum() - SKIN_IMAGES / 2) < 0.1 * SKIN_IMAGES / 2
    with pytest.raises(ValueError):
        isic_like_counts(0)


def test_ich_like_counts_remove_classes_and_keep_class_totals():
    counts = ich_like_counts(10, 1.0, np.random.default_rng(0))
    assert counts.shape == (10, 5) and (counts == 0).any(), "some classes are missing at some sites"
    assert ((counts > 0).sum(1) >= 2).all() and counts.sum() == ICH_IMAGES
    prior = np.asarray(SETTINGS["ich"].prior)
    assert np.allclose(counts.sum(0) / ICH_IMAGES, prior, atol=0.01), "removed shares go to the other sites"
    assert (ich_like_counts(10, 1.0, np.random.default_rng(0)) == counts).all()
    assert (ich_like_counts(10, 1.0, np.random.default_rng(1)) != counts).any()
    with pytest.raises(ValueError, match="raise size_scale"):
        ich_like_counts(10, 0.01, np.random.default_rng(0))


def test_skin_imbalanced_builtin_has_six_sites_with_their_own_test_sets(tmp_path):
    data = builtin_dataset("skin_imbalanced")
    assert (data.task, data.in_channels, data.num_classes, data.min_sites) == ("classification", 3, 8, 6)
    root = ensure_builtin("skin_imbalanced", image_size=32, num_sites=3, size_scale=0.25, cache_dir=tmp_path)
    description = json.loads((root / "dataset.json").read_text())
    expected = isic_like_counts(0.25)
    assert description["benchmark"]["site_class_counts"] == expected.tolist()
    assert description["corrupted_sites"] == [] and description["parameters"]["num_sites"] == 6
    tests = []
    for k in range(6):
        lists, counts = site_counts(root, f"site-{k + 1}", 8)
        assert counts.tolist() == expected[k].tolist() and "testing_corrupted" not in lists
        tests.append({e["image"] for e in lists["testing"]})
    assert not any(tests[i] & tests[j] for i in range(6) for j in range(i)), "each site its own test set"
    with pytest.raises(ValueError, match="six|6 sources"):
        ensure_builtin("skin_imbalanced", image_size=32, num_sites=7, size_scale=0.25, cache_dir=tmp_path)


def test_ich_imbalanced_is_deterministic_and_loads(tmp_path):
    tiny = dict(num_sites=4, image_size=32, size_scale=0.1)
    a = generate_ich_imbalanced_sites(tmp_path / "a", seed=0, **tiny)
    b = generate_ich_imbalanced_sites(tmp_path / "b", seed=0, **tiny)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    counts = np.asarray(json.loads((a / "dataset.json").read_text())["benchmark"]["site_class_counts"])
    for k in range(4):
        assert site_counts(a, f"site-{k + 1}", 5)[1].tolist() == counts[k].tolist()
    assert (ich_like_counts(4, 0.1, np.random.default_rng([0, 2000])) == counts).all(), "the split's seed"
    assert (ich_like_counts(4, 0.1, np.random.default_rng([1, 2000])) != counts).any()
    data = builtin_dataset("ich_imbalanced")
    assert (data.task, data.in_channels, data.num_classes, data.min_sites) == ("classification", 1, 5, 10)


def test_test_scale_gives_each_site_more_test_images_of_its_own_classes_only(tmp_path):
    """test_scale 3: each site's own test set holds three times its images, the new ones in the site's class
    proportions (a class the site lacks never appears: MSK4, site-3, has no BCC, AK, DF, VASC or SCC); training and
    validation are the same files, byte for byte; site_class_counts stays the test_scale-1 table."""
    base, scaled, added = generated_at_test_scales(
        "skin_imbalanced", 3, tmp_path, image_size=32, num_sites=6, size_scale=0.25
    )
    assert base.name == "skin_imbalanced-p1-v1-n6-s32-seed0-x0.25"
    counts = isic_like_counts(0.25)
    description = json.loads((scaled / "dataset.json").read_text())
    assert description["benchmark"]["site_class_counts"] == counts.tolist()
    for k in range(6):
        site = f"site-{k + 1}"
        old = json.loads((base / f"{site}.json").read_text())["testing"]
        new = np.bincount([e["label"] for e in added[site]["testing"]], minlength=8)
        assert new.sum() == 2 * len(old) and not new[counts[k] == 0].any(), (site, new, counts[k])
        assert np.abs(new - counts[k] / counts[k].sum() * new.sum()).max() < 1, (site, new, counts[k])
        assert (
            description["sites"][site]["class_counts"]["testing"]
            == (np.bincount([e["label"] for e in old], minlength=8) + new).tolist()
        )
    assert (counts[2, [2, 3, 5, 6, 7]] == 0).all()  # MSK4 lacks them, as in Table I
