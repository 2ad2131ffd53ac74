"""SAGA's weights (Eq. 16/17), moving average (Eq. 18), report checks and saved state, on small inputs by hand."""

import json

import pytest

from fairfl.methods.fedism.saga import SagaState, check_report, moving_average, saga_weights


def report(sharpness, loss=1.0):
    return {"loss": loss, "perturbed_loss": loss + sharpness, "sharpness": sharpness, "grad_norm": 0.5}


def test_weights_are_proportional_to_the_value_to_the_q():
    assert saga_weights({"a": 1.0, "b": 2.0}, q=2) == pytest.approx({"a": 1 / 5, "b": 4 / 5})
    assert saga_weights({"a": 1.0, "b": 2.0}, q=1) == pytest.approx({"a": 1 / 3, "b": 2 / 3})
    assert saga_weights({"a": 0.3, "b": 0.1, "c": 0.2}, q=0.5) == pytest.approx(
        {s: v**0.5 / (0.3**0.5 + 0.1**0.5 + 0.2**0.5) for s, v in {"a": 0.3, "b": 0.1, "c": 0.2}.items()}
    )
    # scale-free, and no overflow for a large q
    assert saga_weights({"a": 1e-6, "b": 2e-6}, q=2) == pytest.approx({"a": 1 / 5, "b": 4 / 5})
    big = saga_weights({"a": 1e3, "b": 2e3}, q=100)
    assert big["b"] == pytest.approx(1.0) and sum(big.values()) == pytest.approx(1.0)


def test_zero_and_rounding_sharpness():
    assert saga_weights({"a": 0.0, "b": 1.0, "c": 3.0}, q=2) == pytest.approx({"a": 0.0, "b": 0.1, "c": 0.9})
    assert saga_weights({"a": -1e-9, "b": 1.0}, q=2) == pytest.approx({"a": 0.0, "b": 1.0})  # rounding: 0
    assert saga_weights({"a": 0.0, "b": 0.0}, q=2) == {"a": 0.5, "b": 0.5}  # nothing to tell apart: equal
    assert saga_weights({"a": -0.01, "b": 1.0}, q=2) == pytest.approx({"a": 0.0, "b": 1.0})  # clipped, as the authors
    for bad in ({"a": float("nan"), "b": 1.0}, {"a": float("-inf"), "b": 1.0}, {"a": float("inf"), "b": 1.0}, {}):
        with pytest.raises(ValueError):
            saga_weights(bad)
    for q in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="q"):
            saga_weights({"a": 1.0}, q=q)


def test_moving_average_eq18():
    raw = {"a": 0.2, "b": 0.8}
    assert moving_average(raw, {}, beta=0.5) == raw  # round 1: raw
    assert moving_average(raw, {"a": 0.6, "b": 0.4}, beta=0.5) == pytest.approx({"a": 0.4, "b": 0.6})
    assert moving_average(raw, {"a": 0.6, "b": 0.4}, beta=1.0) == pytest.approx(raw)  # no smoothing
    assert moving_average(raw, {"a": 0.6, "b": 0.4}, beta=0.0) == pytest.approx({"a": 0.6, "b": 0.4})
    # a site absent last round (c): its own raw weight stands in for w_{t-1}; then renormalised
    three = moving_average({"a": 0.2, "b": 0.3, "c": 0.5}, {"a": 0.6, "b": 0.4}, beta=0.5)
    assert three == pytest.approx(
        {"a": 0.5 * 0.2 + 0.5 * 0.6 / 1.5, "b": 0.5 * 0.3 + 0.5 * 0.4 / 1.5, "c": 0.5 * 0.5 + 0.5 * 0.5 / 1.5}
    )
    # a site rejected this round (b): the others' previous weights are renormalised among them
    assert moving_average({"a": 1.0, "c": 0.0}, {"a": 0.2, "b": 0.6, "c": 0.2}, beta=0.5) == pytest.approx(
        {"a": 0.75, "c": 0.25}
    )
    with pytest.raises(ValueError, match="beta"):
        moving_average(raw, {}, beta=1.5)


