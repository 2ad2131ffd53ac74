"""What one argument of a fairfl component is: its name, kind, default and meaning.

The shared declarations (fairfl.arguments) and every method unit's own (`fairfl.methods.<name>.arguments`) build on
this; it imports neither of them, so a unit's declarations can be read without the registry that finds them, and
neither torch nor FLARE."""

from __future__ import annotations

import dataclasses

from fairfl.kinds import Kind

MAX_FACTOR = 1e6  # weights, exponents and temperatures above this only overflow


@dataclasses.dataclass(frozen=True)
class Argument:
    """One argument of a component: its name, kind, default and meaning (one line in the docs' tables)."""

    name: str
    kind: Kind
    default: object
    doc: str
