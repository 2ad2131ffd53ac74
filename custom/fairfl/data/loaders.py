"""MONAI transforms and cached data loaders for segmentation and classification datalists: 2-D (NIfTI or PNG/JPEG) and
3-D volumes (NIfTI; fairfl.data.volumes)."""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import warnings
from collections.abc import Hashable, Mapping, Sequence

import torch
from monai.config import KeysCollection
from monai.data import CacheDataset, DataLoader, Dataset, get_track_meta, set_track_meta
from monai.transforms import (
    CastToTyped,
    Compose,
    EnsureChannelFirstd,
    EnsureTyped,
    LoadImage,
    MapTransform,
    NormalizeIntensityd,
    RandFlipd,
    RandRotate90d,
    RandScaleIntensityd,
    RandShiftIntensityd,
    Resized,
)

from fairfl.bundle import build_transforms
from fairfl.data import volumes
from fairfl.errors import DataError, data_error_in

KEYS = ("image", "label")
# MONAI's LoadImage sets up every reader it knows, its GPU DICOM decoder too, which warns on every site without one;
# DICOM reaches fairfl converted (fairfl convert-dicom), so the warning says nothing a site can act on
warnings.filterwarnings("ignore", message="NvImgCodecPydicomReader", category=UserWarning)
TASKS = ("segmentation", "classification")


class LoadCheckedd(MapTransform):
    """LoadImaged that names the file at fault: each key's file is decoded (a truncated or otherwise
    undecodable file is a DataError naming the site and the file) and refused if it holds NaN or
    infinite values, as read or after `then` (huge finite values overflow the normalisation); `then` (the
    deterministic transforms after loading) runs inside the same check, so a failure there (e.g. channels
    that cannot be matched) names the item's image file.
    Inside the CacheDataset's cached part: every file is decoded and checked once."""

    def __init__(self, keys: KeysCollection, site: str, then: Sequence = ()):
        super().__init__(keys)
        self.site, self.load, self.then = site, LoadImage(image_only=True), Compose(list(then))

    def __call__(self, data: Mapping[Hashable, object]) -> dict:
        d = dict(data)
        for key in self.key_iterator(d):
            path = d[key]
            try:
                d[key] = self.load(path)
            except Exception as err:
                raise DataError(self.site, path, f"cannot decode the {key} file: {_root_cause(err)}") from err
            if d[key].is_floating_point() and not torch.isfinite(d[key]).all():
                raise DataError(self.site, path, f"the {key} holds NaN or infinite values")
        try:
            d = self.then(d)
        except Exception as err:
            raise DataError(self.site, data["image"], f"cannot be prepared: {_root_cause(err)}") from err
        for key in self.key_iterator(d):  # finite values can still overflow float32 in the normalisation
            if d[key].is_floating_point() and not torch.isfinite(d[key]).all():
                raise DataError(
                    self.site,
                    data[key],
                    f"the {key} is not finite after normalisation (values too large for float32 arithmetic, e.g. 1e38)",
                )
        return d


def _root_cause(err: BaseException) -> str:
    """The innermost exception's message: MONAI wraps failures in "applying transform ..." layers."""
    while err.__cause__ is not None:
        err = err.__cause__
    return f"{type(err).__name__}: {err}"


class CheckedDataset(Dataset):
    """MONAI's Dataset (files decoded at every read, nothing cached) whose bad file is the DataError naming the
    site and the file, as in the CacheDataset, not MONAI's "applying transform" RuntimeError around it."""

    def __getitem__(self, index):
        try:
            return super().__getitem__(index)
        except Exception as err:
            # re-raised as they are (B904): the DataError already in err's chain keeps its own cause
            raise data_error_in(err) or err  # noqa: B904


_METADATA_LOCK = threading.Lock()
_metadata_users = [0, True]  # blocks inside `_metadata_off` now, the switch as it was before the first


