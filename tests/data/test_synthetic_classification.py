"""Synthetic classification under quality shift: splits, corruption, files, classes, loaders, the cache."""

import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage
from sklearn.metrics import balanced_accuracy_score

from fairfl.data.classification_sites import (
    CORRUPTED_SPLIT,
    ICH_CLASSES,
    SETTINGS,
    SKIN_CLASSES,
    plan_sites,
    split_by_counts,
    split_by_dirichlet,
    stratified_sample,
)
from fairfl.data.corruption import (
    NOISE_SIGMA,
    Corruption,
    blur_size,
    gaussian_noise,
    motion_blur,
    motion_kernel,
)
from fairfl.data.datalist import SPLITS, load_datalist
from fairfl.data.loaders import make_loader
from fairfl.data.synthetic_classification import (
    builtin_classification_name,
    ensure_builtin_ich,
    ensure_builtin_skin,
    generate_classification_sites,
)

from helpers import generated_at_test_scales

SITES = [f"site-{k}" for k in range(1, 11)]
SMALL = dict(num_sites=10, image_size=32, size_scale=0.25)  # 500 skin / 400 ich images: a few seconds each
ALL_SPLITS = (*SPLITS, CORRUPTED_SPLIT)


@pytest.fixture(scope="module")
def skin(made_once):  # generated once for all the test processes
    return made_once("skin", lambda folder: generate_classification_sites(folder, "skin", seed=0, **SMALL))


@pytest.fixture(scope="module")
def ich_blur(made_once):
    return made_once(
        "ich_blur", lambda folder: generate_classification_sites(folder, "ich", seed=0, corruption="blur", **SMALL)
    )


def read(root: Path, entry: dict) -> np.ndarray:
    return np.asarray(Image.open(root / entry["image"]), np.float32) / 255


def datalist(root: Path, site: str) -> dict:
    return json.loads((root / f"{site}.json").read_text())


def high_frequency(image: np.ndarray) -> float:
    """Mean absolute Laplacian: rises with noise, falls with blur."""
    grey = image.mean(-1) if image.ndim == 3 else image
    return float(np.abs(ndimage.laplace(grey)).mean())


# ----------------------------------------------------------------------------------------------
# splitting


def test_dirichlet_split_assigns_every_sample_once_and_alpha_sets_the_skew():
    labels = np.repeat(np.arange(5), [400, 300, 200, 80, 20])
    sites = split_by_dirichlet(labels, 10, 1.0, np.random.default_rng(0), min_per_site=20)
    assert len(sites) == 10 and min(len(s) for s in sites) >= 20
    assert np.array_equal(np.sort(np.concatenate(sites)), np.arange(len(labels)))
    # same seed, same split
    again = split_by_dirichlet(labels, 10, 1.0, np.random.default_rng(0), min_per_site=20)
    assert all(np.array_equal(a, b) for a, b in zip(sites, again, strict=True))

    def skew(alpha):  # mean total-variation distance of a site's label mix from the global mix
        distances = []
        for seed in range(5):
            for site in split_by_dirichlet(labels, 10, alpha, np.random.default_rng(seed)):
                if len(site):
                    mix = np.bincount(labels[site], minlength=5) / len(site)
                    distances.append(0.5 * np.abs(mix - np.bincount(labels) / len(labels)).sum())
        return np.mean(distances)

    assert skew(0.1) > skew(1.0) > skew(100.0)
    assert skew(100.0) < 0.1
    with pytest.raises(ValueError, match="cannot give"):
        split_by_dirichlet(labels, 10, 1.0, np.random.default_rng(0), min_per_site=200)


def test_split_by_counts_gives_exact_counts_and_keeps_missing_classes():
    labels = np.repeat(np.arange(3), [10, 10, 10])
    counts = [[5, 0, 2], [3, 6, 0], [0, 4, 8]]
    sites = split_by_counts(labels, counts, np.random.default_rng(0))
    assert [np.bincount(labels[s], minlength=3).tolist() for s in sites] == counts
    assert len(np.unique(np.concatenate(sites))) == sum(map(sum, counts))
    with pytest.raises(ValueError, match="class 2: 11"):
        split_by_counts(labels, [[0, 0, 11]], np.random.default_rng(0))


