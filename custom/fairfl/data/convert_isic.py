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
- "source" (FedNPR / FLamby's Fed-ISIC2019 natural split): one site per source hospital and device.
  With FLamby's fixed split (its file `train_test_split`, columns `image,...,target,center,fold`: centre
  0-5, fold `train` or `test`; from `flamby_split`, else `<src>/train_test_split[.csv]`, else a metadata
  CSV with `center` and `fold` columns), the sites are FLamby's six centres, named `center<k>_<name>`
  (`--rename-sites`: site-(k+1)), FLamby's test fold is each site's testing split and the validation
  split is `validation_fraction` of the site's train fold (stratified by class, seeded, lesions kept
  together), the rest training: so test results compare with FLamby's published ones. Images not in
  that file are left out and counted. Without it: sites from the `dataset` column of the FL metadata,
  else from the `lesion_id` prefix (BCN, HAM, MSK4: HAM's four devices cannot be told apart without
  HAM10000's metadata), each with its own stratified test set drawn by fairfl (not FLamby's). Images
  without a source are left out and counted (FLamby drops them too).
Images of one lesion (`lesion_id`) never land in two sites or two splits, except across FLamby's folds:
its split is by image (696 HAM10000 lesions have images in both folds) and is kept as published, so a
lesion stays together only between training and validation.

Output (`dst` must not exist or be empty; written to a temporary sibling, renamed when complete):
`<dst>/<site>/<image>.<ext>` (training and validation images), `<dst>/test/clean/`, with corruption
`<dst>/test/<noise|blur>/`, `<dst>/<site>.json` datalists with integer labels (and `testing_corrupted`),
`<dst>/dataset.json` (classes, split, `split_used` in words and `fixed_split` for FLamby's,
quality shift, per-site class counts, what was left out) and
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
# FLamby's Fed-ISIC2019 split: flamby/datasets/fed_isic2019/dataset_creation_scripts/train_test_split
FLAMBY_SPLIT_FILES = ("train_test_split", "train_test_split.csv")
FLAMBY_COLUMNS = ("image", "center", "fold")
FLAMBY_FOLDS = ("train", "test")
# its centres 0-5, as FLamby's README lists them (sizes 12413, 3954, 3363, 2259, 819, 439 images)
FLAMBY_CENTERS = ("BCN", "HAM_vidir_molemax", "HAM_vidir_modern", "HAM_rosendahl", "MSK", "HAM_vienna_dias")