@contextlib.contextmanager
def _metadata_off():
    """MONAI's metadata tracking off (its switch is one for the whole process) for the block; the first block in sets
    it off and the last one out puts it back, so blocks in several threads never leave it off."""
    with _METADATA_LOCK:
        if _metadata_users[0] == 0:
            _metadata_users[1] = get_track_meta()
            set_track_meta(False)
        _metadata_users[0] += 1
    try:
        yield
    finally:
        with _METADATA_LOCK:
            _metadata_users[0] -= 1
            if _metadata_users[0] == 0:
                set_track_meta(_metadata_users[1])


def _plain(item):
    """A cached item's MONAI MetaTensors as plain tensors (the same storage), other values as they are."""
    if isinstance(item, dict):
        return {k: v.as_tensor() if hasattr(v, "as_tensor") else v for k, v in item.items()}
    return item


class PlainCacheDataset(CacheDataset):
    """MONAI's CacheDataset for 2-D images, whose metadata nothing after the cache reads (the pipelines end by
    dropping it): items are cached as plain tensors and the random steps (augmentation) run with MONAI's metadata
    tracking off. The same values and the same random draws, without copying and updating the metadata of every
    image at every step, which took most of a CPU training step's loading (docs/benchmarks/cost.md, Data loading).
    3-D volumes keep MONAI's CacheDataset: their steps read the spacing and orientation metadata."""

    def _load_cache_item(self, idx: int):
        return _plain(super()._load_cache_item(idx))

    def _transform(self, index: int):
        with _metadata_off():
            return super()._transform(index)


class SampleOfCache(Dataset):
    """Entries of a site's training split as an evaluation `transform` gives them, read from `decoded`, the training
    loader's CacheDataset of the same entries, instead of from disk: its cached part is the output of the first step
    that both pipelines share (LoadCheckedd with the same deterministic transforms), so `transform` without that step
    finishes an item. A method's probe of the training split (Fed-LWR's CKA sample) thus decodes nothing again and holds
    no second copy. `order[i]`: the cache's index of this dataset's entry i."""

    def __init__(self, entries: Sequence[dict], transform: Compose, decoded: CacheDataset, order: Sequence[int]):
        if not isinstance(transform.transforms[0], LoadCheckedd):
            raise ValueError("SampleOfCache: the transform must start with the cached LoadCheckedd step")
        if any(item is None for item in decoded._cache):
            raise ValueError("SampleOfCache: the training loader's cache is not filled")
        super().__init__(entries, transform=Compose(list(transform.transforms[1:])))
        # MONAI's CacheDataset keeps its items in _cache, filled when the training loader is built (cache_rate 1).
        # Only that list is held: MONAI's DataLoader seeds every random transform it finds under its dataset, and the
        # training loader's own must not be re-seeded by building this one.
        self.items, self.order = decoded._cache, list(order)

    def _transform(self, index: int):
        # a copy, as CacheDataset itself takes before its random steps, so nothing here changes what training reads
        return self.transform(copy.deepcopy(self.items[self.order[index]]))


class SqueezeTrailingSingletond(MapTransform):
    """Turn a channel-first (C, H, W, 1) array into (C, H, W): 2-D slices stored as HxWx1 NIfTI."""

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        for key in self.key_iterator(d):
            while d[key].ndim > 3 and d[key].shape[-1] == 1:
                d[key] = d[key][..., 0]
        return d


class MatchChannelsd(MapTransform):
    """Give a channel-first array the expected number of channels.

    An alpha channel (grey + alpha, RGBA) is dropped; RGB to one channel by luminance (PNG exports of
    grey MR are often saved as RGB); one channel to several by repetition (for networks built for RGB input).
    """

    LUMINANCE = (0.299, 0.587, 0.114)

    def __init__(self, keys: KeysCollection, channels: int, allow_missing_keys: bool = False):
        super().__init__(keys, allow_missing_keys)
        self.channels = channels

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        for key in self.key_iterator(d):
            array, have = d[key], d[key].shape[0]
            if have == self.channels:
                continue
            if have in (2, 4):  # grey + alpha, RGBA: transparency is not part of the image
                array, have = array[: have - 1], have - 1
                d[key] = array
            if have == self.channels:
                continue
            if self.channels == 1 and have in (3, 4):
                weights = torch.as_tensor(self.LUMINANCE, dtype=array.dtype).reshape(3, *[1] * (array.ndim - 1))
                d[key] = (array[:3] * weights).sum(0, keepdim=True)
            elif have == 1:
                d[key] = array.repeat(self.channels, *[1] * (array.ndim - 1))
            else:
                raise ValueError(f"{key}: cannot turn {have} channels into {self.channels}")
        return d


