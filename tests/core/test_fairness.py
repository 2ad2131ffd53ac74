"""Fairness statistics: mean, population std, worst and best site, percentiles, Gini; agreement of two per-site
vectors (FedCE Tables 2-3)."""

import itertools
import math
import random

import numpy as np
import pytest

from fairfl.fairness import contribution_agreement, performance_fairness, summarize


def test_summarize_uses_population_std():
    per_site = {"site-1": 0.8, "site-2": 0.6, "site-3": 0.9, "site-4": 0.7}
    out = summarize(per_site)
    values = np.array(list(per_site.values()))
    assert out["mean"] == pytest.approx(values.mean(), abs=1e-15)
    assert out["std"] == pytest.approx(values.std(ddof=0), abs=1e-15)
    assert out["std"] != pytest.approx(values.std(ddof=1))
    assert out["worst"] == 0.6 and out["worst_site"] == "site-2"
    assert all(type(out[k]) is float for k in ("mean", "std", "worst"))


def test_summarize_plain_floats_ties_and_direction():
    out = summarize({"a": np.float32(0.5), "b": np.float64(0.5), "c": 1})
    assert type(out["mean"]) is float and out["worst_site"] == "a"  # ties: first site
    assert summarize({"only": 0.3}) == {
        "mean": 0.3,
        "std": 0.0,
        "worst": 0.3,
        "worst_site": "only",
        "best": 0.3,
        "best_site": "only",
        "spread": 0.0,
        "p10": 0.3,
        "p50": 0.3,
        "p90": 0.3,
        "gini": 0.0,
    }
    loss = summarize({"a": 0.2, "b": 0.9}, higher_is_better=False)
    assert loss["worst_site"] == "b" and loss["worst"] == 0.9


def test_summarize_rejects_empty_and_non_finite():
    with pytest.raises(ValueError, match="no sites"):
        summarize({})
    for bad in (float("nan"), float("inf"), -float("inf"), "nan"):
        with pytest.raises(ValueError, match="value of site-2"):
            summarize({"site-1": 0.5, "site-2": bad, "site-3": 0.7})
    with pytest.raises(ValueError, match="value of site-2 is too large"):  # finite, but the sums overflow
        summarize({"site-1": 1e307, "site-2": -1.7e308, "site-3": 0.0})
    with pytest.raises(ValueError, match="value of site-3 is too large"):
        summarize({"site-1": 1e308, "site-2": 1e308, "site-3": 1.5e308})
    huge = summarize({"site-1": 0.0, "site-2": 1e150, "site-3": 1e150})  # large but summable
    assert huge["gini"] == pytest.approx(1 / 3) and huge["spread"] == 1e150


def brute_gini(values):
    """The definition itself: mean absolute difference over all K^2 ordered pairs / (2 mean)."""
    pairs = [abs(a - b) for a, b in itertools.product(values, repeat=2)]
    return (sum(pairs) / len(pairs)) / (2 * (sum(values) / len(values)))


