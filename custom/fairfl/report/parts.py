"""What a report is made of besides its main table: sections (a heading, a paragraph, a table from the runs) and
figures (one per group of runs, or one per run).

The report's own parts are listed in fairfl.report.document. A method unit adds the parts only its runs have
(Fed-LWR's layer weights, FedCE's contributions) in a module `fairfl.methods.<unit>.report` with a tuple `PARTS`,
which the report finds in every registered unit (`method_parts`): the report names no method."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from fairfl.methods import UNITS


@dataclass(frozen=True)
class Inputs:
    """What a section is made from: the runs, the metric reported, the leave-one-out file (None without one)."""

    runs: list
    metric: str
    loo: dict | None


@dataclass(frozen=True)
class Section:
    """A section of report.md: `## heading`, then `text(inputs)`, then the table of `table(inputs)` -> (markdown,
    statistics); ("", {}) leaves the section out. `key` names both in make_report's result (its "tables" and its
    statistics). A method unit's section comes after the section `after` names; the report's own come in their order.
    `title`: its name where `fairfl report` prints it (`printed`) and the benchmark's SUMMARY.md repeats it
    (`summarized`); default the heading."""

    key: str
    heading: str
    text: Callable[[Inputs], str]
    table: Callable[[Inputs], tuple[str, dict]]
    after: str | None = None
    title: str | None = None
    printed: bool = True
    summarized: bool = False

    @property
    def name(self) -> str:
        return self.title or self.heading


@dataclass(frozen=True)
class GroupFigure:
    """A figure of each group of runs (a method with its variant, its seeds together): `draw(group, runs, path)` ->
    the path, or None when there is nothing to draw; <out>/<kind>_<group>.png; its caption `caption(group, runs)`."""

    kind: str
    draw: Callable
    caption: Callable[[str, list], str]


@dataclass(frozen=True)
class RunFigure:
    """A figure of each run: `draw(run, path)` -> the path, or None when there is nothing to draw;
    <out>/<kind>_<method>_seed<seed>.png; its caption `caption(run)`."""

    kind: str
    draw: Callable
    caption: Callable[[dict], str]


@functools.cache
def method_parts() -> tuple:
    """The parts the method units add: each registered unit's `report` module's PARTS, the units in registry order."""
    return tuple(
        part
        for unit in UNITS
        if importlib.util.find_spec(f"{unit.package}.report")
        for part in importlib.import_module(f"{unit.package}.report").PARTS
    )


# what make_report returns besides its sections' statistics: a section of one of these keys would replace it
RESERVED_KEYS = ("report", "figures", "table", "region_tables", "loo", "tables")


def ordered(sections, added) -> list:
    """The report's own `sections` in their order, each of `added` placed after the section its `after` names (after
    the ones placed there before it). Two sections of one key, or one of a key the report returns for itself, are
    refused."""
    order = list(sections)
    for section in added:
        keys = [s.key for s in order]
        if section.key in keys or section.key in RESERVED_KEYS:
            raise ValueError(f"section {section.key!r}: the report has a section or result of that key already")
        if section.after not in keys:
            raise ValueError(f"section {section.key!r} follows {section.after!r}, which the report does not have")
        position = keys.index(section.after) + 1
        while position < len(order) and order[position].after == section.after:
            position += 1
        order.insert(position, section)
    return order
