"""Built-in synthetic multi-site classification under image-quality shift (the FedISM+ setting).

Two settings, `skin` (ISIC 2019-like dermoscopy, eight diagnoses) and `ich` (RSNA intracranial hemorrhage-like CT
slices, five subtypes), drawn by `fairfl.data.render_skin` and `fairfl.data.render_head_ct` at a size CPU training
can afford and split over sites by `fairfl.data.classification_sites` (sites, quality shift and test sets are
described there).

Class frequencies follow the real datasets (ISIC 2019: NV about half, MEL 18%, BCC 13%; the FedISM+
ICH selection: subdural 43%, epidural 2%), with the rarest classes raised to a few per cent so that a
few-thousand-image set still has test images of every class (`SETTINGS[...].prior`). Sizes at
size_scale 1: 2000 skin images, 1600 ICH slices (test set included), 64 x 64; generation takes about 15
s of one CPU core per setting. Images are drawn on a 2x finer grid and box-averaged. A small CNN trained
on the pooled clean sites reaches, on the clean test set, a balanced accuracy of about 0.75-0.8 (skin)
and 0.75-0.8 (ich) after 25-30 epochs, and near chance on the noise-corrupted one: distinguishable
classes, not a solved task.

Layout (`generate_classification_sites`): `<root>/<site>/<id>.png` (the site's training and validation
images, corrupted at corrupted sites), `<root>/test/clean/<id>.png`, `<root>/test/<noise|blur>/<id>.png`,
`<root>/<site>.json` datalists ({"image": relative path, "label": class index}) and `<root>/dataset.json`
(task, classes, num_classes, in_channels, the split, which sites are corrupted and how, per-site class
counts per split).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fairfl.data.builtin import cache_name, check_test_scale, ensure_cached, extra_test_rng, recorded_test_scale
from fairfl.data.classification_sites import (
    SETTINGS,
    add_extra_test_items,
    largest_remainder,
    plan_sites,
    quality_description,
    split_by_counts,
    write_classification_sites,
)
from fairfl.data.corruption import Corruption
from fairfl.data.drawing import SUPERSAMPLE, box_mean
from fairfl.data.render_head_ct import render_ct
from fairfl.data.render_skin import render_skin

GENERATOR_VERSION = 1


def generate_classification_sites(
    root: str | Path,
    setting: str = "skin",
    num_sites: int = 20,
    image_size: int = 64,
    seed: int = 0,
    size_scale: float = 1.0,
    alpha: float = 1.0,
    corrupted_fraction: float = 0.2,
    corruption: str = "noise",
    severity: int = 3,
    test_set: str = "shared",
    site_class_counts: Sequence[Sequence[int]] | None = None,
    test_fraction: float = 0.2,
    validation_fraction: float = 0.15,
    test_scale: float = 1.0,
) -> Path:
    """Write a synthetic multi-site classification dataset (layout in the module docstring); return `root`.

    Args:
        setting: "skin" (8 dermoscopy classes, RGB) or "ich" (5 hemorrhage subtypes, grey CT).
        num_sites: number of sites, named site-1 ... site-N (FLARE client names).
        image_size: images are image_size squared (at least 32).
        seed: everything is deterministic given the seed: image i is drawn from
            `default_rng([seed, setting index, i])`, the split from `default_rng([seed, 1000])`.
        size_scale: scales the number of images (`SETTINGS[setting].images` at 1).
        alpha: Dirichlet concentration of the label split (FedISM+: 1.0).
        corrupted_fraction: share of sites, rounded, whose images are corrupted (FedISM+: 0.2, 4 of 20);
            the last sites are (FFL4MIA's convention). 0 gives clean sites and no `testing_corrupted`.
        corruption, severity: "noise" (Gaussian) or "blur" (motion), severity 1-5 (`fairfl.data.corruption`).
        test_set: "shared" (one test set every site evaluates on: FedISM+) or "site" (each site's own
            share: FedNPR).
        site_class_counts: instead of a Dirichlet split, exactly these images per site (rows) and class
            (columns), test share included (a natural split with missing classes, FedNPR Table I scaled
            down); `num_sites`, `alpha` and `size_scale` are then not used.
        test_fraction, validation_fraction: of all images (shared test) or of each site's; validation is
            taken from each site's non-test images.
        test_scale: s > 1 adds round(n_test * (s - 1)) images `extra-img<j>` to the shared test set (or to each
            site's), in the class proportions of the images it was drawn from (all, or the site's), image j
            drawn from `fairfl.data.builtin.extra_test_rng(seed, setting index, j)` and corrupted in
            `testing_corrupted` like the others; everything else is as at s = 1.
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {sorted(SETTINGS)}, got {setting!r}")
    if image_size < 32:
        raise ValueError(f"image_size must be at least 32 (the textures need the pixels), got {image_size}")
    if not 0 <= corrupted_fraction < 1:
        raise ValueError(f"corrupted_fraction must be in [0, 1), got {corrupted_fraction}")
    spec = SETTINGS[setting]
    test_scale = check_test_scale(test_scale)
    split_rng = np.random.default_rng([seed, 1000])
    if site_class_counts is not None:
        counts = np.asarray(site_class_counts, dtype=int)
        if counts.ndim != 2 or counts.shape[1] != len(spec.classes) or (counts < 0).any():
            raise ValueError(f"site_class_counts must be [sites, {len(spec.classes)}] non-negative integers")
        num_sites = len(counts)
        labels = np.repeat(np.arange(len(spec.classes)), counts.sum(0))
        site_of = np.full(len(labels), -1)
        for site, members in enumerate(split_by_counts(labels, counts, split_rng)):
            site_of[members] = site
    else:
        total = max(round(spec.images * size_scale), 10 * num_sites)
        labels = np.repeat(np.arange(len(spec.classes)), largest_remainder(np.asarray(spec.prior) * total))
        site_of = None
    num_corrupted = round(corrupted_fraction * num_sites)
    quality = Corruption(corruption, severity) if num_corrupted else None
    plan = plan_sites(
        labels,
        num_sites,
        split_rng,
        alpha=alpha,
        num_corrupted=num_corrupted,
        site_of=site_of,
        test_set=test_set,
        test_fraction=test_fraction,
        validation_fraction=validation_fraction,
        min_per_site=3 if test_set == "shared" else 5,
    )
    digits = len(str(len(labels) - 1))
    drawn = len(labels)  # image i < drawn is the same at every test_scale; the extra test images follow
    extra_labels = add_extra_test_items(plan, labels, len(spec.classes), test_scale, test_set == "shared")
    ids = [f"img{i:0{digits}d}" for i in range(drawn)] + [f"extra-img{j:0{digits}d}" for j in range(len(extra_labels))]
    labels = np.concatenate([labels, extra_labels])
    setting_index = list(SETTINGS).index(setting)
    site_names = [f"site-{k + 1}" for k in range(num_sites)]

    def image_of(i: int) -> np.ndarray:
        rng = (
            np.random.default_rng([seed, setting_index, i])
            if i < drawn
            else extra_test_rng(seed, setting_index, i - drawn)
        )
        return render_image(setting, int(labels[i]), image_size, rng)

    from threadpoolctl import threadpool_limits

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    # One BLAS thread: the products here are tiny, and threads spinning on cores that other FLARE
    # clients are using made generation several times slower (as in synthetic_fundus).
    with threadpool_limits(limits=1, user_api="blas"):
        sites = write_classification_sites(
            root, plan, ids, labels, image_of, site_names, len(spec.classes), num_corrupted, quality, seed
        )
    corrupted_sites = site_names[num_sites - num_corrupted :] if num_corrupted else []
    description = dict(
        name=f"fairfl synthetic multi-site classification, {setting} ({spec.imitates}-like)",
        generator=f"fairfl.data.synthetic_classification v{GENERATOR_VERSION}",
        task="classification",
        classes=list(spec.classes),
        class_names=list(spec.class_names),
        num_classes=len(spec.classes),
        in_channels=spec.in_channels,
        image_size=image_size,
        parameters=dict(
            setting=setting,
            num_sites=num_sites,
            image_size=image_size,
            seed=seed,
            size_scale=size_scale,
            alpha=alpha,
            corrupted_fraction=corrupted_fraction,
            corruption=corruption,
            severity=severity,
            test_set=test_set,
            test_fraction=test_fraction,
            validation_fraction=validation_fraction,
            **recorded_test_scale(test_scale),
        ),
        prior=list(spec.prior),
        split=dict(
            method="counts" if site_class_counts is not None else "dirichlet",
            alpha=alpha,
            test_set=test_set,
            test_fraction=test_fraction,
            validation_fraction=validation_fraction,
            site_class_counts=None if site_class_counts is None else counts.tolist(),
        ),
        **quality_description(quality, corrupted_sites, image_size, test_set),
        sites=sites,
    )
    (root / "dataset.json").write_text(json.dumps(description, indent=1) + "\n")
    return root


def render_image(setting: str, label: int, image_size: int, rng: np.random.Generator) -> np.ndarray:
    """One synthetic image as uint8: RGB [S, S, 3] (skin) or grey [S, S] (ich), S = image_size, drawn on a grid
    `SUPERSAMPLE` times finer and box-averaged to the size the model sees."""
    n = image_size * SUPERSAMPLE
    if setting == "skin":
        image = box_mean(render_skin(label, rng, n), SUPERSAMPLE)
        noise = 0.008
    else:
        image = box_mean(render_ct(label, rng, n), SUPERSAMPLE)
        noise = rng.uniform(0.01, 0.03)  # CT quantum noise, at the pixel size the model sees
    image = image + rng.normal(0, noise, image.shape).astype(np.float32)
    return np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)


