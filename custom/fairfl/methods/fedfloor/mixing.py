"""FedFloor's math: the models a site chooses between and how it chooses. Plain functions, no FLARE.

A site has the federation's global model w and its own personal model v (Ditto's, trained near w). It scores the
interpolations (1 - alpha) w + alpha v for alpha on a fixed grid on its own validation split and is scored (and
would deploy) the best (`choose_alpha`), or, guarded, the best whose gain over the global model stands out of the
validation split's noise (`choose_alpha_guarded`). alpha 0 is the global model as it is, alpha 1 the personal model
as it is."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from fairfl.uncertainty import cluster_se

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


def gain_standard_error(influence: Sequence[float], reference: Sequence[float]) -> float | None:
    """The standard error of score(alpha) - score(0) on one validation split, from each patient's influence on the two
    scores (fairfl.uncertainty: the same patients, in the same order): the cluster standard error of the paired
    differences e_g - r_g. None with fewer than two patients, records that differ in length (nothing to pair) or a
    value that is not finite."""
    if len(influence) != len(reference):
        return None
    se = cluster_se({g: float(e) - float(r) for g, (e, r) in enumerate(zip(influence, reference, strict=True))})
    return se if se is not None and math.isfinite(se) else None


def choose_alpha_guarded(
    scores: Mapping[float, float | None], influences: Mapping[float, Sequence[float] | None], guard: float
) -> float:
    """The alpha whose validation gain over the global model (alpha 0) is largest after subtracting `guard` standard
    errors of that gain, when that lower bound is above 0; alpha 0 otherwise. A site leaves the global model only when
    its own validation split shows the gain beyond the split's noise: on a few validation patients a gain within the
    noise is as likely a draw of the split as a better model. A tie goes to the smaller alpha.

    guard 0 is `choose_alpha` exactly. An alpha whose gain has no standard error (fewer than two patients, no
    influence record) is never chosen over alpha 0; nothing usable at alpha 0: alpha 0. The grid must hold 0."""
    if not (math.isfinite(guard) and guard >= 0.0):
        raise ValueError(f"guard must be finite and >= 0, got {guard}")
    if guard == 0.0:
        return choose_alpha(scores)
    if 0.0 not in scores:
        raise ValueError(f"a guarded choice needs alpha 0 (the global model) in the grid, got {sorted(scores)}")
    reference, base = influences.get(0.0), scores[0.0]
    if base is None or math.isnan(base) or reference is None:
        return 0.0
    best, chosen = 0.0, 0.0
    for alpha in sorted(scores):
        score, influence = scores[alpha], influences.get(alpha)
        if alpha == 0.0 or score is None or math.isnan(score) or influence is None:
            continue
        se = gain_standard_error(influence, reference)
        if se is None:
            continue
        bound = score - base - guard * se
        if bound > best:
            best, chosen = bound, alpha
    return chosen
