"""`fairfl report`: the papers' results table and figures from one or more runs' results.json files.

The command line of the report (`fairfl report`, or `python -m fairfl.report.command`): it writes report.md,
results.csv and the figures (fairfl.report.document) and prints the tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fairfl.overwrite import refuse_to_overwrite
from fairfl.report.document import make_report, report_sections
from fairfl.report.runs import FINALS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="WS",
        help="results.json file, run directory, simulator workspace, or folder searched recursively",
    )
    parser.add_argument(
        "--out",
        help="output folder (default: <first input>/report, or beside its results file); "
        "not a non-empty one without --force",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into a non-empty --out folder (same names replaced)"
    )
    parser.add_argument("--metric", help="metric to report (default: the one the runs record)")
    parser.add_argument(
        "--loo",
        metavar="PATH",
        help="leave-one-out file (loo.json of `fairfl leave-one-out`) to compare the methods' "
        "contribution estimates with (the FedCE paper's Table 3)",
    )
    parser.add_argument(
        "--final",
        choices=FINALS,
        default="last",
        help="the tables' final result: the last round's evaluation (default) or, for runs with "
        "average_last > 1, each site's mean over the last rounds (FedISM+'s reporting)",
    )


def run(args) -> int:
    problem = args.out and refuse_to_overwrite(args.out, args.force, "output folder")
    if problem:
        print(f"fairfl report: {problem}", file=sys.stderr)
        return 1
    first = Path(args.inputs[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "report"
    try:
        result = make_report(args.inputs, out, args.metric, args.loo, args.final)
    except (OSError, ValueError) as e:
        print(f"fairfl report: {e}", file=sys.stderr)
        return 1
    print(result["table"])
    for section in report_sections():
        if section.printed and result["tables"][section.key]:
            print(f"\n{section.name}:\n{result['tables'][section.key]}")
    print(f"\nreport: {result['report']}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fairfl report", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