def generate_skin_sites(
    root, num_sites: int = 20, image_size: int = 64, seed: int = 0, size_scale: float = 1.0, **options
) -> Path:
    """`generate_classification_sites` for the skin setting (the signature `fairfl prepare-data` calls)."""
    return generate_classification_sites(root, "skin", num_sites, image_size, seed, size_scale, **options)


def generate_ich_sites(
    root, num_sites: int = 20, image_size: int = 64, seed: int = 0, size_scale: float = 1.0, **options
) -> Path:
    """`generate_classification_sites` for the ich setting (the signature `fairfl prepare-data` calls)."""
    return generate_classification_sites(root, "ich", num_sites, image_size, seed, size_scale, **options)


def builtin_classification_name(
    setting: str,
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 20,
    size_scale: float = 1.0,
    corruption: str = "noise",
    corrupted_fraction: float = 0.2,
    alpha: float = 1.0,
    test_scale: float = 1.0,
) -> str:
    """Cache folder name: changes whenever the generator or its parameters do."""
    kind = f"{setting}-{corruption}"
    if corrupted_fraction != 0.2 or alpha != 1.0:
        kind += f"-c{corrupted_fraction:g}-a{alpha:g}"
    return cache_name(kind, GENERATOR_VERSION, image_size, seed, num_sites, size_scale, test_scale)


