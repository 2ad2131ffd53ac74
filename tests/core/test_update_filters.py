"""What a site's training sends: its weights as a difference from the weights sent (fairfl.updates), through the job's
NVFlare privacy filter (fairfl.flare.update_filters), and what the server makes of it."""

import math

import numpy as np
import pytest
import torch
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.fl_context import FLContext

from fairfl.flare.update_filters import FILTER_CLASSES, filter_setting, make_filter
from fairfl.models import build_model, state_to_numpy
from fairfl.updates import weight_difference, weights_from_update

SPEC = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [4, 8], "strides": [2], "norm": "batch"}


def states():
    torch.manual_seed(0)
    sent = build_model(SPEC).state_dict()
    trained = {k: v + torch.randn_like(v) * 0.01 if v.is_floating_point() else v + 3 for k, v in sent.items()}
    return sent, trained


def test_the_server_rebuilds_the_trained_weights_from_the_difference():
    sent, trained = states()
    update = weight_difference(state_to_numpy(trained), state_to_numpy(sent))
    rebuilt, problem = weights_from_update({k: torch.as_tensor(v) for k, v in update.items()}, sent)
    assert problem is None
    assert list(rebuilt) == list(sent)
    counters = [k for k, v in sent.items() if not v.is_floating_point()]
    assert counters  # batch norm's num_batches_tracked: an integer travels as a difference too
    for key, value in trained.items():
        assert rebuilt[key].dtype == value.dtype
        # float32: (trained - sent) + sent is trained to within rounding of the larger of the two
        torch.testing.assert_close(rebuilt[key], value, rtol=0, atol=1e-6)
    assert all(torch.equal(rebuilt[k], trained[k]) for k in counters)


def test_a_tensor_left_out_keeps_the_value_sent_and_nothing_else_is_admitted():
    sent, trained = states()
    update = {k: (trained[k] - v) for k, v in sent.items()}
    head = next(k for k in sent if k.endswith("weight"))
    partial = {k: v for k, v in update.items() if k != head}
    rebuilt, problem = weights_from_update(partial, sent)
    assert problem is None and torch.equal(rebuilt[head], sent[head])

    bad = {
        "an extra tensor": {**update, "smuggled": torch.zeros(3)},
        "a shape that would broadcast": {**update, head: torch.zeros(1)},
        "another dtype": {**update, head: update[head].double()},
        "NaN": {**update, head: torch.full_like(update[head], math.nan)},
        # finite alone, infinite once added: the sum is checked too
        "overflow": {**update, head: torch.full_like(update[head], 3e38)},
    }
    sent_big = {**sent, head: torch.full_like(sent[head], 3e38)}
    for what, hostile in bad.items():
        rebuilt, problem = weights_from_update(hostile, sent_big if what == "overflow" else sent)
        assert rebuilt is None and problem.startswith("the update: "), what


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("none", None),
        ("percentile", ("percentile", {})),
        ({"name": "svt", "fraction": 0.2}, ("svt", {"fraction": 0.2})),
        (
            {"name": "exclude_vars", "exclude_vars": "^model\\.2\\."},
            ("exclude_vars", {"exclude_vars": "^model\\.2\\."}),
        ),
    ],
)
def test_the_settings_a_job_may_give(value, expected):
    assert filter_setting(value) == expected


@pytest.mark.parametrize(
    "value, says",
    [
        ("nvflare.app_common.filters.dxo_blocker.DXOBlocker", "the filters are"),
        ({"name": "os.system"}, "the filters are"),
        ({"name": "percentile", "percentile": 101}, "percentile percentile"),
        ({"name": "percentile", "data_kinds": ["WEIGHTS"]}, "not data_kinds"),
        ({"name": "exclude_vars", "exclude_vars": "(["}, "not a regular expression"),
        ({"name": "exclude_vars"}, "needs exclude_vars"),
        (["percentile"], "expected a filter's name"),
    ],
)
def test_anything_else_is_refused_saying_why(value, says):
    with pytest.raises(ValueError) as error:
        filter_setting(value)
    assert says in str(error.value)


def filtered(setting, update: dict) -> dict:
    """`update` through the filter of `setting` as NVFlare's filter chain passes a site's training result."""
    shareable = DXO(data_kind=DataKind.WEIGHT_DIFF, data=update).to_shareable()
    return from_shareable(make_filter(setting).process(shareable, FLContext())).data


def test_nvflares_own_filters_are_the_ones_applied():
    assert {
        type(make_filter(name if name != "exclude_vars" else {"name": name, "exclude_vars": "x"})).__module__
        for name in FILTER_CLASSES
    } == {path.rpartition(".")[0] for path in FILTER_CLASSES.values()}
    rng = np.random.default_rng(0)
    update = {"a": rng.normal(0, 0.01, (50, 20)).astype(np.float32), "b": rng.normal(0, 0.01, 100).astype(np.float32)}
    kept = filtered({"name": "percentile", "percentile": 90, "gamma": 0.005}, {k: v.copy() for k, v in update.items()})
    changed = np.concatenate([kept[k].ravel() for k in update])
    # only the largest tenth of the changes is sent, each clipped to gamma
    assert 0.05 < np.mean(changed != 0) < 0.15 and np.abs(changed).max() <= 0.005
    assert set(filtered({"name": "exclude_vars", "exclude_vars": ["b"]}, dict(update))) == {"a"}
    noisy = filtered({"name": "svt", "fraction": 0.5}, {k: v.copy() for k, v in update.items()})
    assert not np.allclose(noisy["a"], update["a"])


def test_the_site_sends_the_filtered_update_in_the_dtypes_of_its_weights():
    from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
    from nvflare.app_common.utils.fl_model_utils import FLModelUtils

    from fairfl.flare.executor import FairflExecutor

    sent, trained = states()
    update = weight_difference(state_to_numpy(trained), state_to_numpy(sent))
    result = FLModel(params_type=ParamsType.DIFF, params=update, metrics={"train_loss": 0.5}, meta={"num_steps": 4})
    executor = FairflExecutor(privacy_filter={"name": "percentile", "percentile": 50, "gamma": 0.001})
    answer = FLModelUtils.from_shareable(executor._filtered(result, FLContext()))
    assert answer.params_type == ParamsType.DIFF and answer.metrics == {"train_loss": 0.5}
    assert {k: v.dtype for k, v in answer.params.items()} == {k: v.dtype for k, v in update.items()}
    rebuilt, problem = weights_from_update({k: torch.as_tensor(v) for k, v in answer.params.items()}, sent)
    assert problem is None
    moved = torch.cat([(rebuilt[k] - sent[k]).ravel() for k in sent if sent[k].is_floating_point()])
    assert 0 < float(moved.abs().max()) <= 0.001 + 1e-7  # the filter's cap, once the weights are rebuilt
