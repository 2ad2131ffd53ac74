"""Built-in synthetic multi-site prostate T2 MRI: 2-D axial slices with prostate masks.

Each case is a short stack of axial slices through a simulated male pelvis (body outline,
subcutaneous fat, muscles, pelvic bones and femoral heads, rectum, bladder and seminal vesicles near
the base, and a zonal prostate that shrinks towards apex and base). Sites imitate the six sources of
the public multi-site prostate dataset (Liu et al., MS-Net, TMI 2020): they differ in scanner
contrast (gamma), intensity scale, coil bias field, endorectal coil, Rician noise, acquisition
resolution, field of view, organ size and number of cases. `site-6` is the minority site: fewest
cases, imitating an endorectal-coil scanner (BIDMC-like) with a strong near-coil bias field, low
contrast, heavy noise and coarse resolution.

The anatomy (`fairfl.data.render_prostate`) is generated on a 2x finer grid and box-averaged to the output size, which
gives partial-volume edges; the mask is the organ's area fraction >= 0.5 on the same grid.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from fairfl.data.builtin import (
    cache_name,
    check_test_scale,
    ensure_generated,
    extra_test_count,
    extra_test_rng,
    recorded_parameters,
    site_progress,
)
from fairfl.data.datalist import SPLITS, split_cases, write_datalist
from fairfl.data.drawing import SUPERSAMPLE, box_mean
from fairfl.data.render_prostate import ProstateCase

GENERATOR_VERSION = 1
SPLIT_FRACTIONS = (0.6, 0.2, 0.2)
Written = TypeVar("Written")  # what write_site_cases's `write` returns for a case (its datalist entries)


@dataclass(frozen=True)
class SiteProfile:
    """How one hospital's scanner and population look. Intensities are T2w signal on a 0-1 scale."""

    imitates: str  # the public source this profile is modelled on
    scanner: str
    cases: int  # at size_scale 1
    slices_per_case: tuple[int, int]  # inclusive range
    fov_mm: float  # in-plane field of view; larger means smaller anatomy in the image
    slice_thickness_mm: float  # recorded in the NIfTI affine
    intensity_scale: float  # arbitrary scanner units
    gamma: float  # signal = tissue ** gamma (protocol TR/TE differences)
    contrast: float  # 1 nominal; < 1 pulls tissue signals towards their mean
    bias_field: float  # std of the log of the smooth multiplicative coil field
    endorectal_coil: float  # 0 none; else peak near-coil signal gain
    noise: float  # Rician sigma as a fraction of the mean signal in the body
    resolution: float  # acquisition pixel size / output pixel size (> 1: coarser, then interpolated)
    organ_scale: float  # mean prostate size relative to nominal (population age / BPH)
    organ_scale_sd: float


# Modelled on the six sources of the multi-site prostate dataset (Liu et al. 2020): 1.5T scanners
# are noisier than 3T; endorectal coils (BMC, HK, BIDMC) come with small fields of view, an
# air-filled balloon in the rectum and a steep near-coil gain; older scanners and protocols
# acquire coarser matrices. Case counts keep the real ordering roughly (30, 30, 19, 13, 12, 12
# cases) at a size CPU training can afford, with BIDMC as the smallest, most shifted site.
PROFILES = (
    SiteProfile(
        imitates="RUNMC",
        scanner="Siemens 3T, pelvic phased-array coil",
        cases=16,
        slices_per_case=(6, 8),
        fov_mm=180.0,
        slice_thickness_mm=3.6,
        intensity_scale=1000.0,
        gamma=1.0,
        contrast=1.0,
        bias_field=0.15,
        endorectal_coil=0.0,
        noise=0.025,
        resolution=1.0,
        organ_scale=1.0,
        organ_scale_sd=0.10,
    ),
    SiteProfile(
        imitates="BMC",
        scanner="Philips 1.5T, endorectal coil",
        cases=14,
        slices_per_case=(5, 7),
        fov_mm=160.0,
        slice_thickness_mm=4.0,
        intensity_scale=2400.0,
        gamma=0.85,
        contrast=0.95,
        bias_field=0.15,
        endorectal_coil=1.0,
        noise=0.045,
        resolution=1.3,
        organ_scale=1.08,
        organ_scale_sd=0.14,
    ),
    SiteProfile(
        imitates="I2CVB",
        scanner="Siemens 3T, phased-array coil",
        cases=12,
        slices_per_case=(6, 8),
        fov_mm=210.0,
        slice_thickness_mm=3.0,
        intensity_scale=400.0,
        gamma=1.15,
        contrast=1.1,
        bias_field=0.20,
        endorectal_coil=0.0,
        noise=0.02,
        resolution=1.0,
        organ_scale=0.95,
        organ_scale_sd=0.10,
    ),
    SiteProfile(
        imitates="UCL",
        scanner="Siemens 1.5T and 3T, phased-array coil",
        cases=10,
        slices_per_case=(5, 7),
        fov_mm=190.0,
        slice_thickness_mm=3.6,
        intensity_scale=800.0,
        gamma=1.0,
        contrast=0.9,
        bias_field=0.30,
        endorectal_coil=0.0,
        noise=0.035,
        resolution=1.25,
        organ_scale=1.0,
        organ_scale_sd=0.12,
    ),
    SiteProfile(
        imitates="HK",
        scanner="Siemens 1.5T, endorectal coil",
        cases=9,
        slices_per_case=(5, 7),
        fov_mm=165.0,
        slice_thickness_mm=3.0,
        intensity_scale=1600.0,
        gamma=0.9,
        contrast=1.0,
        bias_field=0.20,
        endorectal_coil=1.5,
        noise=0.045,
        resolution=1.4,
        organ_scale=1.05,
        organ_scale_sd=0.12,
    ),
    SiteProfile(
        imitates="BIDMC",
        scanner="GE 3T, endorectal coil (minority site)",
        cases=6,
        slices_per_case=(5, 6),
        fov_mm=150.0,
        slice_thickness_mm=3.0,
        intensity_scale=3000.0,
        gamma=1.8,
        contrast=0.6,
        bias_field=0.40,
        endorectal_coil=3.5,
        noise=0.09,
        resolution=2.0,
        organ_scale=1.15,
        organ_scale_sd=0.20,
    ),
)


