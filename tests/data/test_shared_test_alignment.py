"""The built-in quality-shift data's one shared test set, as fairfl.split_noise's `shared_test` needs it: a site sends
each test image's influence under its index in the test loader's order (fairfl.classification.classification_influence),
and split_noise redraws index i once for every site, so every site must list the same images in the same order: the
clean ones in `testing` at a clean site, the same images corrupted in `testing_corrupted` at a corrupted one, and a
larger test_scale adding the same images to both lists at every site."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fairfl.data.datalist import CORRUPTED_SPLIT, load_datalist
from fairfl.data.loaders import classification_transforms, make_loader
from fairfl.data.synthetic_classification import ensure_builtin_skin

SITES = 5  # round(0.2 * 5) = 1 corrupted site: site-5
TINY = dict(image_size=32, num_sites=SITES, size_scale=0.05)  # 100 skin images, 20 of them the test set


@pytest.fixture(scope="module")
def skin(tmp_path_factory):
    """{test_scale: the tiny built-in skin data's root}."""
    cache = tmp_path_factory.mktemp("shared_test_cache")
    return {scale: ensure_builtin_skin(cache_dir=cache, test_scale=scale, **TINY) for scale in (1.0, 2.5)}


def datalists(root: Path) -> dict:
    return {f"site-{k}": json.loads((root / f"site-{k}.json").read_text()) for k in range(1, SITES + 1)}


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_every_site_lists_the_same_test_images_in_the_same_order_clean_and_corrupted(skin, scale):
    root = skin[scale]
    description = json.loads((root / "dataset.json").read_text())
    assert description["test"]["shared"] and description["corrupted_sites"] == [f"site-{SITES}"]
    lists = datalists(root)
    clean, corrupted = lists["site-1"]["testing"], lists["site-1"][CORRUPTED_SPLIT]
    for site, datalist in lists.items():
        assert datalist["testing"] == clean, site
        assert datalist[CORRUPTED_SPLIT] == corrupted, site
    # index i is one image in both lists: the same file name under test/clean and test/noise, the same label
    assert len(clean) == len(corrupted) == round(20 * scale)
    for i, (a, b) in enumerate(zip(clean, corrupted, strict=True)):
        name = Path(a["image"]).name
        assert a["image"] == f"test/clean/{name}" and b["image"] == f"test/noise/{name}", i
        assert a["label"] == b["label"], i
        assert (root / a["image"]).is_file() and (root / b["image"]).is_file()
    assert len({e["image"] for e in clean}) == len(clean)  # no image twice
    if scale > 1:  # the extra images follow the test_scale-1 ones, in both lists, at every site
        base = datalists(skin[1.0])["site-1"]
        assert clean[:20] == base["testing"] and corrupted[:20] == base[CORRUPTED_SPLIT]
        assert all(Path(e["image"]).name.startswith("extra-img") for e in clean[20:] + corrupted[20:])


def test_the_evaluation_loader_keeps_the_datalist_order(skin):
    """A site's test loader (as the executor builds it: train False, no max_samples) gives the datalist's images in
    its order: no shuffling, sorting, sampling or dropping, so loader index i is datalist entry i."""
    root = skin[2.5]
    for site in ("site-1", f"site-{SITES}"):
        lists = load_datalist(root, site, task="classification", num_classes=8, optional_splits=(CORRUPTED_SPLIT,))
        for split in ("testing", CORRUPTED_SPLIT):
            entries = lists[split]
            loader = make_loader(entries, 32, 8, 7, train=False, seed=0, in_channels=3, task="classification")
            batches = list(loader)
            labels = torch.cat([b["label"] for b in batches])
            images = torch.cat([b["image"] for b in batches])
            assert labels.tolist() == [e["label"] for e in entries], (site, split)
            transform = classification_transforms(32, train=False, in_channels=3, site=site)
            one_by_one = torch.stack([transform(dict(e))["image"] for e in entries])
            assert torch.equal(images, one_by_one), (site, split)
            assert not np.array_equal(images[0].numpy(), images[1].numpy())  # distinct images, not one repeated
