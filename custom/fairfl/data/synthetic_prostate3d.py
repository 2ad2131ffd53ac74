"""Built-in synthetic multi-site prostate T2 MRI volumes (3-D) with prostate masks: the data of the 3-D path.

A case is one axial stack of `volume_depth(image_size)` slices (32 x 64 x 64 at the default image size, stored as
(slice, row, column)) through the pelvis of `fairfl.data.render_prostate`, the 2-D data's anatomy: from below the
apex to above the base, so the gland appears, grows and vanishes along z, with the seminal vesicles and the bladder
in the upper slices. The six sites are the 2-D data's scanners and populations (`synthetic_prostate.PROFILES`:
contrast and gamma, intensity scale, coil bias field, endorectal coil, Rician noise, acquisition resolution, field
of view, organ size; `site-6` the BIDMC-like minority), with fewer cases (a volume is 32 slices), and two things
only volumes have:

- Voxel spacing. In-plane it is the field of view over the image size (as in 2-D), along z the profile's
  `slice_thickness_mm` (3 to 4 mm: thicker at the 1.5T sites) at image size 64; a volume covers the same box at every
  image size, so smaller images have coarser voxels on every axis. Real multi-site data mixes spacings just so,
  which is why 3-D pipelines (nnU-Net, MONAI's `Spacingd`) resample every volume to one target spacing first:
  `dataset.json` names it (`spacing`, the median of the sites', along the world axes x, y, z).
- Orientation. Volumes converted from DICOM by different tools store their axes differently, which is why such
  pipelines reorient to one orientation (`Orientationd`) before anything else. Here `site-3` (I2CVB-like) stores
  its slices from the base down and its rows from posterior to anterior (axis codes I, A, L), and `site-5` (HK-like)
  its columns from the patient's left to right (S, P, R); every other site stores (S, P, L). The NIfTI affine
  records each (RAS+ world millimetres), so the world coordinates of the anatomy agree across sites, and a loader
  that ignores the affine sees those sites' anatomy mirrored.

World coordinates: the field of view is centred on the scanner's isocentre in-plane, and z = 0 is mid-gland (where
the technician sets the landmark); the slab extends further above the base than below the apex, as scans planned to
cover the seminal vesicles do. Not modelled: partial volume across a slice's thickness (each slice is drawn at its
centre) and 3-D tissue texture (thick slices make neighbouring slices' texture nearly independent anyway).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
from scipy import ndimage

from fairfl.data.builtin import check_test_scale, ensure_generated, recorded_parameters, site_progress
from fairfl.data.datalist import SPLITS, write_datalist
from fairfl.data.drawing import SUPERSAMPLE, box_mean, standardise
from fairfl.data.render_prostate import ProstateCase
from fairfl.data.synthetic_prostate import PROFILES, SiteProfile, save_nifti, write_site_cases

GENERATOR_VERSION = 1
# A site has the 2-D profile's cases times this (a volume costs as much to draw as 32 slices: the default six sites
# take well under 30 s on one core), and never fewer than MIN_CASES: three training cases, one validation, one test.
CASE_SCALE = 0.8
MIN_CASES = 5
# Slices of a volume at image size 64, where the slice spacing is the profile's slice_thickness_mm: the volume
# covers NOMINAL_DEPTH x slice_thickness_mm (96 to 128 mm) at every image size.
NOMINAL_DEPTH = 32
# Third entry of every site's random key ([seed, site index, VOLUME_STREAM]): the 2-D data's sites draw from
# [seed, site index], so the volumes are other patients than the 2-D slices, not the same ones restacked.
VOLUME_STREAM = 0x3D
# Half the length (mm) of an endorectal coil's receive loop: its near-coil gain reaches every slice within this of
# mid-gland and falls off with the distance beyond.
COIL_HALF_LENGTH_MM = 25.0


@dataclass(frozen=True)
class VolumeSite:
    """One site's volumes: its scanner and population (the 2-D data's profile) and how its files store the axes."""

    profile: SiteProfile
    flip: tuple[bool, bool, bool] = (False, False, False)  # (slice, row, column) stored reversed; the affine says so


VOLUME_SITES = (
    VolumeSite(PROFILES[0]),
    VolumeSite(PROFILES[1]),
    VolumeSite(PROFILES[2], flip=(True, True, False)),  # base first, posterior first: I, A, L
    VolumeSite(PROFILES[3]),
    VolumeSite(PROFILES[4], flip=(False, False, True)),  # the patient's left first (neurological): S, P, R
    VolumeSite(PROFILES[5]),
)


def volume_site(site_index: int) -> VolumeSite:
    """The site at 0-based `site_index`; beyond six the families repeat (new seeds), as in the 2-D data."""
    return VOLUME_SITES[site_index % len(VOLUME_SITES)]


def case_count(profile: SiteProfile, size_scale: float = 1.0) -> int:
    """A site's cases: its 2-D profile's times CASE_SCALE and `size_scale`, at least MIN_CASES."""
    return max(MIN_CASES, round(profile.cases * CASE_SCALE * size_scale))


def volume_depth(image_size: int) -> int:
    """Slices of a volume: half the image size (32 at 64)."""
    return image_size // 2


def slice_spacing(profile: SiteProfile, image_size: int) -> float:
    """Millimetres between slices: the profile's slice thickness at image size 64, coarser for smaller images (the
    volume covers the same NOMINAL_DEPTH x slice_thickness_mm box at every size, as the field of view in-plane)."""
    return profile.slice_thickness_mm * NOMINAL_DEPTH / volume_depth(image_size)


def nominal_spacing(profile: SiteProfile, image_size: int) -> tuple[float, float, float]:
    """The site's voxel spacing (mm) along the world axes x, y, z (cases vary in-plane by the field of view's +-5%)."""
    pixel = profile.fov_mm / image_size
    return (pixel, pixel, slice_spacing(profile, image_size))


def generate_site_volumes(profile: SiteProfile, image_size: int, rng: np.random.Generator, num_cases: int):
    """Yield (case_id, affine, image [D, S, S] float32, mask [D, S, S] uint8) per case, axes (slice from apex to
    base, row from anterior to posterior, column from the patient's right to left) and the affine mapping them to
    RAS+ world millimetres.

    The gland's half-length follows its width (`ProstateCase.organ_scale`); the slab is placed with mid-gland a
    quarter to a half of that below its centre, and never so that the gland reaches the first or last slice."""
    depth, size = volume_depth(image_size), image_size
    thickness = slice_spacing(profile, image_size)
    coverage, margin = depth * thickness, 1.5 * thickness
    for case_index in range(num_cases):
        case = ProstateCase(rng, profile, image_size)
        half_length = min(rng.uniform(17, 23) * case.organ_scale, coverage / 2 - margin)
        reach = coverage / 2 - half_length - margin  # how far the slab's centre may be from mid-gland
        centre = float(np.clip(rng.uniform(0.25, 0.5) * half_length, -reach, reach))
        heights = centre + (np.arange(depth) - (depth - 1) / 2) * thickness  # slice centres, mm above mid-gland
        # The receive coils' sensitivity also drifts along z: a smooth per-case profile of the slices' gain.
        drift = np.exp(
            0.5
            * profile.bias_field
            * standardise(ndimage.zoom(rng.standard_normal(4), depth / 4, order=3, mode="nearest", grid_mode=True))
        )
        images, masks = [], []
        for height, gain in zip(heights, drift, strict=True):
            tissue, organ, nodule_gain, coil = case.render(float(height / half_length))
            beyond_coil = max(0.0, abs(float(height)) - COIL_HALF_LENGTH_MM)
            images.append(case.acquire(tissue, nodule_gain, coil, coil_z=beyond_coil) * np.float32(gain))
            masks.append((box_mean(organ.astype(np.float32), SUPERSAMPLE) >= 0.5).astype(np.uint8))
        pixel, middle = case.spacing, (size - 1) / 2
        affine = np.array(
            [
                [0, 0, -pixel, middle * pixel],  # columns run to the patient's left: -x
                [0, -pixel, 0, middle * pixel],  # rows run posterior: -y
                [thickness, 0, 0, heights[0]],  # slices run from apex to base: +z
                [0, 0, 0, 1],
            ]
        )
        yield f"case{case_index:03d}", affine, np.stack(images), np.stack(masks)


def stored(array: np.ndarray, affine: np.ndarray, flip: tuple[bool, ...]) -> tuple[np.ndarray, np.ndarray]:
    """`array` with the axes `flip` names reversed, and the affine that maps the flipped voxels to the same world
    points (that axis's column negated, the origin moved to its far end)."""
    affine = affine.copy()
    for axis, reverse in enumerate(flip):
        if reverse:
            array = np.flip(array, axis)
            affine[:3, 3] += (array.shape[axis] - 1) * affine[:3, axis]
            affine[:3, axis] *= -1
    return np.ascontiguousarray(array), affine


def axis_codes(flip: tuple[bool, ...]) -> str:
    """Where the stored axes (slice, row, column) run in the world: "SPL" unflipped (to superior, posterior, the
    patient's left), a flipped axis the opposite way ("I", "A", "R")."""
    return "".join(("IAR" if reverse else "SPL")[axis] for axis, reverse in enumerate(flip))


def _write_volume(
    root: Path, site: str, case_id: str, affine: np.ndarray, image: np.ndarray, mask: np.ndarray, flip: tuple
) -> dict:
    """Save one case's volume and mask as NIfTI, stored with the site's `flip`; return its datalist entry."""
    paths = {"image": f"{site}/images/{case_id}.nii.gz", "label": f"{site}/labels/{case_id}.nii.gz"}
    for key, array in (("image", image.astype(np.float32)), ("label", mask.astype(np.uint8))):
        save_nifti(root / paths[key], *stored(array, affine, flip))
    return {**paths, "case": case_id}


# ----------------------------------------------------------------------------------------------
# writing a dataset, and the cache the jobs use


def generate_prostate3d_sites(
    root: str | Path,
    num_sites: int = 6,
    image_size: int = 64,
    seed: int = 0,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Write `num_sites` synthetic sites as NIfTI volumes plus one datalist per site; return `root`.

    Layout: `<root>/site-K/images/<case>.nii.gz` (float32, D x S x S), `.../labels/<case>.nii.gz` (uint8, 0/1),
    `<root>/site-K.json` (training/validation/testing split 6:2:2 by case, paths relative to `root`) and
    `<root>/dataset.json`, which declares the task (segmentation, 2 classes, 1 channel, 3 spatial dimensions, MR,
    the target spacing) and records the generator, its parameters and the site profiles. Deterministic: site K
    draws from `numpy.random.default_rng([seed, K - 1, VOLUME_STREAM])`, so its data does not depend on
    `num_sites`. With `test_scale` s > 1 each site's testing split also holds round(n_test * (s - 1)) more cases
    `extra-case<k>` of its profile, drawn from `fairfl.data.builtin.extra_test_rng(seed, K - 1, VOLUME_STREAM)`:
    everything else is as at s = 1.
    """
    if image_size < 32:
        raise ValueError(f"image_size must be at least 32 (the anatomy needs the pixels), got {image_size}")
    test_scale = check_test_scale(test_scale)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    sites, spacings = {}, []
    for index in range(num_sites):
        site, volume = f"site-{index + 1}", volume_site(index)
        key = [seed, index, VOLUME_STREAM]
        entries, cases, organ_fraction = write_site_cases(
            partial(generate_site_volumes, volume.profile, image_size),
            partial(_write_volume, root, site, flip=volume.flip),
            case_count(volume.profile, size_scale),
            key,
            test_scale,
        )
        write_datalist(root / f"{site}.json", {split: [entries[case] for case in cases[split]] for split in SPLITS})
        spacings.append(nominal_spacing(volume.profile, image_size))
        sites[site] = dict(
            profile=asdict(volume.profile),
            family_seed=key,
            flip=list(volume.flip),
            axes=axis_codes(volume.flip),
            spacing=[round(s, 4) for s in spacings[-1]],
            cases={split: len(cases[split]) for split in SPLITS},
            mean_organ_fraction=round(float(np.mean(organ_fraction)), 4),
        )
        site_progress(f"{site} of {num_sites}", {f"{s} volumes": n for s, n in sites[site]["cases"].items()})
    description = dict(
        name="fairfl synthetic multi-site prostate T2w MRI volumes",
        task="segmentation",
        num_classes=2,
        channels=1,
        in_channels=1,  # what `fairfl check-data` reads
        spatial_dims=3,
        modality="MR",
        spacing=[round(float(s), 4) for s in np.median(spacings, axis=0)],
        spacing_axes="RAS",
        labels={"0": "background", "1": "prostate"},
        generator=f"fairfl.data.synthetic_prostate3d v{GENERATOR_VERSION}",
        parameters=recorded_parameters(num_sites, image_size, seed, size_scale, test_scale),
        note=(
            "Synthetic 3-D axial T2w volumes (slice, row, column) from below the apex to above the base, sites "
            "modelled on the six sources of the multi-site prostate dataset of Liu et al. (MS-Net, TMI 2020) with "
            "the 2-D data's profiles. Voxel spacing differs by site (fov_mm / image_size in-plane, "
            "slice_thickness_mm between slices at image size 64) and site-3 and site-5 store flipped axes, all "
            "recorded in the NIfTI affine (RAS+ mm): resample to `spacing` (mm along x, y, z) and reorient before "
            "use. Splits are by case."
        ),
        sites=sites,
    )
    (root / "dataset.json").write_text(json.dumps(description, indent=1) + "\n")
    return root


def ensure_builtin_prostate3d(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 6,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Path of the cached built-in volumes (`generate_prostate3d_sites` output, in `prostate3d-v<version>-...`),
    generating them on first use (`fairfl.data.builtin.ensure_generated`: one generator at a time, never
    half-written)."""
    return ensure_generated(
        "prostate3d",
        GENERATOR_VERSION,
        generate_prostate3d_sites,
        image_size,
        seed,
        num_sites,
        size_scale,
        test_scale,
        cache_dir,
    )
