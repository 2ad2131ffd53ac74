"""Model factories. Networks come from MONAI; a model is described by a plain dict (its spec) so that the
server can send one spec to every site and all of them build the same architecture: fairfl's own three (`unet`,
`cnn`, `resnet18`, 2-D or 3-D) or any network of fairfl.networks (a class of monai.networks.nets with its `args`, or a
hospital's own factory that the building process admits)."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import TypeGuard

import numpy as np
import torch
from monai.networks.blocks import Convolution
from monai.networks.layers import get_norm_layer
from monai.networks.nets import UNet, resnet18
from torch.overrides import TorchFunctionMode

from fairfl.networks import MODEL_FACTORIES_ENV, argument_problem, build_network, is_network_name
from fairfl.site_settings import MAX_MODEL_PARAMETERS

SERVER_MAX_MODEL_PARAMETERS_ENV = "FAIRFL_SERVER_MAX_MODEL_PARAMETERS"  # the server's own cap; the sites' default
SIZING_SECONDS = 30.0  # the longest a site or the server spends sizing a network before refusing it

# CPU-sized default: a four-level MONAI U-Net. The paper preset uses the five-level one (16..256).
DEFAULT_UNET = {
    "name": "unet",
    "in_channels": 1,
    "num_classes": 2,
    "channels": [16, 32, 64, 128],
    "strides": [2, 2, 2],
    "num_res_units": 2,
    "norm": "instance",
}

# Classification (FedISM+): MONAI's ResNet-18, never pretrained (the paper starts from ImageNet weights; a
# FLARE job cannot download them and medical images are grey). conv1_stride 2 is He et al.'s stem (MONAI's
# default, 1, costs 4x the compute at 224 px). Batch norm as in the paper; see NORMS for the other choices.
DEFAULT_RESNET18 = {
    "name": "resnet18",
    "in_channels": 1,
    "num_classes": 2,
    "norm": "batch",
    "norm_groups": 32,
    "conv1_stride": 2,
}
# A small CNN so that CPU runs finish: per entry of `channels` a 3x3 convolution with stride 2, norm (not in the
# last block) and ReLU; then global average pooling and a linear classifier. Group norm by default: batch-norm
# running statistics averaged over clean and corrupted sites are no site's statistics, and eval-mode accuracy
# suffers (FedBN's observation).
DEFAULT_CNN = {
    "name": "cnn",
    "in_channels": 1,
    "num_classes": 2,
    "channels": [16, 32, 64],
    "norm": "group",
    "norm_groups": 8,
}
DEFAULTS = {"unet": DEFAULT_UNET, "resnet18": DEFAULT_RESNET18, "cnn": DEFAULT_CNN}
NORMS = ("batch", "group", "instance")  # classification networks; group uses gcd(channels, norm_groups) groups


# what a spec may hold, and each value's range: the spec comes from the server, so a site checks it before
# building anything (a 65536-channel CNN or a billion classes would take hundreds of GB)
SPEC_INTS = {
    "in_channels": (1, 64),
    "num_classes": (1, 100_000),
    "num_res_units": (0, 16),
    "norm_groups": (1, 4096),
    "conv1_stride": (1, 4),
    "spatial_dims": (2, 3),
}
SPEC_LISTS = {"channels": (1, 8192, 10), "strides": (1, 4, 9)}  # (low, high, most entries)
SPEC_KEYS = {
    "unet": {"channels", "strides", "num_res_units", "norm"},
    "cnn": {"channels", "norm", "norm_groups"},
    "resnet18": {"norm", "norm_groups", "conv1_stride"},
}


TASK_KEYS = {"name", "in_channels", "num_classes", "spatial_dims"}  # every spec may hold these


def check_model_spec(spec, max_parameters: int, whose: str = "this site's", environ=None) -> str | None:
    """Why the network `spec` describes must not be built here, or None: an unknown name or key, a value of the
    wrong type or out of range (SPEC_INTS, SPEC_LISTS; fairfl.networks for the `args` of another network), a
    factory this process does not admit (`environ`'s FAIRFL_MODEL_FACTORIES), or more than `max_parameters`
    parameters and buffers (counted on torch's meta device: no memory is allocated). The one check of a network's
    size, at the sites (the server's task) and on the server (its own job: `server_parameter_limit`); `whose` names
    the limit in the message."""
    if not isinstance(spec, dict):
        return f"must be an object, got {type(spec).__name__}"
    name = spec.get("name", "unet")
    if not isinstance(name, str) or (name not in DEFAULTS and not is_network_name(name)):
        return (
            f"name {name!r} is not one of {', '.join(DEFAULTS)}, a class of monai.networks.nets or a "
            f"package.module:function factory"
        )
    if name not in DEFAULTS:
        return _check_other_network(spec, max_parameters, whose, environ)
    unknown = set(spec) - TASK_KEYS - SPEC_KEYS[name]
    if unknown:
        return f"unknown key(s) {sorted(unknown, key=str)} for {name}"
    for key, value in spec.items():
        if key in SPEC_INTS and not is_int_in(value, *SPEC_INTS[key]):
            return f"{key} {value!r} is not an integer in {list(SPEC_INTS[key])}"
        if key in SPEC_LISTS:
            low, high, most = SPEC_LISTS[key]
            if (
                not isinstance(value, list)
                or not 1 <= len(value) <= most
                or not all(is_int_in(v, low, high) for v in value)
            ):
                return f"{key} {value!r} is not a list of 1 to {most} integers in [{low}, {high}]"
        if key == "norm" and value not in NORMS:
            return f"norm {value!r} is not one of {', '.join(NORMS)}"
    full = {**DEFAULTS[name], **spec}
    if name == "unet" and len(full["strides"]) != len(full["channels"]) - 1:
        return f"strides {full['strides']} for channels {full['channels']}: a U-Net needs one stride fewer"
    return _size_problem(spec, max_parameters, whose, environ)


def _check_other_network(spec: dict, max_parameters: int, whose: str, environ) -> str | None:
    """check_model_spec of a network of fairfl.networks: the task's keys in range, `args` plain and safe."""
    unknown = set(spec) - TASK_KEYS - {"args"}
    if unknown:
        return f"unknown key(s) {sorted(unknown, key=str)} for {spec['name']} (its own arguments go under args)"
    for key in ("in_channels", "num_classes", "spatial_dims"):
        if key in spec and not is_int_in(spec[key], *SPEC_INTS[key]):
            return f"{key} {spec[key]!r} is not an integer in {list(SPEC_INTS[key])}"
    if "in_channels" not in spec or "num_classes" not in spec:
        return f"{spec['name']} needs in_channels and num_classes"
    problem = argument_problem(spec.get("args", {}))
    return problem or _size_problem(spec, max_parameters, whose, environ)


def _size_problem(spec: dict, max_parameters: int, whose: str, environ) -> str | None:
    """Built on torch's meta device (nothing allocated): why it cannot be, or has more than `max_parameters`
    parameters and buffers (a constructor's buffers take memory too). A spec counted once is not built again in this
    process (`_SPEC_CACHE`): every task carries the same one, and building it took longer than a small site's
    training step."""
    key = _spec_key("count", spec, environ)  # a count once told holds under any limit
    count = _recall(key)
    if count is None:
        try:
            # a constructor's intermediate tensors count too: a generous multiple of the limit (and a floor, so that
            # a small limit still lets the count be told) bounds the building
            with torch.device("meta"), _SizeOnly(max_values=16 * max_parameters + 50_000_000):
                model = build_model(spec, environ)
                count = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
        except Exception as err:  # what the ranges above let through and the constructor still refuses
            return f"cannot be built: {type(err).__name__}: {err}"  # not remembered: it may depend on the bound
        _remember(key, count)
    if count > max_parameters:
        return f"has {count:,} parameters, more than {whose} limit of {max_parameters:,}"
    return None


class _SizeOnly(TorchFunctionMode):
    """While a network is built on the meta device to be counted: a value read out of a meta tensor (`.item()`, as
    SwinUNETR's drop-path rates are) reads 0, since a count of parameters never depends on such values; and the
    building stops (ValueError) once it has made more than `max_values` tensor elements or taken `max_seconds`, so a
    spec of thousands of layers is refused in bounded time, never built for minutes before its count is known."""

    def __init__(self, max_values: float = math.inf, max_seconds: float = SIZING_SECONDS):
        super().__init__()
        self.left, self.deadline = max_values, time.monotonic() + max_seconds

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.item, torch.Tensor.tolist) and args and getattr(args[0], "is_meta", False):
            return 0.0 if func is torch.Tensor.item else []
        result = func(*args, **(kwargs or {}))
        if isinstance(result, torch.Tensor) and result.is_meta:
            self.left -= result.numel()
            if self.left < 0:
                raise ValueError("it makes far more values than the limit allows while it is built")
        if time.monotonic() > self.deadline:
            raise ValueError(f"sizing it took more than {SIZING_SECONDS:g} s (thousands of layers?)")
        return result


# what building a spec tells (its parameter count; its state dict on the meta device), per spec and process: the spec
# comes with every task, the network it describes does not change within a process
_SPEC_CACHE: OrderedDict = OrderedDict()
SPEC_CACHE_SIZE = 32  # specs remembered; a server cycling through more is only slower, never wrong
_SPEC_LOCK = threading.Lock()


def _spec_key(kind: str, spec, environ) -> tuple | None:
    """What identifies a building's result: the spec's canonical JSON and the factories this process admits (a factory
    name builds only where admitted); None for a spec that is not plain JSON, which is never cached."""
    try:
        text = json.dumps(spec, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return kind, text, (os.environ if environ is None else environ).get(MODEL_FACTORIES_ENV, "")


def _recall(key: tuple | None):
    with _SPEC_LOCK:
        return _SPEC_CACHE.get(key) if key else None


def _remember(key: tuple | None, value) -> None:
    if key is None:
        return
    with _SPEC_LOCK:
        _SPEC_CACHE[key] = value
        _SPEC_CACHE.move_to_end(key)
        while len(_SPEC_CACHE) > SPEC_CACHE_SIZE:
            _SPEC_CACHE.popitem(last=False)


def meta_state(spec: dict, environ=None) -> dict:
    """The state dict of the network `spec` describes, on torch's meta device: the keys, shapes and dtypes a received
    or kept state dict is checked against (fairfl.site_checks.check_site_state), with nothing allocated. Built once per
    spec and process; the tensors hold no values and must not be changed. Check the spec first
    (`check_model_spec`): this builds whatever it is given."""
    key = _spec_key("meta_state", spec, environ)
    state = _recall(key)
    if state is None:
        with torch.device("meta"), _SizeOnly():  # a value read out of a meta tensor while building (SwinUNETR) reads 0
            state = build_model(spec, environ).state_dict()
        _remember(key, state)
    return dict(state)  # the caller's own dict: removing a key from it changes no later check


def server_parameter_limit(environ=None) -> int:
    """The most parameters the server's network may have: its own FAIRFL_SERVER_MAX_MODEL_PARAMETERS (the server's
    environment, never the job's), default the sites' default; ValueError naming the variable for anything but a
    positive whole number."""
    value = (os.environ if environ is None else environ).get(SERVER_MAX_MODEL_PARAMETERS_ENV) or str(
        MAX_MODEL_PARAMETERS
    )
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise ValueError(
            f"environment variable {SERVER_MAX_MODEL_PARAMETERS_ENV} {value!r}: expected a positive whole number"
        )
    return int(value)


def is_int_in(value, low: int, high: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def build_model(spec: dict, environ=None) -> torch.nn.Module:
    """Build the network a spec describes (see DEFAULT_UNET, DEFAULT_RESNET18 and DEFAULT_CNN for the keys, and
    fairfl.networks for the others; `environ`: whose FAIRFL_MODEL_FACTORIES admits a factory, default this
    process's); without a name, the U-Net. `spatial_dims` 2 (default) or 3."""
    name = (spec or {}).get("name", "unet")
    if name not in DEFAULTS:
        if is_network_name(name):
            return build_network(spec, environ)
        raise ValueError(f"unknown model name {name!r}; known: {', '.join(map(repr, DEFAULTS))}")
    spec = {**DEFAULTS[name], **(spec or {})}
    dims = spec.get("spatial_dims", 2)
    if name == "unet":
        return UNet(
            spatial_dims=dims,
            in_channels=spec["in_channels"],
            out_channels=spec["num_classes"],
            channels=tuple(spec["channels"]),
            strides=tuple(spec["strides"]),
            num_res_units=spec["num_res_units"],
            norm=spec["norm"],
        )
    if spec["norm"] not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {spec['norm']!r}")
    if name == "resnet18":
        model = resnet18(
            pretrained=False,
            spatial_dims=dims,
            n_input_channels=spec["in_channels"],
            num_classes=spec["num_classes"],
            conv1_t_stride=spec["conv1_stride"],
        )
        return _replace_batch_norms(model, spec)
    layers: list[torch.nn.Module] = []
    width = spec["in_channels"]
    for i, channels in enumerate(spec["channels"]):
        # no norm in the last block: a per-channel (instance, small-group) norm right before the global pooling
        # would give every channel the same mean and leave the classifier nothing to read
        norm = _norm(spec, channels) if i < len(spec["channels"]) - 1 else None
        layers.append(Convolution(dims, width, channels, strides=2, kernel_size=3, act="relu", norm=norm))
        width = channels
    pool = torch.nn.AdaptiveAvgPool2d(1) if dims == 2 else torch.nn.AdaptiveAvgPool3d(1)
    layers += [pool, torch.nn.Flatten(), torch.nn.Linear(width, spec["num_classes"])]
    return torch.nn.Sequential(*layers)


def classifier_head(model: torch.nn.Module) -> tuple[str, torch.nn.Linear]:
    """(name, module) of a classification network's final linear classifier: MONAI ResNet's `fc`, the small
    CNN's last layer. Everything else is the feature extractor, shared by FedNPR-Per while each site keeps its
    own head. Found as the last nn.Linear registered, which in both networks is the layer forward ends with
    (`forward_with_features` relies on it; the tests check head(features) == logits)."""
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no linear classifier head (a segmentation network?)")
    return linears[-1]


def head_state_keys(model: torch.nn.Module | dict) -> list[str]:
    """The state-dict keys of the classifier head (a model, or a spec to build one): what FedNPR-Per leaves
    out of aggregation. Every other key belongs to the feature extractor."""
    model = build_model(model) if isinstance(model, dict) else model
    name, head = classifier_head(model)
    return [f"{name}.{key}" for key in head.state_dict()]


NORM_LAYERS = (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm, torch.nn.LayerNorm)


def norm_state_keys(model: torch.nn.Module | dict) -> list[str]:
    """The state-dict keys of the normalisation layers (a model, or a spec to build one): their affine weights and
    biases and, for batch norm, the running statistics. What FedBN keeps on each site. An instance norm without
    affine parameters or statistics (MONAI's U-Net default) has none."""
    model = build_model(model) if isinstance(model, dict) else model
    return [
        f"{name}.{key}" if name else key
        for name, module in model.named_modules()
        if isinstance(module, NORM_LAYERS)
        for key in module.state_dict()
    ]


@contextmanager
def head_inputs(model: torch.nn.Module):
    """While open, a one-element list holding the classifier head's input (the features) of the model's
    latest forward pass: one forward gives logits and features, the features keeping their graph so that a
    loss on them trains the extractor. Only the latest is kept, so an epoch does not pile up graphs."""
    latest: list[torch.Tensor] = []

    def keep(_module, args):
        latest[:] = [args[0]]

    handle = classifier_head(model)[1].register_forward_pre_hook(keep)
    try:
        yield latest
    finally:
        handle.remove()


def forward_with_features(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [B, d], logits [B, C]) from one forward pass: features are the input of the head. A network whose
    forward does not end with its last linear layer (`classifier_head`: it adds or scales something after it) is a
    ValueError, since its features would not be the classifier's."""
    name, head = classifier_head(model)
    with head_inputs(model) as latest:
        logits = model(images)
    if not latest or not torch.equal(head(latest[0]), logits):
        raise ValueError(
            f"{type(model).__name__}'s forward does not end with its last linear layer {name!r}: the classifier head "
            f"a prototype method needs is not found (its features would not be the classifier's input)"
        )
    return latest[0], logits


def _replace_batch_norms(model: torch.nn.Module, spec: dict) -> torch.nn.Module:
    """Every BatchNorm2d of `model` replaced by the spec's norm. MONAI (1.6) passes ResNet's `norm` to the stem
    only: the residual blocks and shortcuts stay batch norm (Project-MONAI/MONAI PR #9028), so we swap them."""
    if spec["norm"] == "batch":
        return model
    for parent in list(model.modules()):
        for child_name, child in parent.named_children():
            if isinstance(child, (torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)):
                dims = spec.get("spatial_dims", 2)
                setattr(parent, child_name, get_norm_layer(_norm(spec, child.num_features), dims, child.num_features))
    return model


def _norm(spec: dict, channels: int):
    """A classification network's normalisation as MONAI names it: "batch", "instance" (affine, so that it
    has parameters to learn like the others) or ("group", {"num_groups": gcd(channels, norm_groups)})."""
    norm = spec["norm"]
    if norm == "group":
        return "group", {"num_groups": math.gcd(channels, int(spec["norm_groups"]))}
    return (norm, {"affine": True}) if norm == "instance" else norm


def initial_state(spec: dict, seed: int, weights: dict | None = None) -> dict:
    """The initial weights of the global model, as numpy arrays (what FLARE ships): seeded, or `weights` (a MONAI
    bundle's: they must fit the network exactly, every key and shape)."""
    torch.manual_seed(seed)
    model = build_model(spec)
    if weights is not None:
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as err:
            raise ValueError(f"the bundle's weights do not fit its network: {str(err).splitlines()[0]}") from err
    return state_to_numpy(model.state_dict())


def state_to_numpy(state: dict) -> dict:
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


def state_to_torch(state: dict) -> dict:
    return {k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}


def load_numpy_state(model: torch.nn.Module, state: dict) -> torch.nn.Module:
    """Load numpy arrays into a model (strict: every key, every shape)."""
    model.load_state_dict(state_to_torch(state), strict=True)
    return model


def trainable_names(spec: dict) -> list:
    """The names of a network's trainable parameters (not its normalisation statistics)."""
    return [n for n, p in build_model(spec).named_parameters() if p.requires_grad]