AUGMENTATIONS = ("flip", "rotate90", "intensity")


def check_augmentation(names) -> list:
    """The augmentation names of a job argument as a list (None: all of them); ValueError for anything else."""
    if names is None:
        return list(AUGMENTATIONS)
    if (
        not isinstance(names, (list, tuple))
        or any(n not in AUGMENTATIONS for n in names)
        or len(set(names)) != len(names)
    ):
        raise ValueError(f"augmentation must be a list of distinct names from {list(AUGMENTATIONS)}, got {names!r}")
    return list(names)


def _augmentation(spatial_keys, names=AUGMENTATIONS) -> list:
    """Light and label-preserving, each switchable (`names`): mirroring along both axes and quarter turns
    ("flip", "rotate90": cheap, no interpolation of a mask; lesions and slices keep their class; switch them off
    where orientation carries meaning, e.g. laterality markers or a fixed anatomical up) and a small intensity
    scale/shift that mimics residual differences between scanners and cameras ("intensity")."""
    names = check_augmentation(names)
    chosen = []
    if "flip" in names:
        chosen += [RandFlipd(spatial_keys, prob=0.5, spatial_axis=0), RandFlipd(spatial_keys, prob=0.5, spatial_axis=1)]
    if "rotate90" in names:
        chosen += [RandRotate90d(spatial_keys, prob=0.5, max_k=3)]
    if "intensity" in names:
        chosen += [
            RandScaleIntensityd("image", factors=0.1, prob=0.5),
            RandShiftIntensityd("image", offsets=0.1, prob=0.5),
        ]
    return chosen


def segmentation_transforms(
    image_size: int,
    num_classes: int,
    train: bool,
    in_channels: int = 1,
    site: str = "?",
    augmentation=AUGMENTATIONS,
    preprocessing: list | None = None,
) -> Compose:
    """Load, normalise and resize an image/mask pair to `image_size` squared; augment if `train`.

    Output: image float32 [in_channels, S, S], label int64 [1, S, S]. `num_classes` needs no
    transform: `load_datalist` has already checked every mask holds values in [0, num_classes - 1].
    The deterministic part comes first, so `CacheDataset` caches everything up to the first
    random transform; a bad file is a DataError naming `site` and the file (`LoadCheckedd`).
    `preprocessing`: a MONAI bundle's transforms (fairfl.bundle) in place of the z-score, before the resize.
    """
    # Per-image z-score: MR intensities have no absolute scale (they differ by scanner, coil,
    # protocol and even by scan), so each image is standardised on its own, as nnU-Net does
    # for MR and as the multi-site prostate papers (MS-Net, SAML) preprocess. Over the whole
    # slice (nonzero=False): the background is Rician noise, not exact zeros.
    normalise = (
        build_transforms(preprocessing)
        if preprocessing
        else [NormalizeIntensityd("image", nonzero=False, channel_wise=True)]
    )
    deterministic = [
        EnsureChannelFirstd(KEYS),
        SqueezeTrailingSingletond(KEYS),
        MatchChannelsd("image", in_channels),
        MatchChannelsd("label", 1),
        *normalise,
        Resized(KEYS, spatial_size=(image_size, image_size), mode=("bilinear", "nearest"), anti_aliasing=(True, False)),
        CastToTyped("label", dtype=torch.long),
    ]
    augmentation = _augmentation(KEYS, augmentation) if train else []
    # Plain tensors out: batches stay simple to hook, hash and send across FLARE.
    return Compose([LoadCheckedd(KEYS, site, deterministic), *augmentation, EnsureTyped(KEYS, track_meta=False)])