def site_profile(site_index: int) -> SiteProfile:
    """Profile of the site at 0-based `site_index`; beyond six, the families repeat (new seeds)."""
    return PROFILES[site_index % len(PROFILES)]


def generate_site_cases(profile: SiteProfile, image_size: int, rng: np.random.Generator, num_cases: int):
    """Yield (case_id, pixel spacing in mm, images [n, S, S] float32, masks [n, S, S] uint8) per case.

    A case is a few slices evenly spaced from near the apex to near the base.
    """
    for case_index in range(num_cases):
        case = ProstateCase(rng, profile, image_size)
        count = int(rng.integers(profile.slices_per_case[0], profile.slices_per_case[1] + 1))
        images, masks = [], []
        for z in np.linspace(-0.7, 0.8, count) + rng.normal(0, 0.03, count):
            tissue, organ, nodule_gain, coil = case.render(float(z))
            images.append(case.acquire(tissue, nodule_gain, coil))
            masks.append((box_mean(organ.astype(np.float32), SUPERSAMPLE) >= 0.5).astype(np.uint8))
        yield f"case{case_index:03d}", case.spacing, np.stack(images), np.stack(masks)


# ----------------------------------------------------------------------------------------------
# writing a dataset, and the cache the jobs use


def write_site_cases(
    generate: Callable[[np.random.Generator, int], Iterable[tuple]],
    write: Callable[..., Written],
    num_cases: int,
    key: list[int],
    test_scale: float,
) -> tuple[dict[str, Written], dict[str, list[str]], list[float]]:
    """One site's cases (the 2-D slices' and the volumes'): `generate(rng, count)` yields (case_id, ..., masks), each
    written by `write(case_id, ...)`; `num_cases` from `default_rng(key)`, split 6:2:2 by case (seeded by the key's
    seed and site index), then test_scale's extra test cases `extra-<case_id>` from `extra_test_rng(*key)`. Returns
    what `write` returned for each case, the case ids of each split, and each first `num_cases` case's organ fraction.
    """
    written, organ_fraction = {}, []
    for case_id, *data in generate(np.random.default_rng(key), num_cases):
        written[case_id] = write(case_id, *data)
        organ_fraction.append(float(data[-1].mean()))
    cases = split_cases(list(written), SPLIT_FRACTIONS, seed=key[:2])
    for case_id, *data in generate(extra_test_rng(*key), extra_test_count(len(cases["testing"]), test_scale)):
        written[f"extra-{case_id}"] = write(f"extra-{case_id}", *data)
        cases["testing"].append(f"extra-{case_id}")
    return written, cases, organ_fraction


