"""FedAvgM's server update (Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification", 2019, Algorithm "FedAvgM"), on state dicts of numpy arrays; no FLARE or torch import.

The round's FedAvg average is a step from the global model w_t; its negative is the pseudo-gradient
Delta_t = w_t - avg_t. The server keeps a velocity v and moves along it:

    v_{t+1} = beta v_t + Delta_t,        w_{t+1} = w_t - eta v_{t+1}

beta = 0 and eta = 1 is FedAvg. Only floating-point tensors move this way: an integer buffer (batch norm's count of
batches) is a count, not a coordinate, and takes the average's value."""

from __future__ import annotations

import numpy as np


def momentum_step(
    global_state: dict, average: dict, velocity: dict | None, momentum: float, server_lr: float
) -> tuple[dict, dict]:
    """(the new global state, the new velocity) from the global state w_t, the round's average and the velocity
    (None before the first round: zero). Every array keeps the global state's dtype."""
    new_state, new_velocity = {}, {}
    for key, current in global_state.items():
        current = np.asarray(current)
        if not np.issubdtype(current.dtype, np.floating):
            new_state[key] = np.asarray(average[key])
            continue
        step = current - np.asarray(average[key], dtype=current.dtype)
        previous = None if velocity is None else velocity.get(key)
        new_velocity[key] = step if previous is None else (momentum * previous + step).astype(current.dtype)
        new_state[key] = (current - server_lr * new_velocity[key]).astype(current.dtype)
    return new_state, new_velocity
