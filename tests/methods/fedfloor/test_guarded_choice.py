"""FedFloor (guarded): a site leaves the global model only for a mix whose validation gain stands `guard` standard
errors of the gain above 0. The math, the controller's settings and the site's choice on tiny data."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_task import SiteTask, check_meta
from fairfl.methods.fedfloor.controller import FedFloorController
from fairfl.methods.fedfloor.mixing import DEFAULT_GRID, choose_alpha, choose_alpha_guarded, gain_standard_error
from fairfl.methods.fedfloor.protocol import MIX_GRID, MIX_GUARD
from fairfl.models import build_model, load_numpy_state
from fairfl.uncertainty import case_fingerprint, case_influence_record, mean_influence

import helpers
from helpers import segmentation_task_meta

TINY = {"model_channels": [8, 16, 32], "model_strides": [2, 2], "num_rounds": 2}


def _per_patient(values):
    """A mean score over patients and each patient's influence on it, as a site's evaluation records them."""
    values = np.asarray(values, dtype=np.float64)
    record = case_influence_record(mean_influence(values, [f"p{i}" for i in range(len(values))]))
    return float(values.mean()), record["values"]


def test_the_gain_se_is_the_textbook_se_of_the_paired_differences():
    """For a mean over patients the influence route must give sd(a - b) / sqrt(G), the paired t-test's se."""
    rng = np.random.default_rng(0)
    for size in (2, 3, 7, 40):
        a, b = rng.uniform(0, 1, size), rng.uniform(0, 1, size)
        _, ea = _per_patient(a)
        _, eb = _per_patient(b)
        expected = np.std(a - b, ddof=1) / math.sqrt(size)
        assert gain_standard_error(ea, eb) == pytest.approx(expected, rel=1e-12)


def test_no_gain_se_without_two_paired_patients():
    assert gain_standard_error([0.1], [0.2]) is None
    assert gain_standard_error([0.1, 0.2], [0.1, 0.2, 0.3]) is None  # not the same patients
    assert gain_standard_error([float("nan"), 0.2], [0.1, 0.2]) is None


def _scores(per_alpha):
    scores, influences = {}, {}
    for alpha, values in per_alpha.items():
        scores[alpha], influences[alpha] = _per_patient(values)
    return scores, influences


def test_guard_zero_is_the_unguarded_choice_exactly():
    rng = np.random.default_rng(1)
    for _ in range(50):
        scores, influences = _scores({a: rng.uniform(0, 1, 5) for a in DEFAULT_GRID})
        assert choose_alpha_guarded(scores, influences, 0.0) == choose_alpha(scores)
    assert choose_alpha_guarded({0.5: 0.7, 1.0: 0.8}, {}, 0.0) == 1.0  # no influences needed, no 0 needed


def test_a_gain_within_the_validation_noise_keeps_the_global_model():
    """Two patients, the personal model better on one and worse on the other: the unguarded choice follows the
    mean, the guarded one stays on the shared model."""
    scores, influences = _scores({0.0: [0.50, 0.60], 1.0: [0.80, 0.40]})
    assert choose_alpha(scores) == 1.0
    assert choose_alpha_guarded(scores, influences, 1.0) == 0.0


def test_a_gain_every_patient_shows_is_taken_and_the_best_lower_bound_wins():
    global_ = [0.50, 0.55, 0.60, 0.52, 0.58]
    scores, influences = _scores(
        {
            0.0: global_,
            0.5: [v + 0.10 for v in global_],  # +0.10 on every patient: se 0
            1.0: [v + d for v, d in zip(global_, [0.40, -0.10, 0.35, -0.05, 0.30], strict=True)],  # +0.18, noisy
        }
    )
    assert choose_alpha(scores) == 1.0
    assert choose_alpha_guarded(scores, influences, 1.0) == 0.5
    assert choose_alpha_guarded(scores, influences, 0.01) == 1.0  # a tiny guard: the larger mean gain's bound wins


def test_the_choice_does_not_depend_on_the_order_of_the_patients():
    rng = np.random.default_rng(2)
    for _ in range(30):
        per_alpha = {a: rng.uniform(0, 1, 6) for a in DEFAULT_GRID}
        order = rng.permutation(6)
        scores, influences = _scores(per_alpha)
        shuffled = {a: [influences[a][i] for i in order] for a in influences}
        for guard in (0.5, 1.0, 2.0):
            assert choose_alpha_guarded(scores, influences, guard) == choose_alpha_guarded(scores, shuffled, guard)


def test_what_cannot_be_measured_never_moves_the_site_off_the_global_model():
    scores, influences = _scores({0.0: [0.5, 0.6, 0.4], 1.0: [0.9, 0.95, 0.99]})
    assert choose_alpha_guarded(scores, influences, 1.0) == 1.0  # measurable: taken
    assert choose_alpha_guarded(scores, {**influences, 1.0: None}, 1.0) == 0.0  # no record for the mix
    assert choose_alpha_guarded(scores, {**influences, 0.0: None}, 1.0) == 0.0  # no record for the global model
    assert choose_alpha_guarded({**scores, 0.0: None}, influences, 1.0) == 0.0  # nothing to score
    assert choose_alpha_guarded({**scores, 1.0: float("nan")}, influences, 1.0) == 0.0
    assert choose_alpha_guarded(scores, {**influences, 1.0: influences[1.0][:2]}, 1.0) == 0.0  # other patients


