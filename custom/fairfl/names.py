"""The one rule for names that become parts of paths (run names, site names, cache folders).

What the server sends or a job names is untrusted on a site: a name like `../../etc` or `/home` would make the
site read or write outside its own data and workspace. Server and sites check names with `safe_name`."""

from __future__ import annotations

import re
from collections.abc import Mapping

from fairfl.errors import DataError

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SAFE_NAME_RULE = "1-128 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"


def safe_name(value, what: str) -> str:
    """`value` if it is a plain name (no separator, no `..`, not hidden, at most 128 characters); else ValueError
    saying which `what` it was."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value:
        raise ValueError(f"{what} {value!r} is not a safe name ({SAFE_NAME_RULE}, no '..')")
    return value


def safe_site_names(names: Mapping[str, str], where) -> dict[str, str]:
    """A converter's {source: output site name} if every output name is safe (`safe_name`): each becomes
    `<dst>/<name>/` and `<dst>/<name>.json`, so `..`, `.`, `a/b` or `/abs` would write outside the output folder.
    Else a DataError naming the source, the name and `where` (the file or folder the source came from)."""
    for source, name in names.items():
        try:
            safe_name(name, "output site name")
        except ValueError as err:
            raise DataError(str(source), where, f"{err}, from source site {source!r}: rename it") from None
    return dict(names)
