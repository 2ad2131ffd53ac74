"""FedFloor's math: the models a site chooses between and how it chooses. Plain functions, no FLARE.

A site has the federation's global model w and its own personal model v (Ditto's, trained near w). It scores the
interpolations (1 - alpha) w + alpha v for alpha on a fixed grid on its own validation split and is scored (and
would deploy) the best. alpha 0 is the global model as it is, alpha 1 the personal model as it is."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

DEFAULT_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


def check_grid(grid) -> tuple[float, ...]:
    """The grid as sorted floats; an error for an empty grid, a value outside [0, 1], a repeat or a non-number."""
    if isinstance(grid, (str, bytes)) or not hasattr(grid, "__iter__"):
        raise ValueError(f"mix_grid must be a list of numbers in [0, 1], got {grid!r}")
    values = list(grid)
    if not values or not all(type(a) in (int, float) and 0.0 <= a <= 1.0 for a in values):
        raise ValueError(f"mix_grid must be a non-empty list of numbers in [0, 1], got {grid!r}")
    values = [float(a) for a in values]
    if len(set(values)) != len(values):
        raise ValueError(f"mix_grid has a value twice: {grid!r}")
    return tuple(sorted(values))


def mix_states(global_state: Mapping, personal_state: Mapping, alpha: float) -> dict:
    """(1 - alpha) * global + alpha * personal for every floating tensor; exactly one of the two models at alpha 0
    and 1. Integer buffers (batch norm's step counter) are the nearer model's. Both must hold the same tensors."""
    if set(global_state) != set(personal_state):
        missing = sorted(set(global_state) ^ set(personal_state))[:3]
        raise ValueError(f"the global and personal models differ in their tensors ({missing} ...)")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    mixed = {}
    for key, g in global_state.items():
        p = personal_state[key]
        if g.shape != p.shape:
            raise ValueError(f"{key}: global {tuple(g.shape)} and personal {tuple(p.shape)} differ")
        if alpha in (0.0, 1.0) or not g.is_floating_point():
            mixed[key] = (p if alpha >= 0.5 else g).clone()
        else:
            mixed[key] = torch.lerp(g, p.to(g.dtype), alpha)
    return mixed


def choose_alpha(scores: Mapping[float, float | None]) -> float:
    """The alpha with the best validation score (higher is better). A tie goes to the smaller alpha, the model
    nearer the federation's; a score that is None or NaN (nothing to score) never wins; none usable: alpha 0."""
    usable = {a: s for a, s in scores.items() if s is not None and not math.isnan(s)}
    if not usable:
        return 0.0
    best = max(usable.values())
    return min(a for a, s in usable.items() if s == best)
