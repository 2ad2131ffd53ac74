"""The built-in synthetic multi-site fundus data: layout, masks, site differences, determinism, the cache."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import ndimage

from fairfl.data.builtin import ensure_builtin
from fairfl.data.datalist import SPLITS, load_datalist
from fairfl.data.loaders import make_loader
from fairfl.data.synthetic_fundus import (
    PROFILES,
    builtin_fundus_name,
    ensure_builtin_fundus,
    generate_fundus_sites,
)

from helpers import generated_at_test_scales

SITES = [f"site-{k}" for k in range(1, 7)]


@pytest.fixture(scope="module")
def dataset(made_once):
    """The default six sites at 64 (a few seconds), generated once for all the test processes."""
    return made_once("fundus", lambda folder: generate_fundus_sites(folder, image_size=64, seed=0))


def read_site(root: Path, site: str, size: int | None = None):
    """A site's images [n, S, S, 3] (float 0-1, resized to `size` if given), masks, and split of each."""
    datalist = json.loads((root / f"{site}.json").read_text())
    entries = [(split, e) for split in SPLITS for e in datalist[split]]
    images = []
    for _, entry in entries:
        image = Image.open(root / entry["image"])
        images.append(np.asarray(image.resize((size, size), Image.BILINEAR) if size else image, np.float32) / 255)
    masks = [np.asarray(Image.open(root / e["label"])) for _, e in entries]
    return np.stack(images), masks, [split for split, _ in entries]


def test_files_datalists_and_description(dataset):
    description = json.loads((dataset / "dataset.json").read_text())
    assert description["parameters"] == {"num_sites": 6, "image_size": 64, "seed": 0, "size_scale": 1.0}
    assert description["labels"] == {"0": "background", "1": "optic disc rim", "2": "optic cup"}
    assert description["regions"] == {"disc": [1, 2], "cup": [2]}
    assert set(description["sites"]) == set(SITES)
    for index, site in enumerate(SITES):
        datalist = load_datalist(dataset, site, num_classes=3)  # validates files, sizes, label values
        native = round(64 * PROFILES[index].size_factor)
        assert description["sites"][site]["native_size"] == native
        entry = datalist["training"][0]
        with Image.open(entry["image"]) as image, Image.open(entry["label"]) as mask:
            assert image.mode == "RGB" and image.size == (native, native)
            assert mask.mode == "L" and mask.size == (native, native)


def test_splits_by_image_and_cpu_friendly_sizes(dataset):
    sizes = {}
    for site in SITES:
        datalist = json.loads((dataset / f"{site}.json").read_text())
        ids = {split: {e["image"] for e in datalist[split]} for split in SPLITS}
        assert not (
            ids["training"] & ids["validation"]
            or ids["training"] & ids["testing"]
            or ids["validation"] & ids["testing"]
        ), f"{site}: an image is in two splits"
        sizes[site] = sum(len(v) for v in ids.values())
        assert abs(len(ids["training"]) / sizes[site] - 0.5) <= 0.05
        assert abs(len(ids["testing"]) / sizes[site] - 0.25) <= 0.05
    assert all(30 <= n <= 80 for n in sizes.values()), sizes
    assert min(sizes, key=sizes.get) == "site-5"


def test_masks_hold_a_disc_with_a_cup_inside(dataset):
    for site in SITES:
        _, masks, _ = read_site(dataset, site)
        for mask in masks:
            assert mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1, 2}
            disc, cup = mask >= 1, mask == 2
            assert ndimage.label(disc)[1] == 1, f"{site}: one connected disc"
            assert (mask == 1).any() and cup.any(), f"{site}: every eye has a rim and a cup"
            # the cup lies within the disc: inside its outline, and not reaching its outer edge everywhere
            assert (ndimage.binary_fill_holes(disc) >= cup).all()
            assert cup.sum() < disc.sum()
            rows, cols = np.nonzero(disc)
            cup_rows, cup_cols = np.nonzero(cup)
            assert rows.min() <= cup_rows.min() and cup_rows.max() <= rows.max()
            assert cols.min() <= cup_cols.min() and cup_cols.max() <= cols.max()