def volume_segmentation_transforms(
    settings: volumes.VolumeSettings,
    train: bool,
    whole: bool,
    in_channels: int = 1,
    site: str = "?",
    augmentation=AUGMENTATIONS,
    preprocessing: list | None = None,
) -> Compose:
    """A 3-D image/mask pair (fairfl.data.volumes): one frame and intensity scale (or a MONAI bundle's
    `preprocessing`, fairfl.bundle), then training patches (`train`), the whole volume (`whole`: scored by sliding
    window) or patches as for training, without augmentation (a method's probe). A bad file is a DataError naming
    `site` and the file (`LoadCheckedd`), as in 2-D."""
    matched = [MatchChannelsd("image", in_channels), MatchChannelsd("label", 1)]
    fixed, random = volumes.segmentation_steps(settings, whole)
    chosen = volumes.augmentation(KEYS, check_augmentation(augmentation)) if train else []
    return Compose(
        [
            LoadCheckedd(KEYS, site, [*volumes.prepared(KEYS, matched, settings, preprocessing), *fixed]),
            *random,
            *chosen,
            *volumes.plain_tensors(KEYS),
        ]
    )


def classification_transforms(
    image_size: int,
    train: bool,
    in_channels: int = 1,
    site: str = "?",
    augmentation=AUGMENTATIONS,
    preprocessing: list | None = None,
) -> Compose:
    """Load, normalise and resize an image to `image_size` squared; augment if `train`. The label is a
    class index (already checked by `load_datalist`).

    Output: image float32 [in_channels, S, S], label int64 scalar (a batch's labels: int64 [B]).
    Normalisation is a per-image z-score over all channels together (not channel by channel): like the
    segmentation transforms it needs no dataset statistics and takes 8- and 16-bit files alike, but it
    keeps the balance between colour channels, which carries diagnostic colour (red vessels, blue-grey
    veil) in dermoscopy."""
    normalise = (
        build_transforms(preprocessing)
        if preprocessing
        else [NormalizeIntensityd("image", nonzero=False, channel_wise=False)]
    )
    deterministic = [
        EnsureChannelFirstd("image"),
        SqueezeTrailingSingletond("image"),
        MatchChannelsd("image", in_channels),
        *normalise,
        Resized("image", spatial_size=(image_size, image_size), mode="bilinear", anti_aliasing=True),
    ]
    augmentation = _augmentation("image", augmentation) if train else []
    return Compose(
        [
            LoadCheckedd("image", site, deterministic),
            *augmentation,
            EnsureTyped("image", track_meta=False),
            EnsureTyped("label", dtype=torch.long, track_meta=False),
        ]
    )


def volume_classification_transforms(
    settings: volumes.VolumeSettings,
    train: bool,
    in_channels: int = 1,
    site: str = "?",
    augmentation=AUGMENTATIONS,
    preprocessing: list | None = None,
) -> Compose:
    """A 3-D volume and its class index (fairfl.data.volumes): one frame and intensity scale (or a MONAI bundle's
    `preprocessing`), resized whole."""
    prepared = volumes.prepared(("image",), [MatchChannelsd("image", in_channels)], settings, preprocessing)
    chosen = volumes.augmentation(("image",), check_augmentation(augmentation)) if train else []
    return Compose(
        [
            LoadCheckedd("image", site, [*prepared, *volumes.classification_steps(settings)]),
            *chosen,
            EnsureTyped("image", track_meta=False),
            EnsureTyped("label", dtype=torch.long, track_meta=False),
        ]
    )


def _entry_key(entry: dict) -> str:
    return json.dumps(entry, sort_keys=True, default=str)


def _sample_of(decoded: CacheDataset, entries: list[dict], transform: Compose) -> SampleOfCache:
    """`entries` (sorted by `_entry_key`) read from `decoded`, a CacheDataset of the same entries in any order."""
    cached = [_entry_key(entry) for entry in decoded.data]
    if sorted(cached) != [_entry_key(entry) for entry in entries]:
        raise ValueError("decoded: a cache of other entries than the ones to sample")
    # the same sort (stable, by the same key) as `entries` had: equal entries keep their relative order in both
    order = sorted(range(len(cached)), key=lambda i: cached[i])
    return SampleOfCache(entries, transform, decoded, order)


