"""Model factories. Networks come from MONAI; a model is described by a plain dict (its spec) so that the
server can send one spec to every site and all of them build the same architecture."""

from __future__ import annotations

import numpy as np
import torch
from monai.networks.nets import UNet

# CPU-sized default: a four-level MONAI U-Net. The paper preset uses the five-level one (16..256).
DEFAULT_UNET = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [16, 32, 64, 128],
                "strides": [2, 2, 2], "num_res_units": 2, "norm": "instance"}


def build_model(spec: dict) -> torch.nn.Module:
    """Build the network a spec describes (see DEFAULT_UNET for the keys)."""
    spec = {**DEFAULT_UNET, **(spec or {})}
    if spec["name"] != "unet":
        raise ValueError(f"unknown model name {spec['name']!r}; known: 'unet'")
    return UNet(spatial_dims=2, in_channels=spec["in_channels"], out_channels=spec["num_classes"],
                channels=tuple(spec["channels"]), strides=tuple(spec["strides"]),
                num_res_units=spec["num_res_units"], norm=spec["norm"])


def initial_state(spec: dict, seed: int) -> dict:
    """The seeded initial weights of the global model, as numpy arrays (what FLARE ships)."""
    torch.manual_seed(seed)
    return state_to_numpy(build_model(spec).state_dict())


def state_to_numpy(state: dict) -> dict:
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


def state_to_torch(state: dict) -> dict:
    return {k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}


def load_numpy_state(model: torch.nn.Module, state: dict) -> torch.nn.Module:
    """Load numpy arrays into a model (strict: every key, every shape)."""
    model.load_state_dict(state_to_torch(state), strict=True)
    return model
