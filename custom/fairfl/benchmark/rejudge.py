"""The claims of a benchmark's outputs judged again without its runs' workspaces: from the results.csv of each
metric, summary.json and SUMMARY.md rewritten in place."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from fairfl.benchmark.checks import training_checks, warnings_section, with_warnings
from fairfl.benchmark.claims import CLAIMS_HEADING, NOT_JUDGED, check_claims, claims_section, judged
from fairfl.data.builtin import shared_test_set
from fairfl.methods import VARIANTS, family_claims
from fairfl.paired import Interval
from fairfl.report.runs import group_name_markdown, variant_of
from fairfl.results import read_results


def registry_variants() -> dict:
    """{(method as its runs record it, variant column of results.csv): registry name} of the registry's variants that
    a results.csv tells apart only by the variant column (fedavg_sgd: fedavg, "SGD")."""
    found = {}
    for name, variant in VARIANTS.items():
        label = variant_of({"config": dict(variant.arguments)}).strip(" ()")
        if label:
            found[variant.records, label] = name
    return found


def runs_from_csv(files) -> dict:
    """{method: [run records with their final per-site values]} rebuilt from `fairfl report` results.csv files
    (one row per method, seed and site; one file per metric), to judge runs again without their workspaces. A row of
    a registry variant (registry_variants) counts as that variant's; any other variant (free riders, ...) is left
    out."""
    variants, records = registry_variants(), {}
    for file in map(Path, files):
        try:
            rows = list(csv.DictReader(file.open(newline="")))
        except OSError as e:
            raise ValueError(f"{file}: {e}") from e
        for number, row in enumerate(rows, 2):
            key = (row.get("method"), row.get("variant"))
            if (row.get("variant") and key not in variants) or row.get("site") in ("mean", "std", "worst"):
                continue  # another variant's runs are not the method's; the summary rows are recomputed
            try:
                method = variants.get(key, row["method"])
                seed, site, value = int(row["seed"]), row["site"], float(row["percent"]) / 100
                metric = row["metric"]
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{file}, line {number}: not a results row ({e})") from e
            record = records.setdefault((method, seed), {"method": method, "seed": seed, "final": {"per_site": {}}})
            record["final"]["per_site"].setdefault(site, {})[metric] = value
            if "test_influence" not in record["final"]:
                record["final"]["test_influence"] = test_influence(row.get("file"))
    by_method = {}
    for (method, _), record in sorted(records.items()):
        by_method.setdefault(method, []).append(record)
    return by_method


def test_influence(path) -> dict:
    """The final test influences a run's results file records, where it is still here ({} otherwise: the runs'
    workspaces are not committed)."""
    if not path or not os.path.isfile(path):
        return {}
    try:
        return read_results(path)["final"].get("test_influence") or {}
    except (ValueError, KeyError, AttributeError, TypeError):
        return {}


def kept(checked: dict, claim, untrained) -> dict:
    """A claim of the outputs whose metric has no results.csv there: judged again on the interval the outputs kept
    (the rules may have changed since), or not judged without one."""
    checked = {**checked}
    checked.pop("reason", None)
    if claim is None or checked.get("interval") is None:
        return {**checked, "differences": {}, "interval": None, "verdict": NOT_JUDGED, "reason": "no per-seed values"}
    verdict, reason = judged(claim, Interval.from_json(checked["interval"]), untrained)
    checked.update(claim=claim.text(group_name_markdown), verdict=verdict, **({"reason": reason} if reason else {}))
    return checked


def rejudge(out) -> dict:
    """Judge the claims of the benchmark outputs in `out` again from its results.csv files and rewrite the claims
    and the warnings (fairfl.benchmark.checks) of summary.json and SUMMARY.md, the claims in the order they had; a
    claim on a metric without per-seed values there is kept, not judged."""
    out = Path(out)
    try:
        summary = json.loads((out / "summary.json").read_text())
        text = (out / "SUMMARY.md").read_text()
    except (OSError, ValueError) as e:
        raise ValueError(f"{out}: no benchmark outputs to judge ({e})") from e
    runs = runs_from_csv(out / metric / "results.csv" for metric in summary["metrics"])
    summary["warnings"] = training_checks(runs, summary["metrics"])
    shared = shared_test_set(summary.get("dataset", ""), summary.get("data_root"))
    key = lambda c: (c["method"], c["baseline"], c["metric"], c["statistic"])  # noqa: E731
    registry = {(c.method, c.baseline, c.metric, c.statistic): c for c in family_claims(summary["family"])}
    untrained = summary["warnings"]["did_not_train"]
    committed = {key(c): c for c in summary.get("claims", [])}
    # a claim whose interval counted the test splits, now without the runs' influences to count them: kept as it was
    claims = [
        kept(committed[key(c)], registry.get(key(c)), untrained)
        if c["interval"].get("split_se") is None and (committed.get(key(c), {}).get("interval") or {}).get("split_se")
        else c
        for c in check_claims(family_claims(summary["family"]), runs, shared)
    ]
    judged_now = {key(c) for c in claims}
    claims += [kept(c, registry.get(key(c)), untrained) for c in summary.get("claims", []) if key(c) not in judged_now]
    # the outputs' own order first (a rejudge changes verdicts, not the layout), then the registry's
    order = list(
        dict.fromkeys(
            [
                *(key(c) for c in summary.get("claims", [])),
                *((c.method, c.baseline, c.metric, c.statistic) for c in family_claims(summary["family"])),
            ]
        )
    )
    summary["claims"] = sorted(claims, key=lambda c: order.index(key(c)) if key(c) in order else len(order))
    for c in summary["claims"]:
        c.pop("holds", None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    head = text.split("\n" + CLAIMS_HEADING + "\n")[0].rstrip("\n")
    head = with_warnings(head, warnings_section(summary["warnings"], summary["metrics"])).rstrip("\n")
    (out / "SUMMARY.md").write_text("\n".join([head, *claims_section(summary["claims"])]) + "\n")
    return summary
