"""FedBN: which keys are the normalisation layers, the server leaving them out of the average, and the site keeping
its own (the shared local-part step), without FLARE processes."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fairfl.flare.engine import SiteUpdate
from fairfl.methods.fedbn.client import LocalNorm
from fairfl.methods.fedbn.controller import FedBNController
from fairfl.methods.fedbn.protocol import LOCAL_NORM
from fairfl.models import build_model, initial_state, norm_state_keys, state_to_numpy, state_to_torch

TINY = {"model_channels": [4, 8], "model_strides": [2], "model_norm": "batch"}


def test_norm_keys_are_exactly_the_normalisation_layers_state():
    unet = build_model({"name": "unet", "channels": [4, 8], "strides": [2], "norm": "batch"})
    keys = norm_state_keys(unet)
    norms = [m for m in unet.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and len(keys) == 5 * len(norms)  # weight, bias, running mean and var, batches tracked
    assert all(k in unet.state_dict() for k in keys) and not any("conv.weight" in k for k in keys)
    assert norm_state_keys({"name": "unet", "channels": [4, 8], "strides": [2]}) == []  # instance norm, no affine
    cnn = norm_state_keys({"name": "cnn", "channels": [4, 8, 16], "num_classes": 3})
    assert cnn and all(k.endswith(("weight", "bias")) for k in cnn)  # group norm: affine only, no statistics


def test_fedbn_averages_everything_but_the_norm_layers_which_stay_as_they_were():
    controller = FedBNController(**TINY)
    assert controller.method == "fedbn" and controller.site_meta() == {LOCAL_NORM: True}
    global_state = initial_state(controller.model_spec(), 0)
    norm = set(norm_state_keys(controller.model_spec()))
    reference = controller.update_reference(global_state)
    assert norm and not norm & set(reference) and set(reference) | norm == set(global_state)
    generator = torch.Generator().manual_seed(0)
    updates = {
        site: SiteUpdate(
            {
                k: v + (i + 1) * torch.randn(v.shape, generator=generator)
                for k, v in reference.items()
                if v.is_floating_point()
            }
            | {k: v for k, v in reference.items() if not v.is_floating_point()},
            10 * (i + 1),
            {},
        )
        for i, site in enumerate(("site-1", "site-2"))
    }
    new_state, extras = controller.aggregate_round(0, global_state, updates, {})
    assert extras["weights"] == pytest.approx({"site-1": 1 / 3, "site-2": 2 / 3})
    assert set(new_state) == set(global_state)
    for key in global_state:
        if key in norm:
            np.testing.assert_array_equal(new_state[key], global_state[key])
        elif updates["site-1"].state[key].is_floating_point():
            averaged = sum(extras["weights"][s] * updates[s].state[key].double() for s in updates).numpy()
            np.testing.assert_allclose(new_state[key], averaged, rtol=1e-5, atol=1e-6)


def test_fedbn_refuses_a_network_whose_norm_layers_have_nothing_to_keep():
    with pytest.raises(ValueError, match="model_norm to 'batch'"):
        FedBNController(model_channels=[4, 8], model_strides=[2])  # the U-Net's instance norm
    with pytest.raises(ValueError, match="classification networks"):
        FedBNController(model_channels=[4, 8], model_strides=[2], model_norm="group")


def test_the_site_trains_with_its_own_norm_layers_and_never_sends_them(tmp_path):
    spec = FedBNController(**TINY).model_spec()
    kept = {}  # the site's own model, as the executor's StepContext.own_model gives it
    step, ctx = LocalNorm(), SimpleNamespace(state_dir=str(tmp_path), own_model=lambda: kept.get("model"))
    assert LocalNorm.applies({LOCAL_NORM: True}) and not LocalNorm.applies({})
    sent = build_model(spec)
    before = {k: v.clone() for k, v in sent.state_dict().items()}
    step.received(ctx, sent)  # no local model yet: the site starts from the one sent
    assert all(torch.equal(before[k], v) for k, v in sent.state_dict().items())
    own = build_model(spec)
    with torch.no_grad():
        for value in own.state_dict().values():
            if value.is_floating_point():
                value.add_(1.0)
    kept["model"] = own.state_dict()
    step.received(ctx, sent)
    norm = set(norm_state_keys(sent))
    for key, value in sent.state_dict().items():
        expected = own.state_dict()[key] if key in norm else before[key]
        assert torch.equal(value, expected), key
    params = step.outgoing(ctx, state_to_numpy(sent.state_dict()), sent)
    assert set(params) == set(sent.state_dict()) - norm
    assert set(state_to_torch(params)) == set(params)
