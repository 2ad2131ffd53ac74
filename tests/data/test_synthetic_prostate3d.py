"""The built-in synthetic multi-site prostate volumes (prostate3d): layout, the task dataset.json declares, spacings
and orientations in the affine, the gland along z, the sites' scanners, determinism, test_scale and the cache."""

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from fairfl.data import synthetic_prostate3d
from fairfl.data.builtin import builtin_dataset
from fairfl.data.datalist import SPLITS, split_cases
from fairfl.data.synthetic_prostate import PROFILES
from fairfl.data.synthetic_prostate3d import (
    VOLUME_SITES,
    VolumeSite,
    case_count,
    ensure_builtin_prostate3d,
    generate_prostate3d_sites,
)

from helpers import generated_at_test_scales

SITES = [f"site-{k}" for k in range(1, 7)]
SMALL = dict(image_size=32, size_scale=0.25)  # 16 x 32 x 32 volumes, five cases a site (the least a site has)
AXES = {"site-1": "SPL", "site-2": "SPL", "site-3": "IAL", "site-4": "SPL", "site-5": "SPR", "site-6": "SPL"}


@pytest.fixture(scope="module")
def dataset(made_once):
    """The six sites at image size 32, five cases each (a few seconds), generated once for all the test processes."""
    return made_once("volumes", lambda folder: generate_prostate3d_sites(folder, num_sites=6, seed=0, **SMALL))


def cases(root: Path, site: str) -> list[tuple[str, nib.Nifti1Image, nib.Nifti1Image]]:
    """(split, image, label) of every case of a site, in datalist order."""
    datalist = json.loads((root / f"{site}.json").read_text())
    entries = [(split, entry) for split in SPLITS for entry in datalist[split]]
    return [(split, nib.load(root / e["image"]), nib.load(root / e["label"])) for split, e in entries]


def world_centre(label: nib.Nifti1Image) -> np.ndarray:
    """The prostate's centre of mass in world millimetres (RAS+), through the file's affine."""
    voxel = np.argwhere(np.asanyarray(label.dataobj) > 0).mean(axis=0)
    return label.affine[:3, :3] @ voxel + label.affine[:3, 3]


def all_arrays(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): np.asanyarray(nib.load(p).dataobj) for p in sorted(root.rglob("*.nii.gz"))}


def test_files_datalists_and_the_task_dataset_json_declares(dataset):
    description = json.loads((dataset / "dataset.json").read_text())
    declared = {key: description[key] for key in ("task", "num_classes", "channels", "spatial_dims", "modality")}
    assert declared == {"task": "segmentation", "num_classes": 2, "channels": 1, "spatial_dims": 3, "modality": "MR"}
    assert description["labels"] == {"0": "background", "1": "prostate"} and description["in_channels"] == 1
    assert description["parameters"] == {"num_sites": 6, "image_size": 32, "seed": 0, "size_scale": 0.25}
    assert description["generator"] == "fairfl.data.synthetic_prostate3d v1" and description["note"]
    assert set(description["sites"]) == set(SITES)
    for site in SITES:
        datalist = json.loads((dataset / f"{site}.json").read_text())
        assert list(datalist) == list(SPLITS) and all(datalist[split] for split in SPLITS)
        for entry in (e for split in SPLITS for e in datalist[split]):
            assert set(entry) == {"image", "label", "case"}
            assert entry["image"] == f"{site}/images/{entry['case']}.nii.gz"
            assert entry["label"] == f"{site}/labels/{entry['case']}.nii.gz"
        for _, image, label in cases(dataset, site):
            assert image.shape == label.shape == (16, 32, 32)  # depth = image_size // 2
            assert image.get_data_dtype() == np.float32 and label.get_data_dtype() == np.uint8
            assert np.array_equal(image.affine, label.affine)
            assert set(np.unique(np.asanyarray(label.dataobj))) == {0, 1}


