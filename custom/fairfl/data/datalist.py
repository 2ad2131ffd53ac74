"""Decathlon-style datalists: read and validate a site's datalist, split cases, write datalists.

A site's data is `<data_root>/<site>.json` with keys `training`, `validation`, `testing`; each entry
is `{"image": path, "label": mask path or class index}`, paths relative to `data_root`. Paths that lead
outside it (absolute, `../`, a link out of it) are refused unless the site allows them
(`allow_absolute_paths`: the site's FAIRFL_ALLOW_ABSOLUTE_PATHS, fairfl.site_settings), and so is an image whose
header declares more than the site's size limits (FAIRFL_MAX_IMAGE_SIDE, FAIRFL_MAX_IMAGE_VOXELS), before any
pixel is read. Every problem is
reported as a `DataError` naming the site and the file, before any training starts; what only decoding
shows (a truncated file, NaN pixels) when the loader first reads the file (fairfl.data.loaders).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fairfl.errors import DataError
from fairfl.files import read_json
from fairfl.names import safe_name
from fairfl.site_settings import (
    ALLOW_ABSOLUTE_PATHS_ENV,
    MAX_IMAGE_SIDE,
    MAX_IMAGE_SIDE_ENV,
    MAX_IMAGE_VOXELS,
    MAX_IMAGE_VOXELS_ENV,
)

SPLITS = ("training", "validation", "testing")
TASKS = ("segmentation", "classification")
# a classification datalist's optional split: the test images corrupted as the corrupted sites' are (FedISM+'s shift)
CORRUPTED_SPLIT = "testing_corrupted"
NIFTI_SUFFIXES = (".nii", ".nii.gz")
PIL_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
# PIL modes read as they are: one grey channel (bit, 8/16/32-bit integer, float), grey + alpha, RGB(A)
IMAGE_MODES = ("1", "L", "I", "F", "I;16", "I;16B", "I;16L", "LA", "RGB", "RGBA")
MASK_MODES = ("1", "L", "P", "I", "I;16", "I;16B", "I;16L")  # one channel of class indices (a palette's too)


def site_load_options(own, task: str, num_classes: int, spatial_dims: int = 2) -> dict:
    """`load_datalist`'s keyword arguments for a site whose own settings are `own` (fairfl.site_settings): what the
    site checks its data with at its first task, and `fairfl check-data` before a federation starts."""
    return {
        "num_classes": num_classes,
        "task": task,
        "spatial_dims": spatial_dims,
        "allow_absolute_paths": own.allow_absolute_paths,
        "max_image_side": own.max_image_side,
        "max_image_voxels": own.max_image_voxels,
        "optional_splits": (CORRUPTED_SPLIT,) if task == "classification" else (),
    }


def load_datalist(
    data_root: str | Path,
    site: str,
    task: str = "segmentation",
    num_classes: int = 2,
    splits: Sequence[str] = SPLITS,
    optional_splits: Sequence[str] = (),
    allow_absolute_paths: bool = False,
    max_image_side: int = MAX_IMAGE_SIDE,
    max_image_voxels: int = MAX_IMAGE_VOXELS,
    problems: list[DataError] | None = None,
    spatial_dims: int = 2,
) -> dict[str, list[dict]]:
    """Read and validate `<data_root>/<site>.json`; return `{split: entries}` with absolute paths.

    `optional_splits` are read and checked like `splits` when the datalist has them, and left out of the
    result when it does not (a classification datalist's `testing_corrupted`).

    Checks, failing on the first problem with a `DataError` that names the site and the file:
    the site is a plain name (fairfl.names); the datalist exists and is JSON; each requested split is
    present and non-empty; every image (and, for segmentation, mask) file exists inside the data
    root (anywhere with `allow_absolute_paths`); its header says a 2-D image of a supported kind
    (not a volume, no palette image, a one-channel mask), or with `spatial_dims` 3 a NIfTI volume, of at most
    `max_image_side` per axis and
    `max_image_voxels` in all (the site's settings; checked before any pixel, a mask's too, is read);
    image and mask have the same spatial shape;
    mask values are integers in `[0, num_classes - 1]`; for classification, each label is an integer in
    that range.

    With a `problems` list nothing is raised (fairfl check-data): each problem is appended to it and the checks
    go on, one DataError for each bad entry, split or unreadable datalist, and the result holds the entries that
    passed.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    root = Path(data_root).expanduser()

    def checked(check, *args):  # check's result, or None with its problem kept in `problems`
        try:
            return check(*args)
        except DataError as err:
            if problems is None:
                raise
            problems.append(err)
            return None

    datalist = checked(_read_datalist, root, site, allow_absolute_paths)
    if datalist is None:
        return {}
    datalist_path = root / f"{site}.json"
    # each entry's checks
    settings = (task, num_classes, allow_absolute_paths, (max_image_side, max_image_voxels, spatial_dims))
    result = {}
    for split in [*splits, *(s for s in optional_splits if s in datalist)]:
        entries = checked(_split_entries, datalist, split, site, datalist_path)
        if entries is None:
            continue
        passed = (
            checked(_checked_entry, entry, root, site, datalist_path, f"{split}[{index}]", *settings)
            for index, entry in enumerate(entries)
        )
        result[split] = [entry for entry in passed if entry is not None]
    return result


def _read_datalist(root: Path, site: str, allow_absolute_paths: bool) -> dict:
    """`<root>/<site>.json` as a dict, or a DataError: an unsafe site name, no such file, a link out of the root,
    not a JSON object."""
    try:
        safe_name(site, "site name")
    except ValueError as err:  # it becomes a file name: never `../other`
        raise DataError(str(site), root / f"{site}.json", f"{err}: a datalist is <data_root>/<site>.json") from err
    datalist_path = root / f"{site}.json"
    if not datalist_path.is_file():
        raise DataError(site, datalist_path, "datalist not found (expected <data_root>/<site>.json)")
    if not allow_absolute_paths and not _inside(datalist_path, root):
        raise DataError(
            site,
            datalist_path,
            f"the datalist is a link out of the data root {root}; "
            f"the site allows that only with {ALLOW_ABSOLUTE_PATHS_ENV}=1",
        )
    try:
        datalist = read_json(datalist_path)
    except ValueError as err:
        raise DataError(site, datalist_path, f"datalist: {err}") from None
    if not isinstance(datalist, dict):
        raise DataError(site, datalist_path, "datalist must be a JSON object with keys " + ", ".join(SPLITS))
    return datalist


def _split_entries(datalist: dict, split: str, site: str, datalist_path: Path) -> list:
    entries = datalist.get(split)
    if entries is None:
        raise DataError(site, datalist_path, f"split {split!r} missing from datalist")
    if not isinstance(entries, list) or not entries:
        raise DataError(site, datalist_path, f"split {split!r} is empty (or not a list)")
    return entries


def _checked_entry(
    entry,
    root: Path,
    site: str,
    datalist_path: Path,
    where: str,
    task: str,
    num_classes: int,
    allow_absolute_paths: bool,
    limits: tuple[int, int, int],
) -> dict:
    if not isinstance(entry, dict) or "image" not in entry or "label" not in entry:
        raise DataError(site, datalist_path, f"entry {where} must be an object with 'image' and 'label'")
    image = entry_file(entry["image"], root, site, datalist_path, where, "image", allow_absolute_paths)
    image_shape = spatial_shape(image, site, IMAGE_MODES, *limits)
    checked = dict(entry, image=str(image))
    label = entry["label"]
    if task == "classification":
        # bool is an int subclass, but `true` as a class label is almost surely a mistake.
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < num_classes:
            raise DataError(
                site,
                image,
                f"classification label {label!r} (entry {where} of {datalist_path.name}) "
                f"is not an integer in [0, {num_classes - 1}]",
            )
        return checked
    mask = entry_file(label, root, site, datalist_path, where, "label", allow_absolute_paths)
    mask_shape = spatial_shape(mask, site, MASK_MODES, *limits)
    if image_shape != mask_shape:
        raise DataError(site, mask, f"mask shape {mask_shape} does not match image {image.name} shape {image_shape}")
    _check_mask_values(read_array(mask, site), mask, site, num_classes)
    checked["label"] = str(mask)
    return checked


def entry_file(
    value,
    root: Path,
    site: str,
    datalist_path: Path,
    where: str,
    kind: str,
    allow_absolute_paths: bool,
    remedy: str = f"the site allows that only with {ALLOW_ABSOLUTE_PATHS_ENV}=1 in its environment",
) -> Path:
    """The file a datalist entry's `kind` ("image", "label") names, resolved: a DataError naming the site and the
    file unless it is a path to an existing file inside `root` (anywhere with `allow_absolute_paths`); `remedy`
    ends the message for a path leading outside."""
    if not isinstance(value, str) or not value or "\0" in value:
        raise DataError(site, datalist_path, f"entry {where}: {kind} must be a file path, got {value!r}")
    path = Path(value).expanduser()
    path = path if path.is_absolute() else root / path
    if not allow_absolute_paths and not _inside(path, root):
        raise DataError(
            site,
            path,
            f"{kind} path {value!r} (entry {where} of {datalist_path.name}) leads outside the "
            f"data root {root} (absolute, '../' or a link out of it); {remedy}",
        )
    if not path.is_file():
        raise DataError(site, path, f"{kind} file not found (entry {where} of {datalist_path.name})")
    # the file checked, not the name: a link swapped in after this check cannot lead the loader elsewhere
    return path.resolve()


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def _check_mask_values(mask: np.ndarray, path: Path, site: str, num_classes: int) -> None:
    values = np.unique(mask)
    if not np.all(np.isfinite(values)) or not np.array_equal(values, np.round(values)):
        raise DataError(site, path, f"mask holds non-integer values (e.g. {values[values != np.round(values)][:3]})")
    outside = values[(values < 0) | (values > num_classes - 1)]
    if outside.size:
        raise DataError(
            site,
            path,
            f"mask values {outside[:5].tolist()} outside [0, {num_classes - 1}] "
            "(masks must hold class indices; binarise 0/255 masks)",
        )


def image_format(path: Path) -> str:
    """'nifti' or 'pil' from the file name; anything else is not a format this package reads."""
    name = path.name.lower()
    if name.endswith(NIFTI_SUFFIXES):
        return "nifti"
    if name.endswith(PIL_SUFFIXES):
        return "pil"
    raise ValueError(f"unsupported image format {path.name!r}: use NIfTI ({', '.join(NIFTI_SUFFIXES)}) or PNG/JPEG")


def spatial_shape(
    path: Path,
    site: str,
    modes: Sequence[str] = IMAGE_MODES,
    max_side: int = MAX_IMAGE_SIDE,
    max_voxels: int = MAX_IMAGE_VOXELS,
    spatial_dims: int = 2,
) -> tuple[int, ...]:
    """Spatial shape as MONAI's LoadImage will see it, read from the header only; a DataError unless the
    header says a 2-D image (PNG/JPEG: of one of the PIL `modes`), or with `spatial_dims` 3 a NIfTI volume, of at
    most `max_side` along each axis and `max_voxels` in all: decoding is never where a huge declared size is found
    (PIL's decompression-bomb limit, about 179 million pixels, comes on top of these).

    NIfTI: the stored shape without trailing singleton axes (an HxWx1 slice is HxW; a volume's fourth axis, when
    there is one, holds its channels). PNG/JPEG: (width, height), because MONAI's PIL reader transposes to the ITK
    axis order; colour channels are not spatial.
    """
    try:
        if image_format(path) == "nifti":
            import nibabel as nib

            shape = tuple(int(n) for n in nib.load(path).header.get_data_shape())
            while len(shape) > 2 and shape[-1] == 1:
                shape = shape[:-1]
            mode = None
        else:
            from PIL import Image

            with Image.open(path) as image:
                shape, mode = tuple(image.size), image.mode
    except Exception as err:  # unsupported, corrupt or unreadable: say which file
        raise DataError(site, path, f"cannot read image header: {err}") from err
    total = int(np.prod(shape, dtype=np.int64)) if shape else 0
    spatial = shape[:3] if spatial_dims == 3 and len(shape) == 4 else shape
    if spatial_dims == 2 and (len(shape) != 2 or min(shape) < 1):
        raise DataError(
            site,
            path,
            f"not a 2-D slice: shape {shape} (a volume? set spatial_dims 3 in the job, or declare it in the data "
            f"root's dataset.json, to train on volumes; or cut it into slices, e.g. fairfl convert-prostate)",
        )
    if spatial_dims == 3 and (mode is not None or len(spatial) != 3 or min(spatial) < 1):
        raise DataError(
            site,
            path,
            f"not a 3-D volume: shape {shape} (a volume is a NIfTI file of three spatial axes, a fourth for channels "
            f"if any; DICOM series: fairfl convert-dicom)",
        )
    if max(shape) > max_side or total > max_voxels:
        raise DataError(
            site,
            path,
            f"declares {' x '.join(map(str, shape))} ({total:,} voxels): above this site's limit of "
            f"{max_side} per axis and {max_voxels:,} voxels ({MAX_IMAGE_SIDE_ENV}, {MAX_IMAGE_VOXELS_ENV}); not read",
        )
    if mode is not None and mode not in modes:
        raise DataError(
            site,
            path,
            f"PIL image mode {mode!r} is not one of {', '.join(modes)} "
            f"(convert it to grey or RGB{'' if 'P' in modes else '; masks: one channel'})",
        )
    return spatial


def read_array(path: Path, site: str) -> np.ndarray:
    """The stored pixel array (masks are small 2-D slices, so reading them whole is cheap)."""
    try:
        if image_format(path) == "nifti":
            import nibabel as nib

            return np.asanyarray(nib.load(path).dataobj)
        from PIL import Image

        with Image.open(path) as image:
            return np.asarray(image)
    except Exception as err:
        raise DataError(site, path, f"cannot read file: {err}") from err


def declared_task(info: Mapping) -> dict:
    """What a dataset.json declares about its task, by fairfl's names: `task`, `num_classes` (or as many as its
    `labels`), `in_channels` (or `channels`), `spatial_dims`, `spacing` (mm), `modality`; only those present."""
    labels = info.get("labels")
    found = {
        "task": info.get("task"),
        "num_classes": info.get("num_classes", len(labels) if isinstance(labels, Mapping) and labels else None),
        "in_channels": info.get("in_channels", info.get("channels")),
        "spatial_dims": info.get("spatial_dims"),
        "spacing": info.get("spacing"),
        "modality": info.get("modality"),
    }
    return {key: value for key, value in found.items() if value is not None}


def _declared_problem(declared: dict, expected: dict) -> str | None:
    """Why the task a dataset.json declares (`declared_task`) is not the server's (`expected`), or None."""
    if "spacing" in declared and not (
        isinstance(declared["spacing"], list)
        and len(declared["spacing"]) == 3
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 100 for v in declared["spacing"])
    ):
        return f"'spacing' must be three numbers of mm in (0, 100), got {declared['spacing']!r}"
    differ = [
        f"{key} {declared[key]!r} (the job's: {value!r})"
        for key, value in expected.items()
        if key in declared and value is not None and declared[key] != value
    ]
    return "declares " + ", ".join(differ) if differ else None


