"""The results file every run writes: `results.json` in the server's run workspace (schema in docs/results.md)."""

from __future__ import annotations

import json
import math
import os
import re
import time
from typing import NamedTuple

from fairfl.fairness import summarize
from fairfl.files import write_json_atomic

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"
# where the results file lies inside an `nvflare simulator` workspace
SIMULATOR_RESULTS = os.path.join("server", "simulate_job", RESULTS_FILE)
# a personalised method's site (scored with a model of its own) also scores the global model it received: each of
# that evaluation's metrics under this prefix (global_dice, global_auc, ...) beside its own
GLOBAL_PREFIX = "global_"


def site_key(site: str) -> list:
    """Sort key of site names in natural order: site-2 before site-10 (a run of decimal digits is a number; a
    superscript or other digit-like character, which int() refuses, stays text)."""
    return [int(t) if t.isdecimal() else t for t in re.split(r"(\d+)", site)]


class ResultsLog:
    """Accumulates per-round records and rewrites the file after each one, so a crash loses at most a round."""

    def __init__(
        self, path: str, method: str, task: str, metric: str, seed: int, sites: list, config: dict, held_out=()
    ):
        """held_out: the sites held out of training (the server's `exclude_sites`), scored with the global model: every
        evaluated record summarises them apart from the federation's sites as well."""
        self.path = path
        self.held_out = sorted(held_out, key=site_key)
        self.data = {
            "schema": SCHEMA_VERSION,
            "method": method,
            "task": task,
            "metric": metric,
            "seed": seed,
            "sites": sorted(sites, key=site_key),
            "held_out_sites": self.held_out,
            "config": config,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "rounds": [],
            "final": None,
        }

    def add_round(self, round_num: int, seconds: float, per_site: dict | None = None, **extras) -> dict:
        """per_site: {site: {metric: value, ...}} when the round was evaluated; extras: weights, rejected, ..."""
        record = {"round": round_num, "seconds": round(seconds, 3)}
        if per_site:
            record.update(self._scored(per_site))
        record.update({k: v for k, v in extras.items() if v is not None})
        self.data["rounds"].append(record)
        self.write()
        return record

    def stop(self, round_num: int, seconds: float, reason: str, **extras) -> None:
        """The run ends early in round `round_num` (too few sites answered): that round's record holds why."""
        self.add_round(round_num, seconds, stopped=reason, **extras)
        self.data["stopped"] = reason
        self.write()

    def finish(self, per_site: dict, **extras) -> dict:
        self.data["final"] = {**self._scored(per_site), **{k: v for k, v in extras.items() if v is not None}}
        self.write()
        return self.data["final"]

    def mean_of_last(self, last_round: int, count: int) -> dict | None:
        """Each site's metrics averaged over the evaluated rounds among the `count` rounds up to `last_round` (a site
        counts the rounds it was scored in), scored like a round, with the rounds used and `count` ("asked": fewer
        rounds than asked were evaluated when a resumed run changed its length); None when none was evaluated."""
        records = [
            r for r in self.data["rounds"] if last_round - count < r["round"] <= last_round and r.get("per_site")
        ]
        if not records:
            return None
        values = {}
        for record in records:
            for site, metrics in record["per_site"].items():
                for name, value in metrics.items():
                    if isinstance(value, (int, float)) and value == value:  # NaN: nothing scored that round
                        values.setdefault(site, {}).setdefault(name, []).append(float(value))
        per_site = {site: {name: sum(v) / len(v) for name, v in metrics.items()} for site, metrics in values.items()}
        return {"rounds": [r["round"] for r in records], "asked": count, **self._scored(per_site)}

    def cross_site(self, round_num: int, matrix: dict, **extras) -> dict:
        """Record the cross-site evaluation after round `round_num`: matrix {model's site: {test site: main metric}};
        adds each model's score on its own site's test split (`own`, the diagonal) and its mean over the other sites
        (`on_others`, generalisation); extras (rejected, absent, failed, declined: the sites whose own setting keeps
        their model at home) where not empty."""
        models = sorted(matrix, key=site_key)
        others = {m: [v for s, v in matrix[m].items() if s != m] for m in models}
        self.data["cross_site"] = {
            "round": round_num,
            "metric": self.data["metric"],
            "models": models,
            "sites": sorted({s for row in matrix.values() for s in row}, key=site_key),
            "matrix": {m: {s: matrix[m][s] for s in sorted(matrix[m], key=site_key)} for m in models},
            "own": {m: matrix[m][m] for m in models if m in matrix[m]},
            "on_others": {m: sum(v) / len(v) for m, v in others.items() if v},
            **{k: v for k, v in extras.items() if v},
        }
        self.write()
        return self.data["cross_site"]

    def _scored(self, per_site: dict) -> dict:
        """The record's per-site metrics and the main metric's fairness summary over every site scored; with held-out
        sites, the summary of the federation's sites (`federation`) and of the held-out ones (`held_out`) apart; with
        global-model scores (GLOBAL_PREFIX), their summary over the federation's sites (`global_model`)."""
        metric = self.data["metric"]
        summary = _summary(per_site, metric)
        record = {"per_site": {s: per_site[s] for s in sorted(per_site, key=site_key)}}
        record.update({k: v for k, v in summary.items() if k != "sites"})
        federation = {s: m for s, m in per_site.items() if s not in self.held_out}
        if self.held_out:
            record["federation"] = _summary(federation, metric)
            record["held_out"] = _summary({s: m for s, m in per_site.items() if s in self.held_out}, metric)
        global_model = _summary(federation, GLOBAL_PREFIX + metric)
        if global_model["sites"]:
            record["global_model"] = global_model
        return record

    def write(self) -> None:
        """Atomically, NaN/Inf as null (`fairfl.files.write_json_atomic`)."""
        write_json_atomic(self.path, self.data)