def test_sites_differ_as_designed_and_site5_is_most_shifted(dataset):
    data = {site: read_site(dataset, site, size=64) for site in SITES}
    description = json.loads((dataset / "dataset.json").read_text())["sites"]

    # Crop scale: the disc covers very different shares of the image; site-5's is much the smallest.
    disc = {site: np.mean([(m >= 1).mean() for m in masks]) for site, (_, masks, _) in data.items()}
    assert min(disc, key=disc.get) == "site-5" and max(disc, key=disc.get) == "site-2"
    assert sorted(disc.values())[1] > 2 * disc["site-5"]
    assert max(disc.values()) / min(disc.values()) > 5
    # Population: the glaucoma-heavy source (site-1, Drishti-GS-like) has the largest cups.
    cdr = {site: info["mean_vertical_cdr"] for site, info in description.items()}
    assert max(cdr, key=cdr.get) == "site-1"

    # Camera: mean colour of each site, and its distance to the other sites' mean colour.
    colour = {site: images.mean((0, 1, 2)) for site, (images, _, _) in data.items()}
    assert all(c[0] > c[1] > c[2] for c in colour.values()), "fundus photos are red > green > blue"
    spread = np.stack(list(colour.values())).std(0)
    assert (spread > 0.02).all(), colour
    shift = {
        site: np.linalg.norm(c - np.mean([d for s, d in colour.items() if s != site], 0)) for site, c in colour.items()
    }
    assert max(shift, key=shift.get) == "site-5", shift
    assert shift["site-5"] > 2 * sorted(shift.values())[-2]
    green_cast = {site: c[1] / c[0] for site, c in colour.items()}
    assert max(green_cast, key=green_cast.get) == "site-5"


def test_batch_from_make_loader(dataset):
    entries = load_datalist(dataset, "site-3", num_classes=3)["training"]
    loader = make_loader(entries, image_size=64, num_classes=3, batch_size=4, train=True, seed=0, in_channels=3)
    batch = next(iter(loader))
    assert batch["image"].shape == (4, 3, 64, 64) and batch["image"].dtype == torch.float32
    assert batch["label"].shape == (4, 1, 64, 64) and batch["label"].dtype == torch.int64
    assert set(batch["label"].unique().tolist()) == {0, 1, 2}


def _all_bytes(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deterministic_given_seed(tmp_path):
    small = dict(num_sites=2, image_size=32, size_scale=0.2)
    a = _all_bytes(generate_fundus_sites(tmp_path / "a", seed=0, **small))
    b = _all_bytes(generate_fundus_sites(tmp_path / "b", seed=0, **small))
    c = _all_bytes(generate_fundus_sites(tmp_path / "c", seed=1, **small))
    assert a == b
    shared = [k for k in a.keys() & c.keys() if "/images/" in k]
    assert shared and not any(a[k] == c[k] for k in shared)


def test_more_than_six_sites_reuse_profiles_with_new_seeds(tmp_path):
    root = generate_fundus_sites(tmp_path, num_sites=7, image_size=32, size_scale=0.1)
    description = json.loads((root / "dataset.json").read_text())
    assert load_datalist(root, "site-7", num_classes=3)
    assert description["sites"]["site-7"]["profile"] == description["sites"]["site-1"]["profile"]
    first, seventh = (np.asarray(Image.open(root / f"site-{k}/images/img000.png")) for k in (1, 7))
    assert first.shape == seventh.shape and not np.array_equal(first, seventh)


def test_small_image_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 32"):
        generate_fundus_sites(tmp_path, image_size=16)


def test_ensure_builtin_fundus_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRFL_CACHE_DIR", str(tmp_path))
    path = ensure_builtin_fundus(image_size=32, seed=3, num_sites=1, size_scale=0.2)
    assert path == tmp_path / "fundus-v1-n1-s32-seed3-x0.2" and (path / "complete").is_file()
    assert load_datalist(path, "site-1", num_classes=3)
    stamp = (path / "complete").stat().st_mtime_ns
    # the registry finds the same cache, without generating again
    assert ensure_builtin("fundus", image_size=32, seed=3, num_sites=1, size_scale=0.2) == path
    assert (path / "complete").stat().st_mtime_ns == stamp
    assert builtin_fundus_name() == "fundus-v1-n6-s64-seed0"


def test_test_scale_adds_test_images_of_each_sites_camera_and_changes_nothing_else(tmp_path):
    """test_scale 2: every site's testing split holds twice its images, the new ones from the site's own profile;
    training, validation and the test_scale-1 test images are the same files, byte for byte; the cache name is the
    old one at 1 and another at 2."""
    base, scaled, added = generated_at_test_scales("fundus", 2, tmp_path, image_size=32, num_sites=2, size_scale=0.2)
    assert base.name == "fundus-v1-n2-s32-seed0-x0.2" == builtin_fundus_name(32, 0, 2, 0.2, test_scale=1)
    before, after = (json.loads((root / "dataset.json").read_text()) for root in (base, scaled))
    for site, profile in zip(("site-1", "site-2"), PROFILES, strict=False):
        images = before["sites"][site]["images"]["testing"]
        assert len(added[site]["testing"]) == images and after["sites"][site]["images"]["testing"] == 2 * images
        for entry in added[site]["testing"]:
            image, mask = (np.asarray(Image.open(scaled / entry[key])) for key in ("image", "label"))
            assert "/images/extra-img" in entry["image"]
            assert image.shape == (round(32 * profile.size_factor),) * 2 + (3,)  # the site's native crop size
            assert set(np.unique(mask)) <= {0, 1, 2} and (mask >= 1).any()  # a disc in it