def test_splits_are_by_case_and_every_site_has_three_training_cases_at_the_default_size(dataset):
    for site in SITES:
        datalist = json.loads((dataset / f"{site}.json").read_text())
        by_split = {split: {e["case"] for e in datalist[split]} for split in SPLITS}
        assert sum(len(c) for c in by_split.values()) == len(set().union(*by_split.values()))  # no case in two
        assert len(by_split["training"]) >= 3
    # the default dataset: the 2-D profile's cases x 0.8, the minority site-6 the smallest, still 3 training cases
    counts = [case_count(site.profile) for site in VOLUME_SITES]
    assert counts == [13, 11, 10, 8, 7, 5] and counts[5] == min(counts)
    assert all(len(split_cases([str(k) for k in range(n)])["training"]) >= 3 for n in counts)


def test_spacings_and_orientations_are_the_sites_and_in_the_affine(dataset):
    description = json.loads((dataset / "dataset.json").read_text())
    for site, volume in zip(SITES, VOLUME_SITES, strict=True):
        profile = volume.profile
        recorded = description["sites"][site]
        assert recorded["axes"] == AXES[site] and recorded["profile"]["fov_mm"] == profile.fov_mm
        assert recorded["spacing"] == pytest.approx([profile.fov_mm / 32] * 2 + [profile.slice_thickness_mm * 2], 1e-3)
        for _, image, _ in cases(dataset, site):
            assert "".join(nib.aff2axcodes(image.affine)) == AXES[site]
            slices, rows, columns = image.header.get_zooms()
            assert slices == pytest.approx(profile.slice_thickness_mm * 2)  # 16 slices cover what 32 do at 64
            assert rows == columns and 0.95 * profile.fov_mm / 32 <= rows <= 1.05 * profile.fov_mm / 32
    # the target spacing: the median of the sites' along x, y, z (fov 150..210 mm / 32; 3.0..4.0 mm x 2)
    assert description["spacing"] == pytest.approx([172.5 / 32, 172.5 / 32, 6.6], abs=1e-4)
    assert description["spacing_axes"] == "RAS"


def test_the_flipped_sites_prostate_is_where_the_unflipped_sites_is_in_world_coordinates(dataset):
    """Mid-gland is world z = 0 at every site; read through the affine, the flipped sites' glands are there too. Read
    ignoring the flip (the unflipped sites' affine), site-3's would be mirrored about its slab's centre: far off."""
    centres = {site: np.array([world_centre(label) for _, _, label in cases(dataset, site)]) for site in SITES}
    reference = centres["site-1"].mean(axis=0)
    for site in ("site-3", "site-5"):
        assert np.abs(centres[site][:, 2] - reference[2]).max() < 3.0, site  # mm, along z
        assert np.abs(centres[site].mean(axis=0)[:2] - reference[:2]).max() < 10.0, site  # patients lie apart
    wrong = []
    for _, _, label in cases(dataset, "site-3"):  # its slices and rows taken in the order of an unflipped site's
        misread = nib.Nifti1Image(np.flip(np.asanyarray(label.dataobj), (0, 1)), label.affine)
        wrong.append(world_centre(misread)[2])
    assert np.abs(np.array(wrong) - reference[2]).min() > 6.0


def test_a_flip_changes_how_a_volume_is_stored_and_nothing_else(dataset, tmp_path, monkeypatch):
    """site-1 stored with every axis reversed: reoriented to RAS, the same voxels with the same affine."""
    monkeypatch.setattr(synthetic_prostate3d, "VOLUME_SITES", (VolumeSite(PROFILES[0], flip=(True, True, True)),))
    flipped = generate_prostate3d_sites(tmp_path, num_sites=1, seed=0, **SMALL)
    assert json.loads((flipped / "dataset.json").read_text())["sites"]["site-1"]["axes"] == "IAR"
    for (_, image, label), (_, mirrored, mirrored_label) in zip(
        cases(dataset, "site-1"), cases(flipped, "site-1"), strict=True
    ):
        for plain, stored in ((image, mirrored), (label, mirrored_label)):
            assert not np.array_equal(np.asanyarray(plain.dataobj), np.asanyarray(stored.dataobj))
            plain, stored = nib.as_closest_canonical(plain), nib.as_closest_canonical(stored)
            assert np.array_equal(np.asanyarray(plain.dataobj), np.asanyarray(stored.dataobj))
            assert np.allclose(plain.affine, stored.affine)


