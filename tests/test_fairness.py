"""Fairness statistics: mean, population std, worst site."""

import numpy as np
import pytest

from fairfl.fairness import summarize


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
