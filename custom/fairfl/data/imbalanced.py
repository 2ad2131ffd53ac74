"""FedNPR's class-imbalanced multi-site benchmarks with missing classes, drawn by the classification generator
(`synthetic_classification`) at a size CPU training can afford. No site is corrupted; every site has its own
training / validation / testing split (test 20% and validation 15% of the rest, stratified by class), since
FedNPR evaluates each site on its own test set and averages over sites.

- `skin_imbalanced` (FedNPR Table I, Fed-ISIC2019): the six sources Rosendahl, BCN, MSK4, ViDIR Modern,
  ViDIR Old, ViDIR Molemax as site-1 ... site-6, each with the table's images per class scaled by one factor
  (`SKIN_IMAGES` images in all at size_scale 1). A class the source has keeps at least one image and a class
  it lacks stays absent, so the sites differ in size by more than 10x (BCN against ViDIR Old, ~24x at size
  scale 1) and MSK4, ViDIR Old and ViDIR Molemax miss classes, as in the paper.
- `ich_imbalanced` (FedNPR Sec. IV-E1, Table II, RSNA-ICH): `ICH_IMAGES` slices at size_scale 1 with the
  generator's class frequencies; each class is split over the sites by its own Dirichlet (epidural 0.5,
  intraparenchymal 5, intraventricular 10, subarachnoid 30, subdural 50) among the sites that keep it, each
  site losing each class with probability 0.3. Table II's class totals are 80% (its training share) of the
  whole selection, so the removed shares went to the other sites, not away: here too. 10 sites by default,
  differing in size by about 4x (Table II: 2545 to 11177 training slices) through the removals.

`dataset.json` records the table used ("benchmark"); the split is seeded, the images as in the generator.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fairfl.data.builtin import cache_name, ensure_cached, recorded_test_scale
from fairfl.data.classification_sites import ICH_CLASSES, SETTINGS, largest_remainder
from fairfl.data.synthetic_classification import GENERATOR_VERSION, generate_classification_sites

SPLIT_VERSION = 1  # of the site tables below; the images follow GENERATOR_VERSION

# FedNPR Table I: images per class (MEL, NV, BCC, AK, BKL, DF, VASC, SCC) of each Fed-ISIC2019 source
ISIC_SOURCES = (
    ("Rosendahl", (342, 803, 296, 109, 490, 30, 3, 18)),
    ("BCN", (2857, 4206, 2809, 737, 1138, 124, 111, 431)),
    ("MSK4", (215, 415, 0, 0, 189, 0, 0, 0)),
    ("ViDIR Modern", (680, 1832, 211, 21, 475, 51, 82, 11)),
    ("ViDIR Old", (67, 350, 5, 0, 10, 4, 3, 0)),
    ("ViDIR Molemax", (24, 3720, 2, 0, 124, 30, 43, 0)),
)
SKIN_IMAGES = 800  # at size_scale 1, before each present class's minimum of one image
ICH_IMAGES = 1000  # at size_scale 1
ICH_ALPHAS = dict(zip(ICH_CLASSES, (0.5, 5.0, 10.0, 30.0, 50.0), strict=True))  # per-class Dirichlet concentration
ICH_REMOVAL = 0.3  # probability that a site loses a class
ICH_SITES = 10
MIN_SITE_IMAGES = 6  # a site test set, a validation and a training image at least, for any size_scale


def isic_like_counts(size_scale: float = 1.0) -> np.ndarray:
    """[6, 8] images per site and class: Table I times SKIN_IMAGES * size_scale / its total, rounded; a class
    the source has keeps at least one image (a rare class stays rare, not absent), one it lacks none."""
    if size_scale <= 0:
        raise ValueError(f"size_scale must be positive, got {size_scale}")
    table = np.asarray([counts for _, counts in ISIC_SOURCES], dtype=float)
    scaled = np.round(table * SKIN_IMAGES * size_scale / table.sum()).astype(int)
    return np.where(table > 0, np.maximum(scaled, 1), 0)


def ich_like_counts(
    num_sites: int = ICH_SITES, size_scale: float = 1.0, rng: np.random.Generator | None = None, max_tries: int = 1000
) -> np.ndarray:
    """[num_sites, 5] images per site and class: each (site, class) removed with probability ICH_REMOVAL,
    then every class's images split over the sites that keep it by Dirichlet(alpha_c). Drawn again until
    every site has two classes and MIN_SITE_IMAGES images and every class is somewhere (ValueError after
    `max_tries`)."""
    if num_sites < 2 or size_scale <= 0:
        raise ValueError(f"need num_sites >= 2 and size_scale > 0, got {num_sites}, {size_scale}")
    rng = rng or np.random.default_rng(0)
    totals = largest_remainder(np.asarray(SETTINGS["ich"].prior) * ICH_IMAGES * size_scale)
    for _ in range(max_tries):
        keep = rng.random((num_sites, len(totals))) >= ICH_REMOVAL
        counts = np.zeros(keep.shape, dtype=int)
        for c, (alpha, total) in enumerate(zip(ICH_ALPHAS.values(), totals, strict=True)):
            sites = np.flatnonzero(keep[:, c])
            if len(sites):
                counts[sites, c] = largest_remainder(rng.dirichlet(np.full(len(sites), alpha)) * total)
        if ((counts > 0).sum(1) >= 2).all() and (counts.sum(1) >= MIN_SITE_IMAGES).all() and counts.sum(0).all():
            return counts
    raise ValueError(
        f"no ICH-like split of {totals.sum()} slices over {num_sites} sites gave every site two classes "
        f"and {MIN_SITE_IMAGES} slices in {max_tries} tries: raise size_scale"
    )


def _generate(
    root,
    setting: str,
    counts: np.ndarray,
    image_size: int,
    seed: int,
    size_scale: float,
    benchmark: dict,
    test_scale: float = 1.0,
) -> Path:
    """The generator's natural-split mode on `counts`, site test sets (enlarged by `test_scale`, extra images in
    the site's own class proportions), no corruption; `benchmark` and the real number of sites and size scale
    recorded in dataset.json. `counts` stays the table of the images at test_scale 1."""
    if (counts.sum(1) < MIN_SITE_IMAGES).any():
        raise ValueError(f"size_scale {size_scale} leaves a site fewer than {MIN_SITE_IMAGES} images: raise it")
    root = generate_classification_sites(
        root,
        setting,
        image_size=image_size,
        seed=seed,
        site_class_counts=counts,
        corrupted_fraction=0.0,
        test_set="site",
        test_scale=test_scale,
    )
    path = root / "dataset.json"
    description = json.loads(path.read_text())
    description["name"] = f"fairfl synthetic class-imbalanced multi-site classification, {setting} (FedNPR)"
    description["parameters"].update(num_sites=len(counts), size_scale=size_scale, **recorded_test_scale(test_scale))
    description["benchmark"] = dict(benchmark, split_version=SPLIT_VERSION, site_class_counts=counts.tolist())
    path.write_text(json.dumps(description, indent=1) + "\n")
    return root


def _isic_sites(num_sites: int) -> None:
    if num_sites > len(ISIC_SOURCES):
        raise ValueError(
            f"skin_imbalanced has the {len(ISIC_SOURCES)} sources of FedNPR's Table I; {num_sites} sites asked for"
        )


def generate_skin_imbalanced_sites(
    root, num_sites: int = 6, image_size: int = 64, seed: int = 0, size_scale: float = 1.0, test_scale: float = 1.0
) -> Path:
    """The ISIC-like natural split (module docstring). Always all six sources: a run with fewer sites uses
    the first ones; more than six is an error."""
    _isic_sites(num_sites)
    return _generate(
        root,
        "skin",
        isic_like_counts(size_scale),
        image_size,
        seed,
        size_scale,
        dict(kind="isic_natural", table="FedNPR Table I", sources=[s for s, _ in ISIC_SOURCES]),
        test_scale,
    )


def generate_ich_imbalanced_sites(
    root,
    num_sites: int = ICH_SITES,
    image_size: int = 64,
    seed: int = 0,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """The ICH-like per-class Dirichlet split with removed classes over `num_sites` sites (module docstring)."""
    counts = ich_like_counts(num_sites, size_scale, np.random.default_rng([seed, 2000]))
    return _generate(
        root,
        "ich",
        counts,
        image_size,
        seed,
        size_scale,
        dict(kind="ich_dirichlet", table="FedNPR Table II", alphas=ICH_ALPHAS, removal=ICH_REMOVAL),
        test_scale,
    )


def ensure_builtin_skin_imbalanced(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 6,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Path of the cached `skin_imbalanced` dataset (always six sites), generating it on first use."""
    _isic_sites(num_sites)
    name = cache_name(
        f"skin_imbalanced-p{SPLIT_VERSION}",
        GENERATOR_VERSION,
        image_size,
        seed,
        len(ISIC_SOURCES),
        size_scale,
        test_scale,
    )
    return ensure_cached(
        name,
        lambda folder: generate_skin_imbalanced_sites(
            folder, image_size=image_size, seed=seed, size_scale=size_scale, test_scale=test_scale
        ),
        cache_dir,
    )


def ensure_builtin_ich_imbalanced(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = ICH_SITES,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Path of the cached `ich_imbalanced` dataset for `num_sites` sites, generating it on first use."""
    name = cache_name(
        f"ich_imbalanced-p{SPLIT_VERSION}", GENERATOR_VERSION, image_size, seed, num_sites, size_scale, test_scale
    )
    return ensure_cached(
        name,
        lambda folder: generate_ich_imbalanced_sites(
            folder, num_sites, image_size=image_size, seed=seed, size_scale=size_scale, test_scale=test_scale
        ),
        cache_dir,
    )
