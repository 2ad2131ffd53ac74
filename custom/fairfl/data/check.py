"""`fairfl check-data ROOT`: every problem of every site's data, found before a federation is started.

The checks are the sites' own, as a site runs them when it loads its data on its first task (the executor's
`_load_datalist`): `load_dataset_info` and `load_datalist` (fairfl.data.datalist) with the site's settings
(fairfl.site_settings, read from this environment: set a site's FAIRFL_MAX_IMAGE_SIDE, ... here to check with its
limits), given a list that collects every problem instead of stopping at the first. Image headers are read, never the
pixels (only a mask's, to check its classes, as the site does). With `decode`, every file is also decoded and
prepared as the site's loader first reads it (fairfl.data.loaders: a truncated file, NaN pixels, channels that cannot
be matched): slower, and it imports torch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from fairfl.data.builtin import BUILTIN_DATASETS
from fairfl.data.datalist import SPLITS, TASKS, declared_task, load_datalist, load_dataset_info, site_load_options
from fairfl.errors import DataError, data_error_in
from fairfl.files import read_json
from fairfl.site_settings import site_settings

DESCRIPTIONS = ("dataset.json", "sites.json")  # what the converters and generators write beside the datalists
EVERY_SITE = "every site"  # whom a problem of dataset.json concerns: each site reads it


@dataclass(frozen=True)
class DataSettings:
    """What the server's task tells a site about its data: the task, the classes (background included), the image
    channels; `source` says where they were taken from."""

    task: str
    num_classes: int
    in_channels: int
    source: str
    spatial_dims: int = 2  # 3: volumes (dataset.json's spatial_dims)


@dataclass(frozen=True)
class SiteCheck:
    site: str
    passed: dict[str, int]  # split -> its entries that passed every check
    problems: list[DataError]


def datalist_sites(root: str | Path) -> list[str]:
    """The sites of a data root: the names of its `<site>.json` files, the dataset's descriptions left out."""
    return sorted(path.stem for path in Path(root).glob("*.json") if path.name not in DESCRIPTIONS)


def data_settings(
    root: str | Path, task: str | None = None, num_classes: int | None = None, in_channels: int | None = None
) -> DataSettings:
    """The task, classes and channels given; else what `<root>/dataset.json` says (`task`; `num_classes`, else as many
    as its `labels` or `classes`; `in_channels`); else those of the first built-in dataset of the task, which the
    shipped jobs name (prostate: 2 classes, 1 channel; skin: 8 classes, 3 channels)."""
    try:
        info = read_json(Path(root) / "dataset.json")
    except ValueError:  # missing, or malformed: load_dataset_info reports that as the site would
        info = {}
    info = info if isinstance(info, dict) else {}
    said_task = info.get("task") if info.get("task") in TASKS else None
    task, task_from = _first((task, "given"), (said_task, "dataset.json"), ("segmentation", "default"))
    default = next(dataset for dataset in BUILTIN_DATASETS.values() if dataset.task == task)
    said_classes = _count(info.get("num_classes")) or _count(info.get("labels")) or _count(info.get("classes"))
    num_classes, classes_from = _first(
        (num_classes, "given"), (said_classes, "dataset.json"), (default.num_classes, f"built-in {default.name}")
    )
    in_channels, channels_from = _first(
        (in_channels, "given"),
        (_count(declared_task(info).get("in_channels")), "dataset.json"),
        (default.in_channels, f"built-in {default.name}"),
    )
    declared_dims = declared_task(info).get("spatial_dims")
    spatial_dims = declared_dims if declared_dims in (2, 3) else 2
    where = f"task {task_from}, classes {classes_from}, channels {channels_from}"
    return DataSettings(task, num_classes, in_channels, where, spatial_dims)


def _first(*options):
    """The first (value, where it comes from) whose value is not None."""
    return next(option for option in options if option[0] is not None)


def _count(value) -> int | None:
    """A positive whole number as it is, a non-empty mapping or list as its length; None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 1 else None
    return len(value) if isinstance(value, dict | list) and value else None


def check_site(root: str | Path, site: str, settings: DataSettings, decode: bool = False) -> SiteCheck:
    """Every problem of one site's datalist and files, as the site would meet them one at a time."""
    try:
        own = site_settings(site)
    except DataError as err:  # a malformed setting in this environment: the site would stop there too
        return SiteCheck(site, {}, [err])
    problems: list[DataError] = []
    datalist = load_datalist(
        root,
        site,
        **site_load_options(own, settings.task, settings.num_classes, settings.spatial_dims),
        problems=problems,
    )
    if decode:
        datalist = {split: _decoded(entries, site, settings, problems) for split, entries in datalist.items()}
    return SiteCheck(site, {split: len(entries) for split, entries in datalist.items()}, problems)


