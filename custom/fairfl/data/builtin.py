"""The built-in synthetic datasets, and the cache every FLARE client of a run shares.

A job that names no data root uses the built-in data of its task: generated deterministically (seeded) on
first use into a cache folder, then read from there by every site."""

from __future__ import annotations

import importlib
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class BuiltinDataset:
    """What the server must know to build the network, and where the generator lives."""

    name: str
    task: str
    in_channels: int
    num_classes: int
    ensure: str  # "module:function" with the signature of `ensure_builtin`'s arguments
    min_sites: int = 6  # the data is generated for at least this many sites (the prostate generator's six scanners)
    spatial_dims: int = 2  # 2: images (slices), 3: volumes; the server builds a network of as many dimensions
    shared_test: bool = False  # every site is scored on one shared test set (the same images, in the same order)

    def ensure_function(self) -> Callable[..., Path]:
        module, function = self.ensure.split(":")
        return getattr(importlib.import_module(module), function)


BUILTIN_DATASETS = {
    "prostate": BuiltinDataset("prostate", "segmentation", 1, 2, "fairfl.data.synthetic_prostate:ensure_builtin_data"),
    # the same six scanners as T2 volumes (32 x 64 x 64 at image size 64) with their own voxel spacings and, at two
    # sites, flipped axes (the affine says so): the data of the 3-D path (patches, sliding-window evaluation)
    "prostate3d": BuiltinDataset(
        "prostate3d", "segmentation", 1, 2, "fairfl.data.synthetic_prostate3d:ensure_builtin_prostate3d", spatial_dims=3
    ),
    # background, optic disc (rim), optic cup; Dice is reported for the disc (rim + cup) and the cup
    "fundus": BuiltinDataset("fundus", "segmentation", 3, 3, "fairfl.data.synthetic_fundus:ensure_builtin_fundus"),
    # FedISM+'s quality shift: 8 dermoscopy classes (RGB) or 5 hemorrhage subtypes (grey CT), split over exactly
    # the run's sites by Dirichlet(1.0); the last 20% of the sites hold Gaussian-noise (or, *_blur, motion-blurred)
    # images, and every site has a clean `testing` and a corrupted `testing_corrupted` split of one shared test set
    **{
        name: BuiltinDataset(
            name,
            "classification",
            channels,
            classes,
            f"fairfl.data.synthetic_classification:ensure_builtin_{name}",
            min_sites=2,
            shared_test=True,
        )
        for name, channels, classes in (("skin", 3, 8), ("skin_blur", 3, 8), ("ich", 1, 5), ("ich_blur", 1, 5))
    },
    # FedNPR's class imbalance with missing classes, every site its own test set, no corruption: the six
    # Fed-ISIC2019 sources of its Table I (fixed, so six sites at most) and its ten-site ICH Dirichlet split
    "skin_imbalanced": BuiltinDataset(
        "skin_imbalanced", "classification", 3, 8, "fairfl.data.imbalanced:ensure_builtin_skin_imbalanced", min_sites=6
    ),
    "ich_imbalanced": BuiltinDataset(
        "ich_imbalanced", "classification", 1, 5, "fairfl.data.imbalanced:ensure_builtin_ich_imbalanced", min_sites=10
    ),
}


def shared_test_set(dataset: str, data_root: str | None) -> bool:
    """Whether every site of a run on `dataset` was scored on one shared test set: the built-in data's own layout;
    a data root's test sets count as each site's own."""
    return not data_root and dataset in BUILTIN_DATASETS and BUILTIN_DATASETS[dataset].shared_test


def builtin_dataset(name: str) -> BuiltinDataset:
    if not isinstance(name, str) or name not in BUILTIN_DATASETS:
        raise ValueError(f"unknown built-in dataset {name!r}; choose one of {sorted(BUILTIN_DATASETS)}")
    return BUILTIN_DATASETS[name]


def ensure_builtin(
    name: str,
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 6,
    size_scale: float = 1.0,
    cache_dir: str | Path | None = None,
    test_scale: float = 1.0,
) -> Path:
    """Path of the cached built-in dataset `name`, generating it on first use."""
    return builtin_dataset(name).ensure_function()(
        image_size=image_size,
        seed=seed,
        num_sites=num_sites,
        cache_dir=cache_dir,
        size_scale=size_scale,
        test_scale=test_scale,
    )


