"""The claims of a benchmark's outputs judged again without its runs' workspaces: from the results.csv of each
metric, summary.json and SUMMARY.md rewritten in place."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fairfl.benchmark.claims import CLAIMS_HEADING, check_claims, claims_section
from fairfl.methods import family_claims
from fairfl.paired import INCONCLUSIVE


def runs_from_csv(files) -> dict:
    """{method: [run records with their final per-site values]} rebuilt from `fairfl report` results.csv files
    (one row per method, seed and site; one file per metric), to judge runs again without their workspaces."""
    records = {}
    for file in map(Path, files):
        try:
            rows = list(csv.DictReader(file.open(newline="")))
        except OSError as e:
            raise ValueError(f"{file}: {e}") from e
        for number, row in enumerate(rows, 2):
            if row.get("variant") or row.get("site") in ("mean", "std", "worst"):
                continue  # a variant's runs are not the method's; the summary rows are recomputed
            try:
                method, seed, site, value = row["method"], int(row["seed"]), row["site"], float(row["percent"]) / 100
                metric = row["metric"]
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{file}, line {number}: not a results row ({e})") from e
            record = records.setdefault((method, seed), {"method": method, "seed": seed, "final": {"per_site": {}}})
            record["final"]["per_site"].setdefault(site, {})[metric] = value
    by_method = {}
    for (method, _), record in sorted(records.items()):
        by_method.setdefault(method, []).append(record)
    return by_method


def rejudge(out) -> dict:
    """Judge the claims of the benchmark outputs in `out` again from its results.csv files and rewrite the claims
    of summary.json and SUMMARY.md, in the order they had; a claim on a metric without per-seed values there is kept,
    inconclusive."""
    out = Path(out)
    try:
        summary = json.loads((out / "summary.json").read_text())
        text = (out / "SUMMARY.md").read_text()
    except (OSError, ValueError) as e:
        raise ValueError(f"{out}: no benchmark outputs to judge ({e})") from e
    runs = runs_from_csv(out / metric / "results.csv" for metric in summary["metrics"])
    claims = check_claims(family_claims(summary["family"]), runs)
    key = lambda c: (c["method"], c["baseline"], c["metric"], c["statistic"])  # noqa: E731
    judged = {key(c) for c in claims}
    claims += [
        {**c, "differences": {}, "interval": None, "verdict": INCONCLUSIVE}
        for c in summary.get("claims", [])
        if key(c) not in judged
    ]
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
    (out / "SUMMARY.md").write_text("\n".join([head, *claims_section(summary["claims"])]) + "\n")
    return summary
