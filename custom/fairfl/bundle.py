"""A MONAI bundle as a federation's model: its network, its pre-processing and its weights as the starting point.

A bundle (MONAI's packaging of a medical model) is a folder with `configs/` (`inference.json` or `.yaml`, else
`train.json`/`.yaml`; `metadata.json`) and `models/model.pt`. The server reads it (the job's `bundle` argument); it
never runs it: a bundle's configs can name any Python callable (`_target_`) and hold Python expressions (`$...`), so
only data is taken from them:
  * `network_def`: a class of monai.networks.nets with plain arguments (references `@name` to other plain values of
    the same file are followed), which becomes a model spec (fairfl.networks) every site builds and checks as any;
  * `preprocessing`: the transforms of monai.transforms it lists (loading and channel-first dropped: the sites load
    and check the files themselves), each with plain arguments on the keys "image" and "label", sent to the sites in
    place of fairfl's own normalisation (fairfl.data.loaders);
  * `models/model.pt`: tensors only (torch.load weights_only), the global model of round 0 instead of seeded weights;
    it must fit the network exactly.
Anything else (an expression, a macro `%`, a target outside those modules, keys of another name) is a ValueError
naming the bundle file and the entry: a bundle that needs code to run is not a federation's model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fairfl.networks import IN_CHANNELS, OUT_CHANNELS, SPATIAL_DIMS, argument_problem

CONFIG_NAMES = ("inference.json", "inference.yaml", "inference.yml", "train.json", "train.yaml", "train.yml")
# the transforms a site applies itself before a bundle's: loading with its checks, channel first
LOADING = {"LoadImage", "LoadImaged", "EnsureChannelFirst", "EnsureChannelFirstd", "AddChannel", "AddChanneld"}
TRANSFORM_KEYS = ("image", "label")
MAX_TRANSFORMS = 64
MAX_REFERENCE_DEPTH = 16
MAX_RESOLVED_VALUES = 100_000  # what one entry may expand to through its references (references of references multiply)
# transforms that write files where they run: a site's patient images in a folder the server names
WRITING = {"SaveImaged", "SaveClassificationd", "WriteFileMappingd"}


@dataclass(frozen=True)
class Bundle:
    """What fairfl takes from a bundle (module docstring)."""

    path: Path
    network: dict  # a model spec (fairfl.networks): name, in_channels, num_classes, spatial_dims, args
    preprocessing: list  # [{"name": a monai.transforms class, "args": {...}}, ...]
    weights: Path | None  # models/model.pt, when the bundle has one


def read_bundle(folder: str | Path) -> Bundle:
    """The network, pre-processing and weights of the bundle in `folder` (module docstring); a ValueError naming the
    file and the entry for anything fairfl cannot take as data."""
    folder = Path(folder).expanduser()
    configs = folder / "configs"
    found = next((configs / name for name in CONFIG_NAMES if (configs / name).is_file()), None)
    if found is None:
        raise ValueError(f"{folder}: not a MONAI bundle (no configs/ with {', '.join(CONFIG_NAMES)})")
    config = _read_config(found)
    if "network_def" not in config:
        raise ValueError(f"{found}: no network_def")
    try:
        network = _network_spec(_resolved(config["network_def"], config, "network_def"))
        preprocessing = _transforms(config.get("preprocessing"), config)
    except ValueError as err:
        raise ValueError(f"{found}: {err}") from None
    weights = folder / "models" / "model.pt"
    return Bundle(folder, network, preprocessing, weights if weights.is_file() else None)


def _read_config(path: Path) -> dict:
    try:
        text = path.read_text()
        if path.suffix == ".json":
            config = json.loads(text)
        else:
            import yaml

            config = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: cannot be read: {err}") from None
    except Exception as err:  # yaml's own errors
        raise ValueError(f"{path}: cannot be read: {type(err).__name__}: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not an object of named entries")
    return config


def _resolved(value, config: Mapping, where: str, depth: int = 0, count: list | None = None):
    """`value` with every reference "@name" (to a top-level entry of `config`) replaced by that entry, plain data
    only; an expression "$..." or macro "%..." is a ValueError naming `where`."""
    count = [0] if count is None else count
    count[0] += 1
    if count[0] > MAX_RESOLVED_VALUES:
        raise ValueError(f"{where}: more than {MAX_RESOLVED_VALUES:,} values once references are followed")
    if depth > MAX_REFERENCE_DEPTH:
        raise ValueError(f"{where}: references nested deeper than {MAX_REFERENCE_DEPTH} (a cycle?)")
    if isinstance(value, str):
        if value.startswith(("$", "%")):
            raise ValueError(f"{where}: {value[:60]!r} is a Python expression or macro; fairfl takes only plain values")
        if value.startswith("@"):
            name = value[1:]
            if name not in config:
                raise ValueError(f"{where}: reference {value!r} names no entry of the config")
            return _resolved(config[name], config, f"{where} -> {value}", depth + 1, count)
        return value
    if isinstance(value, list):
        return [_resolved(v, config, f"{where}[{i}]", depth + 1, count) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if "_requires_" in value or "_disabled_" in value or "_mode_" in value:
            raise ValueError(f"{where}: _requires_, _disabled_ and _mode_ are instructions fairfl does not run")
        return {k: _resolved(v, config, f"{where}.{k}", depth + 1, count) for k, v in value.items()}
    return value


def _class_name(target, module: str, where: str) -> str:
    """The class a `_target_` names ("UNet", "monai.networks.nets.UNet", "monai.networks.nets.unet.UNet"), checked to
    be one of `module`'s."""
    import importlib

    if not isinstance(target, str) or not target:
        raise ValueError(f"{where}: _target_ {target!r} is not a class name")
    name = target.rsplit(".", 1)[-1]
    if "." in target and not target.startswith(module + "."):
        raise ValueError(f"{where}: _target_ {target!r} is not in {module}")
    if not isinstance(getattr(importlib.import_module(module), name, None), type):
        raise ValueError(f"{where}: _target_ {target!r} is not a class of {module}")
    return name