def cache_name(
    kind: str, version: int, image_size: int, seed: int, num_sites: int, size_scale: float, test_scale: float = 1.0
) -> str:
    """Cache folder name of a generated dataset: changes whenever the generator or its parameters do (test_scale
    exactly, by its repr; at 1 it is left out, so the names of data made before it existed still hold)."""
    scale = "" if size_scale == 1.0 else f"-x{size_scale:g}"
    test = "" if check_test_scale(test_scale) == 1.0 else f"-t{float(test_scale)!r}"
    return f"{kind}-v{version}-n{num_sites}-s{image_size}-seed{seed}{scale}{test}"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else `$FAIRFL_CACHE_DIR`, else `~/.cache/fairfl`."""
    return Path(cache_dir or os.environ.get("FAIRFL_CACHE_DIR") or Path.home() / ".cache" / "fairfl").expanduser()


_REUSED: set[Path] = set()  # cache folders this process has said it reuses: said once, however often asked


def data_progress(message: str) -> None:
    """One line of progress of the built-in data, on stderr (a first run spends its first minute here; the
    simulator's sites write it to their logs)."""
    print(f"fairfl data: {message}", file=sys.stderr, flush=True)


def site_progress(site: str, counts: dict) -> None:
    """The line of one generated site: its items per split, e.g. "site-2: 41 training, 14 validation, 14 testing"."""
    data_progress(f"{site}: " + ", ".join(f"{count} {split}" for split, count in counts.items()))


def ensure_cached(name: str, generate: Callable[[Path], object], cache_dir: str | Path | None = None) -> Path:
    """`<cache root>/<name>`, filled by `generate(folder)` on first use.

    Safe when several FLARE clients start at once: one process generates (the others wait on a lock file)
    into a temporary sibling folder that is renamed into place only when complete, so a half-written
    dataset is never visible; if the rename loses to another process, that process's copy is used."""
    root = cache_root(cache_dir)
    final = root / name
    if (final / "complete").is_file():
        if final not in _REUSED:
            _REUSED.add(final)
            data_progress(f"reusing the built-in data in {final}")
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f".{name}.lock"):
        if (final / "complete").is_file():  # another process finished while we waited
            data_progress(f"another process generated {final}; using it")
            return final
        if final.exists():
            raise RuntimeError(f"{final} exists but is incomplete (no 'complete' marker): delete it and retry")
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
        try:
            started = time.time()
            data_progress(f"generating {name} into {root} (first use only: later runs reuse it)")
            generate(staging)
            (staging / "complete").write_text(f"generated in {time.time() - started:.1f} s\n")
            data_progress(f"generated {name} in {time.time() - started:.1f} s")
            try:
                os.rename(staging, final)
            except OSError:
                if not (final / "complete").is_file():  # not a lost race: a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def ensure_generated(
    kind: str,
    version: int,
    generate: Callable[..., object],
    image_size: int,
    seed: int,
    num_sites: int,
    size_scale: float,
    test_scale: float,
    cache_dir: str | Path | None = None,
) -> Path:
    """What `generate(folder, num_sites=, image_size=, seed=, size_scale=, test_scale=)` writes, cached under
    `cache_name(kind, version, ...)` and made on first use (`ensure_cached`): the body of a generator's `ensure`
    function when those are all its settings."""
    return ensure_cached(
        cache_name(kind, version, image_size, seed, num_sites, size_scale, test_scale),
        lambda folder: generate(
            folder, num_sites=num_sites, image_size=image_size, seed=seed, size_scale=size_scale, test_scale=test_scale
        ),
        cache_dir,
    )


@contextmanager
def _exclusive_lock(path: Path):
    """An advisory inter-process lock (POSIX flock); a no-op where flock is unavailable, since
    the atomic rename alone already keeps the cache consistent (at the cost of duplicate work)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- larger test splits (test_scale): more precise test metrics, the same training and validation data ---------

MAX_TEST_SCALE = 20
TEST_STREAM = 0x7E57  # last in the key of every extra test item's random stream (see extra_test_rng)


def check_test_scale(test_scale) -> float:
    """`test_scale` as a float: a number in [1, MAX_TEST_SCALE] (not a bool, a string or NaN), else ValueError."""
    if (
        isinstance(test_scale, bool)
        or not isinstance(test_scale, (int, float))
        or math.isnan(test_scale)
        or not 1 <= test_scale <= MAX_TEST_SCALE
    ):
        raise ValueError(f"test_scale must be a number in [1, {MAX_TEST_SCALE}], got {test_scale!r}")
    return float(test_scale)


def extra_test_count(num_test: int, test_scale: float) -> int:
    """How many items a test split of `num_test` gains at `test_scale`: round(num_test * (test_scale - 1))."""
    return round(num_test * (check_test_scale(test_scale) - 1))


def extra_test_rng(*key: int) -> np.random.Generator:
    """The random stream of extra test items at `key` (the seed, a site or item index): `key`, zeros to three
    entries, then TEST_STREAM. Every stream the generators already draw from has a key of at most three entries,
    which numpy pads with zeros to four, so it can never be this one: the training and validation data, and the
    test items of test_scale 1, stay exactly as they were."""
    return np.random.default_rng([*key, *[0] * (3 - len(key)), TEST_STREAM])


def recorded_test_scale(test_scale: float) -> dict:
    """dataset.json's record of test_scale: {"test_scale": s}, or nothing at 1 (data made before it existed)."""
    return {} if test_scale == 1.0 else {"test_scale": test_scale}


def recorded_parameters(num_sites: int, image_size: int, seed: int, size_scale: float, test_scale: float) -> dict:
    """dataset.json's `parameters` of a generator whose settings are `ensure_generated`'s."""
    return dict(
        num_sites=num_sites,
        image_size=image_size,
        seed=seed,
        size_scale=size_scale,
        **recorded_test_scale(test_scale),
    )
