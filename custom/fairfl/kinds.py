"""Kinds of values: what a value read from another party may be, said once for the whole package.

Three readers check values against these kinds: a component's job arguments (fairfl.arguments), the server's task as
a site reads it (fairfl.methods.steps: each client step declares the task fields it reads) and a site's answer as the
server reads it (fairfl.site_checks: each controller declares the fields it reads, `answer_fields`). A kind says
whether it `allows` a value, says itself in words (`str`), and why a value is not of it (`problem`: "is nan, expected
a finite number in [0, 1]"); the declarations of answers also give an honest `example` and their numbers' paths
(`leaves`), so the tests can fuzz every field a method reads without knowing the method.

No torch, FLARE or package import: the command line checks a job with it before anything starts."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping


def shown(value) -> str:
    """A value as a message shows it: its repr, cut to 80 characters (an int too long to print: its size)."""
    try:
        text = repr(value)
    except ValueError:  # an integer beyond Python's 4300 digits of text
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 80 else text[:77] + "..."


def _is_bool(value) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy's bool is not a Python bool


class Kind:
    """What a value may be; subclasses say `allows` and `__str__`."""

    def allows(self, value) -> bool:
        return self.problem(value) is None

    def problem(self, value) -> str | None:
        """Why `value` is not of this kind ("is nan, expected a finite number in [0, 1]"), or None."""
        return None if self.allows(value) else f"is {shown(value)}, expected {self}"

    def checked(self, name: str, value):
        """`value` if it is of this kind, else a ValueError naming `name` (a job argument, a task field) and why."""
        problem = self.problem(value)
        if problem:
            raise ValueError(f"{name} {problem}")
        return value

    def example(self):
        """An honest value (the tests build honest answers from the declarations)."""
        raise NotImplementedError(f"{type(self).__name__} has no example")

    def leaves(self, path: tuple = ()):
        """(path inside the value, kind) of every value a reader checks in it: here, the value itself."""
        yield path, self


@dataclasses.dataclass(frozen=True)
class Integer(Kind):
    """A whole number (never a bool) in [low, high], compared exactly however large."""

    low: int
    high: int

    def allows(self, value) -> bool:
        return isinstance(value, numbers.Integral) and not _is_bool(value) and self.low <= value <= self.high

    def example(self) -> int:
        return min(max(1, self.low), self.high)

    def __str__(self):
        return f"an integer in [{self.low}, {self.high}]"


@dataclasses.dataclass(frozen=True)
class Real(Kind):
    """A finite number (an int too, never a bool) in [low, high], either end open."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def allows(self, value) -> bool:
        if _is_bool(value) or not isinstance(value, numbers.Real):
            return False
        try:
            number = float(value)
        except OverflowError:  # an int beyond float's range
            return False
        return (
            math.isfinite(number)
            and (self.low < number if self.low_open else self.low <= number)
            and (number < self.high if self.high_open else number <= self.high)
        )

    def example(self) -> float:
        return min(max(0.5, self.low), self.high)

    def __str__(self):
        return (
            f"a finite number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
            f"{')' if self.high_open else ']'}"
        )


@dataclasses.dataclass(frozen=True)
class Boolean(Kind):
    def allows(self, value) -> bool:
        return isinstance(value, bool)

    def example(self) -> bool:
        return True

    def __str__(self):
        return "true or false"


@dataclasses.dataclass(frozen=True)
class OneOf(Kind):
    choices: tuple

    def allows(self, value) -> bool:
        return isinstance(value, str) and value in self.choices

    def example(self):
        return self.choices[0]

    def __str__(self):
        return "one of " + ", ".join(json.dumps(c) for c in self.choices)


@dataclasses.dataclass(frozen=True)
class Text(Kind):
    """A string (a path, a free text) of at most `longest` characters, without NUL."""

    longest: int = 4096

    def allows(self, value) -> bool:
        return isinstance(value, str) and len(value) <= self.longest and "\0" not in value

    def __str__(self):
        return f"a string of at most {self.longest} characters"