def _decoded(entries: list[dict], site: str, settings: DataSettings, problems: list[DataError]) -> list[dict]:
    """The entries whose files the site's loader reads without a problem (its transforms without augmentation, which
    decode, check and prepare each file; the image size does not change what fails, so the smallest)."""
    from fairfl.arguments import MIN_IMAGE_SIZE
    from fairfl.data.loaders import (
        classification_transforms,
        segmentation_transforms,
        volume_classification_transforms,
        volume_segmentation_transforms,
    )
    from fairfl.data.volumes import VolumeSettings

    volume = VolumeSettings(spacing=None)  # resampling changes nothing of what fails
    if settings.spatial_dims == 3 and settings.task == "segmentation":
        transform = volume_segmentation_transforms(volume, False, True, settings.in_channels, site)
    elif settings.spatial_dims == 3:
        transform = volume_classification_transforms(volume, False, settings.in_channels, site)
    elif settings.task == "segmentation":
        transform = segmentation_transforms(MIN_IMAGE_SIZE, settings.num_classes, False, settings.in_channels, site)
    else:
        transform = classification_transforms(MIN_IMAGE_SIZE, False, settings.in_channels, site)
    passed = []
    for entry in entries:
        try:
            transform(entry)
        except Exception as err:  # MONAI wraps the DataError of a bad file in "applying transform" errors
            problem = data_error_in(err)
            if problem is None:
                raise
            problems.append(problem)
        else:
            passed.append(entry)
    return passed


def check_data(
    root: str | Path, sites: list[str], settings: DataSettings, decode: bool = False
) -> tuple[list[DataError], list[SiteCheck]]:
    """The problems of `<root>/dataset.json` (each site reads it) and each site's check."""
    shared: list[DataError] = []
    try:
        load_dataset_info(
            root,
            EVERY_SITE,
            settings.num_classes,
            task=settings.task,
            in_channels=settings.in_channels,
            spatial_dims=settings.spatial_dims,
        )
    except DataError as err:
        shared.append(err)
    return shared, [check_site(root, site, settings, decode) for site in sites]


def summary_line(check: SiteCheck) -> str:
    """`site-1: training 12, validation 4, testing 4: OK`, or with the number of problems."""
    splits = [*SPLITS, *(split for split in check.passed if split not in SPLITS)]
    counts = ", ".join(f"{split} {check.passed[split]}" for split in splits if split in check.passed) or "no entries"
    if not check.problems:
        return f"{check.site}: {counts}: OK"
    return f"{check.site}: {counts} passed: {len(check.problems)} problem{'s' * (len(check.problems) > 1)}"


def check_data_command(args) -> int:
    """`fairfl check-data`: a line per problem (site and file), a summary line per site; exit code 0 when every site
    is clean, 1 when any problem, 2 for a data root without datalists."""
    sites = list(dict.fromkeys(args.sites or datalist_sites(args.root)))
    if not sites:
        print(
            f"fairfl check-data: error: no datalists in {args.root} (expected <site>.json files; or name --sites)",
            file=sys.stderr,
        )
        return 2
    settings = data_settings(args.root, args.task, args.num_classes, args.in_channels)
    print(
        f"checking {len(sites)} site(s) of {args.root} as a {settings.spatial_dims}-D {settings.task} task, "
        f"{settings.num_classes} classes, "
        f"{settings.in_channels} channel(s) ({settings.source}); "
        + ("every file decoded" if args.decode else "headers read, images not decoded (--decode does)"),
        flush=True,
    )
    shared, checks = check_data(args.root, sites, settings, args.decode)
    for problem in [*shared, *(problem for check in checks for problem in check.problems)]:
        print(problem)
    if shared:
        print(f"dataset.json: {len(shared)} problem(s)")
    for check in checks:
        print(summary_line(check))
    total = len(shared) + sum(len(check.problems) for check in checks)
    bad = sum(bool(check.problems) for check in checks)
    print(f"{total} problem(s) in {bad} of {len(checks)} site(s)" if total else f"all {len(checks)} site(s) OK")
    return 1 if total else 0