def test_the_gland_appears_grows_and_vanishes_along_z(dataset):
    for site in SITES:
        for _, image, label in cases(dataset, site):
            mask = nib.as_closest_canonical(label).get_fdata()  # x, y, z: slices from the feet up
            area = mask.sum(axis=(0, 1))
            present = np.flatnonzero(area)
            assert area[0] == area[-1] == 0 and area[len(area) // 2] > 0, (site, area)  # ends empty, middle not
            assert np.array_equal(present, np.arange(present[0], present[-1] + 1))  # one run of slices
            assert area.max() > max(area[present[0]], area[present[-1]])  # largest inside, smaller to apex and base
            volume = np.asanyarray(image.dataobj)
            assert np.isfinite(volume).all() and volume.min() >= 0  # magnitude images


def test_the_sites_differ_as_their_scanners_do(dataset):
    """Intensity scale (site-3 400, site-1 1000, site-6 3000 scanner units: the medians keep that order) and noise
    (the darkest 2% of voxels, air, gas and cortical bone, are Rician noise: relative to the median, site-6's with
    noise 0.09 is far above site-1's and site-3's, 0.025 and 0.02)."""

    scale, noise = {}, {}
    for site in ("site-1", "site-3", "site-6"):
        voxels = [np.sort(np.asanyarray(image.dataobj).ravel()) for _, image, _ in cases(dataset, site)]
        scale[site] = np.array([np.median(v) for v in voxels])
        noise[site] = np.array([v[: v.size // 50].mean() for v in voxels]) / scale[site]
    assert scale["site-3"].mean() < scale["site-1"].mean() < scale["site-6"].mean()
    assert noise["site-6"].min() > 3 * max(noise["site-1"].max(), noise["site-3"].max())


def test_deterministic_for_a_seed_and_a_sites_data_does_not_depend_on_the_number_of_sites(dataset, tmp_path):
    a = all_arrays(generate_prostate3d_sites(tmp_path / "a", num_sites=1, seed=0, **SMALL))
    b = all_arrays(generate_prostate3d_sites(tmp_path / "b", num_sites=1, seed=0, **SMALL))
    c = all_arrays(generate_prostate3d_sites(tmp_path / "c", num_sites=1, seed=1, **SMALL))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert (tmp_path / "a" / "site-1.json").read_text() == (tmp_path / "b" / "site-1.json").read_text()
    assert a.keys() == c.keys() and not any(np.array_equal(a[k], c[k]) for k in a if "images" in k)
    six = all_arrays(dataset)  # site-1 of six sites is site-1 of one
    assert all(np.array_equal(a[k], six[k]) for k in a)
    assert (tmp_path / "a" / "site-1.json").read_text() == (dataset / "site-1.json").read_text()


def test_test_scale_adds_test_cases_only_and_the_dataset_is_registered(tmp_path):
    data = builtin_dataset("prostate3d")
    assert (data.task, data.in_channels, data.num_classes, data.spatial_dims) == ("segmentation", 1, 2, 3)
    assert data.ensure_function() is ensure_builtin_prostate3d
    base, scaled, added = generated_at_test_scales("prostate3d", 2, tmp_path, num_sites=1, **SMALL)
    assert base.name == "prostate3d-v1-n1-s32-seed0-x0.25"
    assert ensure_builtin_prostate3d(cache_dir=tmp_path, num_sites=1, **SMALL) == base  # cached: found, not remade
    new = added["site-1"]["testing"]
    assert len(new) == 1 and new[0]["case"].startswith("extra-") and not added["site-1"].get("training")
    image = nib.load(scaled / new[0]["image"])
    assert image.shape == (16, 32, 32) and "".join(nib.aff2axcodes(image.affine)) == "SPL"
    assert np.asanyarray(nib.load(scaled / new[0]["label"]).dataobj).any()  # a prostate in it
