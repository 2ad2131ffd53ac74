"""Convert the public multi-site retinal fundus layout into per-site datalists with 0/1/2 masks.

Source layouts (folder names matched case-insensitively), one folder per site under `src`:
- `<site>/train|test/ROIs/image|mask/<id>.<ext>`: the multi-site optic disc/cup release used for
  domain generalisation (Wang et al., DoFE; FedDG: Domain1 Drishti-GS, Domain2 RIM-ONE r3, Domain3
  REFUGE training, Domain4 REFUGE validation);
- `<site>/train|test/image(s)|mask(s)/`, or `<site>/[ROIs/]image(s)|mask(s)/` with no given test set.
Where a container has both a `ROIs/` pair and a direct pair, the ROI crops are used (the papers do).
An image and its mask share the file name stem (any extension: images PNG/JPEG, masks PNG/BMP).

Masks are grey: 255 background, 128 optic disc rim, 0 optic cup. They are re-encoded as uint8
0 background, 1 rim, 2 cup (the disc is 1 + 2). Colour masks are read as the mean of their channels
and anti-aliased edges are mapped to the nearest level (< 64 cup, 64-191 rim, >= 192 background).
A mask is rejected when more than `MAX_OFF_LEVEL` of its pixels are over `OFF_LEVEL` grey levels from
their level (or their channels disagree by as much), when it has no background or no rim, or when the
cup reaches the image border (typical of a 0/255 disc mask with a black background, or of a mask
already holding class indices).

Output (`dst` must not exist or be empty; it is written to a temporary sibling and renamed into
place only when complete): `<dst>/<site>/images/` (RGB images copied as they are; other colour modes
re-encoded as RGB PNG), `<dst>/<site>/labels/<id>.png`, `<dst>/<site>.json` datalists,
`<dst>/dataset.json` (labels, regions, per-site sources and counts) and `<dst>/sites.json`.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fairfl.data.datalist import (
    PIL_SUFFIXES,
    SPLITS,
    check_output_folder,
    output_site_names,
    split_cases,
    staged_output,
    write_datalist,
)
from fairfl.data.synthetic_fundus import LABELS, REGIONS
from fairfl.errors import DataError
from fairfl.names import safe_site_names

TRAIN_NAMES, TEST_NAMES = ("train", "training"), ("test", "testing")
IMAGE_NAMES, MASK_NAMES, ROI_NAMES = ("image", "images"), ("mask", "masks"), ("rois",)
LEVELS = (255, 128, 0)  # grey level of class 0 (background), 1 (disc rim), 2 (cup)
OFF_LEVEL = 48  # grey levels from the nearest level beyond which a pixel is not anti-aliasing
MAX_OFF_LEVEL = 0.05  # fraction of such pixels a mask may hold


def convert_fundus(
    src: str | Path,
    dst: str | Path,
    seed: int = 0,
    site_names: None | str | Mapping[str, str] = None,
    split: Sequence[float] = (0.5, 0.25, 0.25),
) -> dict:
    """Copy every site's images, re-encode its masks to 0/1/2 and write per-site datalists.

    Args:
        src: folder holding one folder per site (layouts in the module docstring).
        dst: output data root (the jobs' `data_root`); must not exist or be empty.
        seed: split seed, combined with the source folder name as in `convert_prostate`.
        site_names: None, "flare" or a mapping, as in `fairfl.data.datalist.output_site_names`;
            `<dst>/sites.json` records output -> source.
        split: training/validation/testing fractions of each site's images (FedCE: 0.5/0.25/0.25).
            A site with `train/` and `test/` folders keeps its test set as testing and splits its
            training images into training and validation in the ratio of the first two fractions.

    Returns:
        `{"sites": {name: {"source", "test_set": "given" | "split", "images": {split: [ids]}}}, "split": in words}`.

    Raises:
        DataError naming the site and the file for every problem found (nothing is written then).
    """
    src, dst = Path(src), Path(dst)
    if len(split) != len(SPLITS) or min(split) < 0 or split[0] <= 0 or split[1] <= 0:
        raise ValueError(f"split must be {len(SPLITS)} non-negative fractions (training, validation > 0), got {split}")
    if not src.is_dir():
        raise DataError("-", src, "source folder not found")
    check_output_folder(dst)
    layouts = {p.name: layout for p in sorted(src.iterdir()) if p.is_dir() and (layout := _site_layout(p))}
    if not layouts:
        raise DataError("-", src, "no site folders with image/ and mask/ folders found (see convert_fundus's layouts)")
    names = safe_site_names(output_site_names(list(layouts), site_names), src)

    with staged_output(dst) as staging:
        summary = {
            names[source]: _convert_site(src / source, names[source], layout, staging, split, seed)
            for source, layout in layouts.items()
        }
        used = _split_used(summary, split, seed)
        description = dict(
            name="multi-site retinal fundus, optic disc and cup",
            converter="fairfl.data.convert_fundus",
            source=str(src.resolve()),
            labels=LABELS,
            regions=REGIONS,
            mask_rule=(
                f"source grey levels {LEVELS[0]} background, {LEVELS[1]} disc rim, {LEVELS[2]} cup, "
                "nearest level (colour: channel mean) -> 0, 1, 2"
            ),
            split=list(split),
            split_used=used,
            seed=seed,
            sites={
                site: dict(
                    source=info["source"], test_set=info["test_set"], images={s: len(info["images"][s]) for s in SPLITS}
                )
                for site, info in summary.items()
            },
        )
        (staging / "dataset.json").write_text(json.dumps(description, indent=1) + "\n")
        (staging / "sites.json").write_text(json.dumps({s: i["source"] for s, i in summary.items()}, indent=1) + "\n")
    return {"sites": summary, "split": used}


def _split_used(summary: dict, split: Sequence[float], seed: int) -> str:
    own = f"fairfl's seeded split by image ({'/'.join(f'{f:g}' for f in split)}, seed {seed})"
    given = [site for site, info in summary.items() if info["test_set"] == "given"]
    return f"testing: the release's test/ folder at {', '.join(given)}; the rest: {own}" if given else own


def mask_classes(mask: np.ndarray) -> tuple[np.ndarray, float]:
    """Class indices (0 background, 1 rim, 2 cup) of a grey [H, W] or colour [H, W, C] 0/128/255 mask,
    and the fraction of pixels far from every level (see the module docstring for the rule)."""
    mask = np.asarray(mask, dtype=np.float32)
    spread = np.zeros(mask.shape[:2], np.float32)
    if mask.ndim == 3:
        spread = mask.max(-1) - mask.min(-1)
        mask = mask.mean(-1)
    distance = np.abs(mask[..., None] - np.asarray(LEVELS, np.float32))
    classes = distance.argmin(-1).astype(np.uint8)
    off = (distance.min(-1) > OFF_LEVEL) | (spread > OFF_LEVEL)
    return classes, float(off.mean())


# ----------------------------------------------------------------------------------------------
# finding the files


def _child(folder: Path, names: Sequence[str]) -> Path | None:
    """The sub-folder whose name is one of `names`, case-insensitively (releases differ)."""
    for child in sorted(folder.iterdir()):
        if child.is_dir() and child.name.lower() in names:
            return child
    return None


def _pair(container: Path) -> tuple[Path, Path] | None:
    """(image folder, mask folder) of a container: its `ROIs/` pair if it has one, else its own."""
    for folder in (_child(container, ROI_NAMES), container):
        if folder is not None and _child(folder, IMAGE_NAMES) and _child(folder, MASK_NAMES):
            return _child(folder, IMAGE_NAMES), _child(folder, MASK_NAMES)
    return None


def _site_layout(site_dir: Path) -> dict[str, tuple[Path, Path]] | None:
    """{"train": pair, "test": pair} where the site has such folders, else {"all": pair}; None if no pair."""
    parts = {part: _child(site_dir, names) for part, names in (("train", TRAIN_NAMES), ("test", TEST_NAMES))}
    if any(parts.values()):
        layout = {part: _pair(folder) for part, folder in parts.items() if folder is not None}
        missing = [part for part, pair in layout.items() if pair is None]
        if missing:
            raise DataError(site_dir.name, parts[missing[0]], "no image/ and mask/ folders (directly or under ROIs/)")
        return layout
    pair = _pair(site_dir)
    return {"all": pair} if pair else None


def _pictures(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.name.lower().endswith(PIL_SUFFIXES)
    )


def _by_stem(files: list[Path], site: str) -> dict[str, Path]:
    """Files by case-folded stem; two files with one stem (a.png, a.jpg) are ambiguous."""
    found = {}
    for path in files:
        key = path.stem.lower()
        if key in found:
            raise DataError(site, path, f"two files named {path.stem} ({found[key].name}, {path.name}): which one?")
        found[key] = path
    return found


def _pairs(image_dir: Path, mask_dir: Path, site: str) -> dict[str, tuple[Path, Path]]:
    """{image id: (image, mask)}; an image without a mask, or a mask without an image, is an error."""
    images, masks = _by_stem(_pictures(image_dir), site), _by_stem(_pictures(mask_dir), site)
    for key, image in images.items():
        if key not in masks:
            raise DataError(site, image, f"no mask for this image in {mask_dir} (looked for {image.stem}.png/.bmp/...)")
    for key, mask in masks.items():
        if key not in images:
            raise DataError(site, mask, f"mask without an image in {image_dir}")
    return {images[key].stem: (images[key], masks[key]) for key in images}


# ----------------------------------------------------------------------------------------------
# one site


def _convert_site(site_dir: Path, site: str, layout: dict, dst: Path, split: Sequence[float], seed: int) -> dict:
    pairs = {part: _pairs(*folders, site) for part, folders in layout.items()}
    seen = {}  # the output folder is flat: an id may appear once in the site
    for found in pairs.values():
        for image_id, (image, _) in found.items():
            if image_id.lower() in seen:
                raise DataError(site, image, f"image id {image_id} also in {seen[image_id.lower()]}")
            seen[image_id.lower()] = image
    entries = {
        image_id: _convert_pair(image, mask, dst, site, image_id)
        for found in pairs.values()
        for image_id, (image, mask) in found.items()
    }

    split_seed = [seed, zlib.crc32(site_dir.name.encode())]
    if "train" in pairs and "test" in pairs:
        if len(pairs["train"]) < 2 or not pairs["test"]:
            raise DataError(
                site,
                site_dir,
                f"{len(pairs['train'])} training and {len(pairs['test'])} test image(s); "
                "at least 2 and 1 are needed for training, validation and testing",
            )
        training, validation = _split_two(list(pairs["train"]), split[0], split[1], split_seed)
        ids = {"training": training, "validation": validation, "testing": sorted(pairs["test"])}
    else:
        if len(entries) < len(SPLITS):
            raise DataError(
                site,
                site_dir,
                f"{len(entries)} image(s) found; at least {len(SPLITS)} are needed "
                "to give training, validation and testing one each",
            )
        ids = split_cases(list(entries), split, seed=split_seed)
    write_datalist(dst / f"{site}.json", {s: [entries[i] for i in ids[s]] for s in SPLITS})
    return dict(source=site_dir.name, test_set="given" if "test" in pairs and "train" in pairs else "split", images=ids)


def _split_two(ids: list[str], train_fraction: float, validation_fraction: float, seed) -> tuple[list[str], list[str]]:
    """Seeded split of a given training set into training and validation (each keeps one image at least)."""
    ids = sorted(ids)
    n_val = min(max(1, round(len(ids) * validation_fraction / (train_fraction + validation_fraction))), len(ids) - 1)
    order = np.random.default_rng(seed).permutation(len(ids))
    return sorted(ids[i] for i in order[n_val:]), sorted(ids[i] for i in order[:n_val])


def _convert_pair(image_path: Path, mask_path: Path, dst: Path, site: str, image_id: str) -> dict:
    """Check one image/mask pair, copy the image, write the re-encoded mask; return its datalist entry."""
    from PIL import Image

    image = _open(image_path, site, "image")
    mask = _open(mask_path, site, "mask")
    if image.size != mask.size:
        raise DataError(
            site, mask_path, f"mask size {mask.size} does not match image {image_path.name} size {image.size}"
        )
    if mask.mode in ("I", "I;16", "I;16B", "F"):
        raise DataError(site, mask_path, f"mask mode {mask.mode}: expected an 8-bit grey (or colour) mask")
    classes, off = mask_classes(np.asarray(mask.convert("RGB") if mask.mode != "L" else mask))
    problem = None
    if off > MAX_OFF_LEVEL:
        problem = f"{off:.0%} of the pixels are far from the grey levels 255/128/0 (background/rim/cup)"
    elif not (classes == 0).any():
        problem = "no background (255) pixels"
    elif not (classes == 1).any():
        problem = "no disc rim (128) pixels"
    elif (np.concatenate([classes[0], classes[-1], classes[:, 0], classes[:, -1]]) == 2).any():
        problem = "cup (0) pixels reach the image border: is 0 the background here?"
    if problem:
        raise DataError(site, mask_path, f"{problem}; expected grey 255 background, 128 disc rim, 0 cup")

    # RGB files are copied as they are; RGBA, palette and grey ones become RGB PNG (3 input channels).
    entry = {
        "image": f"{site}/images/{image_id}{image_path.suffix.lower() if image.mode == 'RGB' else '.png'}",
        "label": f"{site}/labels/{image_id}.png",
    }
    for key in entry:
        (dst / entry[key]).parent.mkdir(parents=True, exist_ok=True)
    if image.mode == "RGB":
        shutil.copyfile(image_path, dst / entry["image"])
    else:
        image.convert("RGB").save(dst / entry["image"])
    Image.fromarray(classes).save(dst / entry["label"])
    return entry


def _open(path: Path, site: str, kind: str):
    """The image, fully decoded (a truncated file fails here, not in training)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
            return image
    except Exception as err:  # unreadable, truncated or not an image: say which file
        raise DataError(site, path, f"cannot read {kind}: {err}") from err