def test_summarize_best_spread_percentiles_and_gini_by_hand():
    out = summarize({"site-1": 0.0, "site-2": 0.0, "site-3": 0.0, "site-4": 1.0})
    # 6 of the 16 ordered pairs differ by 1: mean |difference| 6/16, mean 1/4: Gini = (6/16) / (2/4) = 3/4
    assert out["gini"] == pytest.approx(0.75, abs=1e-15) and brute_gini([0, 0, 0, 1]) == pytest.approx(0.75)
    assert out["best"] == 1.0 and out["best_site"] == "site-4" and out["spread"] == 1.0
    # sorted (0, 0, 0, 1), position q (K - 1) = 0.3, 1.5, 2.7: p90 = 0 + 0.7 (1 - 0)
    assert (out["p10"], out["p50"], out["p90"]) == pytest.approx((0.0, 0.0, 0.7), abs=1e-15)
    out = summarize({"a": 0.9, "b": 0.5, "c": 0.7, "d": 0.6, "e": 0.8})
    # sorted (0.5, 0.6, 0.7, 0.8, 0.9), position q (K - 1) = 0.4, 2, 3.6: p10 = 0.54, p50 = 0.7, p90 = 0.86
    assert (out["p10"], out["p50"], out["p90"]) == pytest.approx((0.54, 0.7, 0.86), abs=1e-12)
    # |differences| of the unordered pairs: 4 x 0.1, 3 x 0.2, 2 x 0.3, 1 x 0.4 = 2.0; ordered pairs 4.0 over 25,
    # mean 0.7: Gini = 0.16 / 1.4 = 4/35
    assert out["gini"] == pytest.approx(4 / 35, abs=1e-12)
    assert out["best_site"] == "a" and out["spread"] == pytest.approx(0.4, abs=1e-15)
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 7, 40):
        values = rng.uniform(0, 1, k).tolist()
        out = summarize({f"site-{i}": v for i, v in enumerate(values)})
        assert out["gini"] == pytest.approx(brute_gini(values), abs=1e-12)
        assert [out[p] for p in ("p10", "p50", "p90")] == pytest.approx(np.percentile(values, [10, 50, 90]).tolist())
        assert out["spread"] == max(values) - min(values) and out["spread"] >= 0
        assert 0 <= out["gini"] <= 1 - 1 / k + 1e-12
    assert all(type(v) is float for k, v in out.items() if not k.endswith("_site"))


def test_summarize_does_not_depend_on_the_order_of_the_sites_but_for_ties():
    values = {f"site-{i}": v for i, v in enumerate([0.61, 0.83, 0.1 + 0.2, 0.7, 0.55, 0.3, 0.92, 0.41, 0.48])}
    reference = summarize(values)
    shuffled = list(values.items())
    for seed in range(20):
        random.Random(seed).shuffle(shuffled)
        assert summarize(dict(shuffled)) == reference  # exactly equal: not a float's last bit differs
    # ties: worst and best go to the first such site in the given order; every number stays the same
    tied = {"x": 0.5, "y": 0.9, "z": 0.5, "w": 0.9}
    first, reverse = summarize(tied), summarize(dict(reversed(tied.items())))
    assert (first["worst_site"], first["best_site"]) == ("x", "y")
    assert (reverse["worst_site"], reverse["best_site"]) == ("z", "w")
    assert {k: v for k, v in first.items() if not k.endswith("_site")} == {
        k: v for k, v in reverse.items() if not k.endswith("_site")
    }
    assert first["spread"] == pytest.approx(0.4) and first["p50"] == pytest.approx(0.7)


def test_summarize_a_loss_keeps_the_spread_positive():
    loss = summarize({"a": 0.2, "b": 0.9, "c": 0.4}, higher_is_better=False)
    assert (loss["worst"], loss["worst_site"], loss["best"], loss["best_site"]) == (0.9, "b", 0.2, "a")
    assert loss["spread"] == pytest.approx(loss["worst"] - loss["best"]) and loss["spread"] > 0
    # percentiles and Gini describe the values themselves, whichever the direction
    score = summarize({"a": 0.2, "b": 0.9, "c": 0.4})
    assert {k: loss[k] for k in ("p10", "p50", "p90", "gini", "spread", "mean", "std")} == {
        k: score[k] for k in ("p10", "p50", "p90", "gini", "spread", "mean", "std")
    }
    assert score["best_site"] == "b" and score["worst_site"] == "a"


@pytest.mark.parametrize(
    "values", [[-0.1, 0.5, 0.9], [-1.0, 1.0], [0.0, 0.0, 0.0], [0.0], [-0.5, -0.2], [-1e-300, 2.0]]
)
def test_summarize_gini_is_none_for_negative_values_or_a_non_positive_mean(values):
    out = summarize({f"site-{i}": v for i, v in enumerate(values)})
    assert out["gini"] is None  # never a crash, never a number with no meaning
    assert out["spread"] == max(values) - min(values) and out["p50"] == pytest.approx(float(np.median(values)))


