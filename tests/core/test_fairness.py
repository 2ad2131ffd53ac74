"""Fairness statistics: mean, population std, worst site; agreement of two per-site vectors (FedCE Tables 2-3)."""

import math

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
    assert summarize({"only": 0.3}) == {"mean": 0.3, "std": 0.0, "worst": 0.3, "worst_site": "only"}
    loss = summarize({"a": 0.2, "b": 0.9}, higher_is_better=False)
    assert loss["worst_site"] == "b" and loss["worst"] == 0.9


def test_summarize_rejects_empty_and_non_finite():
    with pytest.raises(ValueError, match="no sites"):
        summarize({})
    with pytest.raises(ValueError, match="site-2"):
        summarize({"site-1": 0.5, "site-2": float("nan")})


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
