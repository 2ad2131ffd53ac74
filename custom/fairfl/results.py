"""The results file every run writes: `results.json` in the server's run workspace (schema in docs/results.md)."""

from __future__ import annotations

import os
import re
import time

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
    """Sort key of site names in natural order: site-2 before site-10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", site)]


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
        (`on_others`, generalisation); extras (rejected, absent, failed) where not empty."""
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
