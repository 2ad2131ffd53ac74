"""How many sites must answer a task for a round to go on: `min_clients`, a k-of-n quorum (no FLARE imports).

A federation must survive a hospital whose task fails once or whose machine stalls, so the default is a majority of
the sites that train, not every site: a round goes on while more than half of them answered (the others are
recorded `absent` or `failed` for that round), and ends the job only when fewer did. "all" asks every site, a number
asks that many (capped at the number of sites)."""

from __future__ import annotations

MAJORITY, ALL = "majority", "all"


def check_min_clients(value):
    """`value` if it is a quorum setting: null or "majority" (more than half the sites), "all", or a positive number
    of sites; else a ValueError that says what is allowed (0, once NVFlare's "every site", is refused as ambiguous)."""
    if value is None or value in (MAJORITY, ALL):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"min_clients must be null or 'majority' (more than half the sites), 'all' or a positive number of sites, "
            f"got {value!r}"
        )
    return value


def quorum(min_clients, num_sites: int) -> int:
    """How many of `num_sites` must answer under `min_clients` (check_min_clients): a majority is num_sites // 2 + 1
    (2 of 3, 3 of 4, 4 of 6); a number above num_sites asks all of them."""
    if num_sites <= 0:
        return 0
    if min_clients in (None, MAJORITY):
        return num_sites // 2 + 1
    if min_clients == ALL:
        return num_sites
    return min(int(min_clients), num_sites)
