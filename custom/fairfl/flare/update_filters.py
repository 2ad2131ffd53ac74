"""NVFlare's privacy filters on the update a site's training sends (the executor's `privacy_filter`).

A site sends its trained weights as their difference from the weights it received (NVFlare's WEIGHT_DIFF, as
NVFlare's own FedAvg does): the percentile and sparse-vector filters are defined on differences, and on whole weights
they would zero the model's small weights. The job's filter is one of NVFlare's own three, applied by the executor
exactly as NVFlare's filter chain applies it (`Filter.process`), before anything else a site's privacy scope adds
(its local/privacy.json), which then also sees differences. The server adds each difference back to the weights it
sent (fairfl.site_checks.weights_from_update). docs/privacy.md says what each filter does to each method."""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Mapping

from fairfl.kinds import Boolean, Kind, ListOf, Real, Text, shown

# the filters a job may name, by NVFlare's class; nothing else is ever imported from a job's setting
FILTER_CLASSES = {
    "exclude_vars": "nvflare.app_common.filters.exclude_vars.ExcludeVars",
    "percentile": "nvflare.app_common.filters.percentile_privacy.PercentilePrivacy",
    "svt": "nvflare.app_common.filters.svt_privacy.SVTPrivacy",
}
POSITIVE = Real(0, math.inf, low_open=True)
# each filter's arguments a job may set (the rest keep NVFlare's defaults; data_kinds is the filter's own business)
FILTER_ARGUMENTS: Mapping[str, Mapping[str, Kind]] = {
    "exclude_vars": {"exclude_vars": Text()},  # a regular expression, or a list of names (checked below)
    "percentile": {"percentile": Real(0, 100), "gamma": POSITIVE},
    "svt": {
        "fraction": Real(0, 1, low_open=True),
        "epsilon": POSITIVE,
        "noise_var": POSITIVE,
        "gamma": POSITIVE,
        "tau": Real(0, math.inf),
        "replace": Boolean(),
        "epsilon_threshold": POSITIVE,
        "epsilon_query": POSITIVE,
        "epsilon_release": POSITIVE,
    },
}
NAMES = ListOf(Text(), 1, 100_000)


def filter_setting(value) -> tuple[str, dict] | None:
    """(filter name, its arguments) of a `privacy_filter` setting, or None for none: null, "none", a filter's name
    ("percentile": NVFlare's defaults), or an object {"name": ..., <the filter's arguments>}. Anything else is a
    ValueError saying what is accepted."""
    if value is None or value == "none":
        return None
    if isinstance(value, str):
        name, arguments = value, {}
    elif isinstance(value, Mapping):
        arguments = dict(value)
        name = arguments.pop("name", None)
    else:
        raise ValueError(f"is {shown(value)}; expected a filter's name or an object with its name and arguments")
    if name not in FILTER_CLASSES:
        raise ValueError(f"names filter {shown(name)}; the filters are {', '.join(FILTER_CLASSES)} (or none)")
    kinds = FILTER_ARGUMENTS[name]
    unknown = sorted(set(arguments) - set(kinds))
    if unknown:
        raise ValueError(f"{name} takes {', '.join(kinds)}, not {', '.join(unknown)}")
    for key, item in arguments.items():
        problem = _exclusion_problem(item) if key == "exclude_vars" else kinds[key].problem(item)
        if problem:
            raise ValueError(f"{name} {key} {problem}")
    if name == "exclude_vars" and "exclude_vars" not in arguments:
        raise ValueError("exclude_vars needs exclude_vars: the names to keep on the site, or a regular expression")
    return name, arguments


def _exclusion_problem(value) -> str | None:
    """ExcludeVars' own rule: a list of names, or a regular expression (NVFlare ignores anything else silently)."""
    if isinstance(value, list):
        return NAMES.problem(value)
    if not isinstance(value, str) or not value:
        return f"is {shown(value)}; expected a list of names or a regular expression"
    try:
        re.compile(value)
    except re.error as e:
        return f"is not a regular expression: {e}"
    return None


def check_privacy_filter(value) -> None:
    """The `privacy_filter` argument's rule (fairfl.arguments): ValueError unless `filter_setting` reads it."""
    filter_setting(value)


def make_filter(value):
    """NVFlare's filter of a `privacy_filter` setting, or None for none."""
    setting = filter_setting(value)
    if setting is None:
        return None
    module, _, name = FILTER_CLASSES[setting[0]].rpartition(".")
    return getattr(importlib.import_module(module), name)(**setting[1])
