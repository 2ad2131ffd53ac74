"""The server's checks of everything a site sends: one place, plain functions, no FLARE.

A site's answer is untrusted input. Every function here returns why a value cannot be used (a short reason
naming the field), or None; the round loop (`fairfl.flare.engine.FairRoundController`) rejects a site with
a reason for that round, logs it and records it under `rejected` in results.json, and goes on with the others.

What is checked: the returned model (tensors: keys, shapes, dtypes, finiteness; `check_site_state`), the
training-set size (`samples_problem`: a positive int, at most a cap and at most what the site declared in its first
round), the size of the update against the round's other sites (`norm_outliers`), training and evaluation metrics
(`metrics_problem`: names, finite numbers, evaluation scores in [0, 1]; `influence_problem`: each test patient's
influence on them), and the methods' reports: every field a
method's server reads from an answer is declared by the method (`FairRoundController.answer_fields`) as a kind
(fairfl.kinds): a `Real` (a loss, an error, a score; self-reported measurements at most MAX_REPORTED) or a `Record`
of them (a report with several numbers, one per layer), and `answer_problem` checks them all before the method sees
the answer. How much
any one site can weigh is bounded separately (`fairfl.aggregation.cap_shares`)."""

from __future__ import annotations

import math
import posixpath
import re
import statistics
from collections.abc import Mapping

import numpy as np
import torch

from fairfl.kinds import Kind, ListOf, MappingOf, Pattern, Real, Record, shown
from fairfl.uncertainty import MAX_CASES

MAX_REPORTED = 1e6  # a self-reported loss or error above this is not a measurement of these networks
MAX_SAMPLES = 10**7  # default cap on a site's training-set size (`max_samples`)
MAX_METRICS = 64  # metrics one answer may carry ...
MAX_NAME = 100  # ... and the length of their names
METRIC_NAME = re.compile(r"[\w\-. :/]+")  # what MLflow accepts as a metric name


def number_problem(value, what: str, low: float = 0.0, high: float = float("inf")) -> str | None:
    """Why a site's reported number cannot be used ("metric dice is 2.0, expected a finite number in [0, 1]": not a
    real finite number in [low, high]), or None."""
    problem = Real(low, high).problem(value)
    return f"{what} {problem}" if problem else None


def answer_problem(fields: Mapping[str, Kind], meta) -> str | None:
    """Why an answer's `meta` lacks or holds an unusable value of a field a method's server reads ({meta key: kind},
    the method's `answer_fields`), or None: every field is checked before the method sees the answer."""
    meta = meta if isinstance(meta, Mapping) else {}
    for key, kind in fields.items():
        if meta.get(key) is None:
            return f"no {key} in the answer"
        problem = kind.problem(meta[key])
        if problem:
            return f"{key} {problem}"
    return None


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_complex():
        return "complex"
    return "float" if t.is_floating_point() else "integer"


def _list(keys: list) -> str:
    keys = [str(k) for k in keys]
    return ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")


def tensor_state(params) -> tuple[dict | None, str | None]:
    """(state as {name: torch.Tensor}, None), or (None, why not) when `params` is not a mapping of names to numeric
    arrays (a string, an object array, a nested dict ...)."""
    if not isinstance(params, Mapping):
        return None, f"the model is a {type(params).__name__}, not a mapping of tensors"
    state = {}
    for name, value in params.items():
        if not isinstance(name, str):
            return None, f"a tensor name is a {type(name).__name__}: {shown(name)}"
        try:
            array = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError, RuntimeError) as e:
            return None, f"{name} is not a numeric array ({type(value).__name__}: {e})"
        state[name] = array
    return state, None


def check_site_state(state: Mapping, reference: Mapping[str, torch.Tensor]) -> str | None:
    """Why a site's state dict cannot be aggregated with `reference`'s, or None if it can.

    Checks, in this order: missing keys, unexpected keys, then per key in the reference's
    order: a tensor, the same shape, the same dtype (float32 is not float16: the aggregate would take it), and
    finite values. The reason names the first offending key, e.g. "NaN in conv1.weight".
    """
    missing = [k for k in reference if k not in state]
    if missing:
        return f"missing keys: {_list(missing)}"
    unexpected = [k for k in state if k not in reference]
    if unexpected:
        return f"unexpected keys: {_list(unexpected)}"
    for key, ref in reference.items():
        t = state[key]
        if not isinstance(t, torch.Tensor):
            return f"{key} is a {type(t).__name__}, not a tensor"
        if t.shape != ref.shape:
            return f"shape mismatch for {key}: got {tuple(t.shape)}, expected {tuple(ref.shape)}"
        if t.dtype != ref.dtype:  # exactly: the aggregate takes the first site's dtype (float16 would overflow it)
            return f"dtype mismatch for {key}: got {t.dtype} ({_kind(t)}), expected {ref.dtype} ({_kind(ref)})"
    for key in reference:
        t = state[key]
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            return f"{'NaN' if bool(torch.isnan(t).any()) else 'Inf'} in {key}"
    return None