def check_worker_count(value, name: str = "num_workers") -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def make_loader(
    entries: Sequence[dict],
    image_size: int,
    num_classes: int,
    batch_size: int,
    train: bool,
    seed: int,
    max_samples: int | None = None,
    in_channels: int = 1,
    task: str = "segmentation",
    site: str = "?",
    augmentation=AUGMENTATIONS,
    num_workers: int = 0,
    volume: volumes.VolumeSettings | None = None,
    whole: bool = False,
    preprocessing: list | None = None,
    decoded: CacheDataset | None = None,
) -> torch.utils.data.DataLoader:
    """A loader over datalist entries, cached in memory after the first read.

    Shuffles (with a generator seeded from `seed`) and augments only when `train`, with the transforms
    `augmentation` names (see `_augmentation`); the random augmentation is seeded from the same generator, so a
    run is reproducible.
    `max_samples`: every pass is a fresh random sample of at most that many entries, in random order,
    drawn from the loader's generator (re-seed `loader.generator` for another sample), whatever the number
    of entries; never the datalist's order, where neighbouring entries are slices of one patient. The
    sample depends on the entries, not on their order in the datalist. Such a loader reads its sample from
    disk on every pass instead of caching, so memory stays flat however large the site; or, given `decoded` (the
    dataset of a training loader of the same `entries`: `train` True, no `max_samples`), from that loader's cache,
    with the same items and the same sample (`SampleOfCache`).
    `task` "classification" gives batches with "image" float [B, C, S, S] and "label" int64 [B]
    (`classification_transforms`); "segmentation" (the default) image/mask pairs.
    Every file is decoded and checked here, once; a bad one is a DataError naming `site` and the file.
    `volume`: the entries are 3-D volumes prepared as these settings say (fairfl.data.volumes; `image_size` unused):
    training patches, or with `whole` (evaluation) each volume whole, one per batch, of its own size.
    `preprocessing`: a MONAI bundle's transforms (fairfl.bundle, checked) in place of fairfl's normalisation.
    `num_workers`: worker processes that augment and collate the batches beside the training, so a GPU does not
    wait for one CPU thread (0: in this process). The batches' order is drawn here either way; each worker seeds
    its augmentation from the generator, so a seed still gives the same batches for the same `num_workers`.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    entries, generator, sampler = list(entries), torch.Generator().manual_seed(seed), None
    if volume is not None and task == "segmentation":
        transform = volume_segmentation_transforms(volume, train, whole, in_channels, site, augmentation, preprocessing)
        batch_size = 1 if whole else batch_size  # whole volumes differ in size
    elif volume is not None:
        transform = volume_classification_transforms(volume, train, in_channels, site, augmentation, preprocessing)
    elif task == "segmentation":
        transform = segmentation_transforms(
            image_size, num_classes, train, in_channels, site, augmentation, preprocessing
        )
    else:
        transform = classification_transforms(image_size, train, in_channels, site, augmentation, preprocessing)
    if max_samples is not None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        entries.sort(key=_entry_key)  # datalist order is irrelevant
        sampler = torch.utils.data.RandomSampler(
            entries, num_samples=min(max_samples, len(entries)), generator=generator
        )
        dataset = (
            CheckedDataset(entries, transform=transform) if decoded is None else _sample_of(decoded, entries, transform)
        )
    else:
        try:
            cached = CacheDataset if volume is not None else PlainCacheDataset
            dataset = cached(entries, transform=transform, cache_rate=1.0, num_workers=0, progress=False)
        except Exception as err:  # MONAI wraps the DataError of a bad file in "applying transform" errors
            raise data_error_in(err) or err  # noqa: B904 (re-raised as it is, as above)
    check_worker_count(num_workers)
    # MONAI's DataLoader (a torch DataLoader) seeds the dataset's random transforms from this generator: in this
    # process when num_workers is 0, else each worker's copy from a seed drawn from it.
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=train and sampler is None,
        sampler=sampler,
        num_workers=num_workers,
        generator=generator,
    )
