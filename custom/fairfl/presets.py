"""Named settings bundles. A job's config files hold CPU-sized values; a preset overrides the keys it names.

Select one with the component argument `preset` or, for every component at once, the environment
variable FAIRFL_PRESET (e.g. `FAIRFL_PRESET=paper nvflare simulator jobs/fedlwr ...`). A preset may differ by task:
"paper" is the segmentation papers' setting for a segmentation job and FedISM+'s for a classification job."""

from __future__ import annotations

import os

PRESETS = {
    "cpu": {},
    # The Fed-LWR paper: 200 rounds, 384x384 slices, U-Net, one local epoch.
    "paper": {
        "num_rounds": 200,
        "image_size": 384,
        "model_channels": [16, 32, 64, 128, 256],
        "model_strides": [2, 2, 2, 2],
        "local_epochs": 1,
        "local_steps": 0,
    },
}
# (preset, task) -> overrides, where a task's differ from PRESETS[preset]
TASK_PRESETS = {
    # FedISM+ Sec. IV-A: ResNet-18 (batch norm; never pretrained here) at 224x224, batch 32, Adam lr 3e-4,
    # betas (0.9, 0.999), weight decay 5e-4, one local epoch, 300 rounds
    ("paper", "classification"): {
        "num_rounds": 300,
        "image_size": 224,
        "model": "resnet18",
        "model_norm": "batch",
        "batch_size": 32,
        "lr": 3e-4,
        "weight_decay": 5e-4,
        "local_epochs": 1,
        "local_steps": 0,
    },
}


# Adam's (beta1, beta2) at the sites unless a job's `adam_betas` says otherwise: PyTorch's, every task's default
# (Fed-LWR's authors' code ran (0.9, 0.99))
ADAM_BETAS = (0.9, 0.999)

# A component argument left null takes its task's default: the generic jobs (fedavg, solo, ...) run on
# segmentation and classification data alike, and the two tasks train at different settings.
TASK_DEFAULTS = {
    # the segmentation papers' Adam settings at CPU size
    # augmentation: mirroring and quarter turns are label-preserving for axial prostate slices, fundus photographs
    # (the disc/cup masks turn with the image) and dermoscopy/CT lesion classes; intensity jitter mimics scanners
    "segmentation": {
        "batch_size": 8,
        "lr": 1e-3,
        "weight_decay": 1e-4,
        "synthetic_size_scale": 2.0,
        "model_channels": [16, 32, 64, 128],
        "augmentation": ["flip", "rotate90", "intensity"],
    },
    # FedISM+ Sec. IV-A: batch 32, Adam lr 3e-4, weight decay 5e-4; a three-block CNN at CPU size
    "classification": {
        "batch_size": 32,
        "lr": 3e-4,
        "weight_decay": 5e-4,
        "synthetic_size_scale": 1.0,
        "model_channels": [16, 32, 64],
        "augmentation": ["flip", "rotate90", "intensity"],
    },
}


def resolve_preset(preset: str = "", task: str = "segmentation") -> dict:
    """The overrides of the active preset for `task`: FAIRFL_PRESET wins over the component argument."""
    name = os.environ.get("FAIRFL_PRESET") or preset or "cpu"
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return TASK_PRESETS.get((name, task), PRESETS[name])


def apply_preset(obj, preset: str = "", task: str = "segmentation") -> None:
    """Fill the component's null attributes with `task`'s defaults, then override those the active preset names."""
    fill_task_defaults(obj, task)
    for key, value in resolve_preset(preset, task).items():
        if hasattr(obj, key):
            setattr(obj, key, value)


def fill_task_defaults(obj, task: str) -> None:
    """Set the attributes of a component that are null to `task`'s defaults (TASK_DEFAULTS)."""
    for key, value in TASK_DEFAULTS[task].items():
        if getattr(obj, key, 0) is None:
            setattr(obj, key, value)