def load_dataset_info(data_root: str | Path, site: str, num_classes: int, **expected) -> dict:
    """What the site uses of `<data_root>/dataset.json` (optional): `regions` ({name: [class, ...]} Dice is
    reported for), `corrupted_sites` (names) and what it declares of its task (`declared_task`: its `spacing` is the
    3-D loaders' default); {} without the file. Anything malformed, or a declared task, number of classes, input
    channels or spatial dimensions that contradicts the job's (`expected`: task, in_channels, spatial_dims;
    `num_classes`), is a DataError naming the file: data of another task must never be trained on quietly."""
    path = Path(data_root).expanduser() / "dataset.json"
    if not path.exists():
        return {}
    try:
        info = read_json(path)
    except ValueError as err:
        raise DataError(site, path, str(err)) from None
    if not isinstance(info, dict):
        raise DataError(site, path, "must be a JSON object")
    declared = declared_task(info)
    problem = _declared_problem(declared, {**expected, "num_classes": num_classes})
    if problem:
        raise DataError(site, path, f"{problem}: this data is not for this job")
    regions, corrupted = info.get("regions"), info.get("corrupted_sites") or []
    if regions is not None and not (
        isinstance(regions, dict)
        and regions
        and all(
            isinstance(classes, list)
            and classes
            and all(isinstance(c, int) and not isinstance(c, bool) and 0 < c < num_classes for c in classes)
            for classes in regions.values()
        )
    ):
        raise DataError(
            site,
            path,
            f"'regions' must map names to non-empty lists of classes in [1, {num_classes - 1}], got {regions!r}",
        )
    if not isinstance(corrupted, list) or not all(isinstance(s, str) for s in corrupted):
        raise DataError(site, path, f"'corrupted_sites' must be a list of site names, got {corrupted!r}")
    return {
        **({"regions": regions} if regions is not None else {}),
        "corrupted_sites": corrupted,
        "declared": declared,
    }


