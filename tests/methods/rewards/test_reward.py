"""CFFL and CGSV: the reward math (`fairfl.methods.rewards.reward`) against direct computations, and the
per-site-model bookkeeping
of their controllers (`fairfl.methods.rewards.controller`) without FLARE running."""

import json
import math

import numpy as np
import pytest
import torch

from fairfl.flare.engine import SiteUpdate
from fairfl.methods.rewards.controller import SITE_MODELS_FILE, CFFLController, CGSVController
from fairfl.methods.rewards.protocol import VAL_METRIC, VALIDATE_TRAINED
from fairfl.methods.rewards.reward import (
    apply_threshold,
    cffl_reputations,
    cgsv_values,
    mask_top_fraction,
    normalised_update,
    reward_fractions,
    reward_states,
    state_delta,
    update_reputation,
    weighted_update,
)
from fairfl.models import initial_state, state_to_torch
from fairfl.results import ResultsLog

from helpers import screened

SITES = ("site-1", "site-2", "site-3")
TINY = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": 3}


# ---------------------------------------------------------------- core math
def test_mask_keeps_exactly_the_top_fraction_per_tensor_and_q1_is_identity():
    update = {"a": torch.tensor([0.1, -0.5, 0.3, 0.0, -0.2]), "b": torch.tensor([[2.0, -1.0], [0.5, -3.0]])}
    half = mask_top_fraction(update, 0.5)  # ceil(2.5) = 3 of a, ceil(2) = 2 of b
    assert torch.equal(half["a"], torch.tensor([0.0, -0.5, 0.3, 0.0, -0.2]))
    assert torch.equal(half["b"], torch.tensor([[2.0, 0.0], [0.0, -3.0]]))
    ties = mask_top_fraction({"t": torch.ones(10)}, 0.3)["t"]
    assert int((ties != 0).sum()) == 3  # exactly ceil(q n), even with ties
    for q in (1.0, 1.5):
        full = mask_top_fraction(update, q)
        assert all(torch.equal(full[k], update[k]) for k in update)
    assert all(not t.any() for t in mask_top_fraction(update, 0.0).values())
    with pytest.raises(ValueError):
        mask_top_fraction(update, float("nan"))


def test_cffl_reputations_are_normalised_sinh_and_smoothed():
    values = {"site-1": 0.8, "site-2": 0.5, "site-3": 0.1}
    raw = cffl_reputations(values, alpha=5.0)
    total = sum(math.sinh(5 * v) for v in values.values())
    assert raw == pytest.approx({s: math.sinh(5 * v) / total for s, v in values.items()})
    first = update_reputation({}, raw, keep=0.5)  # first round: raw
    assert first == pytest.approx(raw)
    second_raw = cffl_reputations({"site-1": 0.2, "site-2": 0.6, "site-3": 0.4}, alpha=5.0)
    smoothed = {s: 0.5 * first[s] + 0.5 * second_raw[s] for s in SITES}
    second = update_reputation(first, second_raw, keep=0.5)
    assert second == pytest.approx({s: v / sum(smoothed.values()) for s, v in smoothed.items()})
    assert sum(second.values()) == pytest.approx(1.0)
    assert cffl_reputations({"a": 0.0, "b": 0.0}, 5.0) == {"a": 0.5, "b": 0.5}


def test_cffl_threshold_removes_low_reputations_for_good():
    reputations, removed = apply_threshold({"a": 0.5, "b": 0.45, "c": 0.05}, 0.1)
    assert removed == ["c"] and reputations == pytest.approx({"a": 0.5 / 0.95, "b": 0.45 / 0.95, "c": 0.0})
    again, removed = apply_threshold({"a": 0.4, "b": 0.3, "c": 0.3}, 0.1, removed)
    assert removed == ["c"] and again == pytest.approx({"a": 4 / 7, "b": 3 / 7, "c": 0.0})
    nobody, removed = apply_threshold({"a": 0.5, "b": 0.5}, 0.0)
    assert removed == [] and nobody == {"a": 0.5, "b": 0.5}