def test_performance_fairness_by_hand():
    method = {"site-1": 2.0, "site-2": 4.0, "site-3": 7.0}
    solo = {"site-3": 3.0, "site-1": 1.0, "site-2": 2.0}  # dict order must not matter
    out = performance_fairness(method, solo)
    # solo - mean = (-1, 0, 1); method - mean = (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114/9)
    r = 5 / math.sqrt(2 * 114 / 9)
    assert out["pearson"] == pytest.approx(r, abs=1e-12)
    # 3 sites: t = r sqrt(1 / (1 - r^2)) has 1 degree of freedom (Cauchy): p = 1 - 2 atan|t| / pi
    assert out["p_value"] == pytest.approx(1 - 2 * math.atan(r / math.sqrt(1 - r * r)) / math.pi, abs=1e-12)
    assert out["euclidean"] == pytest.approx(math.sqrt(1 + 4 + 16), abs=1e-12) and out["note"] is None
    assert performance_fairness(solo, solo)["pearson"] == pytest.approx(1.0)
    assert performance_fairness(solo, solo)["euclidean"] == 0.0


def test_performance_fairness_degenerate_inputs_give_nan_with_a_note():
    two = performance_fairness({"a": 80.0, "b": 70.0}, {"a": 75.0, "b": 60.0})
    assert math.isnan(two["pearson"]) and math.isnan(two["p_value"]) and "at least 3 sites" in two["note"]
    assert two["euclidean"] == pytest.approx(math.hypot(5, 10))
    flat = performance_fairness({"a": 80.0, "b": 80.0, "c": 80.0}, {"a": 75.0, "b": 60.0, "c": 70.0})
    assert math.isnan(flat["pearson"]) and "constant" in flat["note"]
    with pytest.raises(ValueError, match="sites differ.*'c'"):
        performance_fairness({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, "b": 2.0})
    with pytest.raises(ValueError, match="value of b"):
        performance_fairness({"a": 1.0, "b": float("nan")}, {"a": 1.0, "b": 2.0})
    with pytest.raises(ValueError, match="no sites"):
        performance_fairness({}, {})


def test_contribution_agreement_by_hand():
    estimates = {"a": 0.5, "b": 0.3, "c": 0.2}
    loo = {"a": 0.04, "b": -0.01, "c": 0.01}  # site b: the federation did better without it
    out = contribution_agreement(estimates, loo)
    # loo / sum|loo| = (2/3, -1/6, 1/6); estimates - that = (-1/6, 7/15, 1/30): squares sum to 222/900
    assert out["euclidean"] == pytest.approx(math.sqrt(222 / 900), abs=1e-12)
    assert out["cosine"] == pytest.approx(0.019 / math.sqrt(0.38 * 0.0018), abs=1e-12)
    de, dl = np.array([1 / 6, -1 / 30, -2 / 15]), np.array([0.08, -0.07, -0.01]) / 3  # minus the means
    assert out["pearson"] == pytest.approx(de @ dl / math.sqrt((de @ de) * (dl @ dl)), abs=1e-12)
    assert 0 < out["p_value"] < 1 and out["note"] is None
    # the marginal values' unit (fraction or points) does not matter, nor does a sum other than 1
    scaled = contribution_agreement({k: 3 * v for k, v in estimates.items()}, {k: 100 * v for k, v in loo.items()})
    assert scaled == pytest.approx(out)


def test_contribution_agreement_degenerate_inputs():
    flat = contribution_agreement({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, {"a": 0.01, "b": 0.02, "c": 0.03})
    assert math.isnan(flat["pearson"]) and "constant" in flat["note"]
    assert flat["cosine"] == pytest.approx(0.06 / math.sqrt(3 * 0.0014))  # still defined
    assert flat["euclidean"] == pytest.approx(math.sqrt((1 / 6) ** 2 + 0 + (1 / 6) ** 2))
    zero = contribution_agreement({"a": 0.2, "b": 0.3, "c": 0.5}, {"a": 0.0, "b": 0.0, "c": 0.0})
    assert all(math.isnan(zero[k]) for k in ("pearson", "euclidean", "cosine"))
    assert "constant" in zero["note"] and "all-zero" in zero["note"]
