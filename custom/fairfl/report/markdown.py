"""The cells and the layout of the report's markdown tables."""

from __future__ import annotations

import numpy as np


def cell(stat, bold=False, digits=2) -> str:
    """A (mean, sd or None) statistic as "mean ± sd" or "mean"; "–" for None."""
    if stat is None:
        return "–"
    mean, sd = stat
    text = f"{mean:.{digits}f}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"
    return f"**{text}**" if bold else text


def table_lines(header, rows) -> list[str]:
    """Lines of a markdown table: the first column left-aligned, the others right-aligned."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" + "---:|" * (len(header) - 1),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def number_cell(value, spec, best=None) -> str:
    """A value formatted with `spec`; bold if it equals `best` as printed; "–" if undefined (NaN)."""
    if value is None or not np.isfinite(value):
        return "–"
    text = format(value, spec)
    return f"**{text}**" if best is not None and text == format(best, spec) else text


def best_of(values, pick):
    """`pick` (min or max) of the finite values; None without any."""
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return pick(finite) if finite else None


def pearson_cell(stat, best=None) -> str:
    """ "r (p)" as in the papers' tables, e.g. "0.982 (4.6e-04)"."""
    if not np.isfinite(stat["pearson"]):
        return "–"
    return f"{number_cell(stat['pearson'], '.3f', best)} ({stat['p_value']:.1e})"
