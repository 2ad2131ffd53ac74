"""The networks a job may name beyond fairfl's own three: any class of `monai.networks.nets` (SegResNet, AttentionUnet,
SwinUNETR, DenseNet121, ...) with its arguments, and a hospital's own factories ("package.module:function") that this
process admits.

Trust model. A job is written by its submitter and reaches every site; it may name a network but never make a site
import code: MONAI's networks are code every site already runs (fairfl depends on MONAI), built only from JSON
arguments checked here; a hospital's own factory is imported only when this process's own FAIRFL_MODEL_FACTORIES
lists it (the site's environment, set by its IT beside FAIRFL_DATA_ROOT; the server's for the server). Whoever
installs that package at a site (pip) and lists it there admits its code; a job naming an unlisted factory is refused
before anything is imported. Arguments that would make a constructor read files or the network (`pretrained=True`,
a weights path or URL) are refused: a federation's starting weights come from the server (a MONAI bundle's, or seeded).

A spec names the network (`name`), its `spatial_dims`, `in_channels`, `num_classes` (the task's) and `args` (the
rest, as the constructor names them). The task's three are given under whatever names the constructor uses
(`in_channels`/`n_input_channels`, `out_channels`/`num_classes`, ...): a network whose constructor has no place for
the input channels or the classes is refused, since fairfl could not make it fit the data."""

from __future__ import annotations

import importlib
import inspect
import os
import re
from collections.abc import Callable, Mapping

MODEL_FACTORIES_ENV = "FAIRFL_MODEL_FACTORIES"
FACTORY_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
MONAI_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*$")  # a class of monai.networks.nets: SegResNet, DenseNet121, ...
# where a constructor takes the task's three, in the order tried
IN_CHANNELS = ("in_channels", "n_input_channels", "in_chans", "num_channels")
OUT_CHANNELS = ("out_channels", "num_classes", "out_chans", "n_classes", "num_outputs")
SPATIAL_DIMS = ("spatial_dims", "dimensions")
# argument names that would make a constructor fetch or read weights (refused unless false or null)
# (not a drop-path rate: SwinUNETR's dropout_path_rate is stochastic depth)
FETCHING = re.compile(r"pretrain|(?<!drop_)(?<!dropout_)path|url|download|weights|checkpoint_file|file", re.IGNORECASE)
MAX_ARGUMENT_DEPTH = 4  # lists in lists, e.g. DynUNet's per-level kernel sizes [[3, 3, 3], ...]
MAX_ARGUMENT_ITEMS = 1000


def is_factory_name(name) -> bool:
    """Whether `name` reads as a hospital's own factory, "package.module:function"."""
    return isinstance(name, str) and bool(FACTORY_PATTERN.match(name))


def is_network_name(name) -> bool:
    """Whether `name` could be a network beyond fairfl's own: a MONAI class name or a factory name (syntax only)."""
    return isinstance(name, str) and (bool(MONAI_NAME.match(name)) or is_factory_name(name))


def admitted_factories(environ=None) -> frozenset[str]:
    """The hospital's own factories this process admits: FAIRFL_MODEL_FACTORIES, comma-separated
    "package.module:function"; ValueError naming the variable for an entry of another form."""
    value = (os.environ if environ is None else environ).get(MODEL_FACTORIES_ENV, "")
    names = [part.strip() for part in value.split(",") if part.strip()]
    bad = [name for name in names if not is_factory_name(name)]
    if bad:
        raise ValueError(
            f"environment variable {MODEL_FACTORIES_ENV}: {bad} are not of the form package.module:function"
        )
    return frozenset(names)


def network_class(name: str, environ=None) -> Callable:
    """The constructor `name` names: a class of monai.networks.nets, or an admitted factory (imported only then);
    ValueError saying why not otherwise."""
    import torch

    if is_factory_name(name):
        admitted = admitted_factories(environ)
        if name not in admitted:
            raise ValueError(
                f"{name!r} is not admitted here: this process's {MODEL_FACTORIES_ENV} lists "
                f"{sorted(admitted) or 'no factory'}; the site (or server) that installed the package adds it there"
            )
        module, function = name.split(":")
        try:
            factory = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"{name!r} is admitted but cannot be imported here: {type(err).__name__}: {err}") from err
        if not callable(factory):
            raise ValueError(f"{name!r} is not callable")
        return factory
    if not isinstance(name, str) or not MONAI_NAME.match(name):
        raise ValueError(f"{name!r} is neither a class of monai.networks.nets nor a package.module:function factory")
    from monai.networks import nets

    found = getattr(nets, name, None)
    if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
        raise ValueError(f"{name!r} is not a network class of monai.networks.nets")
    # a default weights name, path or URL (Transchex's path_or_repo_id "bert-base-uncased") is fetched whatever the
    # job says: such a constructor cannot be told not to
    fetching = [
        key
        for key, parameter in inspect.signature(found).parameters.items()
        if FETCHING.search(key) and isinstance(parameter.default, str) and parameter.default
    ]
    if fetching:
        raise ValueError(
            f"{name!r} fetches or reads weights by default ({', '.join(fetching)}); it cannot be built here"
        )
    return found


