"""The methods' client steps (fairfl.methods.steps): the real executor runs the steps a task's meta switches on in
fixed phases, a step that does not apply is never called, and a step's bad data is the site's bad-task reply."""

import contextlib
import os
import subprocess
import sys

import pytest
from nvflare.apis.fl_constant import ReservedKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

import fairfl.methods.steps as steps_module
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.methods import CLIENT_STEPS
from fairfl.methods.steps import ClientStep, TaskSteps, problems, registered_steps
from fairfl.models import initial_state

from conftest import segmentation_task_meta

SPEC = {"name": "unet", "in_channels": 1, "num_classes": 3, "channels": [8, 16, 32], "strides": [2, 2]}
META = segmentation_task_meta(SPEC)
CALLS = []


class Recorder(ClientStep):
    """Switched on by meta "record"; records every phase it is called in, adds reply meta and a metric."""

    @classmethod
    def applies(cls, meta):
        return bool(meta.get("record"))

    def before_start(self, ctx):
        CALLS.append("before_start")
        if ctx.meta["record"] == "bad data":
            raise DataError(ctx.site, "my_step_file.pt", "not a step file")
        if ctx.meta["record"] == "crash":
            raise RuntimeError("a bug in a step")

    def received(self, ctx, model):
        CALLS.append("received")

    def before_training(self, ctx, model):
        CALLS.append("before_training")
        with ctx.timed("record_seconds"):
            ctx.reply["recorded"] = ctx.round

    def loss(self, ctx, loss_fn, model, stack):
        CALLS.append("loss")
        return loss_fn

    def train(self, ctx, model, loader, settings, loss_fn, optimizer):
        CALLS.append("train")
        return None  # the usual loop

    def after_training(self, ctx, model):
        CALLS.append("after_training")

    def outgoing(self, ctx, params, model):
        CALLS.append("outgoing")
        return params

    def evaluated_model(self, ctx):
        CALLS.append("evaluated_model")
        return None


class NeverApplies(ClientStep):
    """A step no task switches on: any phase called fails the test."""

    @classmethod
    def applies(cls, meta):
        return False

    def __getattribute__(self, name):
        raise AssertionError(f"a step that does not apply was used ({name})")


@pytest.fixture
def site(monkeypatch, tmp_path, cache_dir):
    """A real executor for site-2 with the registry's steps plus Recorder and NeverApplies, and `run(task, meta)`:
    its reply to a task through `execute`, as FLARE calls it."""
    monkeypatch.setattr(steps_module, "registered_steps", lambda: (NeverApplies, *registered_steps(), Recorder))
    CALLS.clear()
    executor = FairflExecutor(image_size=32, batch_size=8, local_steps=1, synthetic_size_scale=0.5)
    monkeypatch.setattr(executor, "_state_dir", lambda fl_ctx, meta: str(tmp_path))
    fl_ctx = FLContext()
    fl_ctx.set_prop(ReservedKey.IDENTITY_NAME, "site-2", private=False, sticky=False)

    def run(task_name, meta, round_num=1):
        task = FLModel(params_type=ParamsType.FULL, params=initial_state(SPEC, 0), current_round=round_num, meta=meta)
        return executor.execute(task_name, FLModelUtils.to_shareable(task), fl_ctx, Signal())

    return run, tmp_path


def test_the_executor_runs_a_steps_phases_in_order_and_never_a_step_that_does_not_apply(site):
    run, state_dir = site
    reply = run(protocol.TASK_TRAIN, {**META, "record": True})
    assert reply.get_return_code() == ReturnCode.OK
    result = FLModelUtils.from_shareable(reply)
    assert CALLS == ["before_start", "received", "before_training", "loss", "train", "after_training", "outgoing"]
    assert result.meta["recorded"] == 1 and result.metrics["record_seconds"] >= 0.0  # the step's reply and metric
    assert result.metrics["train_loss"] > 0 and result.meta[protocol.NUM_STEPS] == 1  # the usual loop trained
    assert set(result.params) == set(initial_state(SPEC, 0))
    CALLS.clear()
    reply = run(protocol.TASK_VALIDATE, {**META, "record": True})
    assert reply.get_return_code() == ReturnCode.OK and CALLS == ["evaluated_model", "received"]
    CALLS.clear()
    assert run(protocol.TASK_TRAIN, META).get_return_code() == ReturnCode.OK and CALLS == []  # not switched on


@pytest.mark.parametrize(
    "mode, code", [("bad data", ReturnCode.BAD_TASK_DATA), ("crash", ReturnCode.EXECUTION_EXCEPTION)]
)
def test_a_step_that_fails_is_the_sites_reply_and_trains_nothing(site, mode, code):
    run, state_dir = site
    assert run(protocol.TASK_TRAIN, {**META, "record": mode}).get_return_code() == code
    assert CALLS == ["before_start"] and not os.path.exists(state_dir / protocol.LOCAL_MODEL_FILE)


def test_two_steps_that_both_replace_the_loss_or_both_train_are_a_bad_task(monkeypatch):
    # FedNPR's objective and SALT's loop are real steps; a second of each kind is switched on with them
    replacing = type("OtherObjective", (Recorder,), {"replaces_loss": True})
    training = type(
        "OtherLoop",
        (ClientStep,),
        {"applies": classmethod(lambda cls, meta: True), "train": lambda self, *args: {"steps": 0}},
    )
    npr_meta = {
        protocol.NPR: {
            "k": 2,
            "weight": 1.0,
            "epsilon": 0.05,
            "iterations": 3,
            "temperature": 1.0,
            "logits": "layernorm",
        },
        "record": True,
    }
    found = problems(npr_meta, (*registered_steps(), replacing))
    assert len(found) == 1 and "NPRObjective" in found[0] and "OtherObjective" in found[0] and "loss" in found[0]
    found = problems({protocol.SALT_RHO: 0.1}, (*registered_steps(), training))
    assert len(found) == 1 and "SALTTraining" in found[0] and "OtherLoop" in found[0]
    assert problems({**npr_meta, protocol.PROX_MU: 0.01}) == []  # FedProx + NPR: one replaces, one adds a term
    real = registered_steps()
    monkeypatch.setattr(steps_module, "registered_steps", lambda: (*real, replacing))
    with pytest.raises(DataError, match="site-2.*the server's task.*would all replace the local loss"):
        FairflExecutor._check_task("site-2", {**META, **npr_meta})


def test_a_step_replacing_the_loss_runs_before_steps_adding_a_term_whatever_the_registry_order():
    def step(name, replaces):
        return type(
            name,
            (ClientStep,),
            {
                "replaces_loss": replaces,
                "applies": classmethod(lambda cls, meta: name in meta),
                "loss": lambda self, ctx, loss_fn, model, stack: name if replaces else f"{loss_fn} + {name}",
            },
        )

    prox, npr, other = step("prox", False), step("npr", True), step("other", False)
    with contextlib.ExitStack() as stack:
        steps = TaskSteps({"prox": 1, "npr": 1, "other": 1}, (prox, npr, other))
        assert steps.loss(None, "base", None, stack) == "npr + prox + other"
        assert (
            TaskSteps({"prox": 1, "other": 1}, (prox, npr, other)).loss(None, "base", None, stack)
            == "base + prox + other"
        )


def test_the_registry_names_step_classes_in_the_units_and_imports_without_torch():
    classes = registered_steps()
    assert len(classes) == len(CLIENT_STEPS) == len(set(classes))
    assert all(issubclass(cls, ClientStep) and cls.__module__.endswith(".client") for cls in classes)
    code = "import sys, fairfl.methods; assert 'torch' not in sys.modules and 'nvflare' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