@dataclasses.dataclass(frozen=True)
class Pattern(Kind):
    regex: str
    what: str

    def allows(self, value) -> bool:
        return isinstance(value, str) and re.fullmatch(self.regex, value) is not None

    def __str__(self):
        return self.what


@dataclasses.dataclass(frozen=True)
class Checked(Kind):
    """What a rule kept elsewhere accepts (fairfl.quorum.check_min_clients, FedNPR's settings): `function(value)`
    raises ValueError (or TypeError) for anything else, or with `reports` returns why not (None when it accepts);
    `what` says in words what it accepts."""

    function: Callable
    what: str
    reports: bool = False

    def problem(self, value) -> str | None:
        try:
            why = self.function(value)
        except (TypeError, ValueError) as e:
            why = str(e) or type(e).__name__
        else:
            why = why if self.reports else None
        return f"is not usable: {why}" if why else None

    def __str__(self):
        return self.what


@dataclasses.dataclass(frozen=True)
class Nullable(Kind):
    kind: Kind

    def allows(self, value) -> bool:
        return value is None or self.kind.allows(value)

    def __str__(self):
        return f"null or {self.kind}"


@dataclasses.dataclass(frozen=True)
class ListOf(Kind):
    """A list of `shortest` to `longest` items of kind `item`; `distinct`: no item twice; `increasing`: each above the
    one before."""

    item: Kind
    shortest: int
    longest: int
    distinct: bool = False
    increasing: bool = False

    def allows(self, value) -> bool:
        if not isinstance(value, (list, tuple)) or not self.shortest <= len(value) <= self.longest:
            return False
        if not all(self.item.allows(v) for v in value):
            return False
        if self.distinct and len(set(value)) != len(value):
            return False
        return not self.increasing or all(a < b for a, b in zip(value, value[1:], strict=False))

    def __str__(self):
        count = f"{self.shortest}" if self.shortest == self.longest else f"{self.shortest} to {self.longest}"
        extra = ", all different" * self.distinct + ", increasing" * self.increasing
        return f"a list of {count} items, each {self.item}{extra}"


@dataclasses.dataclass(frozen=True)
class MappingOf(Kind):
    """An object of names (`what` they are: "site names") to values of kind `value`, any number of them."""

    value: Kind
    what: str = "names"

    def problem(self, value) -> str | None:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            return f"is {shown(value)}, expected {self}"
        for name, item in value.items():
            problem = self.value.problem(item)
            if problem:
                return f"[{shown(name)}] {problem}"
        return None

    def __str__(self):
        return f"an object of {self.what} to values each {self.value}"


@dataclasses.dataclass(frozen=True)
class Record(Kind):
    """An object of exactly these named fields: every one of `fields` present (not null) and of its kind, the
    `optional` ones of theirs where present, no other field."""

    fields: Mapping[str, Kind]
    optional: Mapping[str, Kind] = dataclasses.field(default_factory=dict)

    def problem(self, value) -> str | None:
        if not isinstance(value, Mapping):
            return f"is {shown(value)}, expected {self}"
        missing = [k for k in self.fields if value.get(k) is None]
        if missing:
            return f"lacks {_names(missing)}"
        kinds = {**self.optional, **self.fields}
        unknown = [k for k in value if k not in kinds]
        if unknown:
            return f"has unknown fields: {_names(unknown)}"
        for key, item in value.items():
            problem = kinds[key].problem(item)
            if problem:
                return f"{key} {problem}"
        return None

    def example(self) -> dict:
        return {k: kind.example() for k, kind in {**self.fields, **self.optional}.items()}

    def leaves(self, path: tuple = ()):
        for key, kind in {**self.fields, **self.optional}.items():
            yield from kind.leaves((*path, key))

    def __str__(self):
        return f"an object of {', '.join(self.fields)}" if len(self.fields) <= 6 else "an object"


def _names(keys: list) -> str:
    keys = [shown(k) if not isinstance(k, str) else k for k in keys]
    return ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")
