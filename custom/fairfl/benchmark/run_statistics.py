"""What a benchmark's outputs say of its finished runs besides the tables of `fairfl report`: each run's final Avg.
or Std., the test splits' standard errors, the aggregation weights, what the sites reported, the round times."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

from fairfl.jobconfig import is_job_copy, job_arguments
from fairfl.presets import TASK_DEFAULTS, apply_preset
from fairfl.report.statistics import avg_std, site_scores
from fairfl.results import site_key


def final_stat(run: dict, metric: str, statistic: str) -> float | None:
    """A run's final Avg. or Std. across sites of `metric`, in percent; None when it has no final metric."""
    scores = site_scores(run.get("final"), metric)
    if not scores:
        return None
    avg, std = avg_std(scores)
    return avg if statistic == "avg" else std


def per_site_mean(runs: list, metric: str) -> dict:
    """{site: final metric (%) averaged over the runs (seeds)}."""
    sites = sorted({s for r in runs for s in site_scores(r.get("final"), metric)}, key=site_key)
    return {
        s: statistics.mean(site_scores(r["final"], metric)[s] for r in runs if s in site_scores(r["final"], metric))
        for s in sites
    }


def test_split_errors(runs_by_method: dict, metric: str) -> dict:
    """{site: mean over every run of the standard error of the site's final `metric` on its own test split}, in
    points (`fairfl.uncertainty`; runs that recorded none are left out): how precisely the test split measures
    the site, whatever the method."""
    errors = {}
    for runs in runs_by_method.values():
        for run in runs:
            for site, values in ((run.get("final") or {}).get("per_site") or {}).items():
                if isinstance(values.get(f"{metric}_se"), (int, float)):
                    errors.setdefault(site, []).append(100 * values[f"{metric}_se"])
    return {site: statistics.mean(v) for site, v in sorted(errors.items(), key=lambda item: site_key(item[0]))}


def mean_weights(runs: list) -> dict:
    """{site: its aggregation weight averaged over the rounds of each run, then over the runs} for a method whose
    rounds record one: Fed-LWR's layer weights (first averaged over the layers), else `weights` (FedAvg's sample
    shares, FedCE's contributions, SAGA's weights, ...); {} when none is recorded."""
    per_run = []
    for run in runs:
        sums = {}
        for record in run.get("rounds") or []:
            layers = record.get("layer_weights")
            shares = (
                {
                    s: statistics.mean(w[s] for w in layers.values() if s in w)
                    for s in {s for w in layers.values() for s in w}
                }
                if layers
                else record.get("weights") or {}
            )
            for site, share in shares.items():
                if isinstance(share, (int, float)):
                    sums.setdefault(site, []).append(share)
        if sums:
            per_run.append({site: statistics.mean(v) for site, v in sums.items()})
    sites = sorted({s for r in per_run for s in r}, key=site_key)
    return {site: statistics.mean(r[site] for r in per_run if site in r) for site in sites}


# what a method's sites report while training that says whether the method acts: train-record key -> label
DIAGNOSTICS = {"npr_grad_ratio": "NPR/BSM gradient ratio (FedNPR: ||d(lambda NPR)/dz|| / ||d BSM/dz||)"}


def train_diagnostics(runs: list) -> dict:
    """{key: median over sites, rounds and runs} of the DIAGNOSTICS keys the runs' train records hold."""
    values = {}
    for run in runs:
        for record in run.get("rounds") or []:
            for metrics in (record.get("train") or {}).values():
                for key in DIAGNOSTICS:
                    if isinstance((metrics or {}).get(key), (int, float)):
                        values.setdefault(key, []).append(metrics[key])
    return {key: statistics.median(v) for key, v in values.items()}


def round_seconds_median(runs: list) -> float | None:
    """Median seconds of the rounds that were not evaluated (of all rounds if every one was), round 0 (process
    start-up) left out."""
    rounds = [r for run in runs for r in run["rounds"][1:]]
    seconds = [r["seconds"] for r in rounds if "per_site" not in r] or [r["seconds"] for r in rounds]
    return statistics.median(seconds) if seconds else None


# the sites' job arguments that decide what data they read, as SUMMARY.md's header shows them: a data root's images
# are resized to image_size, whatever size they were written at
SITE_SETTINGS = ("image_size", "data_root", "synthetic_size_scale", "test_scale")


def site_settings(workspace, run: dict) -> dict:
    """{SITE_SETTINGS key: value} a run's sites used: the job copy it was written from (<workspace>_job,
    fairfl.simulate) under the server's settings as its results recorded them, a null resolved to the task's
    default and the recorded preset applied as the sites apply it (fairfl.presets); keys neither records left out."""
    job_copy = f"{workspace}_job"
    written = {**(job_arguments(job_copy) if is_job_copy(job_copy) else {}), **(run.get("config") or {})}
    values = SimpleNamespace(**{key: written.get(key) for key in SITE_SETTINGS})
    if run.get("task") in TASK_DEFAULTS:
        apply_preset(values, written.get("preset_env") or written.get("preset") or "", run["task"])
    return {key: value for key, value in vars(values).items() if value is not None}


def shared_settings(settings: list) -> dict:
    """{key: the value every run had, or the sorted list of the values they had} over the runs' site_settings."""
    keys = sorted({k for s in settings for k in s}, key=SITE_SETTINGS.index)
    shared = {}
    for key in keys:
        values = sorted({json.dumps(s.get(key)) for s in settings})
        shared[key] = json.loads(values[0]) if len(values) == 1 else [json.loads(v) for v in values]
    return shared
