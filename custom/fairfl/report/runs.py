"""Runs as the report reads them: the results.json files found under a path, loaded once each; which final
evaluation the tables report; the rows runs are grouped into (a method and what makes its runs incomparable with
the method's others) and how a row is named."""

from __future__ import annotations

import json
from pathlib import Path

from fairfl.methods import display_name
from fairfl.presets import ADAM_BETAS
from fairfl.report.statistics import site_scores
from fairfl.results import RESULTS_FILE, SIMULATOR_RESULTS, read_results, site_key
from fairfl.text import markdown_text

METHOD_ORDER = ("solo", "fedavg")  # then the others alphabetically
FINALS = ("last", "mean_of_last")


def find_results(path) -> list[Path]:
    """The results.json files of a file, a run directory, an NVFlare simulator workspace, or any folder (recursive)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory")
    for candidate in (path / RESULTS_FILE, path / SIMULATOR_RESULTS):
        if candidate.is_file():
            return [candidate]
    found = sorted(path.rglob(RESULTS_FILE))
    if not found:
        raise FileNotFoundError(
            f"{path}: no {RESULTS_FILE} in it or below it (expected a run directory or an NVFlare simulator workspace)"
        )
    return found


def load_runs(paths) -> list[dict]:
    """Load each results.json found under the given paths (once each); a run's file is kept under "file"."""
    files = [f for p in ([paths] if isinstance(paths, (str, Path)) else paths) for f in find_results(p)]
    runs, seen = [], set()
    for file in files:
        if file.resolve() not in seen:
            seen.add(file.resolve())
            runs.append({**read_results(file), "file": str(file)})
    return runs


def with_final(runs: list, final: str) -> list:
    """The runs with "final" as `final` says: "last" (the last round's evaluation) or "mean_of_last" (each site's
    metrics averaged over the last rounds, a run's `average_last` > 1); a run without it is a ValueError."""
    if final not in FINALS:
        raise ValueError(f"final must be one of {FINALS}, got {final!r}")
    if final == "last":
        return runs
    missing = [r["file"] for r in runs if not (r["final"] or {}).get("mean_of_last")]
    if missing:
        raise ValueError(f"no mean over the last rounds in {', '.join(missing)} (run them with average_last > 1)")
    short = [r["file"] for r in runs if len(r["final"]["mean_of_last"]["rounds"]) < r["final"]["mean_of_last"]["asked"]]
    if short:
        raise ValueError(
            f"fewer rounds evaluated than average_last asks in {', '.join(short)} (a resumed run changed its length)"
        )
    # the final record's other fields (FedCE's contributions) stay; its scores become the mean's
    return [
        {
            **r,
            "final": {
                **r["final"],
                **{k: v for k, v in r["final"]["mean_of_last"].items() if k not in ("rounds", "asked")},
            },
        }
        for r in runs
    ]


def chosen_metric(runs, metric=None) -> str:
    """The metric to report: the one asked for, else the one all runs use."""
    if not runs:
        raise ValueError("no runs to report")
    if metric:
        return metric
    names = {r["metric"] for r in runs}
    if len(names) != 1:
        raise ValueError(f"the runs use different metrics {sorted(names)}; choose one (--metric)")
    return names.pop()


def dataset_of(runs) -> str | None:
    """The built-in dataset the runs name (config "dataset"), None if none names one; mixing two is an error."""
    names = {(r.get("config") or {}).get("dataset") for r in runs} - {None}
    if len(names) > 1:
        raise ValueError(f"the runs are on different datasets {sorted(names)}: report each separately")
    return names.pop() if names else None


def region_metrics(runs, metric) -> list[str]:
    """The per-region variants of `metric` in the runs' final evaluations, e.g. dice_disc and dice_cup."""
    found = (key for r in runs for values in ((r["final"] or {}).get("per_site") or {}).values() for key in values)
    return [key for key in dict.fromkeys(found) if key.startswith(metric + "_") and not key.endswith("_se")]


def finished(runs, metric) -> list[dict]:
    """The runs whose final evaluation has the metric."""
    return [r for r in runs if site_scores(r["final"], metric)]


def sites_of(runs) -> list[str]:
    """Every site the runs name (in their sites or their final evaluation), in natural order."""
    found = {s for r in runs for s in list(r["sites"]) + list((r["final"] or {}).get("per_site") or {})}
    return sorted(found, key=site_key)


def left_out(run) -> list:
    """The sites the run held out of training (the server's `exclude_sites`)."""
    return list((run.get("config") or {}).get("exclude_sites") or [])


def free_riders(run) -> list:
    """The sites that reported themselves free riders (training metric `free_rider`; their own test switch), or
    that an older results file lists under config `free_riders`."""
    reported = {
        site
        for record in run.get("rounds") or []
        for site, metrics in (record.get("train") or {}).items()
        if (metrics or {}).get("free_rider")
    }
    return sorted(reported | set((run.get("config") or {}).get("free_riders") or []), key=site_key)


def variant_of(run) -> str:
    """What besides the method makes runs of it incomparable: a local optimiser other than Adam, a kept optimiser
    state, Adam's betas other than PyTorch's, each site scored with its local model, its free riders and left-out
    sites ("" if none)."""
    config = run.get("config") or {}
    sgd = config.get("local_optimizer", "adam") != "adam"
    betas = config.get("adam_betas", list(ADAM_BETAS))  # an older run's config has none: it ran at the default
    parts = [
        label
        for label, applies in (
            (str(config.get("local_optimizer", "")).upper(), sgd),
            ("optimiser state kept", bool(config.get("keep_optimizer_state"))),
            (f"Adam betas {json.dumps(betas)}", not sgd and betas != list(ADAM_BETAS)),
            ("local models scored", bool(config.get("score_local_model"))),
        )
        if applies
    ]
    parts += [
        prefix + ", ".join(sites)
        for sites, prefix in ((free_riders(run), "free riders: "), (left_out(run), "without "))
        if sites
    ]
    return f" ({'; '.join(parts)})" if parts else ""


def group_of(run) -> str:
    """The row a run belongs to: its method, and its variant if any, e.g. "fedce_sum (free riders: site-6)"."""
    return run["method"] + variant_of(run)


def by_method(runs) -> dict[str, list[dict]]:
    """Runs grouped by method and variant: Solo, FedAvg, then the others alphabetically; seeds in order."""

    def key(run):
        m = run["method"]
        return (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m, variant_of(run), run["seed"])

    groups = {}
    for run in sorted(runs, key=key):
        groups.setdefault(group_of(run), []).append(run)
    return groups


def group_name(group: str) -> str:
    """Display name of a method, or of a group "method (variant)", as text (figures)."""
    method, sep, variant = group.partition(" (")
    return display_name(method) + sep + variant


def group_name_markdown(group: str) -> str:
    """`group_name` as markdown (`markdown_text`)."""
    return markdown_text(group_name(group))