def test_check_report_rejects_missing_nan_and_absurd_values_but_accepts_negative_ones():
    assert check_report(report(0.1), "S") is None
    assert check_report(report(0.0), "S") is None
    assert check_report(report(-1e-8), "S") is None  # rounding
    assert check_report(report(-0.01), "S") is None  # clipped to 0 by saga_weights, as the authors floor it
    assert check_report(report(-0.01), "L") is None
    assert check_report({**report(0.1), "rho": 0.05, "samples": 12}, "S") is None  # what measure_sharpness sends
    assert "perturbed_loss is -1e+300, expected a finite number in [0, 1e+06]" in check_report(report(-1e300), "S")
    assert "sharpness report perturbed_loss is 1e+300, expected" in check_report(report(1e300), "S")
    nan = check_report(report(float("nan")), "S")
    assert nan == "sharpness report perturbed_loss is nan, expected a finite number in [0, 1e+06]"
    assert "is inf" in check_report(report(float("inf")), "S")
    assert "lacks perturbed_loss, sharpness, grad_norm" in check_report({"loss": 1.0}, "S")
    assert "lacks sharpness" in check_report({**report(0.1), "sharpness": None}, "S")
    assert "lacks loss, perturbed_loss, grad_norm" in check_report({"sharpness": 0.1}, "L")
    assert "sharpness is '0.1', expected" in check_report({**report(0.1), "sharpness": "0.1"}, "S")
    assert "sharpness is True, expected" in check_report({**report(0.1), "sharpness": True}, "S")
    assert "unknown fields: backdoor" in check_report({**report(0.1), "backdoor": 1.0}, "S")
    assert "is None, expected an object" in check_report(None, "S")
    with pytest.raises(ValueError, match="variant"):
        check_report(report(0.1), "X")


@pytest.mark.parametrize("field", ["loss", "perturbed_loss", "sharpness", "grad_norm"])
@pytest.mark.parametrize("bad", ["0.1", [0.1], {"v": 0.1}, None, float("nan"), float("inf"), 10**400, True])
def test_every_field_the_server_reads_is_checked_for_both_variants(field, bad):
    # before, only the variant's own value was checked and float() of any other field ended the job
    for variant in ("S", "L"):
        problem = check_report({**report(0.1), field: bad}, variant)
        assert problem is not None and field in problem


def test_state_over_rounds_for_both_variants():
    reports = {"a": report(0.1, loss=1.0), "b": report(0.3, loss=0.5)}
    s = SagaState(variant="S", q=2, beta=0.5)
    first = s.update(reports)
    assert {k: v["weight"] for k, v in first.items()} == pytest.approx({"a": 0.1, "b": 0.9})  # 0.01 : 0.09
    assert first["a"]["raw"] == first["a"]["weight"] and first["a"]["value"] == 0.1
    second = s.update({"a": report(0.3), "b": report(0.1)})  # raw 0.9 / 0.1
    assert {k: v["weight"] for k, v in second.items()} == pytest.approx({"a": 0.5, "b": 0.5})
    assert s.rounds == 2

    perturbed = SagaState(variant="L", q=1, beta=0.5).update(reports)  # L = 1.1 and 0.8
    assert {k: v["weight"] for k, v in perturbed.items()} == pytest.approx({"a": 1.1 / 1.9, "b": 0.8 / 1.9})
    with pytest.raises(ValueError, match="variant"):
        SagaState(variant="sharpness")
    with pytest.raises(ValueError, match="b: sharpness report perturbed_loss is nan"):
        SagaState().update({"a": report(0.1), "b": report(float("nan"))})


def test_a_slightly_negative_sharpness_is_clipped_and_keeps_its_moving_average_share():
    """The authors floor sharpness at 1e-10: a site whose sharpness comes out a little below 0 in one round (float32
    rounding, or an ascent step that overshoots) is not dropped; its raw weight is 0 and its share is (1 - beta)
    times last round's."""
    assert saga_weights({"a": -0.02, "b": 0.1, "c": 0.3}, q=2) == pytest.approx({"a": 0.0, "b": 0.1, "c": 0.9})
    s = SagaState(variant="S", q=2, beta=0.5)
    first = s.update({"a": report(0.1), "b": report(0.1)})
    assert first["a"]["weight"] == pytest.approx(0.5)
    second = s.update({"a": report(-0.003), "b": report(0.1)})
    assert second["a"]["raw"] == 0.0 and second["a"]["value"] == -0.003
    assert second["a"]["weight"] == pytest.approx(0.25) and second["b"]["weight"] == pytest.approx(0.75)


def test_saved_state_gives_the_same_next_round_as_staying_up():
    rounds = [
        {"a": report(0.1), "b": report(0.2), "c": report(0.0)},
        {"a": report(0.2), "c": report(0.05)},  # b rejected this round
        {"a": report(0.1), "b": report(0.1), "c": report(0.3)},
    ]
    up = SagaState(variant="S", q=2, beta=0.5)
    for r in rounds[:2]:
        up.update(r)
    restarted = SagaState.from_dict(json.loads(json.dumps(up.to_dict())))
    assert restarted == up
    assert restarted.update(rounds[2]) == up.update(rounds[2])
    assert sum(v for s, v in up.weights.items() if s in rounds[2]) == pytest.approx(1.0)
