"""The methods' client steps (fairfl.methods.steps): the real executor runs the steps a task's meta switches on in
fixed phases, a step that does not apply is never called, and a step's bad data is the site's bad-task reply. What the
server sends is checked before anything is built: every task field the steps and the executor declare, the round and
the weights; and a site sends its own model for cross-site evaluation only where its own setting lets it."""

import contextlib
import importlib
import importlib.util
import inspect
import logging
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from nvflare.apis.fl_constant import FLContextKey, ReservedKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

import fairfl.flare.executor as executor_module
import fairfl.methods.steps as steps_module
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import TASK_FIELDS, check_meta
from fairfl.kinds import Boolean, Integer, Real
from fairfl.methods import CLIENT_STEPS, UNITS
from fairfl.methods.ditto.protocol import DITTO_LAMBDA
from fairfl.methods.fedce.protocol import LOO_WEIGHTS
from fairfl.methods.fedfloor.protocol import MIX_GRID
from fairfl.methods.fedism.protocol import SALT_ALPHA, SALT_RHO, SHARPNESS_RHO
from fairfl.methods.fednpr.protocol import NPR
from fairfl.methods.fedprox.protocol import PROX_MU
from fairfl.methods.qfedavg.protocol import MEASURE_LOSS
from fairfl.methods.steps import (
    ClientStep,
    MethodTask,
    TaskSteps,
    declared_fields,
    problems,
    registered_steps,
    registered_tasks,
)
from fairfl.models import initial_state

from helpers import segmentation_task_meta