def test_stratified_sample_keeps_class_proportions():
    labels = np.repeat(np.arange(3), [500, 300, 200])
    chosen = stratified_sample(labels, 0.2, np.random.default_rng(0))
    assert len(chosen) == 200 and len(np.unique(chosen)) == 200
    assert np.bincount(labels[chosen]).tolist() == [100, 60, 40]
    assert len(stratified_sample(labels[:2], 0.01, np.random.default_rng(0))) == 1  # at least one, at most n - 1


def test_plan_keeps_groups_together_and_corrupted_sites_get_their_share_of_each_class():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), [300, 200, 100, 100])
    groups = [f"p{i // 3}" for i in range(len(labels))]  # three samples per patient...
    labels = np.array([labels[(i // 3) * 3] for i in range(len(labels))])  # ...of one class
    plan = plan_sites(labels, 10, rng, num_corrupted=2, groups=groups)
    where = {}
    for k, site in enumerate(plan):
        for split in ("training", "validation"):
            for i in site[split]:
                where.setdefault(groups[i], set()).add((k, split))
    for i in plan[0]["testing"]:
        where.setdefault(groups[i], set()).add(("test", "testing"))
    assert all(len(places) == 1 for places in where.values()), "a patient is in two places"
    assert len(where) == len(set(groups))
    assert all(np.array_equal(site["testing"], plan[0]["testing"]) for site in plan)  # one shared test set
    # the two corrupted sites together hold 2/10 of every class outside the test set
    held = [np.concatenate([site["training"], site["validation"]]) for site in plan]
    for label in range(4):
        total = sum((labels[h] == label).sum() for h in held)
        corrupted = sum((labels[h] == label).sum() for h in held[-2:])
        assert abs(corrupted / total - 0.2) < 0.03


# ----------------------------------------------------------------------------------------------
# corruption


def test_gaussian_noise_and_motion_blur():
    rng = np.random.default_rng(0)
    grey = np.full((64, 64), 128, np.uint8)
    noisy = gaussian_noise(grey, NOISE_SIGMA[2], rng)
    assert noisy.dtype == np.uint8 and abs(noisy.astype(float).std() / 255 - 0.18) < 0.01
    wide = gaussian_noise(np.full((8, 8, 3), 30000, np.uint16), 0.1, rng)
    assert wide.dtype == np.uint16 and wide.shape == (8, 8, 3)

    kernel = motion_kernel(4.0, 2.0, 0.0)
    assert kernel.sum() == pytest.approx(1.0) and kernel.shape == (17, 17)
    centre = kernel.shape[0] // 2
    assert kernel[centre, centre:].sum() == pytest.approx(1.0)  # one-sided, along +x at angle 0
    assert kernel[centre, centre] > kernel[centre, centre + 4] > 0
    # a vertical edge blurs along x but not along y
    edge = np.zeros((32, 32), np.uint8)
    edge[:, 16:] = 255
    assert np.array_equal(motion_blur(edge, 4, 2, 90.0), edge)
    blurred = motion_blur(edge, 4, 2, 0.0)
    assert 0 < blurred[5, 13] < 255 and np.array_equal(blurred[5], blurred[20])
    assert blur_size(3, 224) == (15, 8) and blur_size(3, 64) == pytest.approx((15 * 64 / 224, 8 * 64 / 224))
    rgb = (np.random.default_rng(1).random((32, 32, 3)) * 255).astype(np.uint8)
    out = Corruption("blur", 3)(rgb, rng)
    assert out.shape == rgb.shape and high_frequency(out / 255) < 0.5 * high_frequency(rgb / 255)
    with pytest.raises(ValueError, match="corruption must be"):
        Corruption("fog")
    with pytest.raises(ValueError, match="severity"):
        Corruption("noise", 6)


# ----------------------------------------------------------------------------------------------
# the generated data


def test_files_datalists_and_description(skin, ich_blur):
    for root, setting, mode in ((skin, "skin", "RGB"), (ich_blur, "ich", "L")):
        spec = SETTINGS[setting]
        description = json.loads((root / "dataset.json").read_text())
        assert description["task"] == "classification" and description["num_classes"] == len(spec.classes)
        assert description["classes"] == list(SKIN_CLASSES if setting == "skin" else ICH_CLASSES)
        assert description["in_channels"] == (3 if setting == "skin" else 1)
        assert description["split"]["alpha"] == 1.0 and description["test"]["shared"]
        assert description["corrupted_sites"] == ["site-9", "site-10"] == description["corruption"]["sites"]
        assert set(description["sites"]) == set(SITES)
        for site in SITES:
            lists = load_datalist(root, site, task="classification", num_classes=len(spec.classes), splits=ALL_SPLITS)
            counts = {
                split: np.bincount([e["label"] for e in lists[split]], minlength=len(spec.classes)).tolist()
                for split in SPLITS
            }
            assert counts == description["sites"][site]["class_counts"]
            assert description["sites"][site]["corrupted"] == (site in ("site-9", "site-10"))
            with Image.open(lists["training"][0]["image"]) as image:
                assert image.mode == mode and image.size == (32, 32)
    noise = json.loads((skin / "dataset.json").read_text())["corruption"]
    assert noise["kind"] == "noise" and noise["sigma"] == 0.18
    blur = json.loads((ich_blur / "dataset.json").read_text())["corruption"]
    assert blur["kind"] == "blur" and blur["radius_px"] == pytest.approx(15 * 32 / 224, abs=1e-3)


def test_every_image_once_shared_test_sets_and_class_imbalance(skin):
    lists = {site: datalist(skin, site) for site in SITES}
    held = [e["image"] for site in SITES for split in ("training", "validation") for e in lists[site][split]]
    assert len(held) == len(set(held))
    assert all(e["image"].startswith(f"{site}/") for site in SITES for e in lists[site]["training"])
    test = lists["site-1"]["testing"]
    assert all(lists[site]["testing"] == test for site in SITES), "one shared clean test set"
    corrupted = lists["site-1"][CORRUPTED_SPLIT]
    assert [e["label"] for e in corrupted] == [e["label"] for e in test]
    assert [Path(e["image"]).name for e in corrupted] == [Path(e["image"]).name for e in test]
    assert not set(held) & {e["image"] for e in test + corrupted}
    assert len(held) + len(test) == 500 and len(test) == 100
    labels = np.bincount([e["label"] for e in test], minlength=8)
    assert labels.argmax() == SKIN_CLASSES.index("NV") and labels.min() >= 1  # NV dominant, every class tested
    # Dirichlet(1.0): label mixes differ between sites
    mixes = [np.bincount([e["label"] for e in lists[s]["training"]], minlength=8) for s in SITES]
    assert max(m.argmax() for m in mixes) != min(m.argmax() for m in mixes)


def test_corrupted_sites_and_test_set_are_noisier_or_blurrier(skin, ich_blur):
    def mean_hf(root, entries):
        return np.mean([high_frequency(read(root, e)) for e in entries])

    for root, noisier in ((skin, True), (ich_blur, False)):
        lists = {site: datalist(root, site) for site in SITES}
        clean = mean_hf(root, [e for s in SITES[:8] for e in lists[s]["training"]])
        corrupted = mean_hf(root, [e for s in SITES[8:] for e in lists[s]["training"]])
        test, test_corrupted = (mean_hf(root, lists["site-1"][k]) for k in ("testing", CORRUPTED_SPLIT))
        if noisier:
            assert corrupted > 2 * clean and test_corrupted > 2 * test
        else:
            assert corrupted < 0.75 * clean and test_corrupted < 0.75 * test
        # the corrupted test image is the clean one corrupted: close in the large, different in detail
        a, b = read(root, lists["site-1"]["testing"][0]), read(root, lists["site-1"][CORRUPTED_SPLIT][0])
        smooth = [ndimage.gaussian_filter(x.mean(-1) if x.ndim == 3 else x, 3) for x in (a, b)]
        assert np.abs(smooth[0] - smooth[1]).mean() < 0.05 and np.abs(a - b).mean() > 0.01


def test_classes_are_distinguishable_but_not_trivially(skin, ich_blur):
    """A nearest-centroid classifier on a few colour and texture statistics beats chance by far on clean
    images, and a corrupted test set costs it accuracy."""

    def features(image):
        image = image if image.ndim == 3 else image[..., None]
        centre = image[8:-8, 8:-8]
        gy, gx = np.gradient(image.mean(-1))
        return np.concatenate(
            [
                centre.mean((0, 1)),
                centre.std((0, 1)),
                [np.hypot(gx, gy).mean(), (image.mean(-1) > 0.7).mean(), (image.mean(-1) < 0.3).mean()],
            ]
        )

    for root, classes in ((skin, 8), (ich_blur, 5)):
        lists = {site: datalist(root, site) for site in SITES}
        train = [e for s in SITES[:8] for split in ("training", "validation") for e in lists[s][split]]
        x = np.stack([features(read(root, e)) for e in train])
        y = np.array([e["label"] for e in train])
        mean, sd = x.mean(0), x.std(0) + 1e-6
        centroids = np.stack([((x[y == c] - mean) / sd).mean(0) for c in range(classes)])

        def accuracy(entries, root=root, mean=mean, sd=sd, centroids=centroids):
            z = (np.stack([features(read(root, e)) for e in entries]) - mean) / sd
            predicted = ((z[:, None] - centroids[None]) ** 2).sum(-1).argmin(1)
            return balanced_accuracy_score([e["label"] for e in entries], predicted)

        clean, corrupted = accuracy(lists["site-1"]["testing"]), accuracy(lists["site-1"][CORRUPTED_SPLIT])
        assert 1.6 / classes < clean < 0.9, clean
        assert corrupted < clean, (clean, corrupted)


def test_batches_from_make_loader(skin, ich_blur):
    for root, channels, classes in ((skin, 3, 8), (ich_blur, 1, 5), (ich_blur, 3, 5)):
        entries = load_datalist(root, "site-2", task="classification", num_classes=classes)["training"]
        loader = make_loader(
            entries,
            image_size=48,
            num_classes=classes,
            batch_size=4,
            train=True,
            seed=0,
            in_channels=channels,
            task="classification",
        )
        batch = next(iter(loader))
        assert batch["image"].shape == (4, channels, 48, 48) and batch["image"].dtype == torch.float32
        assert batch["label"].shape == (4,) and batch["label"].dtype == torch.int64
        assert batch["label"].min() >= 0 and batch["label"].max() < classes
        assert abs(float(batch["image"].mean())) < 0.5  # per-image z-score
    with pytest.raises(ValueError, match="task must be"):
        make_loader(entries, 32, 5, 2, False, 0, task="detection")


def _all_bytes(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deterministic_given_seed(tmp_path):
    tiny = dict(num_sites=4, image_size=32, size_scale=0.02)
    a = _all_bytes(generate_classification_sites(tmp_path / "a", "ich", seed=0, **tiny))
    b = _all_bytes(generate_classification_sites(tmp_path / "b", "ich", seed=0, **tiny))
    c = _all_bytes(generate_classification_sites(tmp_path / "c", "ich", seed=1, **tiny))
    assert a == b
    assert a.keys() != c.keys() or any(a[k] != c[k] for k in a if k.endswith(".png"))
    assert not any(a[k] == c[k] for k in a.keys() & c.keys() if k.endswith(".png"))


def test_explicit_site_class_counts_and_site_test_sets(tmp_path):
    counts = [[6, 20, 5, 5, 0, 0, 0, 0], [10, 10, 0, 0, 10, 5, 0, 0], [5, 30, 0, 5, 5, 0, 5, 0]]
    root = generate_classification_sites(
        tmp_path, "skin", image_size=32, site_class_counts=counts, corrupted_fraction=0.0, test_set="site"
    )
    description = json.loads((root / "dataset.json").read_text())
    assert description["corruption"] is None and description["corrupted_sites"] == []
    assert set(description["sites"]) == {"site-1", "site-2", "site-3"}
    for k, site in enumerate(("site-1", "site-2", "site-3")):
        lists = datalist(root, site)
        assert CORRUPTED_SPLIT not in lists
        per_class = np.bincount([e["label"] for s in SPLITS for e in lists[s]], minlength=8).tolist()
        assert per_class == counts[k], "the site holds exactly its counts, missing classes missing"
        assert 0.1 < len(lists["testing"]) / sum(counts[k]) < 0.3
    tests = [{e["image"] for e in datalist(root, s)["testing"]} for s in ("site-1", "site-2", "site-3")]
    assert not (tests[0] & tests[1] or tests[1] & tests[2]), "each site its own test set"


def test_builtin_cache_and_argument_checks(tmp_path):
    tiny = dict(image_size=32, num_sites=4, size_scale=0.02, cache_dir=tmp_path)
    first = ensure_builtin_skin(**tiny)
    assert first.name == builtin_classification_name("skin", 32, 0, 4, 0.02) == "skin-noise-v1-n4-s32-seed0-x0.02"
    marker = (first / "complete").stat().st_mtime_ns
    assert ensure_builtin_skin(**tiny) == first and (first / "complete").stat().st_mtime_ns == marker
    blur = ensure_builtin_ich(corruption="blur", **tiny)
    assert blur.name.startswith("ich-blur-")
    assert json.loads((blur / "dataset.json").read_text())["corruption"]["kind"] == "blur"
    with pytest.raises(ValueError, match="at least 32"):
        generate_classification_sites(tmp_path / "x", "skin", image_size=16)
    with pytest.raises(ValueError, match="setting must be"):
        generate_classification_sites(tmp_path / "x", "retina")


def test_test_scale_enlarges_the_shared_test_set_and_its_corrupted_copy_only(tmp_path):
    """test_scale 2: the one test set every site shares holds twice its images, in the same class mix, and
    testing_corrupted the same new images corrupted as the others are; every training and validation image (the
    corrupted site's too) and every test_scale-1 test image is the same file, byte for byte."""
    base, scaled, added = generated_at_test_scales("ich_blur", 2, tmp_path, image_size=32, num_sites=4, size_scale=0.05)
    assert base.name == "ich-blur-v1-n4-s32-seed0-x0.05"
    new, new_corrupted = added["site-1"]["testing"], added["site-1"][CORRUPTED_SPLIT]
    assert all(added[site] == added["site-1"] for site in added) and set(added) == {f"site-{k}" for k in range(1, 5)}
    old = datalist(base, "site-1")["testing"]
    assert len(new) == len(old) == 16
    old_mix, new_mix = (np.bincount([e["label"] for e in entries], minlength=5) for entries in (old, new))
    assert np.abs(old_mix - new_mix).max() <= 1, (old_mix, new_mix)  # stratified like the test set it extends
    old_pixels = {(base / e["image"]).read_bytes() for e in old}
    assert not any((scaled / e["image"]).read_bytes() in old_pixels for e in new)  # new images, not copies
    assert [e["label"] for e in new_corrupted] == [e["label"] for e in new]
    for clean, corrupted in zip(new, new_corrupted, strict=True):
        name = Path(clean["image"]).name
        assert clean["image"] == f"test/clean/{name}" and corrupted["image"] == f"test/blur/{name}"
        expected = Corruption("blur", 3)(
            np.asarray(Image.open(scaled / clean["image"])),
            np.random.default_rng([0, zlib.crc32(Path(name).stem.encode())]),
        )
        assert np.array_equal(np.asarray(Image.open(scaled / corrupted["image"])), expected)
    assert sum(json.loads((scaled / "dataset.json").read_text())["sites"]["site-1"]["class_counts"]["testing"]) == 32
