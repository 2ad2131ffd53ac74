"""The accountant's epsilon against an independent computation written here: the RDP of the Poisson-subsampled Gaussian
at integer orders (Mironov, Talwar and Zhang 2019), converted to (epsilon, delta), and for q = 1 the exact privacy
curve of the Gaussian mechanism (Balle and Wang 2018)."""

import math

import pytest

from fairfl.privacy.accountant import epsilon_spent, noise_multiplier, sample_rate, steps_per_round

DELTA = 1e-5
INTEGER_ORDERS = range(2, 64)  # the integer orders among Opacus's default ones


def log_moment(alpha: int, q: float, sigma: float) -> float:
    """log A_alpha, A_alpha = sum_k C(alpha, k) (1 - q)^(alpha - k) q^k exp((k^2 - k) / (2 sigma^2))."""
    if q == 1.0:
        return (alpha * alpha - alpha) / (2 * sigma**2)
    terms = [
        math.lgamma(alpha + 1)
        - math.lgamma(k + 1)
        - math.lgamma(alpha - k + 1)
        + (alpha - k) * math.log1p(-q)
        + k * math.log(q)
        + (k * k - k) / (2 * sigma**2)
        for k in range(alpha + 1)
    ]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def rdp(alpha: int, q: float, sigma: float, steps: int) -> float:
    return steps * log_moment(alpha, q, sigma) / (alpha - 1)


def epsilon_balle(q, sigma, steps, delta) -> float:
    """The conversion Opacus uses (Balle et al. 2020), over the integer orders."""
    return min(
        rdp(a, q, sigma, steps) + math.log1p(-1 / a) - (math.log(delta) + math.log(a)) / (a - 1) for a in INTEGER_ORDERS
    )


def epsilon_classic(q, sigma, steps, delta) -> float:
    """eps = rdp + log(1 / delta) / (alpha - 1), the classic conversion (looser)."""
    return min(rdp(a, q, sigma, steps) + math.log(1 / delta) / (a - 1) for a in INTEGER_ORDERS)


def normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The least epsilon of a Gaussian mechanism of sensitivity / std `mu` at `delta` (Balle and Wang 2018, Thm. 8),
    by bisection on delta(eps) = Phi(mu / 2 - eps / mu) - e^eps Phi(-mu / 2 - eps / mu)."""

    def delta_of(eps):
        return normal_cdf(mu / 2 - eps / mu) - math.exp(eps) * normal_cdf(-mu / 2 - eps / mu)

    low, high = 0.0, 100.0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high


@pytest.mark.parametrize(
    "q, sigma, steps", [(0.01, 1.0, 1000), (0.05, 0.8, 200), (0.1, 1.5, 50), (0.5, 4.0, 20), (0.25, 2.0, 8)]
)
def test_the_accountant_matches_the_rdp_of_the_subsampled_gaussian_written_here(q, sigma, steps):
    reported = epsilon_spent(sigma, q, steps, DELTA)
    own = epsilon_balle(q, sigma, steps, DELTA)
    # Opacus also tries fractional orders, which can only lower the bound, and by little
    assert 0.9 * own <= reported <= own + 1e-9
    assert reported <= epsilon_classic(q, sigma, steps, DELTA)


@pytest.mark.parametrize("sigma, steps", [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_without_subsampling_the_accountant_bounds_the_exact_gaussian_composition(sigma, steps):
    # T Gaussian steps of std sigma (per unit sensitivity) are one Gaussian mechanism of mu = sqrt(T) / sigma
    exact = exact_gaussian_epsilon(math.sqrt(steps) / sigma, DELTA)
    reported = epsilon_spent(sigma, 1.0, steps, DELTA)
    assert exact <= reported <= epsilon_classic(1.0, sigma, steps, DELTA)
    assert reported == pytest.approx(epsilon_balle(1.0, sigma, steps, DELTA), rel=0.1)


@pytest.mark.parametrize("epsilon, rate, steps", [(8.0, 0.5, 8), (1.0, 0.01, 2000), (3.0, 0.1, 100)])
def test_the_noise_multiplier_spends_the_budget_over_the_planned_steps_and_no_more(epsilon, rate, steps):
    sigma = noise_multiplier(epsilon, DELTA, rate, steps)
    spent = epsilon_spent(sigma, rate, steps, DELTA)
    assert epsilon - 0.05 <= spent <= epsilon
    # a round's statement grows with the rounds done and ends within the budget
    per_round = [epsilon_spent(sigma, rate, steps * r // 4, DELTA) for r in range(1, 5)]
    assert per_round == sorted(per_round) and per_round[-1] == spent


def test_a_budget_no_noise_can_meet_is_refused_naming_the_settings():
    with pytest.raises(ValueError, match="dp_epsilon 1e-06 .* cannot be met"):
        noise_multiplier(1e-6, DELTA, 1.0, 10**5)


def test_small_sites_sample_more_of_their_items_and_need_more_noise_for_the_same_budget():
    small, large = sample_rate(8, 20), sample_rate(8, 2000)
    assert (small, large) == (0.4, 0.004) and sample_rate(8, 4) == 1.0
    steps_small, steps_large = steps_per_round(0, 1, 8, 20), steps_per_round(0, 1, 8, 2000)
    assert (steps_small, steps_large, steps_per_round(5, 1, 8, 2000)) == (3, 250, 5)
    assert noise_multiplier(4.0, DELTA, small, 10 * steps_small) > noise_multiplier(4.0, DELTA, large, 10 * 3)
