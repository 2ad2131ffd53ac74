"""FedAvgM: the server's momentum step against the paper's recursion written out, its limits (FedAvg), what it leaves
alone (integer buffers, dtypes), the order of the sites, and the arguments it refuses, without FLARE processes."""

import numpy as np
import pytest
import torch

from fairfl.flare.engine import SiteUpdate
from fairfl.methods.fedavg.controller import FedAvgController
from fairfl.methods.fedavgm.controller import FedAvgMController
from fairfl.methods.fedavgm.momentum import momentum_step
from fairfl.models import initial_state, state_to_torch

TINY = {"model_channels": [4, 8], "model_strides": [2], "model_norm": "batch"}


def test_three_rounds_follow_the_papers_recursion():
    """v_{t+1} = beta v_t + (w_t - avg_t), w_{t+1} = w_t - eta v_{t+1}, written out for one float64 vector."""
    rng = np.random.default_rng(0)
    beta, eta = 0.8, 0.3
    w, v = rng.normal(size=5), np.zeros(5)
    state, velocity = {"w": w.copy()}, None
    for _ in range(3):
        average = w + rng.normal(size=5)
        v = beta * v + (w - average)
        w = w - eta * v
        state, velocity = momentum_step(state, {"w": average}, velocity, beta, eta)
        np.testing.assert_allclose(state["w"], w, rtol=0, atol=1e-12)
        np.testing.assert_allclose(velocity["w"], v, rtol=0, atol=1e-12)


def test_no_momentum_and_a_unit_step_is_the_average_and_integers_take_the_average():
    current = {"w": np.array([1.0, -2.0], dtype=np.float32), "count": np.array(4, dtype=np.int64)}
    average = {"w": np.array([0.5, 3.0], dtype=np.float32), "count": np.array(9, dtype=np.int64)}
    new, velocity = momentum_step(current, average, None, 0.0, 1.0)
    np.testing.assert_allclose(new["w"], average["w"], atol=1e-6)
    assert new["w"].dtype == np.float32 and velocity["w"].dtype == np.float32
    assert new["count"] == 9 and new["count"].dtype == np.int64 and "count" not in velocity


def updates_for(controller, global_state, seed, sites=("site-1", "site-2", "site-3")):
    reference = controller.update_reference(global_state)
    generator = torch.Generator().manual_seed(seed)
    return {
        site: SiteUpdate(
            {
                k: v + 0.1 * (i + 1) * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v + i
                for k, v in reference.items()
            },
            10 * (i + 1),
            {},
        )
        for i, site in enumerate(sites)
    }


def test_the_controller_is_fedavg_without_momentum_and_accumulates_with_it():
    fedavg = FedAvgController(**TINY)
    plain = FedAvgMController(**TINY, server_momentum=0.0, server_lr=1.0)
    with_momentum = FedAvgMController(**TINY, server_momentum=0.5, server_lr=0.4)
    global_state = initial_state(fedavg.model_spec(), 0)
    first = updates_for(fedavg, global_state, seed=1)
    average, record = fedavg.aggregate(0, global_state, first, {})
    new, plain_record = plain.aggregate(0, global_state, first, {})
    assert plain_record == record  # the same weights recorded
    for key in average:
        np.testing.assert_allclose(new[key], average[key], atol=1e-6)
        assert new[key].dtype == global_state[key].dtype
    stepped, _ = with_momentum.aggregate(0, global_state, first, {})
    second = updates_for(fedavg, stepped, seed=2)
    second_average, _ = fedavg.aggregate(1, stepped, second, {})
    final, _ = with_momentum.aggregate(1, stepped, second, {})
    key = next(k for k, v in global_state.items() if np.issubdtype(v.dtype, np.floating) and v.size > 1)
    delta_1, delta_2 = global_state[key] - average[key], stepped[key] - second_average[key]
    np.testing.assert_allclose(final[key], stepped[key] - 0.4 * (0.5 * delta_1 + delta_2), atol=1e-5)


def test_the_order_the_sites_answer_in_changes_nothing():
    controller = FedAvgMController(**TINY)
    global_state = initial_state(controller.model_spec(), 0)
    updates = updates_for(controller, global_state, seed=3)
    backwards = dict(reversed(list(updates.items())))
    new, record = FedAvgMController(**TINY).aggregate(0, global_state, updates, {})
    reordered, reordered_record = FedAvgMController(**TINY).aggregate(0, global_state, backwards, {})
    assert record == reordered_record
    assert all(np.array_equal(new[k], reordered[k]) for k in new)


def test_the_velocity_survives_a_checkpoint():
    controller = FedAvgMController(**TINY)
    global_state = initial_state(controller.model_spec(), 0)
    controller.aggregate(0, global_state, updates_for(controller, global_state, seed=4), {})
    restored = FedAvgMController(**TINY)
    restored.load_method_tensors(controller.method_tensors())
    assert set(restored.velocity) == set(controller.velocity)
    assert all(np.array_equal(restored.velocity[k], controller.velocity[k]) for k in controller.velocity)
    assert FedAvgMController(**TINY).method_tensors() is None  # nothing to keep before the first step


@pytest.mark.parametrize(
    "name, value",
    [("server_momentum", 1.0), ("server_momentum", -0.1), ("server_lr", 0.0), ("server_lr", float("nan"))],
)
def test_a_momentum_that_never_decays_or_a_step_that_never_moves_is_refused(name, value):
    with pytest.raises(ValueError, match=name):
        FedAvgMController(**TINY, **{name: value})


def test_sites_send_what_fedavg_sites_send():
    """FedAvgM changes only the server: its sites get FedAvg's train task."""
    fedavg, fedavgm = FedAvgController(**TINY), FedAvgMController(**TINY)
    assert fedavgm.train_meta(0) == fedavg.train_meta(0) and fedavgm.site_meta() == fedavg.site_meta()
    assert (
        state_to_torch(initial_state(fedavgm.model_spec(), 0)).keys()
        == fedavg.update_reference(initial_state(fedavg.model_spec(), 0)).keys()
    )
