"""Convert the public ISIC 2019 training release into per-site classification datalists.

Source layout (`src`), as the ISIC archive distributes it:
- `ISIC_2019_Training_Input/<image>.jpg` (or FLamby's `ISIC_2019_Training_Input_preprocessed/`; the
  first is used when both exist); other files there (LICENSE.txt, ATTRIBUTION.txt) are ignored;
- `ISIC_2019_Training_GroundTruth.csv`: `image,MEL,NV,BCC,AK,BKL,DF,VASC,SCC,UNK`, one-hot (1.0/0.0);
- optional `ISIC_2019_Training_Metadata.csv` (`image,age_approx,anatom_site_general,lesion_id,sex`) and
  FLamby's `ISIC_2019_Training_Metadata_FL.csv` (with a `dataset` column naming the source hospital and
  device: BCN_nan, HAM_vidir_molemax, HAM_vidir_modern, HAM_rosendahl, HAM_vienna_dias, MSK4nan).

Labels: the index of the one positive column in the order MEL, NV, BCC, AK, BKL, DF, VASC, SCC (the
FedISM+, FedNPR and FLamby order). UNK is not a class: its rows (none in the 2019 training set) are left
out and counted. A row with no positive or several is an error.

Sites (`sites`):
- "dirichlet" (default; FedISM+): `num_sites` sites by a Dirichlet(alpha) label split, one shared test
  set (`test_fraction` of the images); the last `round(corrupted_fraction * num_sites)` sites hold
  corrupted images (see `fairfl.data.classification_sites`).
- "source" (FedNPR / FLamby's Fed-ISIC2019 natural split): one site per source, from the `dataset`
  column of the FL metadata, else from the `lesion_id` prefix (BCN, HAM, MSK4: HAM's four devices cannot
  be told apart without HAM10000's metadata); each site keeps its own stratified test set. Images
  without a source are left out and counted (FLamby drops them too).
Images of one lesion (`lesion_id`) never land in two sites or two splits.

Output (`dst` must not exist or be empty; written to a temporary sibling, renamed when complete):
`<dst>/<site>/<image>.<ext>` (training and validation images), `<dst>/test/clean/`, with corruption
`<dst>/test/<noise|blur>/`, `<dst>/<site>.json` datalists with integer labels (and `testing_corrupted`),
`<dst>/dataset.json` (classes, split, quality shift, per-site class counts, what was left out) and
`<dst>/sites.json`. Without `image_size` the JPEGs are copied as they are (after a full decode, so a
truncated file is found now); with it, every image is resized to a square RGB PNG (needed for
corruption, which the papers apply to the resized 224-pixel images).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from fairfl.data.classification_sites import SETTINGS, SKIN_CLASSES, convert_pool, read_csv
from fairfl.data.datalist import PIL_SUFFIXES
from fairfl.errors import DataError

IMAGE_FOLDERS = ("ISIC_2019_Training_Input", "ISIC_2019_Training_Input_preprocessed")
GROUND_TRUTH = "ISIC_2019_Training_GroundTruth.csv"
METADATA = "ISIC_2019_Training_Metadata.csv"
METADATA_FL = "ISIC_2019_Training_Metadata_FL.csv"
UNKNOWN = "UNK"


def convert_isic(
    src: str | Path,
    dst: str | Path,
    seed: int = 0,
    site_names: None | str | Mapping[str, str] = None,
    sites: str = "dirichlet",
    **options,
) -> dict:
    """Split ISIC 2019 over sites and write per-site datalists (layouts in the module docstring).

    Args:
        src: folder with the ISIC 2019 training images and CSV files.
        dst: output data root (the jobs' `data_root`); must not exist or be empty.
        seed: seed of the site split, the test and validation splits and the corruption draws.
        site_names: None, "flare" or a mapping, as in `fairfl.data.datalist.output_site_names` ("source"
            sites; Dirichlet sites are already site-1 ... site-N and only a mapping renames them).
        sites: "dirichlet" or "source" (see the module docstring).
        options: the split and quality-shift options of
            `fairfl.data.classification_sites.convert_pool`: num_sites (20) and alpha (1.0) of the
            Dirichlet split; image_size (None: copy the files; else resize to square PNGs);
            corrupted_fraction (0.0), corruption ("noise" or "blur") and severity (3), which need
            image_size (FedISM+: 0.2 of 20 sites, severity 3); test_set ("shared" for Dirichlet sites,
            "site" for source sites), test_fraction (0.2), validation_fraction (0.15).

    Returns:
        `{"sites": {name: {"source", "corrupted", "class_counts": {split: [per class]}}}, "excluded": {...}}`.

    Raises:
        DataError naming the site (or "-") and the file for every problem found (nothing is written then).
    """
    src = Path(src)
    if sites not in ("dirichlet", "source"):
        raise ValueError(f"sites must be 'dirichlet' or 'source', got {sites!r}")
    if not src.is_dir():
        raise DataError("-", src, "source folder not found")
    folder = next((src / name for name in IMAGE_FOLDERS if (src / name).is_dir()), None)
    if folder is None:
        raise DataError("-", src / IMAGE_FOLDERS[0], "image folder not found (the ISIC 2019 training images)")
    labels, unknown = _ground_truth(src / GROUND_TRUTH)
    excluded = {"UNK label": len(unknown)}
    metadata = _metadata(src)
    images = _image_files(folder)
    for image_id in labels:
        if image_id not in images:
            raise DataError("-", folder / f"{image_id}.jpg", f"listed in {GROUND_TRUTH} but not found")
    for image_id, path in images.items():
        if image_id not in labels and image_id not in unknown:
            raise DataError("-", path, f"image without a row in {GROUND_TRUTH}")

    ids = sorted(labels)
    lesion = {i: metadata.get(i, {}).get("lesion_id") or None for i in ids}
    sources = None
    if sites == "source":
        from_dataset = (src / METADATA_FL).is_file()
        sources = [_source(metadata.get(i, {}), from_dataset) for i in ids]
        if not any(sources):
            raise DataError(
                "-",
                src / METADATA_FL,
                f"no source sites: needs FLamby's metadata (column 'dataset') or {METADATA} with lesion_id",
            )
        excluded["no source site"] = sum(s is None for s in sources)
    description = dict(
        name="ISIC 2019 dermoscopy",
        converter="fairfl.data.convert_isic",
        classes=list(SKIN_CLASSES),
        class_names=list(SETTINGS["skin"].class_names),
        in_channels=3,
        image_folder=folder.name,
        excluded=excluded,
    )
    return convert_pool(
        src,
        Path(dst),
        ids,
        [labels[i] for i in ids],
        [images[i] for i in ids],
        description,
        groups=[lesion[i] or f"image:{i}" for i in ids] if any(lesion.values()) else None,
        sources=sources,
        site_names=site_names,
        mode="RGB",
        seed=seed,
        **options,
    )


def _ground_truth(path: Path) -> tuple[dict[str, int], set[str]]:
    """{image: class index} from the one-hot ground truth, and the images left out (UNK)."""
    rows = read_csv(path, ("image", *SKIN_CLASSES))
    labels, unknown = {}, set()
    for line, row in enumerate(rows, start=2):
        image = row["image"]
        if not image:
            raise DataError("-", path, f"line {line}: empty image name")
        if image in labels or image in unknown:
            raise DataError("-", path, f"line {line}: image {image} listed twice")
        columns = [*SKIN_CLASSES, *([UNKNOWN] if UNKNOWN in row else [])]
        try:
            values = [float(row[c] or 0) for c in columns]
        except ValueError as err:
            raise DataError("-", path, f"line {line} ({image}): labels must be 0 or 1 ({err})") from err
        if any(v not in (0.0, 1.0) for v in values) or sum(values) != 1:
            raise DataError(
                "-",
                path,
                f"line {line} ({image}): exactly one of {', '.join(columns)} must be 1, "
                f"got {', '.join(row[c] for c in columns)}",
            )
        if values[-1] and columns[-1] == UNKNOWN:
            unknown.add(image)
            continue
        labels[image] = values.index(1.0)
    if not labels:
        raise DataError("-", path, "no labelled image")
    return labels, unknown


def _metadata(src: Path) -> dict[str, dict[str, str]]:
    """{image: {lesion_id, dataset, ...}} from whichever metadata files exist (the FL one adds 'dataset')."""
    merged: dict[str, dict[str, str]] = {}
    for name in (METADATA, METADATA_FL):
        if (src / name).is_file():
            for row in read_csv(src / name, ("image",)):
                merged.setdefault(row["image"], {}).update({k: v for k, v in row.items() if v})
    return merged


def _source(row: dict[str, str], from_dataset: bool) -> str | None:
    """The source site of an image: FLamby's `dataset` (where that file exists), else the lesion_id
    prefix; None if unknown."""
    name = row.get("dataset") if from_dataset else (row.get("lesion_id") or "").split("_")[0]
    if not name or name.lower() in ("nan", "none"):
        return None
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _image_files(folder: Path) -> dict[str, Path]:
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.startswith(".") and path.name.lower().endswith(PIL_SUFFIXES):
            if path.stem in files:
                raise DataError("-", path, f"two files for image {path.stem} ({files[path.stem].name}, {path.name})")
            files[path.stem] = path
    return files