def convert_isic(
    src: str | Path,
    dst: str | Path,
    seed: int = 0,
    site_names: None | str | Mapping[str, str] = None,
    sites: str = "dirichlet",
    flamby_split: str | Path | None = None,
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
        flamby_split: FLamby's `train_test_split` file (relative to `src` or absolute) for "source" sites;
            without it, `<src>/train_test_split[.csv]` or a metadata CSV with `center` and `fold` columns
            is used where one exists.
        options: the split and quality-shift options of
            `fairfl.data.classification_sites.convert_pool`: num_sites (20) and alpha (1.0) of the
            Dirichlet split; image_size (None: copy the files; else resize to square PNGs);
            corrupted_fraction (0.0), corruption ("noise" or "blur") and severity (3), which need
            image_size (FedISM+: 0.2 of 20 sites, severity 3); test_set ("shared" for Dirichlet sites,
            "site" for source sites), test_fraction (0.2), validation_fraction (0.15).

    Returns:
        `{"sites": {name: {"source", "corrupted", "class_counts": {split: [per class]}}}, "excluded": {...},
        "split": which split was used, in words}`.

    Raises:
        DataError naming the site (or "-") and the file for every problem found (nothing is written then).
    """
    src = Path(src)
    if sites not in ("dirichlet", "source"):
        raise ValueError(f"sites must be 'dirichlet' or 'source', got {sites!r}")
    if flamby_split is not None and sites != "source":
        raise ValueError("a FLamby split (flamby_split) gives source sites: use sites='source' (--sites source)")
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
    sources, test, fixed, split_used = None, None, None, None  # None: convert_pool's words for its own split
    flamby = _flamby_split(src, flamby_split, labels) if sites == "source" else None
    if flamby is not None:
        path, assigned = flamby
        sources = [_flamby_site(assigned[i][0]) if i in assigned else None for i in ids]
        test = [i in assigned and assigned[i][1] == "test" for i in ids]
        # FLamby splits by image: a lesion is kept together within its fold only
        lesion = {i: f"{assigned[i][1]}:{lesion[i]}" if lesion[i] and i in assigned else None for i in ids}
        excluded["not in FLamby's split"] = len(ids) - len(assigned)
        fixed = dict(
            name="FLamby Fed-ISIC2019 train_test_split",
            file=str(path.resolve()),
            centers={_flamby_site(k): k for k in sorted({c for c, _ in assigned.values()})},
            testing="FLamby's test fold",
            validation=f"{options.get('validation_fraction', 0.15):g} of each centre's train fold, stratified by "
            f"class, seed {seed}; training: the rest of the train fold",
        )
        split_used = f"FLamby's Fed-ISIC2019 split ({path}): its centres as sites, its test fold as testing"
    elif sites == "source":
        from_dataset = (src / METADATA_FL).is_file()
        sources = [_source(metadata.get(i, {}), from_dataset) for i in ids]
        if not any(sources):
            raise DataError(
                "-",
                src / METADATA_FL,
                f"no source sites: needs FLamby's metadata (column 'dataset') or {METADATA} with lesion_id",
            )
        excluded["no source site"] = sum(s is None for s in sources)
        split_used = (
            f"source sites, fairfl's seeded stratified test split (seed {seed}), not FLamby's: "
            f"no {FLAMBY_SPLIT_FILES[0]} found (give FLamby's file with --flamby-split)"
        )
    description = dict(
        name="ISIC 2019 dermoscopy",
        converter="fairfl.data.convert_isic",
        classes=list(SKIN_CLASSES),
        class_names=list(SETTINGS["skin"].class_names),
        in_channels=3,
        image_folder=folder.name,
        excluded=excluded,
    )
    description.update(split_used=split_used, **({"fixed_split": fixed} if fixed else {}))
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
        fixed_test=test,
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


def _flamby_site(center: int) -> str:
    return f"center{center}_{FLAMBY_CENTERS[center]}"


def _flamby_split(src: Path, given, labels: Mapping[str, int]) -> tuple[Path, dict[str, tuple[int, str]]] | None:
    """FLamby's split as `(file, {image: (centre, fold)})` from `given` (relative to `src` or absolute), else
    `src/train_test_split[.csv]`, else a metadata CSV with its columns; None without any. Every row is checked
    (DataError naming the file and the line)."""
    given = given or next((name for name in FLAMBY_SPLIT_FILES if (src / name).is_file()), None)
    if given is not None:
        path = src / given
        rows = read_csv(path, FLAMBY_COLUMNS)
    else:  # a metadata file with FLamby's columns added
        candidates = [src / name for name in (METADATA_FL, METADATA)]
        found = [(p, rows) for p in candidates if p.is_file() and (rows := read_csv(p, ("image",)))]
        found = [(p, rows) for p, rows in found if set(FLAMBY_COLUMNS) <= rows[0].keys()]
        if not found:
            return None
        path, rows = found[0]
    assigned, line_of = {}, {}
    centers = [str(k) for k in range(len(FLAMBY_CENTERS))]
    for line, row in enumerate(rows, start=2):
        image, center, fold = (row[c] for c in FLAMBY_COLUMNS)
        where = f"line {line} ({image or 'no image'})"
        if image and not center and not fold:  # a metadata file's image outside FLamby's split
            continue
        if not image:
            raise DataError("-", path, f"{where}: empty image name")
        if image in assigned:
            raise DataError("-", path, f"{where}: image listed twice (also on line {line_of[image]})")
        if center not in centers:
            raise DataError("-", path, f"{where}: center {center!r} is not one of FLamby's centres 0-5")
        if fold not in FLAMBY_FOLDS:
            raise DataError("-", path, f"{where}: fold {fold!r} is not 'train' or 'test'")
        if image not in labels:
            raise DataError(
                "-", path, f"{where}: no such image with a class in {GROUND_TRUTH} (a split of another release?)"
            )
        if row.get("target") not in (None, "", str(labels[image])):
            raise DataError(
                "-",
                path,
                f"{where}: target {row['target']}, but {GROUND_TRUTH} says {labels[image]} "
                f"({SKIN_CLASSES[labels[image]]})",
            )
        assigned[image], line_of[image] = (int(center), fold), line
    if not assigned:
        raise DataError("-", path, "no rows: FLamby's split lists every image with its centre and fold")
    for center in sorted({c for c, _ in assigned.values()}):
        folds = {f for c, f in assigned.values() if c == center}
        for fold in FLAMBY_FOLDS:
            if fold not in folds:
                raise DataError(
                    "-", path, f"centre {center} ({FLAMBY_CENTERS[center]}) has no image in the {fold} fold"
                )
    return path, assigned


def _image_files(folder: Path) -> dict[str, Path]:
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.startswith(".") and path.name.lower().endswith(PIL_SUFFIXES):
            if path.stem in files:
                raise DataError("-", path, f"two files for image {path.stem} ({files[path.stem].name}, {path.name})")
            files[path.stem] = path
    return files
