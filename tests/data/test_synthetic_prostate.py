"""The built-in synthetic multi-site prostate data: layout, determinism, realism checks, the cache."""

import json
import multiprocessing
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
from scipy import ndimage

from fairfl.data.datalist import SPLITS, load_datalist
from fairfl.data.loaders import make_loader
from fairfl.data.synthetic_prostate import (
    PROFILES,
    builtin_data_name,
    ensure_builtin_data,
    generate_prostate_sites,
)

from helpers import generated_at_test_scales

SITES = [f"site-{k}" for k in range(1, 7)]


@pytest.fixture(scope="module")
def dataset(made_once):
    """The default six sites at 64x64 (a few seconds), generated once for all the test processes."""
    return made_once("prostate", lambda folder: generate_prostate_sites(folder, image_size=64, seed=0))


def read_site(root: Path, site: str):
    """All of a site's slices: images [n, S, S], masks [n, S, S], split of each, case of each."""
    datalist = json.loads((root / f"{site}.json").read_text())
    entries = [(split, e) for split in SPLITS for e in datalist[split]]
    images = np.stack([nib.load(root / e["image"]).get_fdata(dtype=np.float32) for _, e in entries])
    masks = np.stack([np.asanyarray(nib.load(root / e["label"]).dataobj) for _, e in entries])
    return images, masks, [s for s, _ in entries], [e["case"] for _, e in entries]


def appearance(images):
    """Per-slice appearance after per-image z-scoring (what the loader does): intensity quantiles,
    sharpness (mean absolute neighbour difference) and low-frequency variation (coil field)."""
    z = (images - images.mean((1, 2), keepdims=True)) / images.std((1, 2), keepdims=True)
    quantiles = np.percentile(z.reshape(len(z), -1), [5, 25, 50, 75, 95], axis=1).T
    sharpness = np.abs(np.diff(z, axis=2)).mean((1, 2))
    low_frequency = ndimage.gaussian_filter(z, (0, 6, 6)).std((1, 2))
    return np.column_stack([quantiles, sharpness, low_frequency])


def test_files_and_datalists(dataset):
    description = json.loads((dataset / "dataset.json").read_text())
    assert description["parameters"] == {"num_sites": 6, "image_size": 64, "seed": 0, "size_scale": 1.0}
    assert set(description["sites"]) == set(SITES)
    for site in SITES:
        datalist = load_datalist(dataset, site)  # validates files, shapes, label values
        entry = datalist["training"][0]
        image, mask = nib.load(entry["image"]), nib.load(entry["label"])
        assert image.shape == mask.shape == (64, 64)
        assert image.get_data_dtype() == np.float32 and mask.get_data_dtype() == np.uint8
        spacing = description["sites"][site]["profile"]["fov_mm"] / 64
        assert np.allclose(image.header.get_zooms()[:2], spacing, rtol=0.06)


def test_splits_are_by_case_and_sizes_are_cpu_friendly(dataset):
    training_slices = 0
    for site in SITES:
        _, _, splits, cases = read_site(dataset, site)
        by_split = {s: {c for c, sp in zip(cases, splits, strict=True) if sp == s} for s in SPLITS}
        assert all(by_split.values()), f"{site}: every split needs a case"
        assert not (
            by_split["training"] & by_split["validation"]
            or by_split["training"] & by_split["testing"]
            or by_split["validation"] & by_split["testing"]
        ), f"{site}: a case is in two splits"
        n_cases = sum(len(v) for v in by_split.values())
        assert len(by_split["training"]) >= 0.5 * n_cases
        training_slices += splits.count("training")
    assert 250 <= training_slices <= 400


def test_masks_hold_a_realistic_organ(dataset):
    for site in SITES:
        _, masks, _, _ = read_site(dataset, site)
        assert set(np.unique(masks)) == {0, 1}
        fraction = masks.mean((1, 2))
        assert fraction.min() > 0.003, f"{site}: every slice goes through the gland"
        assert 0.02 <= fraction.mean() <= 0.25, f"{site}: mean organ fraction {fraction.mean():.3f}"
        # one connected organ per slice
        assert all(ndimage.label(m)[1] == 1 for m in masks)