def test_cgsv_cosines_and_reputation_update_by_hand():
    deltas = {
        "site-1": {"w": torch.tensor([3.0, 4.0])},
        "site-2": {"w": torch.tensor([0.0, 2.0])},
        "site-3": {"w": torch.tensor([-1.0, 0.0])},
    }
    uploads = {s: normalised_update(d, 2.0) for s, d in deltas.items()}
    assert torch.allclose(uploads["site-1"]["w"], torch.tensor([1.2, 1.6]))  # Gamma * delta / ||delta||
    weights = {"site-1": 0.5, "site-2": 0.25, "site-3": 0.25}
    aggregate = weighted_update(uploads, weights)
    expected = 0.5 * torch.tensor([1.2, 1.6]) + 0.25 * torch.tensor([0.0, 2.0]) + 0.25 * torch.tensor([-2.0, 0.0])
    assert torch.allclose(aggregate["w"], expected)
    psi = cgsv_values(uploads, aggregate)
    direct = {s: float(torch.dot(u["w"], expected) / (u["w"].norm() * expected.norm())) for s, u in uploads.items()}
    assert psi == pytest.approx(direct) and psi["site-3"] < 0
    first = update_reputation({}, psi, keep=0.95)  # first round: psi itself, negative clipped to 0
    positive = {s: max(0.0, v) for s, v in psi.items()}
    assert first == pytest.approx({s: v / sum(positive.values()) for s, v in positive.items()})
    assert first["site-3"] == 0.0
    second = update_reputation(first, {"site-1": 0.1, "site-2": 0.9, "site-3": 0.5}, keep=0.95)
    raw = {s: 0.95 * first[s] + 0.05 * v for s, v in {"site-1": 0.1, "site-2": 0.9, "site-3": 0.5}.items()}
    assert second == pytest.approx({s: v / sum(raw.values()) for s, v in raw.items()})
    assert normalised_update({"w": torch.zeros(2)}, 1.0)["w"].abs().sum() == 0  # a zero update stays zero


def test_reward_fractions_linear_and_tanh_top_site_gets_one():
    r = {"a": 0.5, "b": 0.3, "c": 0.2}
    assert reward_fractions(r) == pytest.approx({"a": 1.0, "b": 0.6, "c": 0.4})
    q = reward_fractions(r, beta=2.0)
    assert q == pytest.approx({s: math.tanh(2 * v) / math.tanh(1.0) for s, v in r.items()})
    assert reward_fractions(r, beta=1e7) == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})  # fully altruistic


def test_reward_states_top_site_gets_the_update_exactly_and_integers_come_from_its_own_model():
    model = {"w": torch.tensor([1.0, 1.0, 1.0, 1.0]), "n": torch.tensor(0)}
    models = {"top": dict(model), "low": dict(model), "rejected": dict(model)}
    update = {"w": torch.tensor([0.4, -0.1, 0.3, 0.2])}
    trained = {"top": {"w": torch.zeros(4), "n": torch.tensor(7)}, "low": {"w": torch.zeros(4), "n": torch.tensor(5)}}
    new = reward_states(models, update, {"top": 1.0, "low": 0.5}, trained)
    assert torch.equal(new["top"]["w"], model["w"] + update["w"]) and int(new["top"]["n"]) == 7
    assert torch.allclose(new["low"]["w"], torch.tensor([1.4, 1.0, 1.3, 1.0])) and int(new["low"]["n"]) == 5
    assert new["rejected"] is not models["rejected"] and all(torch.equal(new["rejected"][k], model[k]) for k in model)
    assert set(state_delta(trained["top"], model)) == {"w"}  # only floating tensors are updates


# ---------------------------------------------------------------- controllers without FLARE
def trained_updates(models: dict, seed: int, report=None) -> dict:
    """{site: SiteUpdate} of each site's model moved by a random step (and `report` as CFFL's val_metric)."""
    generator = torch.Generator().manual_seed(seed)
    updates = {}
    for i, (site, state) in enumerate(sorted(models.items())):
        new = {
            k: (t + 0.01 * (i + 1) * torch.randn(t.shape, generator=generator) if t.is_floating_point() else t + 1)
            for k, t in state_to_torch(state).items()
        }
        meta = {VAL_METRIC: report[site]} if report else {}
        updates[site] = SiteUpdate(new, 10 * (i + 1), meta)
    return updates


def controller(cls, tmp_path, **kwargs):
    c = cls(**TINY, **kwargs)
    c.trainers = list(SITES)
    c.get_run_dir = lambda: str(tmp_path)
    return c


