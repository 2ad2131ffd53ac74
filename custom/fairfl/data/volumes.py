"""MONAI transforms of 3-D volumes (NIfTI; DICOM after `fairfl convert-dicom`): one orientation and spacing, intensity
normalisation, training on patches, scoring whole volumes.

Real sites' volumes differ in voxel spacing (slice thickness 1 to 5 mm), in the order and direction of their axes and
in intensity scale, so every volume is first brought to one frame: RAS orientation, the task's spacing (`spacing`;
linear for images, nearest for masks), then intensities mapped to [0, 1]: a fixed window for CT, whose Hounsfield units
mean the same everywhere, or each volume's own percentiles for MR, which has no absolute scale. Training sees patches
(`patch_size`), half centred on the foreground and half on the background, since a whole volume rarely fits a GPU and
the organ is a small part of it; a site's test volumes are scored whole, by sliding the same window over them
(fairfl.training.evaluate_dice). Probes that need batches of one size (a method's statistics) get patches cut as for
training, without augmentation. Classification volumes are resized whole to `patch_size`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import torch
from monai.data import MetaTensor
from monai.transforms import (
    CastToTyped,
    EnsureChannelFirstd,
    EnsureTyped,
    MapTransform,
    Orientationd,
    RandCropByPosNegLabeld,
    RandFlipd,
    RandRotate90d,
    RandScaleIntensityd,
    RandShiftIntensityd,
    Resized,
    ScaleIntensityRanged,
    ScaleIntensityRangePercentilesd,
    Spacingd,
    SpatialPadd,
)

from fairfl.bundle import build_transforms


@dataclass(frozen=True)
class VolumeSettings:
    """How a site prepares its volumes (the executor's 3-D arguments, fairfl.arguments)."""

    patch_size: tuple[int, int, int] = (64, 64, 32)
    patches_per_volume: int = 2
    spacing: tuple[float, float, float] | None = None  # mm; None: as stored
    intensity_window: tuple[float, float] | None = None  # CT; None: percentiles
    intensity_percentiles: tuple[float, float] = (0.5, 99.5)


def frame(keys: tuple, settings: VolumeSettings) -> list:
    """RAS orientation and the task's spacing (images linear, masks nearest: class indices stay classes)."""
    modes = ("bilinear", "nearest")[: len(keys)]
    chosen = [Orientationd(keys, axcodes="RAS", labels=(("L", "R"), ("P", "A"), ("I", "S")))]
    if settings.spacing is not None:
        chosen.append(Spacingd(keys, pixdim=settings.spacing, mode=modes))
    return chosen


def intensity(settings: VolumeSettings) -> list:
    """The image's intensities mapped to [0, 1] (module docstring)."""
    if settings.intensity_window is not None:
        low, high = settings.intensity_window
        return [ScaleIntensityRanged("image", a_min=low, a_max=high, b_min=0.0, b_max=1.0, clip=True)]
    low, high = settings.intensity_percentiles
    return [ScaleIntensityRangePercentilesd("image", low, high, b_min=0.0, b_max=1.0, clip=True, channel_wise=True)]


def prepared(keys: tuple, match_channels: list, settings: VolumeSettings, preprocessing: list | None = None) -> list:
    """The deterministic part, cached once per volume: channel first, the channels matched, then one frame and
    intensity, or a MONAI bundle's `preprocessing` (fairfl.bundle, checked) in their place."""
    own = build_transforms(preprocessing) if preprocessing else [*frame(keys, settings), *intensity(settings)]
    return [EnsureChannelFirstd(keys), *match_channels, *own]


def augmentation(keys: tuple, names) -> list:
    """The 3-D counterparts of the 2-D augmentations (fairfl.data.loaders): mirroring along each axis, quarter turns in
    the axial plane (the slices' own plane: turning through thick slices would interpolate across them), and the
    intensity scale and shift."""
    chosen: list = []
    if "flip" in names:
        chosen += [RandFlipd(keys, prob=0.5, spatial_axis=axis) for axis in range(3)]
    if "rotate90" in names:
        chosen += [RandRotate90d(keys, prob=0.5, max_k=3, spatial_axes=(0, 1))]
    if "intensity" in names:
        chosen += [
            RandScaleIntensityd("image", factors=0.1, prob=0.5),
            RandShiftIntensityd("image", offsets=0.1, prob=0.5),
        ]
    return chosen


def segmentation_steps(settings: VolumeSettings, whole: bool) -> tuple[list, list]:
    """(deterministic after loading, random) transforms of an image/mask pair after `prepared`: `whole` keeps the
    volume as it is (scored by sliding window, one per batch); else `patches_per_volume` patches (a list of items,
    which MONAI's DataLoader flattens into the batch), half centred on the foreground: training's, and a probe's (a
    method's statistics need batches of one size, and as many samples as training sees), drawn from the loader's
    seed."""
    keys, patch = ("image", "label"), settings.patch_size
    pad = [SpatialPadd(keys, spatial_size=patch), CastToTyped("label", dtype=torch.long)]
    if whole:
        return [CastToTyped("label", dtype=torch.long)], []
    crop = RandCropByPosNegLabeld(
        keys,
        label_key="label",
        spatial_size=patch,
        pos=1,
        neg=1,
        num_samples=settings.patches_per_volume,
        allow_smaller=False,
    )
    return pad, [crop]


def classification_steps(settings: VolumeSettings) -> list:
    """A classification volume resized whole to `patch_size` (the network sees the whole organ)."""
    return [Resized("image", spatial_size=settings.patch_size, mode="trilinear", anti_aliasing=True)]


class RecordSpacingd(MapTransform):
    """Keep the image's voxel spacing (mm, from its affine) as the item's "spacing", before the tensors become plain:
    surface distances (HD95, surface Dice) are measured in mm."""

    def __call__(self, data: Mapping[Hashable, torch.Tensor]) -> dict:
        d = dict(data)
        image = d["image"]
        affine = image.affine if isinstance(image, MetaTensor) else torch.eye(4)
        d["spacing"] = torch.linalg.norm(torch.as_tensor(affine, dtype=torch.float64)[:3, :3], dim=0).float()
        return d


def plain_tensors(keys) -> list:
    return [RecordSpacingd("image"), EnsureTyped(keys, track_meta=False)]
