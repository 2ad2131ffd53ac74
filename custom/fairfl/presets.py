"""Named settings bundles. A job's config files hold CPU-sized values; a preset overrides the keys it names.

Select one with the component argument `preset` or, for every component at once, the environment
variable FAIRFL_PRESET (e.g. `FAIRFL_PRESET=paper nvflare simulator jobs/fedlwr ...`)."""

from __future__ import annotations

import os

PRESETS = {
    "cpu": {},
    # The Fed-LWR paper: 200 rounds, 384x384 slices, U-Net, one local epoch.
    "paper": {"num_rounds": 200, "image_size": 384, "model_channels": [16, 32, 64, 128, 256],
              "model_strides": [2, 2, 2, 2], "local_epochs": 1, "local_steps": 0},
}


def resolve_preset(preset: str = "") -> dict:
    """The overrides of the active preset: FAIRFL_PRESET wins over the component argument."""
    name = os.environ.get("FAIRFL_PRESET") or preset or "cpu"
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]


def apply_preset(obj, preset: str = "") -> None:
    """Override the attributes of a component that the active preset names."""
    for key, value in resolve_preset(preset).items():
        if hasattr(obj, key):
            setattr(obj, key, value)