def split_cases(
    case_ids: Sequence[str], fractions: Sequence[float] = (0.6, 0.2, 0.2), seed: int | Sequence[int] = 0
) -> dict[str, list[str]]:
    """Assign whole cases to training/validation/testing, deterministically for a seed.

    Slices of one patient are correlated, so splitting by case (never by slice) is what keeps the
    test set honest. Validation and testing each get at least one case; training gets the rest.
    Needs at least three cases.
    """
    if len(fractions) != len(SPLITS) or min(fractions) < 0 or sum(fractions) <= 0:
        raise ValueError(f"fractions must be {len(SPLITS)} non-negative numbers, got {fractions}")
    cases = sorted(case_ids)
    if len(cases) < len(SPLITS):
        raise ValueError(f"need at least {len(SPLITS)} cases to give every split one, got {len(cases)}")
    n, total = len(cases), sum(fractions)
    n_val = max(1, round(n * fractions[1] / total))
    n_test = max(1, round(n * fractions[2] / total))
    while n_val + n_test > n - 1:  # training keeps at least one case
        if n_val >= n_test:
            n_val -= 1
        else:
            n_test -= 1
    shuffled = [cases[i] for i in np.random.default_rng(seed).permutation(n)]
    n_train = n - n_val - n_test
    parts = (shuffled[:n_train], shuffled[n_train : n_train + n_val], shuffled[n_train + n_val :])
    return {split: sorted(part) for split, part in zip(SPLITS, parts, strict=True)}