@pytest.mark.parametrize("guard", [-1.0, float("nan"), float("inf")])
def test_a_bad_guard_is_refused(guard):
    with pytest.raises(ValueError, match="guard"):
        choose_alpha_guarded({0.0: 0.5, 1.0: 0.6}, {0.0: [0.0, 0.0], 1.0: [0.0, 0.0]}, guard)


def test_a_guard_needs_the_global_model_in_the_grid():
    with pytest.raises(ValueError, match="alpha 0"):
        choose_alpha_guarded({0.5: 0.5, 1.0: 0.6}, {0.5: [0.0, 0.0], 1.0: [0.0, 0.0]}, 1.0)


def test_the_controller_sends_the_guard_only_when_it_is_on_and_names_the_arm():
    off = FedFloorController(**TINY)
    assert MIX_GUARD not in off.site_meta() and off.method == "fedfloor"
    on = FedFloorController(mix_guard=1.0, **TINY)
    assert on.site_meta() == {MIX_GRID: list(DEFAULT_GRID), MIX_GUARD: 1.0} and on.method == "fedfloor_guarded"
    with pytest.raises(ValueError, match="needs 0"):
        FedFloorController(mix_guard=1.0, mix_grid=[0.5, 1.0], **TINY)
    for clash in ({"mix_grid": [0, 1]}, {"minimax_aggregation": True}):  # one component changed at a time
        with pytest.raises(ValueError, match="fedfloor_"):
            FedFloorController(mix_guard=1.0, **clash, **TINY)
    for bad in (-1, float("nan"), "1", 11):
        with pytest.raises(ValueError, match="mix_guard"):
            FedFloorController(mix_guard=bad, **TINY)


def _validate(executor, meta, sent, state_dir, **extra):
    task_meta = {**meta, protocol.EVALUATE: protocol.FROM_PERSONAL, MIX_GRID: list(DEFAULT_GRID), **extra}
    task = FLModel(params_type=ParamsType.FULL, params=sent, meta=task_meta)
    return executor._validate(SiteTask.of("site-2", task), str(state_dir)).metrics


def test_the_site_applies_the_guard_to_its_own_validation_patients(trained, monkeypatch):
    """The site's choice with a guard is choose_alpha_guarded of the scores and the patient influences its validation
    split gives, every alpha's record from the same patients; without a guard no influence is computed; a guard so
    large no gain passes keeps the global model, scored as the global model."""
    import fairfl.methods.fedfloor.client as client

    executor, meta, sent, state_dir = trained
    seen = []

    def recording(scores, influences, guard):
        seen.append((dict(scores), dict(influences), guard))
        return choose_alpha_guarded(scores, influences, guard)

    monkeypatch.setattr(client, "choose_alpha_guarded", recording)
    unguarded = _validate(executor, meta, sent, state_dir)
    assert seen[-1][2] == 0.0 and all(v is None for v in seen[-1][1].values())
    guarded = _validate(executor, meta, sent, state_dir, **{MIX_GUARD: 1.0})
    scores, influences, guard = seen[-1]
    assert guard == 1.0 and set(influences) == set(DEFAULT_GRID) == set(scores)
    assert len({len(values) for values in influences.values()}) == 1 and all(influences.values())
    assert guarded["mix_alpha"] == choose_alpha_guarded(scores, influences, 1.0)
    assert unguarded["mix_alpha"] == choose_alpha(scores)  # the same validation scores, unguarded
    strict = _validate(executor, meta, sent, state_dir, **{MIX_GUARD: 10.0, protocol.SCORE_GLOBAL: True})
    assert strict["mix_alpha"] == 0.0 and strict["dice"] == pytest.approx(strict["global_dice"], abs=1e-12)


def test_the_validation_score_gives_each_patients_influence(trained):
    """What the guard reads: one influence per validation patient (slices of one patient are one cluster), summing
    to 0 (deviations from the mean), fingerprinted by the patients' ids."""
    executor, meta, sent, _ = trained
    model = load_numpy_state(build_model(meta[protocol.MODEL_SPEC]), sent)
    record: dict = {}
    site = helpers.site_task(meta, "site-2")
    score = executor._validation_score(site, model, "cpu", record)
    assert score == executor._validation_score(site, model, "cpu")
    datalist = json.loads((Path(executor._data_root(site)) / "site-2.json").read_text())
    patients = sorted({entry["case"] for entry in datalist["validation"]})
    assert len(datalist["validation"]) > len(patients)  # several slices per patient: clusters, not images
    assert len(record["values"]) == len(patients) and abs(sum(record["values"])) < 1e-9
    assert record["cases"] == case_fingerprint(patients)


@pytest.mark.parametrize("guard", [-1.0, float("nan"), "1", 11.0, True])
def test_a_bad_guard_from_the_server_fails_the_task_naming_it(guard):
    meta = {**segmentation_task_meta(FedFloorController(**TINY).model_spec()), MIX_GRID: list(DEFAULT_GRID)}
    check_meta("site-2", {**meta, MIX_GUARD: 1.0})
    with pytest.raises(DataError, match="site-2.*mix_guard"):
        check_meta("site-2", {**meta, MIX_GUARD: guard})
