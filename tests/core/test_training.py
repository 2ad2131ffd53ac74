"""Local training and evaluation loops on tiny real MONAI models and data."""

import os

import pytest
import torch

from fairfl.models import build_model, initial_state, load_numpy_state
from fairfl.training import TrainSettings, evaluate_dice, save_model, site_seed, train_local

SPEC = {"channels": [4, 8], "strides": [2]}


def batches(n=4, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        label = torch.zeros(4, 1, size, size, dtype=torch.long)
        label[:, :, 4:12, 5:11] = 1
        image = label.float() * 2 + 0.3 * torch.randn(4, 1, size, size, generator=g)
        out.append({"image": image, "label": label})
    return out


class Oracle(torch.nn.Module):
    """Logits that put each pixel in the class given (a perfect segmenter for these batches)."""

    def forward(self, x):
        fg = (x > 1.0).float()
        return torch.cat([1 - fg, fg], dim=1) * 10


def test_dice_is_one_for_a_perfect_model_and_lower_for_a_blank_one():
    data = [{"image": b["label"].float() * 2, "label": b["label"]} for b in batches()]
    assert evaluate_dice(Oracle(), data, 2, "cpu")["dice"] == pytest.approx(1.0)

    class Blank(torch.nn.Module):
        def forward(self, x):
            return torch.cat([torch.ones_like(x), torch.zeros_like(x)], dim=1)

    assert evaluate_dice(Blank(), data, 2, "cpu")["dice"] == pytest.approx(0.0)


def test_train_local_lowers_the_loss_and_counts_steps():
    torch.manual_seed(0)
    model = build_model(SPEC)
    data = batches()
    first = train_local(model, data, TrainSettings(lr=1e-2), "cpu")
    for _ in range(15):
        last = train_local(model, data, TrainSettings(lr=1e-2), "cpu")
    assert first["steps"] == len(data)
    assert last["train_loss"] < first["train_loss"]
    fixed = train_local(model, data, TrainSettings(local_steps=6), "cpu")
    assert fixed["steps"] == 6  # a fixed number of steps, cycling over the data


def test_initial_state_is_seeded_and_loads_back(tmp_path):
    a, b, c = initial_state(SPEC, 0), initial_state(SPEC, 0), initial_state(SPEC, 1)
    assert all((a[k] == b[k]).all() for k in a)
    assert any((a[k] != c[k]).any() for k in a if a[k].dtype.kind == "f")
    model = load_numpy_state(build_model(SPEC), a)
    path = str(tmp_path / "sub" / "model.pt")
    save_model(model, path)
    assert os.listdir(tmp_path / "sub") == ["model.pt"]  # no temporary left behind
    assert site_seed(0, "site-1") == site_seed(0, "site-1") != site_seed(0, "site-2")


def test_ast_parse_guard_keeps_literal_eval_working():
    import ast
    import importlib
    import sys

    from fairfl.compat import serialize_ast_parse

    importlib.import_module("fairfl.flare")  # importing it installs the guard where the Python version needs it

    serialize_ast_parse()  # idempotent
    affected = (3, 11) <= sys.version_info[:3] < (3, 11, 8) or sys.version_info[:3] == (3, 12, 0)
    assert getattr(ast.parse, "_fairfl_serialized", False) == affected
    assert ast.literal_eval("{'descr': '<f4', 'shape': (2, 3)}") == {"descr": "<f4", "shape": (2, 3)}