def write_datalist(path: str | Path, splits: Mapping[str, list[dict]]) -> Path:
    """Write a Decathlon-style datalist (keys in SPLITS order) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({split: list(splits[split]) for split in SPLITS}, indent=1) + "\n")
    return path


def output_site_names(sources: Sequence[str], site_names: None | str | Mapping[str, str]) -> dict[str, str]:
    """Source folder name -> output site name, as the converters' `site_names` argument asks: None keeps
    the folder names, "flare" renames to site-1..site-N in sorted order (FLARE client names), a mapping
    renames explicitly (sources it does not name keep theirs). Output names must be unique."""
    if site_names is None:
        names = {s: s for s in sources}
    elif site_names == "flare":
        names = {s: f"site-{i + 1}" for i, s in enumerate(sorted(sources))}
    elif isinstance(site_names, Mapping):
        names = {s: site_names.get(s, s) for s in sources}
    else:
        raise ValueError(f"site_names must be None, 'flare' or a mapping, got {site_names!r}")
    if len(set(names.values())) != len(names):
        raise ValueError(f"site names must be unique, got {names}")
    return names


def check_output_folder(dst: str | Path) -> None:
    """A DataError unless `dst` is free for a converter's output (missing or an empty folder): converters never
    write over data. Called first, so that the check does not wait for the source's."""
    dst = Path(dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise DataError("-", dst, "output folder exists and is not empty: choose a new folder or delete it")


@contextmanager
def staged_output(dst: str | Path) -> Iterator[Path]:
    """A temporary sibling of `dst` for a converter to write into, renamed to `dst` when the block ends without an
    error and removed otherwise: the output appears complete or not at all. `dst` must not exist or be empty."""
    dst = Path(dst)
    check_output_folder(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    try:
        yield staging
        if dst.exists():
            dst.rmdir()  # checked empty above
        os.rename(staging, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