def _ensure(
    setting: str,
    image_size: int,
    seed: int,
    num_sites: int,
    cache_dir,
    size_scale: float,
    corruption: str,
    corrupted_fraction: float,
    alpha: float,
    test_scale: float,
) -> Path:
    name = builtin_classification_name(
        setting, image_size, seed, num_sites, size_scale, corruption, corrupted_fraction, alpha, test_scale
    )
    return ensure_cached(
        name,
        lambda folder: generate_classification_sites(
            folder,
            setting,
            num_sites,
            image_size,
            seed,
            size_scale,
            alpha,
            corrupted_fraction,
            corruption,
            test_scale=test_scale,
        ),
        cache_dir,
    )


def ensure_builtin_skin(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 20,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    corruption: str = "noise",
    corrupted_fraction: float = 0.2,
    alpha: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Path of the cached built-in skin dataset, generating it on first use (`ensure_cached`: one
    generator at a time, never half-written)."""
    return _ensure(
        "skin", image_size, seed, num_sites, cache_dir, size_scale, corruption, corrupted_fraction, alpha, test_scale
    )


def ensure_builtin_ich(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 20,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    corruption: str = "noise",
    corrupted_fraction: float = 0.2,
    alpha: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Path of the cached built-in ICH dataset, generating it on first use."""
    return _ensure(
        "ich", image_size, seed, num_sites, cache_dir, size_scale, corruption, corrupted_fraction, alpha, test_scale
    )


def ensure_builtin_skin_blur(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 20,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """The skin dataset with motion-blurred sites (for a BUILTIN_DATASETS entry of its own)."""
    return ensure_builtin_skin(
        image_size, seed, num_sites, cache_dir, size_scale, corruption="blur", test_scale=test_scale
    )


def ensure_builtin_ich_blur(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 20,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """The ICH dataset with motion-blurred sites (for a BUILTIN_DATASETS entry of its own)."""
    return ensure_builtin_ich(
        image_size, seed, num_sites, cache_dir, size_scale, corruption="blur", test_scale=test_scale
    )