def test_sites_differ_and_the_minority_site_is_smallest_and_most_shifted(dataset):
    data = {site: read_site(dataset, site) for site in SITES}
    sizes = {site: len(d[0]) for site, d in data.items()}
    assert min(sizes, key=sizes.get) == "site-6"
    raw_means = [d[0].mean() for d in data.values()]
    assert max(raw_means) / min(raw_means) > 3  # scanners use different intensity scales
    organ_means = [d[1].mean() for d in data.values()]
    assert max(organ_means) / min(organ_means) > 1.3  # field of view and population differ

    # Appearance after normalisation: distance of each site's mean descriptor from the other
    # sites' pooled mean, in units of the pooled spread.
    features = {site: appearance(d[0]) for site, d in data.items()}
    spread = np.vstack(list(features.values())).std(0)
    shift = {
        site: np.linalg.norm((f.mean(0) - np.vstack([g for s, g in features.items() if s != site]).mean(0)) / spread)
        for site, f in features.items()
    }
    assert max(shift, key=shift.get) == "site-6", shift
    sharpness = {site: f[:, 5].mean() for site, f in features.items()}
    assert min(sharpness, key=sharpness.get) == "site-6", sharpness  # coarsest acquisition


def test_batch_from_make_loader(dataset):
    entries = load_datalist(dataset, "site-6")["training"]
    batch = next(iter(make_loader(entries, image_size=64, num_classes=2, batch_size=4, train=True, seed=0)))
    assert batch["image"].shape == (4, 1, 64, 64) and batch["image"].dtype == torch.float32
    assert batch["label"].shape == (4, 1, 64, 64) and batch["label"].dtype == torch.int64
    assert set(batch["label"].unique().tolist()) == {0, 1}


def _epoch(entries, augmentation, num_workers, seed=3):
    loader = make_loader(entries, 64, 2, 4, train=True, seed=seed, augmentation=augmentation, num_workers=num_workers)
    return [(torch.Tensor(b["image"]).clone(), torch.Tensor(b["label"]).clone()) for b in loader]


def _same_batches(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True)
    )


def test_loader_workers_keep_the_order_and_are_reproducible(dataset):
    """Workers only move the augmentation out of the process: with none, the same batches in the same order as
    without workers; with augmentation, the same seed gives the same batches and another seed others."""
    entries = load_datalist(dataset, "site-6")["training"][:12]
    assert _same_batches(_epoch(entries, [], 0), _epoch(entries, [], 2))
    augmented = _epoch(entries, ["flip", "rotate90", "intensity"], 2)
    assert _same_batches(augmented, _epoch(entries, ["flip", "rotate90", "intensity"], 2))
    assert not _same_batches(augmented, _epoch(entries, ["flip", "rotate90", "intensity"], 2, seed=4))
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="num_workers must be an integer >= 0"):
            make_loader(entries, 64, 2, 4, train=True, seed=0, num_workers=bad)


def _all_arrays(root: Path):
    return {p.relative_to(root).as_posix(): np.asanyarray(nib.load(p).dataobj) for p in sorted(root.rglob("*.nii.gz"))}


def test_deterministic_given_seed(tmp_path):
    small = dict(num_sites=2, image_size=32, size_scale=0.25)
    a = _all_arrays(generate_prostate_sites(tmp_path / "a", seed=0, **small))
    b = _all_arrays(generate_prostate_sites(tmp_path / "b", seed=0, **small))
    c = _all_arrays(generate_prostate_sites(tmp_path / "c", seed=1, **small))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert (tmp_path / "a" / "site-1.json").read_text() == (tmp_path / "b" / "site-1.json").read_text()
    shared = a.keys() & c.keys()
    assert shared and not any(np.array_equal(a[k], c[k]) for k in shared if "images" in k)


def test_more_than_six_sites_reuse_profiles_with_new_seeds(tmp_path):
    root = generate_prostate_sites(tmp_path, num_sites=8, image_size=32, size_scale=0.2)
    description = json.loads((root / "dataset.json").read_text())
    assert [load_datalist(root, f"site-{k}") for k in range(1, 9)]
    assert description["sites"]["site-7"]["profile"] == description["sites"]["site-1"]["profile"]
    first = np.asanyarray(nib.load(root / "site-1/images/case000_s0.nii.gz").dataobj)
    seventh = np.asanyarray(nib.load(root / "site-7/images/case000_s0.nii.gz").dataobj)
    assert not np.array_equal(first, seventh)


def test_ensure_builtin_data_is_safe_when_clients_start_together(tmp_path):
    args = (32, 0, 2, str(tmp_path))  # image_size, seed, num_sites, cache_dir
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        paths = pool.starmap(ensure_builtin_data, [args] * 3)
    final = tmp_path / builtin_data_name(32, 0, 2)
    assert {Path(p) for p in paths} == {final}
    assert (final / "complete").is_file() and (final / "site-1.json").is_file() and (final / "site-2.json").is_file()
    # nothing half-written is left beside it (only the lock file)
    assert [p.name for p in tmp_path.iterdir() if p != final and not p.name.endswith(".lock")] == []
    stamp = (final / "complete").stat().st_mtime_ns
    assert ensure_builtin_data(*args) == final and (final / "complete").stat().st_mtime_ns == stamp  # cached