def _network_spec(definition) -> dict:
    if not isinstance(definition, dict) or "_target_" not in definition:
        raise ValueError("network_def must be an object with a _target_")
    name = _class_name(definition["_target_"], "monai.networks.nets", "network_def")
    args = {k: v for k, v in definition.items() if k != "_target_"}
    spec: dict = {"name": name}
    for key, names in (("in_channels", IN_CHANNELS), ("num_classes", OUT_CHANNELS), ("spatial_dims", SPATIAL_DIMS)):
        given = [n for n in names if n in args]
        if given:
            spec[key] = args.pop(given[0])
    if "in_channels" not in spec or "num_classes" not in spec:
        raise ValueError(f"network_def of {name} gives no input channels or classes ({IN_CHANNELS}, {OUT_CHANNELS})")
    problem = argument_problem(args)
    if problem:
        raise ValueError(f"network_def: {problem}")
    return {**spec, "args": args}


def _transforms(preprocessing, config: Mapping) -> list:
    if preprocessing is None:
        return []
    preprocessing = _resolved(preprocessing, config, "preprocessing")
    if isinstance(preprocessing, dict) and "transforms" in preprocessing:  # a Compose
        preprocessing = preprocessing["transforms"]
    if not isinstance(preprocessing, list) or len(preprocessing) > MAX_TRANSFORMS:
        raise ValueError(f"preprocessing must be a Compose or a list of at most {MAX_TRANSFORMS} transforms")
    chosen = []
    for i, item in enumerate(preprocessing):
        where = f"preprocessing[{i}]"
        if not isinstance(item, dict) or "_target_" not in item:
            raise ValueError(f"{where} must be an object with a _target_")
        name = _class_name(item["_target_"], "monai.transforms", where)
        if name in LOADING:
            continue
        args = {k: v for k, v in item.items() if k != "_target_"}
        chosen.append(check_transform({"name": name, "args": args}, where))
    return chosen


def check_transform(entry, where: str = "transform") -> dict:
    """A pre-processing entry {"name", "args"} as a site accepts it from the server: a dictionary transform of
    monai.transforms on the keys "image" and/or "label", with plain arguments; else ValueError."""
    if not isinstance(entry, dict) or set(entry) != {"name", "args"}:
        raise ValueError(f"{where} must be an object of name and args")
    name, args = entry["name"], entry["args"]
    _class_name(name, "monai.transforms", where)
    if name in WRITING:
        raise ValueError(
            f"{where}: {name} writes files where it runs; a pre-processing transform only changes the data"
        )
    if not isinstance(name, str) or not name.endswith("d"):
        raise ValueError(f"{where}: {name!r} is not a dictionary transform (its name ends with d)")
    problem = argument_problem(args)
    if problem:
        raise ValueError(f"{where}: {problem}")
    keys = args.get("keys")
    keys = [keys] if isinstance(keys, str) else keys
    if not isinstance(keys, list) or not keys or not set(keys) <= set(TRANSFORM_KEYS):
        raise ValueError(f"{where}: keys {args.get('keys')!r} must be among {list(TRANSFORM_KEYS)}")
    return entry


def preprocessing_problem(entries) -> str | None:
    """Why a task's pre-processing list cannot be used by a site, or None (fairfl.flare.site_task)."""
    if not isinstance(entries, list) or len(entries) > MAX_TRANSFORMS:
        return f"is not a list of at most {MAX_TRANSFORMS} transforms"
    for i, entry in enumerate(entries):
        try:
            check_transform(entry, f"[{i}]")
        except ValueError as err:
            return str(err)
    return None


def build_transforms(entries: list) -> list:
    """The transforms of a checked pre-processing list (lists as tuples, as MONAI's constructors take them)."""
    import monai.transforms

    def tuples(value):
        if isinstance(value, list):
            return tuple(tuples(v) for v in value)
        if isinstance(value, dict):
            return {k: tuples(v) for k, v in value.items()}
        return value

    built = []
    for entry in entries:
        check_transform(entry)
        args = {k: (v if k == "keys" else tuples(v)) for k, v in entry["args"].items()}
        built.append(getattr(monai.transforms, entry["name"])(**args))
    return built


def bundle_weights(bundle: Bundle | None) -> dict | None:
    """The bundle's models/model.pt as a state dict of tensors (weights_only: nothing pickled is run; a checkpoint
    {"model": state} is unwrapped), or None without a bundle or its weights; a ValueError naming the file otherwise."""
    if bundle is None or bundle.weights is None:
        return None
    import torch

    try:
        state = torch.load(bundle.weights, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{bundle.weights}: not a file of tensors ({type(err).__name__}: {err})") from None
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{bundle.weights}: not a state dict of tensors")
    return state