SPEC = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [8, 16, 32], "strides": [2, 2]}
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

    def run(task_name, meta, round_num=1, params=None, simulator=False):
        """The site's reply; `params` default: the initial weights; `simulator`: as NVFlare's simulator runs it."""
        fl_ctx = FLContext()
        fl_ctx.set_prop(ReservedKey.IDENTITY_NAME, "site-2", private=False, sticky=False)
        if simulator:
            fl_ctx.set_prop(FLContextKey.SIMULATE_MODE, True, private=True, sticky=False)
        params = initial_state(SPEC, 0) if params is None else params
        task = FLModel(params_type=ParamsType.FULL, params=params, current_round=round_num, meta=meta)
        return executor.execute(task_name, FLModelUtils.to_shareable(task), fl_ctx, Signal())

    run.executor = executor
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
        NPR: {
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
    found = problems({SALT_RHO: 0.1}, (*registered_steps(), training))
    assert len(found) == 1 and "SALTTraining" in found[0] and "OtherLoop" in found[0]
    assert problems({**npr_meta, PROX_MU: 0.01}) == []  # FedProx + NPR: one replaces, one adds a term
    real = registered_steps()
    monkeypatch.setattr(steps_module, "registered_steps", lambda: (*real, replacing))
    with pytest.raises(DataError, match="site-2.*the server's task.*would all replace the local loss"):
        check_meta("site-2", {**META, **npr_meta})


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
    tasks = registered_tasks()
    assert tasks and all(issubclass(cls, MethodTask) and cls.__module__.endswith(".client") for cls in tasks.values())
    assert all(name == cls.name for name, cls in tasks.items())
    assert not set(tasks) & {protocol.TASK_TRAIN, protocol.TASK_VALIDATE}  # the executor's own tasks
    code = "import sys, fairfl.methods; assert 'torch' not in sys.modules and 'nvflare' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


class Probe(MethodTask):
    """A method's own site task reading one field: replies what it measured and a metric."""

    name = "probe"
    fields = {"probe_scale": Real(0.0, 10.0)}

    def run(self, ctx):
        ctx.reply["probed"] = ctx.round * ctx.meta["probe_scale"]
        ctx.metrics["probe_seconds"] = 0.0


def test_the_executor_answers_a_methods_own_task_by_its_name_and_refuses_one_lacking_its_fields(
    site, caplog, monkeypatch
):
    run, state_dir = site
    for module in (steps_module, executor_module):  # the registry the executor dispatches and checks by
        monkeypatch.setattr(module, "registered_tasks", lambda: {"probe": Probe})
    reply = run("probe", {**META, "probe_scale": 2.0})
    assert reply.get_return_code() == ReturnCode.OK
    result = FLModelUtils.from_shareable(reply)
    assert result.meta["probed"] == 2.0 and result.metrics == {"probe_seconds": 0.0} and not result.params
    code, log = answered(run, caplog, META, task_name="probe")
    assert code == ReturnCode.BAD_TASK_DATA and "site-2] the server's task: task field probe_scale is missing" in log
    code, log = answered(run, caplog, {**META, "probe_scale": 11.0})  # a declared field is checked in every task
    assert code == ReturnCode.BAD_TASK_DATA and "task field probe_scale is 11.0" in log and nothing_done(run, state_dir)
    code, log = answered(run, caplog, META, task_name="probes")
    assert code == ReturnCode.TASK_UNKNOWN and "this executor answers ['probe', 'train', 'validate']" in log


class SampledProbe(Probe):
    """Reads a sample of the validation split of the size the server asks for (as Fed-LWR's CKA does)."""

    name = "sampled_probe"

    def run(self, ctx):
        size = int(ctx.meta["probe_scale"])
        ctx.reply["probed"] = sum(len(batch["image"]) for batch in ctx.loader("validation", False, 0, size, 2))


def test_a_site_keeps_one_sampled_loader_per_split_whatever_sizes_the_server_asks_for(site, monkeypatch):
    """The server's task chooses a sample's size; a site caching a loader per size asked would grow every round."""
    run, _ = site
    for module in (steps_module, executor_module):
        monkeypatch.setattr(module, "registered_tasks", lambda: {"sampled_probe": SampledProbe})
    for size in (2, 3, 4, 3):
        reply = run("sampled_probe", {**META, "probe_scale": float(size)})
        assert FLModelUtils.from_shareable(reply).meta["probed"] == size
    assert run(protocol.TASK_VALIDATE, META).get_return_code() == ReturnCode.OK
    sampled = [key for key in run.executor._loaders if key[2] is not None]
    assert sampled == [("validation", False, 3, 2, False)]
    assert ("testing", False, None, None, False) in run.executor._loaders  # the unsampled loaders stay


# ------------------------------------------------------------------------------------ what the server sends
HOSTILE = (math.nan, math.inf, -1e9, 1e9, "x", "../x", [1], {}, None, True)
# (field, hostile value) pairs that are honest settings: the grid of Ditto itself, FedCE's weights without this site
HONEST = {(MIX_GRID, "[1]"), (LOO_WEIGHTS, "{}"), (protocol.RUN_NAME, "'x'")}


def task_fields():
    """{meta key: (who reads it, its Field)}: the executor's own and every registered step's and method task's."""
    fields = {key: ("FairflExecutor", field) for key, field in TASK_FIELDS.items()}
    for reader in (*registered_steps(), *registered_tasks().values()):
        fields.update({key: (reader.__name__, field) for key, field in reader.fields.items()})
    return fields


def has_protocol(unit) -> bool:
    return importlib.util.find_spec(f"{unit.package}.protocol") is not None


def answered(run, caplog, meta, task_name=protocol.TASK_TRAIN, **options):
    """(return code, what the site logged) of one task."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        code = run(task_name, meta, **options).get_return_code()
    return code, caplog.text


def nothing_done(run, state_dir) -> bool:
    """No data read, nothing trained or kept."""
    return run.executor._datalist is None and not os.listdir(state_dir)


def hostile_task_cases() -> list:
    """(who reads it, meta key, hostile value) of every declared task field, but the honest pairs."""
    return [
        (reader, key, value)
        for key, (reader, field) in task_fields().items()
        for value in HOSTILE
        if (key, repr(value)) not in HONEST and not (isinstance(field, Boolean) and value is True)
    ]


def test_every_declared_task_field_refuses_each_hostile_value_naming_the_field_before_training(site, caplog):
    run, state_dir = site
    failures = []
    for reader, key, value in hostile_task_cases():
        code, log = answered(run, caplog, {**META, key: value})
        named = re.search(rf"site-2.*task field {key} ", log)
        if code != ReturnCode.BAD_TASK_DATA or not named or not nothing_done(run, state_dir):
            failures.append(f"{reader} {key}={value!r}: {code}, named {bool(named)}")
    assert not failures, "\n".join(failures)


def sent_keys(module) -> set:
    """The keys of a protocol module's server -> site block (up to its first blank line)."""
    source = inspect.getsource(module)
    block = source.split("# server -> site\n")[1].split("\n\n")[0] if "# server -> site" in source else ""
    return {getattr(module, name) for name in re.findall(r"^([A-Z_]+) = ", block, re.M) if not name.startswith("FROM_")}


def test_the_declarations_cover_every_key_the_server_sends_and_agree():
    """A key of a server -> site block, the shared protocol's or a unit's (fairfl.methods.<name>.protocol), is
    declared (by the executor, a step or a method task) or checked by one of the executor's own checks; a new method
    key without a declaration fails here."""
    units = [importlib.import_module(f"{unit.package}.protocol") for unit in UNITS if has_protocol(unit)]
    sent = set().union(*(sent_keys(module) for module in (protocol, *units)))
    assert len(units) >= 10 and {PROX_MU, "cka_split"} <= sent
    checked_elsewhere = {  # tests/core/test_bad_configuration.py CONFIG_CASES
        protocol.MODEL_SPEC,
        protocol.NUM_SITES,
        protocol.DATA_SEED,
        protocol.TEST_SCALE,
        protocol.HELD_OUT,
        protocol.OPTIMIZER,
    }
    assert sent - checked_elsewhere - set(task_fields()) == set()
    assert declared_fields() == {k: f for k, (_, f) in task_fields().items() if k not in TASK_FIELDS}
    with pytest.raises(ValueError, match="declare task field 'prox_mu' differently"):
        declared_fields((*registered_steps(), type("Other", (ClientStep,), {"fields": {PROX_MU: Boolean()}})))


def test_honest_settings_at_their_bounds_are_accepted():
    honest = {
        DITTO_LAMBDA: 1000.0,
        PROX_MU: 0.0,
        SALT_RHO: 10.0,
        SALT_ALPHA: 1,
        SHARPNESS_RHO: np.float32(0.05),
        MEASURE_LOSS: False,
        LOO_WEIGHTS: {"site-1": 0.25, "site-2": 1.0},
        MIX_GRID: [0.0, 0.5, 1.0],
        protocol.TASK: "classification",
    }
    assert problems(honest) == [] and check_meta("site-2", {**META, **honest}) is None
    too_far = {DITTO_LAMBDA: 1000.001, LOO_WEIGHTS: {"site-1": 1.5}, MIX_GRID: [0.0] * 0}
    found = problems(too_far)
    assert len(found) == 3 and all(
        any(text in line for line in found)
        for text in ("ditto_lambda is 1000.001, expected a finite number in [0, 1000]", "['site-1'] is 1.5", "mix_grid")
    )
    assert Integer(0, 10).problem(10**5000).startswith("is an integer of 16610 bits")
    assert "more than the 101" in problems({MIX_GRID: [i / 200 for i in range(201)]})[0]


@pytest.mark.parametrize(
    "tensor, value, named",
    [(0, math.nan, "NaN in"), (3, math.inf, "Inf in"), (1, "shape", "shape mismatch"), (2, "drop", "missing keys")],
)
def test_non_finite_or_misfitting_global_weights_are_refused_naming_the_tensor_before_training(
    site, caplog, tensor, value, named
):
    run, state_dir = site
    params = initial_state(SPEC, 0)
    key = sorted(k for k, v in params.items() if v.dtype.kind == "f")[tensor]
    if value == "shape":
        params[key] = np.zeros((*params[key].shape, 2), np.float32)
    elif value == "drop":
        del params[key]
    else:
        params[key] = params[key].copy()
        params[key].flat[0] = value
    code, log = answered(run, caplog, META, params=params)
    assert code == ReturnCode.BAD_TASK_DATA and f"site-2] the server's task: the weights sent: {named}" in log
    assert key in log and "Traceback" not in log and nothing_done(run, state_dir)
    code, log = answered(run, caplog, META, task_name=protocol.TASK_VALIDATE, params=params)
    assert code == ReturnCode.BAD_TASK_DATA and key in log  # not scored either


@pytest.mark.parametrize("round_num", [-1, 10**12, "3", 2.5])
def test_a_task_of_no_plausible_round_is_refused(site, caplog, monkeypatch, round_num):
    """The round seeds the site's batches and names its kept files' rounds; FLModel's own check of it (a negative or
    non-integer round) is bad task data too, not a crash."""
    run, state_dir = site
    to_shareable = FLModelUtils.to_shareable

    def with_round(model):
        shareable = to_shareable(model)
        shareable.set_header(AppConstants.CURRENT_ROUND, round_num)
        return shareable

    monkeypatch.setattr(FLModelUtils, "to_shareable", with_round)
    code, log = answered(run, caplog, META)
    assert code == ReturnCode.BAD_TASK_DATA and "site-2] the server's task:" in log and "round" in log
    assert "Traceback" not in log and nothing_done(run, state_dir)


# ------------------------------------------------------------------- cross-site evaluation: sharing own models
SUBMIT = {**META, protocol.EVALUATE: protocol.FROM_PERSONAL, protocol.SUBMIT_MODEL: True}


def test_a_site_sends_its_own_model_only_where_its_setting_lets_it(site, caplog, monkeypatch):
    """Unset: only in NVFlare's simulator (POC and provisioned sites keep their models); 1 or 0: the site's choice.
    Declined is TASK_UNSUPPORTED (the server records the site as failed for the cross-site evaluation), nothing read
    or sent; scoring another site's model (no SUBMIT_MODEL) is never declined."""
    run, state_dir = site
    for setting, simulator, shares in (
        (None, False, False),
        ("0", True, False),
        ("no", False, False),
        (None, True, True),
        ("1", False, True),
    ):
        monkeypatch.delenv("FAIRFL_SHARE_OWN_MODEL", raising=False)
        if setting is not None:
            monkeypatch.setenv("FAIRFL_SHARE_OWN_MODEL", setting)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            reply = run(protocol.TASK_VALIDATE, SUBMIT, simulator=simulator)
        case = f"FAIRFL_SHARE_OWN_MODEL={setting}, simulator {simulator}"
        if shares:
            assert reply.get_return_code() == ReturnCode.OK, case
            assert set(FLModelUtils.from_shareable(reply).params) == set(initial_state(SPEC, 0)), case
            continue
        assert reply.get_return_code() == ReturnCode.TASK_UNSUPPORTED and set(reply) == {"__headers__"}, case
        assert "[site-2] declines to send its own model for cross-site evaluation: FAIRFL_SHARE_OWN_MODEL is" in (
            caplog.text
        )
        assert nothing_done(run, state_dir) and "Traceback" not in caplog.text, case
    monkeypatch.setenv("FAIRFL_SHARE_OWN_MODEL", "0")
    others = {**META, protocol.HELD_OUT: ["site-1", "site-2"]}  # the second phase: scoring another site's model
    assert run(protocol.TASK_VALIDATE, others).get_return_code() == ReturnCode.OK


def test_a_malformed_sharing_setting_is_bad_task_data_naming_it(site, caplog, monkeypatch):
    run, state_dir = site
    monkeypatch.setenv("FAIRFL_SHARE_OWN_MODEL", "maybe")
    code, log = answered(run, caplog, SUBMIT, task_name=protocol.TASK_VALIDATE, simulator=True)
    assert code == ReturnCode.BAD_TASK_DATA and "environment variable FAIRFL_SHARE_OWN_MODEL: 'maybe'" in log


@pytest.mark.parametrize(
    "path, message",
    [
        ("fairfl.methods.fedlwr.client.Shadow", "needs a name of its own"),  # named "train": would never run
        ("fairfl.methods.fedlwr.controller.FedLWRController", "no MethodTask of its own package"),
        ("fairfl.methods.fedce.client.LeaveOneOutError", "no MethodTask of its own package"),  # another unit's
    ],
)
def test_a_unit_task_that_would_never_run_or_is_not_the_units_is_refused(path, message, monkeypatch):
    import dataclasses

    import fairfl.methods
    import fairfl.methods.fedlwr.client as fedlwr_client
    from fairfl.methods import steps

    class Shadow(MethodTask):
        name = protocol.TASK_TRAIN

    monkeypatch.setattr(fedlwr_client, "Shadow", Shadow, raising=False)
    fedlwr = next(unit for unit in fairfl.methods.UNITS if unit.name == "fedlwr")
    monkeypatch.setattr(fairfl.methods, "UNITS", (dataclasses.replace(fedlwr, site_tasks=(path,)),))
    steps.registered_tasks.cache_clear()
    try:
        with pytest.raises(ValueError, match=message):
            steps.registered_tasks()
    finally:
        steps.registered_tasks.cache_clear()