def argument_problem(args) -> str | None:
    """Why a spec's `args` must not reach a constructor, or None: not a JSON object of plain values (numbers, text,
    booleans, null, lists and objects of them, nested at most MAX_ARGUMENT_DEPTH deep), or an argument that would
    fetch or read weights set to anything but false or null."""
    if not isinstance(args, Mapping):
        return f"args must be an object, got {type(args).__name__}"
    items = 0

    def walk(value, depth: int) -> str | None:
        nonlocal items
        items += 1
        if items > MAX_ARGUMENT_ITEMS:
            return f"more than {MAX_ARGUMENT_ITEMS} values"
        if value is None or isinstance(value, (bool, int, str)):
            return None
        if isinstance(value, float):
            return None if value == value and abs(value) != float("inf") else f"{value!r} is not a finite number"
        if depth >= MAX_ARGUMENT_DEPTH:
            return f"nested deeper than {MAX_ARGUMENT_DEPTH}"
        if isinstance(value, (list, tuple)):
            return next(filter(None, (walk(v, depth + 1) for v in value)), None)
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return next(filter(None, (walk(v, depth + 1) for v in value.values())), None)
        return f"{type(value).__name__} is not a JSON value"

    for key, value in args.items():
        if not isinstance(key, str) or not key.isidentifier():
            return f"argument name {key!r} is not an identifier"
        if FETCHING.search(key) and value not in (None, False, ""):
            return f"argument {key}={value!r} would fetch or read weights; a federation's start comes from the server"
        problem = walk(value, 0)
        if problem:
            return f"argument {key}: {problem}"
    return None


def constructor_arguments(constructor: Callable, spec: Mapping) -> dict:
    """The keyword arguments that build the spec's network: its `args`, with the task's spatial_dims, in_channels
    and num_classes under the names the constructor uses (lists as tuples, as MONAI's constructors expect them);
    ValueError when the constructor has no place for the channels or the classes, or `args` sets them itself."""
    parameters = inspect.signature(constructor).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())

    def place(names: tuple, what: str, required: bool) -> str | None:
        found = next((n for n in names if n in parameters), None)
        if found is None and open_ended:
            found = names[0]
        if found is None and required:
            raise ValueError(f"its constructor takes none of {list(names)}: fairfl cannot give it the task's {what}")
        return found

    args = {key: _as_tuples(value) for key, value in spec.get("args", {}).items()}
    task = {
        place(IN_CHANNELS, "input channels", True): spec["in_channels"],
        place(OUT_CHANNELS, "classes", True): spec["num_classes"],
    }
    dims = place(SPATIAL_DIMS, "spatial dimensions", False)
    if dims is not None:
        task[dims] = spec.get("spatial_dims", 2)
    clash = sorted(set(args) & set(task) | set(args) & {*IN_CHANNELS, *OUT_CHANNELS, *SPATIAL_DIMS})
    if clash:
        raise ValueError(
            f"args {clash} are the task's: set in_channels, num_classes and spatial_dims as job arguments instead"
        )
    unknown = sorted(set(args) - set(parameters)) if not open_ended else []
    if unknown:
        raise ValueError(f"{getattr(constructor, '__name__', constructor)} takes no argument(s) {unknown}")
    # a constructor that fetches weights by default (EfficientNetBN's pretrained=True) is told not to
    never_fetch = {
        name: False
        for name, parameter in parameters.items()
        if FETCHING.search(name) and parameter.default is True and name not in args
    }
    return {**args, **never_fetch, **task}


def _as_tuples(value):
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    if isinstance(value, Mapping):
        return {k: _as_tuples(v) for k, v in value.items()}
    return value


def build_network(spec: Mapping, environ=None):
    """The network a spec of a MONAI class or an admitted factory describes (module docstring)."""
    constructor = network_class(spec["name"], environ)
    return constructor(**constructor_arguments(constructor, spec))
