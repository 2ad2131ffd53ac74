"""The privacy accountant of DP-SGD: Renyi DP of the Poisson-subsampled Gaussian mechanism (Mironov, Talwar and Zhang
2019), converted to (epsilon, delta), by Opacus's RDP accountant.

Spending is stateless: the noise multiplier is the one for which the run's planned steps (rounds x steps per round)
spend exactly the budget, and after round r a site states the budget spent by (r + 1) rounds' steps."""

from __future__ import annotations

import functools
import math
import warnings

from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

# Opacus warns when the best order is its largest (63): the bound is then looser than it could be, still valid
LARGEST_ORDER_WARNING = "Optimal order is the largest alpha"


def sample_rate(batch_size: int, num_items: int) -> float:
    """q: each item joins a step's batch with this probability (batch_size items expected), at most 1."""
    if num_items < 1:
        raise ValueError("DP-SGD needs at least one training item")
    return min(1.0, batch_size / num_items)


def steps_per_round(local_steps: int, local_epochs: int, batch_size: int, num_items: int) -> int:
    """A round's steps: local_steps, or as many as the epochs' batches of the ordinary loop (ceil(N / batch))."""
    return local_steps if local_steps > 0 else local_epochs * math.ceil(num_items / batch_size)


@functools.lru_cache(maxsize=64)
def noise_multiplier(epsilon: float, delta: float, rate: float, steps: int) -> float:
    """sigma: Gaussian noise std per unit of clip norm such that `steps` steps at sampling rate `rate` spend at most
    (epsilon, delta) (Opacus searches it to 0.01 in epsilon, from below). A budget too small for any noise is a
    ValueError naming the settings."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LARGEST_ORDER_WARNING)
            return float(
                get_noise_multiplier(
                    target_epsilon=epsilon, target_delta=delta, sample_rate=rate, steps=steps, accountant="rdp"
                )
            )
    except ValueError as e:
        raise ValueError(
            f"dp_epsilon {epsilon:g} with dp_delta {delta:g} cannot be met by any noise over {steps} steps at sampling "
            f"rate {rate:.4g}: raise dp_epsilon or lower the rounds or steps ({e})"
        ) from e


def epsilon_spent(sigma: float, rate: float, steps: int, delta: float) -> float:
    """The epsilon at `delta` of `steps` DP-SGD steps of noise multiplier `sigma` at sampling rate `rate`."""
    accountant = RDPAccountant()
    accountant.history = [(sigma, rate, steps)]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=LARGEST_ORDER_WARNING)
        return float(accountant.get_epsilon(delta))
