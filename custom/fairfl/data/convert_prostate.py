"""Convert the public multi-site prostate MRI layout into per-site 2-D datalists.

Source layout (Liu et al., MS-Net / SAML release, and similar; also NVFlare's prostate example's
`dataset/` folder): `<src>/<site>/Image/<case>.nii.gz` with `<src>/<site>/Mask/<case>.nii.gz` or
`<src>/<site>/Mask/<case>_segmentation.nii.gz` (any capitalisation), 3-D volumes; split by fairfl.

NVFlare's prostate example (research/prostate in the NVFlare repository; examples/advanced/prostate before)
with its own split (`nvflare_datalists`): a folder of `client_<site>.json` datalists (its `datalist_2D/` or
`datalist/`; the merged `client_All.json` is skipped) with `training`, `validation`, `testing` lists of
`{"image", "label"}` paths relative to `src` (its `dataset_2D/` or `dataset/`). Its split is kept as it is:
a 3-D volume entry (NIfTI) is sliced as above, a 2-D slice entry (its PNGs `<site>/Image/<case>/<k>.png`,
or a 2-D NIfTI) is copied; masks are binarised (> 0 is the prostate; its PNG masks are 0/255).

Output (`dst` must not exist or be empty; written to a temporary sibling, renamed when complete):
`<dst>/<site>/images|labels/<case>_s<k>.nii.gz` (2-D slices, the volume's affine kept so slice k sits
where it was; copied slices keep their format), `<dst>/<site>.json` datalists, `<dst>/sites.json`
(output site -> source) and `<dst>/dataset.json` (`split_used`: whose split).
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fairfl.data.datalist import (
    MASK_MODES,
    NIFTI_SUFFIXES,
    SPLITS,
    check_output_folder,
    entry_file,
    image_format,
    output_site_names,
    read_array,
    spatial_shape,
    split_cases,
    staged_output,
    write_datalist,
)
from fairfl.errors import DataError
from fairfl.names import safe_name, safe_site_names

MASK_SUFFIXES = ("", "_segmentation")  # matched case-insensitively
NVFLARE_PREFIX, NVFLARE_MERGED = "client_", "client_All.json"  # NVFlare's datalist names; All = every client merged


def convert_prostate(
    src: str | Path,
    dst: str | Path,
    axis: int = 2,
    keep_empty_slices: bool | int = 2,
    split: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    site_names: None | str | Mapping[str, str] = None,
    nvflare_datalists: str | Path | None = None,
) -> dict:
    """Slice every site's 3-D volumes along `axis` and write per-site datalists split by case.

    Args:
        src: folder holding one folder per site, each with `Image/` and `Mask/`.
        dst: output data root (the jobs' `data_root`).
        axis: volume axis to slice along (2 is axial for these datasets as stored).
        keep_empty_slices: True keeps every slice; False keeps only slices showing the organ; an
            integer m (default 2) keeps the organ's slice range plus m slices either side. The
            default: a model trained only on organ slices never sees the apex and base ends where
            the organ disappears and over-segments there on whole volumes, while keeping every
            slice would fill the set with background-only slices (most of a large field of view).
        split: training/validation/testing fractions of each site's cases. Every split gets at
            least one case; a site needs 3 cases or more.
        seed: split seed (combined with the source site name, so adding a site changes no other
            site's split).
        site_names: None keeps the source folder names; "flare" renames the sites to
            site-1..site-N in sorted order (FLARE client names); a mapping renames explicitly
            (sites it does not name keep theirs). `<dst>/sites.json` records output -> source.
        nvflare_datalists: folder of NVFlare's prostate example datalists (`client_<site>.json`, paths relative
            to `src`): their sites and split are used as they are (`split` and `seed` are not used).

    Returns:
        `{"sites": {name: {"source", "cases": {split: [case ids]}, "slices": {split: count}}}, "split": in words}`.

    Raises:
        DataError naming the site (or "-") and the file for every problem found (nothing is written then).
    """
    src, dst = Path(src), Path(dst)
    if not -3 <= axis < 3:
        raise ValueError(f"axis must be 0, 1 or 2, got {axis}")
    if not src.is_dir():
        raise DataError("-", src, "source folder not found")
    check_output_folder(dst)
    if nvflare_datalists is not None:
        return _convert_nvflare(src, Path(nvflare_datalists), dst, axis, keep_empty_slices, site_names)
    site_dirs = sorted(p for p in src.iterdir() if p.is_dir() and _subfolder(p, "Image") and _subfolder(p, "Mask"))
    if not site_dirs:
        raise DataError("-", src, "no site folders with Image/ and Mask/ subfolders found")
    names = safe_site_names(output_site_names([p.name for p in site_dirs], site_names), src)

    summary = {}
    with staged_output(dst) as staging:
        for site_dir in site_dirs:
            site = names[site_dir.name]
            slices = {}  # case id -> datalist entries
            for image_path in _nifti_files(_subfolder(site_dir, "Image")):
                case = _case_id(image_path)
                mask_path = _find_mask(image_path, _subfolder(site_dir, "Mask"), site)
                slices[case] = _convert_case(image_path, mask_path, staging, site, case, axis, keep_empty_slices)
            if len(slices) < len(SPLITS):
                raise DataError(
                    site,
                    site_dir,
                    f"{len(slices)} case(s) found; at least {len(SPLITS)} are needed "
                    "to give training, validation and testing one case each",
                )
            cases = split_cases(list(slices), split, seed=[seed, zlib.crc32(site_dir.name.encode())])
            write_datalist(staging / f"{site}.json", {s: [e for c in cases[s] for e in slices[c]] for s in SPLITS})
            summary[site] = dict(
                source=site_dir.name,
                cases=cases,
                slices={s: sum(len(slices[c]) for c in cases[s]) for s in SPLITS},
            )
        used = f"fairfl's split by case {'/'.join(f'{f:g}' for f in split)} (seed {seed})"
        _write_description(staging, src, summary, used)
    return {"sites": summary, "split": used}


def _write_description(root: Path, src: Path, summary: dict, split_used: str) -> None:
    """`<root>/sites.json` (output site -> source) and `<root>/dataset.json` (where from, whose split)."""
    (root / "sites.json").write_text(json.dumps({site: i["source"] for site, i in summary.items()}, indent=1) + "\n")
    description = dict(
        name="multi-site prostate MRI, 2-D slices",
        converter="fairfl.data.convert_prostate",
        source=str(src.resolve()),
        split_used=split_used,
        sites={site: dict(source=i["source"], slices=i["slices"]) for site, i in summary.items()},
    )
    (root / "dataset.json").write_text(json.dumps(description, indent=1) + "\n")


def _convert_nvflare(root: Path, folder: Path, dst: Path, axis: int, keep_empty_slices: bool | int, site_names) -> dict:
    """NVFlare's prostate datalists (module docstring) to ours, their sites and split kept."""
    if not folder.is_dir():
        raise DataError("-", folder, "NVFlare datalist folder not found")
    files = {
        p.name[len(NVFLARE_PREFIX) : -len(".json")]: p
        for p in sorted(folder.glob(f"{NVFLARE_PREFIX}*.json"))
        if p.name != NVFLARE_MERGED
    }
    if not files:
        raise DataError(
            "-", folder, f"no {NVFLARE_PREFIX}<site>.json datalists (NVFlare's prostate example writes datalist_2D/)"
        )
    for source, path in files.items():
        try:
            safe_name(source, "site name")
        except ValueError as err:
            raise DataError(source, path, str(err)) from err
    names = safe_site_names(output_site_names(list(files), site_names), folder)
    first_use: dict[Path, str] = {}  # image file -> where it was first listed (a file in two splits leaks)
    written: set[str] = set()  # output images
    summary = {}
    with staged_output(dst) as staging:
        for source, path in files.items():
            site = names[source]
            datalist = _nvflare_datalist(path, site)
            entries = {split: [] for split in SPLITS}
            for split in SPLITS:
                for index, item in enumerate(datalist[split]):
                    where = f"{split}[{index}]"
                    if not isinstance(item, dict):
                        raise DataError(site, path, f"entry {where} must be an object with 'image' and 'label'")
                    image, mask = (
                        entry_file(
                            item.get(key),
                            root,
                            site,
                            path,
                            where,
                            key,
                            False,
                            remedy="give as SRC the folder its paths are relative to (NVFlare's dataset_2D or dataset)",
                        )
                        for key in ("image", "label")
                    )
                    if image in first_use:
                        raise DataError(site, image, f"listed twice: {first_use[image]} and {path.name} {where}")
                    first_use[image] = f"{path.name} {where}"
                    new = _convert_nvflare_entry(image, mask, staging, site, axis, keep_empty_slices)
                    clash = next((e["image"] for e in new if e["image"] in written), None)
                    if clash:  # two sources named alike: the later would have replaced the earlier
                        raise DataError(site, image, f"its output {clash} is also another entry's: rename one")
                    written.update(e["image"] for e in new)
                    entries[split] += new
            write_datalist(staging / f"{site}.json", entries)
            summary[site] = dict(
                source=path.name,
                cases={s: sorted({e["case"] for e in entries[s]}) for s in SPLITS},
                slices={s: len(entries[s]) for s in SPLITS},
            )
        used = f"NVFlare's prostate datalists ({folder}), kept as they are"
        _write_description(staging, root, summary, used)
    return {"sites": summary, "split": used}


def _nvflare_datalist(path: Path, site: str) -> dict:
    try:
        datalist = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # JSON and Unicode errors are ValueErrors
        raise DataError(site, path, f"not valid JSON: {err}") from err
    if not isinstance(datalist, dict):
        raise DataError(site, path, "must be a JSON object with keys " + ", ".join(SPLITS))
    for split in SPLITS:
        if not isinstance(datalist.get(split), list) or not datalist[split]:
            raise DataError(site, path, f"split {split!r} is missing or empty (every site needs all three)")
    return datalist


def _convert_nvflare_entry(
    image: Path, mask: Path, dst: Path, site: str, axis: int, keep_empty_slices: bool | int
) -> list[dict]:
    """One entry's datalist entries: a volume's selected slices, or the slice itself (copied) with its mask
    binarised, named `<case>_<slice>` after NVFlare's `<site>/Image/<case>/<slice>.png`."""
    if image_format(image) == "nifti" and _is_volume(image, site):
        if image_format(mask) != "nifti":
            raise DataError(site, mask, f"the mask of the volume {image.name} must be a NIfTI volume too")
        return _convert_case(image, mask, dst, site, _case_id(image), axis, keep_empty_slices)
    shape, mask_shape = spatial_shape(image, site), spatial_shape(mask, site, MASK_MODES)
    if shape != mask_shape:
        raise DataError(site, mask, f"mask shape {mask_shape} does not match image {image.name} shape {shape}")
    case = image.parent.name
    paths = {"image": f"{site}/images/{case}_{image.name}", "label": f"{site}/labels/{case}_{mask.name}"}
    binary = (read_array(mask, site) > 0).astype(np.uint8)
    for path in paths.values():
        (dst / path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(image, dst / paths["image"])
    if image_format(mask) == "nifti":
        import nibabel as nib

        nib.save(nib.Nifti1Image(binary, nib.load(mask).affine), dst / paths["label"])
    else:
        from PIL import Image

        Image.fromarray(binary).save(dst / paths["label"])
    return [{**paths, "case": case}]


def _is_volume(path: Path, site: str) -> bool:
    """Whether a NIfTI file holds a 3-D volume (trailing axes of length 1 aside) rather than a 2-D slice."""
    import nibabel as nib

    try:
        shape = list(nib.load(path).shape)
    except Exception as err:  # unsupported, corrupt or unreadable: say which file
        raise DataError(site, path, f"cannot read NIfTI header: {err}") from err
    while len(shape) > 2 and shape[-1] == 1:
        shape.pop()
    return len(shape) == 3


def _subfolder(site_dir: Path, name: str) -> Path | None:
    """`site_dir/name`, matched case-insensitively (releases differ: Image, image, IMAGE)."""
    for child in site_dir.iterdir():
        if child.is_dir() and child.name.lower() == name.lower():
            return child
    return None


def _nifti_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(NIFTI_SUFFIXES))


def _case_id(path: Path) -> str:
    name = path.name
    for suffix in sorted(NIFTI_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def _find_mask(image_path: Path, mask_dir: Path, site: str) -> Path:
    """The mask named like the image, optionally with a `_segmentation` suffix, any capitalisation."""
    case = _case_id(image_path).lower()
    for mask in _nifti_files(mask_dir):
        if _case_id(mask).lower() in {case + suffix for suffix in MASK_SUFFIXES}:
            return mask
    tried = ", ".join(f"{_case_id(image_path)}{s}.nii[.gz]" for s in MASK_SUFFIXES)
    raise DataError(site, image_path, f"no mask for this image in {mask_dir} (looked for {tried})")


def _convert_case(
    image_path: Path, mask_path: Path, dst: Path, site: str, case: str, axis: int, keep_empty_slices: bool | int
) -> list[dict]:
    """Write one case's selected slices; return their datalist entries (paths relative to dst)."""
    import nibabel as nib

    image_nii, mask_nii = nib.load(image_path), nib.load(mask_path)
    image, mask = _volume(image_nii, image_path, site), _volume(mask_nii, mask_path, site)
    if image.shape != mask.shape:
        raise DataError(
            site, mask_path, f"mask shape {mask.shape} does not match image {image_path.name} shape {image.shape}"
        )
    axis %= 3
    mask = mask > 0  # releases store 0/1 or 0/255
    keep = _slices_to_keep(mask.any(axis=tuple(a for a in range(3) if a != axis)), keep_empty_slices)
    if not keep:
        raise DataError(site, mask_path, "mask is empty: no slice shows the organ (is it the right file?)")

    in_plane = [a for a in range(3) if a != axis]
    entries = []
    for k in keep:
        # Slice k's affine: the in-plane columns of the volume's, origin moved to slice k.
        affine = image_nii.affine.copy()
        affine[:3, 3] += affine[:3, axis] * k
        affine[:, :3] = affine[:, [*in_plane, axis]]
        name = f"{case}_s{k:03d}.nii.gz"
        paths = {"image": f"{site}/images/{name}", "label": f"{site}/labels/{name}"}
        for key, array in (
            ("image", image.take(k, axis).astype(np.float32)),
            ("label", mask.take(k, axis).astype(np.uint8)),
        ):
            (dst / paths[key]).parent.mkdir(parents=True, exist_ok=True)
            nib.save(nib.Nifti1Image(array, affine), dst / paths[key])
        entries.append({**paths, "case": case})
    return entries


def _volume(nii, path: Path, site: str) -> np.ndarray:
    array = np.asanyarray(nii.dataobj)
    while array.ndim > 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim != 3:
        raise DataError(site, path, f"expected a 3-D volume, got shape {array.shape}")
    return array


def _slices_to_keep(has_organ: np.ndarray, keep_empty_slices: bool | int) -> list[int]:
    """Slice indices: all, the organ's slices, or the organ's range widened by a margin."""
    if keep_empty_slices is True:
        return list(range(len(has_organ)))
    organ = np.flatnonzero(has_organ)
    if organ.size == 0:
        return []
    if keep_empty_slices is False:
        return organ.tolist()
    margin = int(keep_empty_slices)
    return list(range(max(organ[0] - margin, 0), min(organ[-1] + margin + 1, len(has_organ))))