def _summary(per_site: dict, metric: str) -> dict:
    """{"sites": the sites that have `metric`, in site order, **`summarize` of their values} ({"sites": []} when none
    has)."""
    # in site order, not the order answers arrived: equal scores name the same worst site every run
    scores = {site: per_site[site][metric] for site in sorted(per_site, key=site_key) if metric in per_site[site]}
    return {"sites": list(scores), **(summarize(scores) if scores else {})}


# ---------------------------------------------------------------- reading: what a results file must hold
# A results file may come from another centre: before anything reads it, every field the report reads is checked for
# its kind, and the first one that is not what docs/results.md says is named with the file. Fields not listed are
# not read, and so not checked (new fields may be added).


class ListOf(NamedTuple):
    item: object


class MapOf(NamedTuple):  # a JSON object of any keys (site names, layer names, metric names)
    value: object


class Nullable(NamedTuple):
    spec: object


class Record(NamedTuple):  # a JSON object with these optional fields (others unread); `required` must be there
    fields: dict
    required: tuple = ()


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a key named .key in an error; any other ["key"]
NUMBER = "a number"  # an int or a float, not true/false, small enough for a float
ANY = "anything"
COUNT = "a whole number"  # an int in [0, MAX_COUNT]: round numbers and counts the figures plot
MAX_COUNT = 10**9
SHARE = "a share"  # a number in [0, 1]: weights and contributions
SCORES = MapOf(MapOf(Nullable(NUMBER)))  # {site: {metric: value}}; null: a NaN as the server writes it
WEIGHTS = MapOf(SHARE)  # {site: weight}
SCORED = {"per_site": SCORES}  # an evaluated record's fields the report reads
CONTRIBUTIONS = {"contributions": WEIGHTS, "contribution_terms": MapOf(MapOf(Nullable(NUMBER)))}
# {site: {metric: {"cases": fingerprint, "values": [each test patient's influence]}}} (fairfl.uncertainty)
TEST_INFLUENCE = MapOf(MapOf(Record({"cases": str, "values": ListOf(NUMBER)}, ("cases", "values"))))
RESULTS_SCHEMA = Record(
    {
        "schema": int,
        "method": str,
        "task": str,
        "metric": str,
        "seed": int,
        "sites": ListOf(str),
        "held_out_sites": ListOf(str),
        "config": Nullable(
            Record(
                {
                    "exclude_sites": Nullable(ListOf(str)),
                    "free_riders": Nullable(ListOf(str)),
                    "local_optimizer": Nullable(str),
                    "dataset": Nullable(str),
                }
            )
        ),
        "rounds": ListOf(
            Record(
                {
                    "round": COUNT,
                    "seconds": NUMBER,
                    **SCORED,
                    "train": MapOf(Nullable(MapOf(ANY))),
                    "weights": WEIGHTS,
                    "layer_weights": MapOf(WEIGHTS),
                    **CONTRIBUTIONS,
                    "rejected": MapOf(ANY),
                    "test_influence": TEST_INFLUENCE,
                },
                required=("round",),
            )
        ),
        "cross_site": Nullable(
            Record(
                {
                    "models": ListOf(str),
                    "sites": ListOf(str),
                    "matrix": MapOf(MapOf(Nullable(NUMBER))),
                    "own": MapOf(Nullable(NUMBER)),
                    "on_others": MapOf(Nullable(NUMBER)),
                },
                required=("matrix",),
            )
        ),
        "final": Nullable(
            Record(
                {
                    **SCORED,
                    **CONTRIBUTIONS,
                    "test_influence": TEST_INFLUENCE,
                    "mean_of_last": Record({"rounds": ListOf(COUNT), "asked": COUNT, **SCORED}, ("rounds", "asked")),
                }
            )
        ),
    },
    required=("schema", "method", "metric", "seed", "sites", "rounds", "final"),
)