def test_cgsv_controller_gives_each_site_its_reward_and_keeps_a_rejected_site(tmp_path):
    c = controller(CGSVController, tmp_path)
    state0 = initial_state(c.model_spec(), seed=0)
    sent = c.models_for(0, state0, SITES)
    assert all(sent[s] is state0 for s in SITES)  # round 0: everyone starts from the global model
    updates = trained_updates(sent, seed=0)
    new_global, extras = c.aggregate(0, state0, updates, {})
    assert extras["weights"] == pytest.approx({"site-1": 1 / 6, "site-2": 2 / 6, "site-3": 3 / 6})  # samples
    assert (
        sum(extras["reputations"].values()) == pytest.approx(1.0) and extras["contributions"] == extras["reputations"]
    )
    assert max(extras["reward_fractions"].values()) == 1.0
    top = max(extras["reputations"], key=extras["reputations"].get)
    start = state_to_torch(state0)
    aggregate = weighted_update(
        {s: normalised_update(state_delta(updates[s].state, start), extras["gamma"]) for s in SITES}, extras["weights"]
    )
    for name, value in aggregate.items():  # the top site and the global model get u_N exactly
        np.testing.assert_allclose(c.site_models[top][name], (start[name] + value).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(new_global[name], (start[name] + value).numpy(), rtol=1e-5, atol=1e-6)
    low = min(extras["reward_fractions"], key=extras["reward_fractions"].get)
    assert extras["reward_fractions"][low] < 1.0
    assert any(not np.array_equal(c.site_models[low][k], c.site_models[top][k]) for k in aggregate)
    saved = torch.load(tmp_path / SITE_MODELS_FILE)
    assert set(saved) == set(SITES)
    # round 1: site-2 is rejected (the base loop leaves it out of `updates`): its model and reputation stay
    before = {k: v.copy() for k, v in c.site_models["site-2"].items()}
    reputation_before = dict(c.reputations)
    updates1 = trained_updates(c.models_for(1, new_global, SITES), seed=1)
    del updates1["site-2"]
    _, extras1 = c.aggregate(1, new_global, updates1, {"site-2": "NaN in w"})
    assert set(extras1["weights"]) == set(extras1["reward_fractions"]) == {"site-1", "site-3"}
    assert all(np.array_equal(c.site_models["site-2"][k], before[k]) for k in before)
    raw = {s: 0.95 * reputation_before[s] + 0.05 * psi for s, psi in extras1["cgsv"].items()}
    raw["site-2"] = reputation_before["site-2"]  # kept, then everyone renormalised
    raw = {s: max(0.0, v) for s, v in raw.items()}
    assert extras1["reputations"] == pytest.approx({s: v / sum(raw.values()) for s, v in raw.items()})


def test_cffl_controller_weights_by_smoothed_sinh_reputations(tmp_path):
    c = controller(CFFLController, tmp_path)
    assert c.train_meta(0) == {VALIDATE_TRAINED: True}
    state0 = initial_state(c.model_spec(), seed=0)
    metrics = {"site-1": 0.9, "site-2": 0.5, "site-3": None}  # site-3 cannot be scored: rejected
    rejected = {}
    updates = screened(c, 0, trained_updates(c.models_for(0, state0, SITES), seed=0, report=metrics), rejected)
    new_global, extras = c.aggregate(0, state0, updates, rejected)
    assert set(rejected) == {"site-3"} and "val_metric" in rejected["site-3"]
    expected = cffl_reputations({"site-1": 0.9, "site-2": 0.5}, 5.0)
    assert extras["reputations"] == pytest.approx(expected) and extras["weights"] == pytest.approx(expected)
    assert extras["reward_fractions"] == pytest.approx(
        {"site-1": 1.0, "site-2": expected["site-2"] / expected["site-1"]}
    )
    start = state_to_torch(state0)
    u = weighted_update({s: state_delta(updates[s].state, start) for s in expected}, expected)
    for name, value in u.items():
        np.testing.assert_allclose(c.site_models["site-1"][name], (start[name] + value).numpy(), rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(c.site_models["site-3"][k], state0[k]) for k in state0)  # rejected: unchanged
    # integer buffers of a rewarded site come from its own trained model
    ints = [k for k, t in start.items() if not t.is_floating_point()]
    assert all(np.array_equal(c.site_models["site-1"][k], updates["site-1"].state[k].numpy()) for k in ints)


def test_reward_controllers_checkpoint_round_trip_restores_models_and_reputations(tmp_path):
    def make():
        c = controller(CFFLController, tmp_path, run_name="trial", reputation_threshold=0.2)
        c.results = ResultsLog(
            str(tmp_path / "results.json"),
            method=c.method,
            task=c.task,
            metric=c.metric,
            seed=0,
            sites=list(SITES),
            config=c.config(),
        )
        return c

    first = make()
    state0 = initial_state(first.model_spec(), seed=0)
    updates = trained_updates(first.models_for(0, state0, SITES), 0, {"site-1": 0.9, "site-2": 0.8, "site-3": 0.05})
    state1, extras = first.aggregate(0, state0, updates, {})
    assert extras["removed"] == ["site-3"] and extras["reward_fractions"]["site-3"] == 0.0
    assert json.loads(json.dumps(first.method_state())) == first.method_state()  # JSON-small: no tensors
    path = str(tmp_path / "trial" / "checkpoint.pt")
    first._save_checkpoint(path, 0, state1)
    resumed = make()
    resumed._load_checkpoint(path)
    assert resumed.reputations == first.reputations and resumed.removed == ["site-3"]
    for site in SITES:
        assert all(np.array_equal(resumed.site_models[site][k], first.site_models[site][k]) for k in state0)
    report = {"site-1": 0.7, "site-2": 0.9, "site-3": 0.9}
    next_updates = trained_updates(first.models_for(1, state1, SITES), 1, report)
    _, a = first.aggregate(1, state1, next_updates, {})
    _, b = resumed.aggregate(1, state1, next_updates, {})
    assert a["reputations"] == b["reputations"] and a["reputations"]["site-3"] == 0.0  # removed for good
