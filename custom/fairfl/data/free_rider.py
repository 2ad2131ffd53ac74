"""Free riders (FedCE paper, Fig. 4): a site with too little data that joins by repeating one image."""

from __future__ import annotations


def free_rider_datalist(source: dict, copies: int | None = None) -> dict:
    """A free rider's datalist made from another site's: its training split is the source's first training
    image repeated `copies` times (default: as many as the source has, so sample-count weighting counts it
    as a full site); validation and testing are the source's, so it is scored on real data of that kind."""
    training = source["training"]
    copies = len(training) if copies is None else copies
    if copies < 1:
        raise ValueError(f"a free rider needs at least one copy, got {copies}")
    return {**source, "training": [dict(training[0]) for _ in range(copies)]}
