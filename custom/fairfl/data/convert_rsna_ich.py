"""Convert the RSNA intracranial hemorrhage layout (PNG slices + label CSV) into per-site datalists.

Source layout (`src`):
- a folder of PNG slices converted from the challenge's DICOM files (any window: 8-bit grey, 16-bit grey
  or three windows as RGB), named by the image ID of the label file, `ID_<id>.png` (or `<id>.png`);
  `images_dir` names it, else the first of `IMAGE_FOLDERS` that exists;
- `stage_2_train.csv` (or `stage_1_train.csv`): `ID,Label` rows `ID_<id>_<subtype>,<0|1>` for the
  subtypes epidural, intraparenchymal, intraventricular, subarachnoid, subdural and `any` (the real file
  repeats some rows: identical repeats are accepted, conflicting ones are an error);
- optional slice metadata for patient grouping (`metadata_csv`, else the first of `METADATA_FILES`),
  with an image-ID column (`ID`, `SOPInstanceUID` or `image`) and `PatientID` (`StudyInstanceUID`
  if that is all there is), as extracted from the DICOM headers. Without it, slices are split one by one
  and slices of one patient can land in two sites or splits (recorded in dataset.json).

Labels, as FedISM+ (after Jiang et al.) and FedNPR set the task: slices with exactly one hemorrhage
subtype, labelled 0 epidural, 1 intraparenchymal, 2 intraventricular, 3 subarachnoid, 4 subdural. Slices
with several subtypes and slices without hemorrhage are left out and counted (`include_none` keeps the
latter as a sixth class, "none"). `max_images` keeps a seeded random subset (FedISM+ uses 25,000).
Labelled slices without a PNG are counted, not an error (one may convert part of the 750,000 slices);
a PNG without labels, a subtype set with `any` = 0, or `any` = 1 without a subtype is an error.

Sites, splits, corruption and output: as `fairfl.data.convert_isic` with Dirichlet sites (the source
hospitals of the RSNA data are not published): `<dst>/<site>/`, `<dst>/test/clean|noise|blur/`,
`<dst>/<site>.json`, `<dst>/dataset.json`, `<dst>/sites.json`; complete or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fairfl.data.classification_sites import ICH_CLASSES, convert_pool, read_csv
from fairfl.errors import DataError

SUBTYPES = ICH_CLASSES  # label order
ANY = "any"
LABEL_FILES = ("stage_2_train.csv", "stage_1_train.csv")
IMAGE_FOLDERS = ("stage_2_train", "stage_2_train_images", "stage_1_train_images", "stage_1_train", "png", "images")
METADATA_FILES = ("stage_2_train_metadata.csv", "train_metadata.csv", "metadata.csv")
ID_COLUMNS = ("ID", "SOPInstanceUID", "image")
PATIENT_COLUMNS = ("PatientID", "StudyInstanceUID")


def convert_rsna_ich(
    src: str | Path,
    dst: str | Path,
    seed: int = 0,
    site_names: None | str | Mapping[str, str] = None,
    include_none: bool = False,
    max_images: int | None = None,
    images_dir: str | Path | None = None,
    labels_csv: str | Path | None = None,
    metadata_csv: str | Path | None = None,
    **options,
) -> dict:
    """Select single-subtype slices, split them over Dirichlet sites and write datalists (see module docstring).

    Args:
        src, dst, seed, site_names: as in `fairfl.data.convert_isic.convert_isic`.
        include_none: keep slices without hemorrhage as class 5 ("none").
        max_images: keep a random subset of this many selected slices (seeded).
        images_dir, labels_csv, metadata_csv: paths (relative to `src` or absolute) overriding the
            default names.
        options: the split and quality-shift options of `convert_pool`, as for `convert_isic`
            (Dirichlet sites: num_sites, alpha, image_size, corrupted_fraction, corruption, severity,
            test_set "shared" by default, test_fraction, validation_fraction).

    Returns:
        `{"sites": {...}, "excluded": {reason: count}, "split": the split used, in words}`.

    Raises:
        DataError naming the site (or "-") and the file for every problem found (nothing is written then).
    """
    src = Path(src)
    if not src.is_dir():
        raise DataError("-", src, "source folder not found")
    folder = _find(src, images_dir, IMAGE_FOLDERS, "dir")
    if folder is None:
        raise DataError("-", src / IMAGE_FOLDERS[0], f"PNG folder not found (looked for {', '.join(IMAGE_FOLDERS)})")
    label_path = _find(src, labels_csv, LABEL_FILES, "file") or src / LABEL_FILES[0]
    subtypes = _labels(label_path)
    images = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix.lower() == ".png" and not path.name.startswith("."):
            image_id = path.stem if path.stem.startswith("ID_") else f"ID_{path.stem}"
            if image_id not in subtypes:
                raise DataError("-", path, f"no rows for {image_id} in {label_path.name}")
            images[image_id] = path
    if not images:
        raise DataError("-", folder, "no PNG slices found")

    classes = [*SUBTYPES, *(["none"] if include_none else [])]
    labels, excluded = {}, {"several subtypes": 0, "no hemorrhage": 0, "labelled, no PNG": len(subtypes) - len(images)}
    for image_id in sorted(images):
        positive = [i for i, name in enumerate(SUBTYPES) if subtypes[image_id][name]]
        if len(positive) == 1:
            labels[image_id] = positive[0]
        elif positive:
            excluded["several subtypes"] += 1
        elif include_none:
            labels[image_id] = len(SUBTYPES)
        else:
            excluded["no hemorrhage"] += 1
    ids = sorted(labels)
    if max_images is not None and max_images < len(ids):
        keep = np.random.default_rng([seed, 2000]).permutation(len(ids))[:max_images]
        excluded["not sampled (max_images)"] = len(ids) - max_images
        ids = sorted(ids[i] for i in keep)
    if not ids:
        raise DataError("-", label_path, "no slice with a single hemorrhage subtype among the PNGs")
    patients = _patients(src, metadata_csv)
    groups = None
    if patients is not None:
        missing = [i for i in ids if i not in patients]
        if missing:
            raise DataError(
                "-",
                images[missing[0]],
                f"no patient in the metadata for {missing[0]} ({len(missing)} slice(s) without one)",
            )
        groups = [patients[i] for i in ids]

    modes = {_mode(images[i]) for i in ids}
    description = dict(
        name="RSNA intracranial hemorrhage CT, single-subtype slices",
        converter="fairfl.data.convert_rsna_ich",
        classes=classes,
        class_names=classes,
        in_channels=3 if modes == {"RGB"} else 1,
        image_folder=folder.name,
        labels_file=label_path.name,
        label_rule="the one positive subtype; several subtypes or none: left out"
        + (" (none kept as class 5)" if include_none else ""),
        excluded=excluded,
    )
    return convert_pool(
        src,
        Path(dst),
        ids,
        [labels[i] for i in ids],
        [images[i] for i in ids],
        description,
        groups=groups,
        site_names=site_names,
        seed=seed,
        **options,
    )


def _find(src: Path, given, defaults, kind: str) -> Path | None:
    if given is not None:
        path = Path(given) if Path(given).is_absolute() else src / given
        if not (path.is_dir() if kind == "dir" else path.is_file()):
            raise DataError("-", path, f"{'folder' if kind == 'dir' else 'file'} not found")
        return path
    return next((src / name for name in defaults if (src / name).exists()), None)


def _labels(path: Path) -> dict[str, dict[str, int]]:
    """{image id: {subtype or 'any': 0/1}} from `ID_<id>_<subtype>,<label>` rows, every subtype present."""
    rows = read_csv(path, ("ID", "Label"))
    labels: dict[str, dict[str, int]] = {}
    for line, row in enumerate(rows, start=2):
        image_id, _, subtype = row["ID"].rpartition("_")
        if not image_id or subtype not in (*SUBTYPES, ANY):
            raise DataError(
                "-",
                path,
                f"line {line}: ID {row['ID']!r} is not ID_<image id>_<subtype> with a subtype "
                f"in {', '.join((*SUBTYPES, ANY))}",
            )
        if row["Label"] not in ("0", "1"):
            raise DataError("-", path, f"line {line} ({row['ID']}): label {row['Label']!r} is not 0 or 1")
        seen = labels.setdefault(image_id, {})
        if seen.get(subtype, int(row["Label"])) != int(row["Label"]):
            raise DataError("-", path, f"line {line}: {row['ID']} repeated with a different label")
        seen[subtype] = int(row["Label"])
    for image_id, seen in labels.items():
        missing = [name for name in (*SUBTYPES, ANY) if name not in seen]
        if missing:
            raise DataError("-", path, f"{image_id}: no row for {', '.join(missing)}")
        if seen[ANY] != max(seen[name] for name in SUBTYPES):
            raise DataError(
                "-",
                path,
                f"{image_id}: 'any' is {seen[ANY]} but the subtypes say {max(seen[name] for name in SUBTYPES)}",
            )
    if not labels:
        raise DataError("-", path, "no label rows")
    return labels


def _patients(src: Path, given) -> dict[str, str] | None:
    """{image id: patient} from the slice metadata, or None when there is none."""
    path = _find(src, given, METADATA_FILES, "file")
    if path is None:
        return None
    rows = read_csv(path, ())
    header = rows[0].keys() if rows else []
    id_column = next((c for c in ID_COLUMNS if c in header), None)
    patient_column = next((c for c in PATIENT_COLUMNS if c in header), None)
    if id_column is None or patient_column is None:
        raise DataError(
            "-",
            path,
            f"needs an image-ID column ({' or '.join(ID_COLUMNS)}) and a patient column "
            f"({' or '.join(PATIENT_COLUMNS)})",
        )
    patients = {}
    for line, row in enumerate(rows, start=2):
        image_id = row[id_column] if row[id_column].startswith("ID_") else f"ID_{row[id_column]}"
        if not row[patient_column]:
            raise DataError("-", path, f"line {line}: empty {patient_column} for {image_id}")
        patients[image_id] = row[patient_column]
    return patients


def _mode(path: Path) -> str | None:
    """The PIL mode from the header; None if unreadable (writing the image then reports it, with its site)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            return image.mode
    except Exception:
        return None