def test_cache_dir_from_environment_and_size_scale_in_the_name(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRFL_CACHE_DIR", str(tmp_path))
    path = ensure_builtin_data(image_size=32, seed=3, num_sites=1, size_scale=0.5)
    assert path == tmp_path / "prostate-v1-n1-s32-seed3-x0.5" and (path / "complete").is_file()
    assert json.loads((path / "dataset.json").read_text())["parameters"]["size_scale"] == 0.5
    assert load_datalist(path, "site-1")
    assert builtin_data_name(64, 0, 6) == "prostate-v1-n6-s64-seed0"


def test_test_scale_adds_test_cases_of_each_sites_scanner_and_changes_nothing_else(tmp_path):
    """test_scale 3: every site's testing split holds three times its cases, the new ones from the site's own profile;
    training, validation and the test_scale-1 test cases are the same files, byte for byte; the cache name is the
    old one at 1 and another at 3."""
    base, scaled, added = generated_at_test_scales("prostate", 3, tmp_path, image_size=32, num_sites=2, size_scale=0.5)
    assert base.name == "prostate-v1-n2-s32-seed0-x0.5" == builtin_data_name(32, 0, 2, 0.5, test_scale=1)
    before, after = (json.loads((root / "dataset.json").read_text()) for root in (base, scaled))
    for site, profile in zip(("site-1", "site-2"), PROFILES, strict=False):
        test_cases = before["sites"][site]["cases"]["testing"]
        new_cases = {entry["case"] for entry in added[site]["testing"]}
        assert len(new_cases) == 2 * test_cases and after["sites"][site]["cases"]["testing"] == 3 * test_cases
        assert after["sites"][site]["cases"]["training"] == before["sites"][site]["cases"]["training"]
        for case in new_cases:
            entries = [e for e in added[site]["testing"] if e["case"] == case]
            low, high = profile.slices_per_case
            assert case.startswith("extra-") and low <= len(entries) <= high
            # the site's scanner: its field of view (site-1 180 mm, site-2 160 mm, +-5%) sets the pixel spacing
            spacing = nib.load(scaled / entries[0]["image"]).header.get_zooms()[0]
            assert 0.95 * profile.fov_mm / 32 <= spacing <= 1.05 * profile.fov_mm / 32
            assert np.asanyarray(nib.load(scaled / entries[0]["label"]).dataobj).any()  # a prostate in it


def test_a_lost_rename_race_uses_the_winners_copy(tmp_path, monkeypatch):
    """Where the lock does not hold (e.g. some network file systems), two processes both generate;
    the one whose rename fails must use the other's complete copy and clean up its own."""
    from fairfl.data import synthetic_prostate

    generate = synthetic_prostate.generate_prostate_sites
    final = tmp_path / builtin_data_name(32, 0, 1)

    def generate_while_another_process_wins(root, **kwargs):
        generate(root, **kwargs)
        generate(final, **kwargs)
        (final / "complete").write_text("winner\n")
        return root

    monkeypatch.setattr(synthetic_prostate, "generate_prostate_sites", generate_while_another_process_wins)
    assert ensure_builtin_data(32, 0, 1, cache_dir=tmp_path) == final
    assert (final / "complete").read_text() == "winner\n"
    assert [p.name for p in tmp_path.iterdir() if p != final and not p.name.endswith(".lock")] == []


def test_generating_the_built_in_data_says_so_site_by_site_and_the_cache_says_once_that_it_is_reused(tmp_path, capsys):
    from fairfl.data.builtin import _REUSED

    root = ensure_builtin_data(image_size=32, seed=5, num_sites=2, size_scale=0.5, cache_dir=tmp_path)
    lines = capsys.readouterr().err.splitlines()
    dataset = json.loads((root / "dataset.json").read_text())
    slices = {site: dataset["sites"][site]["slices"] for site in ("site-1", "site-2")}
    assert lines[0] == f"fairfl data: generating {root.name} into {tmp_path} (first use only: later runs reuse it)"
    assert lines[1:3] == [
        f"fairfl data: {site} of 2: " + ", ".join(f"{n} {split} slices" for split, n in slices[site].items())
        for site in ("site-1", "site-2")
    ]
    assert len(lines) == 4 and lines[3].startswith(f"fairfl data: generated {root.name} in ")
    _REUSED.discard(root)  # as in a new process
    for _ in range(3):  # a site asks again each task: one line, not one each time
        assert ensure_builtin_data(image_size=32, seed=5, num_sites=2, size_scale=0.5, cache_dir=tmp_path) == root
    assert capsys.readouterr().err.splitlines() == [f"fairfl data: reusing the built-in data in {root}"]
