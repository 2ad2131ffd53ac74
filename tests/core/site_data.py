"""A tiny site's data for the bad-input tests (test_bad_data_files.py, test_bad_configuration.py): a valid
segmentation site written in the real formats (nibabel, PIL), a datalist entry pointed elsewhere, a server task as
the site reads it, and what the site's executor does with its data on its first tasks."""

import json

import nibabel as nib
import numpy as np
from PIL import Image

from fairfl.data.datalist import SPLITS, write_datalist
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask

import helpers

SITE = "site-1"
SHAPE = (8, 8)


def save(path, array, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".png") or path.name.endswith(".jpg"):
        Image.fromarray(array, mode).save(path) if mode is None else Image.fromarray(array).convert(mode).save(path)
    else:
        nib.save(nib.Nifti1Image(array, np.eye(4)), path)
    return path


def good_site(root, site=SITE, fmt="nii.gz"):
    """A valid tiny segmentation site (2 cases a split); returns the first training entry's file paths."""
    rng = np.random.default_rng(0)
    splits = {}
    for split in SPLITS:
        entries = []
        for i in range(2):
            name = f"{split}_{i}.{fmt}"
            image = rng.integers(0, 255, SHAPE).astype(np.uint8 if fmt == "png" else np.float32)
            mask = np.zeros(SHAPE, np.uint8)
            mask[2:5, 2:5] = 1
            save(root / site / "images" / name, image)
            save(root / site / "labels" / name, mask)
            entries.append({"image": f"{site}/images/{name}", "label": f"{site}/labels/{name}"})
        splits[split] = entries
    write_datalist(root / f"{site}.json", splits)
    first = splits["training"][0]
    return root / first["image"], root / first["label"]


def set_first(root, key, value, site=SITE):
    """Point the first training entry's `key` at `value` (a path string as a datalist holds it)."""
    path = root / f"{site}.json"
    datalist = json.loads(path.read_text())
    datalist["training"][0][key] = value
    path.write_text(json.dumps(datalist))


def site_task(meta: dict, site=SITE) -> SiteTask:
    """A server task of `meta` as the site (default SITE) reads it."""
    return helpers.site_task(meta, site)


def load_site(root, site=SITE, in_channels=1, num_classes=2, task="segmentation", max_samples=None):
    """What a site does with its data on its first tasks: read the datalist and dataset.json, then build (decode
    and cache) the loader of every split; with max_samples, the sampling loader (Fed-LWR's CKA), which decodes
    only while it is read: read once."""
    executor = FairflExecutor(data_root=str(root), image_size=16, batch_size=2)
    meta = {
        protocol.MODEL_SPEC: {"name": "unet", "in_channels": in_channels, "num_classes": num_classes},
        protocol.TASK: task,
    }
    for split in SPLITS:
        for _ in executor._loader(site_task(meta, site), split, train=False, seed=0, max_samples=max_samples):
            if max_samples is None:
                break
    return executor
