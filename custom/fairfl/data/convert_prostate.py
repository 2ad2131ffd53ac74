"""Convert the public multi-site prostate MRI layout into per-site 2-D datalists.

Source layout (Liu et al., MS-Net / SAML release, and similar):
`<src>/<site>/Image/<case>.nii.gz` with `<src>/<site>/Mask/<case>.nii.gz` or
`<src>/<site>/Mask/<case>_segmentation.nii.gz` (any capitalisation), 3-D volumes.
Output: `<dst>/<site>/images|labels/<case>_s<k>.nii.gz` (2-D slices, the volume's affine kept so
slice k sits where it was), `<dst>/<site>.json` datalists split by case, `<dst>/sites.json`.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fairfl.data.datalist import NIFTI_SUFFIXES, SPLITS, output_site_names, split_cases, write_datalist
from fairfl.errors import DataError

MASK_SUFFIXES = ("", "_segmentation")  # matched case-insensitively


def convert_prostate(
    src: str | Path,
    dst: str | Path,
    axis: int = 2,
    keep_empty_slices: bool | int = 2,
    split: Sequence[float] = (0.6, 0.2, 0.2),
    seed: int = 0,
    site_names: None | str | Mapping[str, str] = None,
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

    Returns:
        `{"sites": {name: {"source", "cases": {split: [case ids]}, "slices": {split: count}}}}`.
    """
    src, dst = Path(src), Path(dst)
    if not -3 <= axis < 3:
        raise ValueError(f"axis must be 0, 1 or 2, got {axis}")
    if not src.is_dir():
        raise DataError("-", src, "source folder not found")
    site_dirs = sorted(p for p in src.iterdir() if p.is_dir() and _subfolder(p, "Image") and _subfolder(p, "Mask"))
    if not site_dirs:
        raise DataError("-", src, "no site folders with Image/ and Mask/ subfolders found")
    names = output_site_names([p.name for p in site_dirs], site_names)

    summary = {}
    for site_dir in site_dirs:
        site = names[site_dir.name]
        slices = {}  # case id -> datalist entries
        for image_path in _nifti_files(_subfolder(site_dir, "Image")):
            case = _case_id(image_path)
            mask_path = _find_mask(image_path, _subfolder(site_dir, "Mask"), site)
            slices[case] = _convert_case(image_path, mask_path, dst, site, case, axis, keep_empty_slices)
        if len(slices) < len(SPLITS):
            raise DataError(
                site,
                site_dir,
                f"{len(slices)} case(s) found; at least {len(SPLITS)} are needed "
                "to give training, validation and testing one case each",
            )
        cases = split_cases(list(slices), split, seed=[seed, zlib.crc32(site_dir.name.encode())])
        write_datalist(dst / f"{site}.json", {s: [e for c in cases[s] for e in slices[c]] for s in SPLITS})
        summary[site] = dict(
            source=site_dir.name,
            cases=cases,
            slices={s: sum(len(slices[c]) for c in cases[s]) for s in SPLITS},
        )
    (dst / "sites.json").write_text(
        json.dumps({site: info["source"] for site, info in summary.items()}, indent=1) + "\n"
    )
    return {"sites": summary}


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