def generate_prostate_sites(
    root: str | Path,
    num_sites: int = 6,
    image_size: int = 64,
    seed: int = 0,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Write `num_sites` synthetic sites as NIfTI slices plus one datalist per site; return `root`.

    Layout: `<root>/site-K/images/<case>_s<k>.nii.gz` (float32), `.../labels/...` (uint8, 0/1),
    `<root>/site-K.json` (training/validation/testing split 6:2:2 by case, paths relative to
    `root`) and `<root>/dataset.json` (generator version, parameters, site profiles, counts).
    Deterministic: site K draws from `numpy.random.default_rng([seed, K - 1])`. With `test_scale` s > 1 each
    site's testing split also holds round(n_test * (s - 1)) more cases `extra-case<k>` of its profile, drawn from
    `fairfl.data.builtin.extra_test_rng(seed, K - 1)`: everything else is as at s = 1.
    """
    if image_size < 32:
        raise ValueError(f"image_size must be at least 32 (the anatomy needs the pixels), got {image_size}")
    test_scale = check_test_scale(test_scale)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    sites = {}
    for index in range(num_sites):
        site, profile = f"site-{index + 1}", site_profile(index)
        slices, cases, organ_fraction = write_site_cases(
            partial(generate_site_cases, profile, image_size),
            lambda case_id, spacing, images, masks, site=site, profile=profile: _write_case(
                root, site, case_id, spacing, profile.slice_thickness_mm, images, masks
            ),
            max(len(SPLITS), round(profile.cases * size_scale)),
            [seed, index],
            test_scale,
        )
        write_datalist(
            root / f"{site}.json",
            {split: [entry for case in cases[split] for entry in slices[case]] for split in SPLITS},
        )
        sites[site] = dict(
            profile=asdict(profile),
            family_seed=[seed, index],
            cases={split: len(cases[split]) for split in SPLITS},
            slices={split: sum(len(slices[case]) for case in cases[split]) for split in SPLITS},
            mean_organ_fraction=round(float(np.mean(organ_fraction)), 4),
        )
        site_progress(f"{site} of {num_sites}", {f"{s} slices": n for s, n in sites[site]["slices"].items()})
    description = dict(
        name="fairfl synthetic multi-site prostate T2w MRI",
        generator=f"fairfl.data.synthetic_prostate v{GENERATOR_VERSION}",
        parameters=recorded_parameters(num_sites, image_size, seed, size_scale, test_scale),
        labels={"0": "background", "1": "prostate"},
        note=(
            "Synthetic 2-D axial T2w slices (cases of a few slices from apex to base), sites modelled on "
            "the six sources of the multi-site prostate dataset of Liu et al. (MS-Net, TMI 2020). Profile "
            "fields: fov_mm and slice_thickness_mm (geometry), gamma and contrast (protocol), bias_field "
            "(std of the log coil field), endorectal_coil (near-coil gain), noise (Rician sigma / mean "
            "body signal), resolution (acquisition pixel / output pixel). Splits are by case."
        ),
        sites=sites,
    )
    (root / "dataset.json").write_text(json.dumps(description, indent=1) + "\n")
    return root


def _write_case(
    root: Path, site: str, case_id: str, spacing: float, thickness: float, images: np.ndarray, masks: np.ndarray
) -> list[dict]:
    """Save one case's slices as 2-D NIfTI; return their datalist entries (paths relative to root)."""
    # Array axes (row, column) = (anterior->posterior, right->left of the patient), so the affine
    # maps them to -y and -x in RAS+ and viewers show the usual radiological orientation.
    affine = np.array([[0, -spacing, 0, 0], [-spacing, 0, 0, 0], [0, 0, thickness, 0], [0, 0, 0, 1]], dtype=float)
    entries = []
    for k, (image, mask) in enumerate(zip(images, masks, strict=True)):
        name = f"{case_id}_s{k}.nii.gz"
        paths = {"image": f"{site}/images/{name}", "label": f"{site}/labels/{name}"}
        for key, array in (("image", image.astype(np.float32)), ("label", mask.astype(np.uint8))):
            save_nifti(root / paths[key], array, affine)
        entries.append({**paths, "case": case_id})
    return entries


def save_nifti(path: Path, array: np.ndarray, affine: np.ndarray) -> None:
    """Write `array` as NIfTI at `path` (its folder made), the affine's units millimetres (the 2-D slices and the
    volumes of `fairfl.data.synthetic_prostate3d`)."""
    import nibabel as nib

    path.parent.mkdir(parents=True, exist_ok=True)
    nifti = nib.Nifti1Image(array, affine)
    nifti.header.set_xyzt_units("mm")
    nib.save(nifti, path)


def builtin_data_name(
    image_size: int = 64, seed: int = 0, num_sites: int = 6, size_scale: float = 1.0, test_scale: float = 1.0
) -> str:
    """Cache folder name: changes whenever the generator or its parameters do."""
    return cache_name("prostate", GENERATOR_VERSION, image_size, seed, num_sites, size_scale, test_scale)


def ensure_builtin_data(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 6,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Path of the cached built-in dataset (`generate_prostate_sites` output), generating it on first use
    (`fairfl.data.builtin.ensure_generated`: one generator at a time, never half-written)."""
    return ensure_generated(
        "prostate",
        GENERATOR_VERSION,
        generate_prostate_sites,
        image_size,
        seed,
        num_sites,
        size_scale,
        test_scale,
        cache_dir,
    )