def samples_problem(num_samples, declared: int | None, cap: int) -> str | None:
    """Why a site's training-set size cannot weigh its model: not a positive int, above `cap`, or above what the
    site `declared` in its first round (a site cannot grow its weight by claiming more data later)."""
    if isinstance(num_samples, (bool, np.bool_)) or not isinstance(num_samples, (int, np.integer)) or num_samples <= 0:
        return f"invalid num_samples {shown(num_samples)}"
    if num_samples > cap:
        return f"num_samples {num_samples} above max_samples {cap}"
    if declared is not None and num_samples > declared:
        return f"num_samples {num_samples} above the {declared} this site declared in its first round"
    return None


# evaluation metrics that are distances in mm, not scores (names ending so: hd95, global_hd95)
DISTANCE_METRICS = ("hd95",)


def metrics_problem(
    metrics, low: float = -MAX_REPORTED, high: float = MAX_REPORTED, distances: tuple = ()
) -> str | None:
    """Why a site's metrics {name: number} cannot be recorded: not a mapping, too many, a name that is not a short
    string of the characters MLflow takes (letters, digits, `_-. :/`; else MLflow refuses the whole batch of the
    run's metrics it is in), or a value that is not a finite real number in [low, high] (a name ending with one of
    `distances`: in [0, MAX_REPORTED])."""
    if metrics is None:
        return None
    if not isinstance(metrics, Mapping):
        return f"metrics are a {type(metrics).__name__}, not a mapping"
    if len(metrics) > MAX_METRICS:
        return f"{len(metrics)} metrics, more than {MAX_METRICS}"
    for name, value in metrics.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            return f"metric name {shown(name)} is not a string of 1 to {MAX_NAME} characters"
        if not METRIC_NAME.fullmatch(name):
            return f"metric name {shown(name)} has characters other than letters, digits and _-. :/"
        if not is_plain_path(name):
            return f"metric name {shown(name)} is absolute, holds '..' or '//', or is not in its plain form"
        bounds = (0.0, MAX_REPORTED) if distances and name.endswith(distances) else (low, high)
        problem = number_problem(value, f"metric {name}", *bounds)
        if problem:
            return problem
    return None


# a test split's per-patient influences on a metric (fairfl.uncertainty.case_influence_record): a score in [0, 1]
# moves by at most 1 for any patient
CASE_INFLUENCE = Record(
    {
        "cases": Pattern(r"[0-9a-f]{16}", "16 hexadecimal digits"),
        "values": ListOf(Real(-1.0, 1.0), 1, MAX_CASES),
    }
)


def influence_problem(influence, metrics: Mapping) -> str | None:
    """Why a site's test influences {metric: CASE_INFLUENCE} cannot be recorded: not such a mapping, or a metric
    the same answer does not score."""
    problem = MappingOf(CASE_INFLUENCE, "metric names").problem(influence)
    if problem:
        return f"test_influence {problem}"
    unscored = [name for name in influence if name not in metrics]
    return f"test_influence of {shown(unscored[0])}, a metric the answer does not score" if unscored else None


def is_plain_path(name: str) -> bool:
    """Whether `name` read as a relative path is already in its one plain form: not absolute, no `.` or `..`
    segment, no empty segment. MLflow (which stores metrics as files) refuses every other name, and NVFlare's MLflow
    receiver then drops the records of every site after the one that sent it."""
    plain = posixpath.normpath(name)
    return plain == name and plain != "." and not plain.startswith("..") and not plain.startswith("/")


def norm_outliers(norms: Mapping[str, float], max_ratio: float) -> dict:
    """{site: why} for the sites whose update norm is more than `max_ratio` times the round's lower median norm
    (the lower median: with two sites the larger cannot set its own bar). Nothing with max_ratio 0 (off), fewer than
    two sites or a median of 0 (nothing moved; nothing to compare with)."""
    if not max_ratio or len(norms) < 2:
        return {}
    median = statistics.median_low(norms.values())
    if median <= 0.0:
        return {}
    return {
        s: f"update norm {n:.4g} is {n / median:.3g} times the round's median {median:.4g} "
        f"(max_update_ratio {max_ratio:g})"
        for s, n in norms.items()
        if n > max_ratio * median
    }


def distance(state: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor]) -> float:
    """||state - start|| over the floating-point tensors of `start`: the size of a site's update."""
    return math.sqrt(
        math.fsum(
            float(torch.sum((state[k].double() - t.double()) ** 2)) for k, t in start.items() if t.is_floating_point()
        )
    )
