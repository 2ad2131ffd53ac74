"""The round's settings (fairfl.flare.round_settings.RoundSettings): one typed field per round argument, resolved
once, never changed; a controller reads the round's from them and keeps only its method's own as attributes."""

import dataclasses

import pytest

from fairfl.arguments import ROUND
from fairfl.flare.round_settings import ROUND_ARGUMENTS, RoundSettings
from fairfl.methods.fedavg.controller import FedAvgController
from fairfl.methods.fedlwr.controller import FedLWRController
from fairfl.methods.fedprox.controller import FedProxController

TINY = {"model_channels": [4, 8], "model_strides": [2]}


def test_one_field_per_round_argument_in_their_order():
    assert [field.name for field in dataclasses.fields(RoundSettings)] == [a.name for a in ROUND]
    assert {a.name for a in ROUND} == ROUND_ARGUMENTS


def test_settings_are_resolved_once_and_never_changed(monkeypatch):
    controller = FedAvgController(
        **TINY, num_classes=None, straggler_timeout=2.5, exclude_sites=["site-3", "site-1"], momentum=0
    )
    settings = controller.settings
    assert (settings.num_classes, settings.in_channels) == (2, 1)  # the dataset's
    assert settings.straggler_timeout == 3 and settings.exclude_sites == ["site-1", "site-3"]
    assert settings.max_share == 0.5 and FedLWRController(**TINY).settings.max_share == 1.0  # the method's default
    assert type(settings.momentum) is float and settings.network == "unet" and settings.task == "segmentation"
    assert FedAvgController(dataset="skin").settings.model_channels == [16, 32, 64]  # the task's
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.num_rounds = 5
    monkeypatch.setenv("FAIRFL_PRESET", "paper")
    paper = settings.with_preset()
    assert paper.num_rounds == 200 and paper.model_strides == [2, 2, 2, 2] and settings.num_rounds == 20


def test_a_method_s_own_arguments_stay_attributes_and_config_records_both():
    controller = FedProxController(**TINY, mu=0.5, num_rounds=7)
    assert controller.mu == 0.5 and not hasattr(controller, "num_rounds") and controller.settings.num_rounds == 7
    config = controller.config()
    assert config["mu"] == 0.5 and config["num_rounds"] == 7 and config["model_strides"] == [2]
