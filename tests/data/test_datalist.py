"""Datalist validation (load_datalist), case splitting, and the MONAI loaders on NIfTI and PNG data."""

import json

import nibabel as nib
import numpy as np
import pytest
import torch
from PIL import Image

from fairfl.data.datalist import SPLITS, load_datalist, split_cases, write_datalist
from fairfl.data.loaders import make_loader
from fairfl.errors import DataError

SITE = "site-1"


def _save(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".png":
        Image.fromarray(array).save(path)
    else:
        nib.save(nib.Nifti1Image(array, np.eye(4)), path)


def make_site(root, site=SITE, per_split=3, shape=(20, 24), fmt="nii.gz", depth_axis=False, rgb=False):
    """A small valid segmentation site: random images, disc masks; returns the datalist path."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    splits = {}
    for split in SPLITS:
        entries = []
        for i in range(per_split):
            name = f"{split}_{i}.{fmt}"
            mask = ((yy - shape[0] / 2) ** 2 + (xx - shape[1] / 2) ** 2 < (3 + i) ** 2).astype(np.uint8)
            if fmt == "png":
                image = rng.integers(0, 255, shape, dtype=np.uint8)
                image = np.stack([image] * 3, -1) if rgb else image
            else:
                image = rng.normal(100, 20, shape).astype(np.float32)
                image, mask = (image[..., None], mask[..., None]) if depth_axis else (image, mask)
            _save(root / site / "images" / name, image)
            _save(root / site / "labels" / name, mask)
            entries.append({"image": f"{site}/images/{name}", "label": f"{site}/labels/{name}"})
        splits[split] = entries
    return write_datalist(root / f"{site}.json", splits)


def test_valid_nifti_site_gives_absolute_existing_paths(tmp_path):
    make_site(tmp_path)
    datalist = load_datalist(tmp_path, SITE)
    assert set(datalist) == set(SPLITS)
    for entries in datalist.values():
        assert len(entries) == 3
        for entry in entries:
            for key in ("image", "label"):
                assert entry[key].startswith(str(tmp_path)) and (tmp_path / entry[key]).is_file()


def test_absolute_paths_and_requested_splits(tmp_path):
    path = make_site(tmp_path)
    datalist = json.loads(path.read_text())
    for entry in datalist["training"]:
        entry["image"] = str(tmp_path / entry["image"])
    del datalist["testing"]  # not requested below, so not needed
    path.write_text(json.dumps(datalist))
    loaded = load_datalist(tmp_path, SITE, splits=("training", "validation"))  # absolute, inside the data root
    assert set(loaded) == {"training", "validation"}
    root = tmp_path / "other_root"  # the same files seen from a data root they are outside of
    datalist["validation"] = [{k: str(tmp_path / v) for k, v in e.items()} for e in datalist["validation"]]
    datalist["training"] = [{**e, "label": str(tmp_path / e["label"])} for e in datalist["training"]]
    write_datalist(root / path.name, {**datalist, "testing": []})
    with pytest.raises(DataError, match="FAIRFL_ALLOW_ABSOLUTE_PATHS"):  # only where the site allows it
        load_datalist(root, SITE, splits=("training", "validation"))
    assert set(load_datalist(root, SITE, splits=("training",), allow_absolute_paths=True)) == {"training"}


@pytest.mark.parametrize(
    "fmt, depth_axis, rgb",
    [("nii.gz", False, False), ("nii.gz", True, False), ("png", False, False), ("png", False, True)],
)
def test_loader_batch_shapes(tmp_path, fmt, depth_axis, rgb):
    """HxW and HxWx1 NIfTI, grey and RGB PNG all come out as [B, 1, S, S] float / long {0, 1}."""
    make_site(tmp_path, fmt=fmt, depth_axis=depth_axis, rgb=rgb)
    datalist = load_datalist(tmp_path, SITE)
    batch = next(
        iter(make_loader(datalist["training"], image_size=32, num_classes=2, batch_size=3, train=True, seed=0))
    )
    assert batch["image"].shape == (3, 1, 32, 32) and batch["image"].dtype == torch.float32
    assert batch["label"].shape == (3, 1, 32, 32) and batch["label"].dtype == torch.int64
    assert set(batch["label"].unique().tolist()) <= {0, 1} and batch["label"].sum() > 0
    assert type(batch["image"]) is torch.Tensor  # plain tensors, not MetaTensor


def test_loader_is_seeded_and_subset_is_deterministic(tmp_path):
    make_site(tmp_path, per_split=8)
    entries = load_datalist(tmp_path, SITE)["training"]

    def first_batch(seed, **kwargs):
        return next(iter(make_loader(entries, 32, 2, 4, train=True, seed=seed, **kwargs)))

    a, b, c = first_batch(0), first_batch(0), first_batch(1)
    assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    assert not torch.equal(a["image"], c["image"])
    subset = make_loader(entries, 32, 2, 4, train=False, seed=3, max_samples=5)
    again = make_loader(entries, 32, 2, 4, train=False, seed=3, max_samples=5)
    assert list(subset.sampler) == list(again.sampler) and len(set(subset.sampler)) == 5  # a seeded sample of 5
    assert sum(len(batch["image"]) for batch in again) == 5
    # evaluation: no shuffling, no augmentation: two passes give the same batches
    plain = make_loader(entries, 32, 2, 4, train=False, seed=3)
    first, second = (torch.cat([batch["image"] for batch in plain]) for _ in range(2))
    assert torch.equal(first, second)


def test_classification_labels(tmp_path):
    image = tmp_path / "a.png"
    _save(image, np.zeros((8, 8), np.uint8))
    write_datalist(tmp_path / f"{SITE}.json", {s: [{"image": "a.png", "label": 2}] for s in SPLITS})
    assert load_datalist(tmp_path, SITE, task="classification", num_classes=3)["training"][0]["label"] == 2
    for bad in (3, -1, 1.5, "1", True):
        write_datalist(tmp_path / f"{SITE}.json", {s: [{"image": "a.png", "label": bad}] for s in SPLITS})
        with pytest.raises(DataError, match="a.png"):
            load_datalist(tmp_path, SITE, task="classification", num_classes=3)


def test_optional_splits_are_checked_when_present_and_skipped_when_absent(tmp_path):
    _save(tmp_path / "a.png", np.zeros((8, 8), np.uint8))
    splits = {s: [{"image": "a.png", "label": 1}] for s in SPLITS}
    write_datalist(tmp_path / f"{SITE}.json", splits)
    options = dict(task="classification", num_classes=3, optional_splits=("testing_corrupted",))
    assert set(load_datalist(tmp_path, SITE, **options)) == set(SPLITS)
    datalist = {**splits, "testing_corrupted": [{"image": "a.png", "label": 2}]}
    (tmp_path / f"{SITE}.json").write_text(json.dumps(datalist))
    assert load_datalist(tmp_path, SITE, **options)["testing_corrupted"][0]["label"] == 2
    (tmp_path / f"{SITE}.json").write_text(
        json.dumps({**datalist, "testing_corrupted": [{"image": "b.png", "label": 2}]})
    )
    with pytest.raises(DataError, match="b.png"):
        load_datalist(tmp_path, SITE, **options)


def _break(kind, root):
    """Make one kind of bad data in a valid site; return the file name the error must name."""
    datalist_path = root / f"{SITE}.json"
    datalist = json.loads(datalist_path.read_text())
    first = datalist["training"][0]
    if kind == "missing datalist":
        datalist_path.unlink()
        return datalist_path.name
    if kind == "invalid json":
        datalist_path.write_text("{not json")
        return datalist_path.name
    if kind == "missing split":
        del datalist["validation"]
    elif kind == "empty split":
        datalist["testing"] = []
    elif kind == "missing image":
        (root / first["image"]).unlink()
        return first["image"].split("/")[-1]
    elif kind == "unsupported format":
        (root / SITE / "images" / "scan.mha").write_bytes(b"not read")
        first["image"] = f"{SITE}/images/scan.mha"
        datalist_path.write_text(json.dumps(datalist))
        return "scan.mha"
    elif kind == "missing label":
        first["label"] = f"{SITE}/labels/nope.nii.gz"
        datalist_path.write_text(json.dumps(datalist))
        return "nope.nii.gz"
    elif kind == "shape mismatch":
        _save(root / first["label"], np.zeros((20, 23), np.uint8))
        return first["label"].split("/")[-1]
    elif kind == "label out of range":
        _save(root / first["label"], np.full((20, 24), 255, np.uint8))  # an unbinarised 0/255 mask
        return first["label"].split("/")[-1]
    elif kind == "non-integer label":
        _save(root / first["label"], np.full((20, 24), 0.5, np.float32))
        return first["label"].split("/")[-1]
    datalist_path.write_text(json.dumps(datalist))
    return datalist_path.name


@pytest.mark.parametrize(
    "kind",
    [
        "missing datalist",
        "invalid json",
        "missing split",
        "empty split",
        "missing image",
        "unsupported format",
        "missing label",
        "shape mismatch",
        "label out of range",
        "non-integer label",
    ],
)
def test_bad_data_raises_data_error_naming_site_and_file(tmp_path, kind):
    make_site(tmp_path)
    file_name = _break(kind, tmp_path)
    with pytest.raises(DataError) as info:
        load_datalist(tmp_path, SITE)
    assert SITE in str(info.value) and file_name in str(info.value), str(info.value)


def test_split_cases_by_case():
    cases = [f"case{i:02d}" for i in range(10)]
    split = split_cases(cases, seed=0)
    assert [len(split[s]) for s in SPLITS] == [6, 2, 2]
    assert sorted(sum(split.values(), [])) == cases  # every case once: no leakage
    assert split == split_cases(list(reversed(cases)), seed=0)  # order of input does not matter
    assert split != split_cases(cases, seed=1)
    for n in (3, 4, 5):
        assert all(split_cases(cases[:n], seed=0)[s] for s in SPLITS)
    with pytest.raises(ValueError):
        split_cases(cases[:2])
