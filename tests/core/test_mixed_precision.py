"""The executor's `amp` switch: forward passes in mixed precision (bfloat16 on this CPU), float32 weights and losses,
float64 CKA Grams; off, nothing changes."""

import numpy as np
import pytest
import torch
from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.methods.fedism.protocol import SALT_RHO, SHARPNESS, SHARPNESS_RHO
from fairfl.methods.fedlwr.cka import _GramWorkspace
from fairfl.methods.fedlwr.protocol import CKA, CKA_BATCH_SIZE, CKA_MAX_POSITIONS, CKA_MAX_SAMPLES, CKA_SPLIT, TASK_CKA
from fairfl.models import build_model, initial_state
from fairfl.training import TrainSettings, mixed_precision, train_local

from helpers import segmentation_task_meta, trained_weights

SPEC = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [8, 16], "strides": [2]}
META = segmentation_task_meta(SPEC)


def conv_output_dtypes(model) -> list:
    """The dtypes of every convolution's output, recorded as the model runs."""
    seen = []
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    return seen


def batches(n=3, size=16):
    g = torch.Generator().manual_seed(0)
    label = torch.zeros(4, 1, size, size, dtype=torch.long)
    label[:, :, 4:12, 5:11] = 1
    return [{"image": label.float() * 2 + 0.3 * torch.randn(4, 1, size, size, generator=g), "label": label}] * n


@pytest.mark.parametrize("amp", [False, True])
def test_train_local_with_amp_runs_bfloat16_forward_passes_and_keeps_float32_weights(amp):
    torch.manual_seed(0)
    model = build_model(SPEC)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dtypes = conv_output_dtypes(model)
    stats = train_local(model, batches(), TrainSettings(lr=1e-2), "cpu", amp=amp)
    assert set(dtypes) == {torch.bfloat16 if amp else torch.float32}
    after = model.state_dict()
    assert {k: v.dtype for k, v in after.items()} == {k: v.dtype for k, v in before.items()}
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    assert np.isfinite(stats["train_loss"]) and stats["steps"] == 3


def test_amp_off_trains_bit_identically_to_the_plain_loop():
    results = []
    for kwargs in ({}, {"amp": False}):
        torch.manual_seed(0)
        model = build_model(SPEC)
        train_local(model, batches(), TrainSettings(lr=1e-2), "cpu", **kwargs)
        results.append(model.state_dict())
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_cka_grams_stay_float64_under_amp():
    features = torch.randn(8, 3, 40, 40).to(torch.bfloat16)
    with mixed_precision("cpu", True):
        gram = _GramWorkspace()(features)
    assert gram.dtype == torch.float64
    assert not mixed_precision("cpu", False).__enter__()  # off: a no-op context


@pytest.mark.parametrize("amp", ["true", 1, None])
def test_amp_must_be_true_or_false(amp):
    with pytest.raises(ValueError, match="amp must be true or false"):
        FairflExecutor(amp=amp)


def test_a_site_with_amp_runs_fedism_plus_and_fedlwr_tasks_in_bfloat16(tmp_path, cache_dir, monkeypatch):
    """Through the real executor: FedISM+'s sharpness probe and SALT training, then Fed-LWR's CKA and evaluation,
    every forward pass in bfloat16; the weights sent back float32 and finite, CKA in [0, 1]."""
    executor = FairflExecutor(image_size=32, batch_size=8, local_steps=2, synthetic_size_scale=0.5, amp=True)
    monkeypatch.setattr(executor, "_state_dir", lambda fl_ctx, meta: str(tmp_path))
    dtypes = []
    real_build = build_model

    def recording_build(spec):
        model = real_build(spec)
        dtypes.append(conv_output_dtypes(model))
        return model

    monkeypatch.setattr("fairfl.flare.executor.build_model", recording_build)
    fl_ctx = FLContext()
    fl_ctx.set_prop(ReservedKey.IDENTITY_NAME, "site-1", private=False, sticky=False)

    def run(task_name, meta, params):
        task = FLModel(params_type=ParamsType.FULL, params=params, current_round=0, meta=meta)
        reply = executor.execute(task_name, FLModelUtils.to_shareable(task), fl_ctx, Signal())
        return FLModelUtils.from_shareable(reply)

    sent = initial_state(SPEC, 0)
    fedism = {**META, SHARPNESS_RHO: 0.05, SALT_RHO: 0.05}
    trained = run(protocol.TASK_TRAIN, fedism, sent)
    assert np.isfinite(trained.meta[SHARPNESS]["sharpness"])
    assert np.isfinite(trained.metrics["train_loss"]) and np.isfinite(trained.metrics["train_perturbed_loss"])
    weights = trained_weights(trained, sent)
    assert {k: v.dtype for k, v in weights.items()} == {k: v.dtype for k, v in sent.items()}
    assert all(np.isfinite(v).all() for v in weights.values())
    sample = {CKA_SPLIT: "training", CKA_MAX_SAMPLES: 64, CKA_BATCH_SIZE: 32, CKA_MAX_POSITIONS: 4096}
    cka = run(TASK_CKA, {**META, **sample}, sent).meta[CKA]
    assert cka and all(0.0 <= v <= 1.0 for v in cka.values())
    scores = run(protocol.TASK_VALIDATE, META, weights).metrics
    assert 0.0 <= scores["dice"] <= 1.0
    assert {d for seen in dtypes for d in seen} == {torch.bfloat16}
