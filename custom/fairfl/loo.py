"""Leave-one-out client values: the "ground truth" of client contribution in the FedCE paper (Table 3).

A job runs once with every site and once per site with that site left out (server argument `exclude_sites`:
the site gets no train task and no aggregation weight, but is still evaluated on its test split). A site's
marginal value is how much the federation's mean test Dice over ALL sites drops without it:

    marginal(k) = mean_i Dice_i(all sites) - mean_i Dice_i(all sites but k)

It can be negative: the federation did better without the site (e.g. a free rider, or a site whose data
pulls the shared model away from the others).

`marginal_values` is the computation on results dicts; `run_leave_one_out` runs the jobs in the real NVFlare
simulator (resumable) and writes `loo.json`, which `fairfl report --loo` compares the methods' estimates with.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fairfl.fairness import normalise_abs
from fairfl.files import read_json, write_json_atomic
from fairfl.kinds import ListOf, MappingOf, Real, Record, Text, shown
from fairfl.progress import QUIET
from fairfl.simulate import run_unless_finished
from fairfl.text import markdown_text

LOO_FILE = "loo.json"
FULL_RUN = "full"
# settings that differ between the runs on purpose; everything else in their configs must be the same
VARIES = ("exclude_sites",)
# what the tables read of a loo.json (`load_loo`): the mean of the metric (0..1) with every site and without each
_MEAN = Record({"mean": Real(0.0, 1.0)}, optional={"per_site": MappingOf(Real(0.0, 1.0), "site names")})
LOO_FIELDS = {
    "sites": ListOf(Text(200), 1, 100_000),
    "metric": Text(100),
    "full": _MEAN,
    "without": MappingOf(_MEAN, "site names"),
    "marginal": MappingOf(Real(-1.0, 1.0), "site names"),
}


def final_scores(results: dict, metric: str, sites: list, who: str) -> dict:
    """{site: final metric} of a results dict for every one of `sites`; a missing one is an error."""
    per_site = (results.get("final") or {}).get("per_site") or {}
    missing = [s for s in sites if metric not in per_site.get(s, {})]
    if missing:
        raise ValueError(
            f"{who}: no final {metric} for {', '.join(missing)}"
            + ("" if results.get("final") else " (the run did not finish)")
        )
    return {s: float(per_site[s][metric]) for s in sites}


def _mean_over_sites(scores: dict) -> dict:
    return {"mean": math.fsum(scores.values()) / len(scores), "per_site": scores}


def marginal_values(full_results: dict, without_results: dict, metric: str | None = None) -> dict:
    """Leave-one-out marginal values from results dicts (results.json contents).

    full_results: the run with every site; without_results: {site: the run that left that site out}.
    Both means are over all sites of the full run, the left-out site included. metric: null = the runs' main
    metric (their results' `metric`: dice for segmentation, auc for classification).

    Returns:
        {"sites", "metric", "full": {"mean", "per_site"}, "without": {site: {"mean", "per_site"}},
         "marginal": {site: full mean - mean without the site}} (metric values as the runs record them, 0..1).
    """
    sites = list(full_results["sites"])
    metric = metric or full_results.get("metric", "dice")
    config = full_results.get("config") or {}
    if config.get("exclude_sites"):
        raise ValueError(f"the full run left out {config['exclude_sites']}; it must train with every site")
    full = _mean_over_sites(final_scores(full_results, metric, sites, "the full run"))
    without = {}
    for site, results in without_results.items():
        who = f"the run without {site}"
        other = results.get("config") or {}
        if list(other.get("exclude_sites") or []) != [site]:
            raise ValueError(f"{who} records exclude_sites={other.get('exclude_sites')!r}, not [{site!r}]")
        differing = sorted(k for k in set(config) | set(other) if k not in VARIES and config.get(k) != other.get(k))
        if differing or results.get("method") != full_results.get("method"):
            raise ValueError(f"{who} differs from the full run in {differing or ['method']}: not comparable")
        without[site] = _mean_over_sites(final_scores(results, metric, sites, who))
    return {
        "sites": sites,
        "metric": metric,
        "full": full,
        "without": without,
        "marginal": {site: full["mean"] - w["mean"] for site, w in without.items()},
    }


def load_loo(path) -> dict:
    """A loo.json written by `run_leave_one_out`, checked for the fields the report uses."""
    path = Path(path)
    if path.is_dir():
        path = path / LOO_FILE
    try:
        data = read_json(path)
    except ValueError as e:
        raise ValueError(f"{path}: not a readable leave-one-out file ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a leave-one-out file (a {type(data).__name__}, not an object)")
    missing = [k for k in LOO_FIELDS if k not in data]
    if missing:
        raise ValueError(f"{path}: leave-one-out file lacks {', '.join(missing)}")
    for key, kind in LOO_FIELDS.items():  # a file another centre sends: every field the tables read, checked
        problem = kind.problem(data[key])
        if problem:
            raise ValueError(f"{path}: {key} {problem}")
    if not data["marginal"]:
        raise ValueError(f"{path}: marginal names no site")
    unscored = [s for s in data["marginal"] if s not in data["without"]]
    if unscored:
        raise ValueError(f"{path}: marginal names sites without a run left out: {', '.join(map(shown, unscored))}")
    return {**data, "file": str(path)}


def marginal_table(loo: dict) -> str:
    """Markdown: per left-out site, the mean without it, its marginal value and its normalised share."""
    sites = list(loo["marginal"])
    marginal = np.array([loo["marginal"][s] for s in sites])
    shares = [f"{v:+.3f}" for v in normalise_abs(marginal)] if marginal.any() else ["–"] * len(sites)
    metric = markdown_text(loo["metric"])
    rows = [
        [f"mean {metric} without the site (%)", *(f"{100 * loo['without'][s]['mean']:.2f}" for s in sites)],
        ["marginal value (points)", *(f"{100 * v:+.2f}" for v in marginal)],
        ["normalised: marginal / sum of absolute marginals", *shares],
    ]
    lines = [
        f"Full federation: mean {metric} {100 * loo['full']['mean']:.2f}% over {len(loo['sites'])} sites.",
        "",
        "| | " + " | ".join(map(markdown_text, sites)) + " |",
        "|---|" + "---:|" * len(sites),
    ]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# ---------------------------------------------------------------- running the jobs


def run_leave_one_out(
    job,
    out_dir,
    n_clients: int,
    overrides: dict | None = None,
    sites=None,
    threads: int | None = None,
    metric: str | None = None,
    verbosity: int = QUIET,
) -> Path:
    """Run `job` with all `n_clients` sites and once without each of `sites` (default: all of them), then write
        `<out_dir>/loo.json` and return its path. Workspaces: `<out_dir>/runs/full`, `.../without-site-k`. `verbosity`:
    fairfl.progress's QUIET, PROGRESS (a line per round of each run) or VERBOSE (and the simulator's log)."""
    all_sites = [f"site-{k}" for k in range(1, n_clients + 1)]  # the simulator's client names for -n
    sites = list(sites or all_sites)
    unknown = sorted(set(sites) - set(all_sites))
    if unknown:
        raise ValueError(f"{unknown} are not among the {n_clients} simulator sites {all_sites}")
    out, overrides = Path(out_dir).resolve(), dict(overrides or {})
    workspaces = {FULL_RUN: out / "runs" / FULL_RUN, **{s: out / "runs" / f"without-{s}" for s in sites}}
    runs = {}
    for key, workspace in workspaces.items():
        # the full run names no site either, so a job without the argument fails before any training
        job_args = {**overrides, "exclude_sites": [] if key == FULL_RUN else [key]}
        runs[key] = run_unless_finished(job, workspace, n_clients, job_args, threads, verbosity=verbosity)
    full = runs.pop(FULL_RUN)
    loo = {
        "job": str(job),
        "overrides": overrides,
        "n_clients": n_clients,
        **marginal_values(full, runs, metric),
        "workspaces": {key: str(path) for key, path in workspaces.items()},
    }
    path = out / LOO_FILE
    write_json_atomic(str(path), loo)
    return path