def read_results(path) -> dict:
    """The results file at `path`, parsed and checked (`check_results`); a ValueError naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep to parse
        raise ValueError(f"{path}: not a readable results file ({type(e).__name__}: {e})") from None
    return check_results(data, str(path))


def check_results(data, name: str) -> dict:
    """`data` if it holds what a results file must (`RESULTS_SCHEMA`, schema SCHEMA_VERSION); else a ValueError naming
    `name` and the first field that does not, e.g. `results.json: rounds[3].per_site["site-2"].dice is a string,
    not a number`."""
    if not isinstance(data, dict):
        raise ValueError(f"{name}: not a results file ({_kind(data)}, not an object)")
    if data.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{name}: results schema {data.get('schema')!r}; this fairfl reads schema {SCHEMA_VERSION}")
    _check(data, RESULTS_SCHEMA, name, "")
    return data


def _check(value, spec, name: str, where: str) -> None:
    if isinstance(spec, Nullable):
        if value is not None:
            _check(value, spec.spec, name, where)
    elif isinstance(spec, (ListOf, MapOf, Record)):
        wanted = list if isinstance(spec, ListOf) else dict
        if not isinstance(value, wanted):
            raise ValueError(f"{name}: {where or 'the file'} is {_kind(value)}, not {WANTED[wanted]}")
        if isinstance(spec, ListOf):
            for i, item in enumerate(value):
                _check(item, spec.item, name, f"{where}[{i}]")
        elif isinstance(spec, MapOf):
            for key, item in value.items():
                _check(
                    item,
                    spec.value,
                    name,
                    f"{where}.{key}" if IDENTIFIER.fullmatch(key) else f"{where}[{json.dumps(key)}]",
                )
        else:
            missing = [key for key in spec.required if key not in value]
            if missing:
                raise ValueError(f"{name}: {where or 'the file'} lacks {', '.join(missing)}")
            for key, field in spec.fields.items():
                if key in value:
                    _check(value[key], field, name, f"{where}.{key}" if where else key)
    elif spec in (NUMBER, SHARE, COUNT):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{name}: {where} is {_kind(value)}, not a number")
        if not math.isfinite(_as_float(value)):  # NaN and Infinity literals, or an int beyond a float
            raise ValueError(f"{name}: {where} is {_kind(value)}, not a finite number")
        if spec is SHARE and not 0 <= value <= 1:
            raise ValueError(f"{name}: {where} is {_kind(value)}, not a share in [0, 1]")
        if spec is COUNT and (not isinstance(value, int) or not 0 <= value <= MAX_COUNT):
            raise ValueError(f"{name}: {where} is {_kind(value)}, not a whole number in [0, {MAX_COUNT}]")
    elif spec is not ANY and (not isinstance(value, spec) or isinstance(value, bool)):
        raise ValueError(f"{name}: {where} is {_kind(value)}, not {WANTED[spec]}")


def _as_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


WANTED = {str: "a string", int: "an integer", list: "a list", dict: "an object"}


def _kind(value) -> str:
    """How a JSON value is named in an error: "a string", "the number 1.5", "an object", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"the number {text if len(text) <= 20 else text[:20] + '...'}"
    return WANTED.get(type(value), type(value).__name__)
