"""The server's task as a site reads it: checked once, before the site builds or reads anything (`read_task`), and
parsed into a `SiteTask` that the executor's helpers share (fairfl.flare.executor).

The server is not trusted with the site's memory, files or models, so a site checks: that the task reads as a model
task at all; the network it asks for against what this site builds (its own FAIRFL_MAX_MODEL_PARAMETERS); every task
field the executor reads (TASK_FIELDS) and every field a method's step or task declares (fairfl.methods.steps), as
kinds, and that a method's task carries every field it reads; the optimiser settings; the held-out sites; DP-SGD
(fairfl.privacy) only where no step of the task trains or replaces the loss its own way; the round
(a whole number: it seeds and names the site's kept files); and the weights sent: none, or every tensor of the network
with its shape and dtype, finite (a NaN trained on would poison the site's own models too). Anything else is bad
task data (DataError) naming the field."""

from __future__ import annotations

import dataclasses

from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from fairfl.bundle import preprocessing_problem
from fairfl.data.builtin import BUILTIN_DATASETS
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.kinds import Boolean, Checked, Integer, OneOf
from fairfl.methods.steps import MethodTask, applying, field_problems
from fairfl.methods.steps import problems as step_problems
from fairfl.models import check_model_spec, meta_state
from fairfl.names import safe_name
from fairfl.privacy.settings import PrivacySettings, step_refusal, task_field_kind
from fairfl.site_checks import check_site_state, tensor_state
from fairfl.site_settings import site_settings
from fairfl.training import ADAM_BETAS, check_optimizer_settings

SEGMENTATION, CLASSIFICATION = "segmentation", "classification"
MAX_ROUND = 10**6  # the highest round number a task may carry (it names the site's kept files' rounds)
SERVERS_TASK = "the server's task"  # where bad task data comes from, as a DataError names it
# the task meta keys the executor reads itself (the methods' steps and tasks declare theirs: fairfl.methods.steps)
TASK_FIELDS = {
    protocol.TASK: OneOf((SEGMENTATION, CLASSIFICATION)),
    protocol.START_FROM: OneOf((protocol.FROM_GLOBAL, protocol.FROM_LOCAL)),
    protocol.EVALUATE: OneOf((protocol.FROM_GLOBAL, protocol.FROM_LOCAL, protocol.FROM_PERSONAL)),
    protocol.SEND_PARAMS: Boolean(),
    protocol.SCORE_GLOBAL: Boolean(),
    protocol.SUBMIT_MODEL: Boolean(),
    protocol.DATASET: OneOf(tuple(BUILTIN_DATASETS)),
    protocol.RUN_NAME: Checked(lambda value: safe_name(value, protocol.RUN_NAME), "a safe name (a folder at the site)"),
    protocol.PREPROCESSING: Checked(
        preprocessing_problem, "a list of monai.transforms dictionary transforms with plain arguments", reports=True
    ),
    protocol.PRIVACY: task_field_kind(MAX_ROUND),
}


@dataclasses.dataclass(frozen=True)
class SiteTask:
    """One task of the server as this site reads it. The built-in data's settings (dataset, data_seed, num_sites,
    test_scale) are as sent: a site checks them only where it builds that data (a site with a data root never
    does)."""

    site: str  # this site
    round: int  # the task's round (0 when it has none)
    kind: str  # SEGMENTATION or CLASSIFICATION: which loaders, loss and metrics the site uses
    model_spec: dict  # the network (fairfl.models.build_model)
    params: dict  # the weights sent (numpy arrays), as they came; {} when none were
    meta: dict  # the server's meta as it came: the methods' steps and tasks read their own fields from it
    start_from: str  # train from FROM_GLOBAL (the weights sent) or FROM_LOCAL (the site's own model)
    evaluate: str  # validate FROM_GLOBAL, FROM_LOCAL or FROM_PERSONAL (a method's step chooses the model)
    send_params: bool  # train: whether the site returns its trained weights
    score_global: bool  # validate: a site scored with a model of its own also scores the model sent
    submit_model: bool  # validate: return the model the site would be scored with, unscored
    held_out: tuple  # validate: the sites held out of training, scored with the model sent as it is
    optimizer: str  # the local optimiser, "adam" or "sgd" ...
    momentum: float  # ... its momentum ...
    keep_optimizer_state: bool  # ... whether its state carries over from round to round ...
    betas: tuple[float, float]  # ... and Adam's betas
    run_name: str | None  # a named run: the site keeps its state where a resubmitted job finds it
    dataset: str  # checked as a field (TASK_FIELDS)
    data_seed: object
    num_sites: object
    test_scale: object
    privacy: PrivacySettings | None  # train with DP-SGD (fairfl.privacy); None: no DP

    @property
    def num_classes(self) -> int:
        return self.model_spec["num_classes"]

    @property
    def in_channels(self) -> int:
        return self.model_spec["in_channels"]

    @property
    def preprocessing(self) -> list | None:
        """A MONAI bundle's pre-processing (fairfl.bundle), checked; None: fairfl's own."""
        return self.meta.get(protocol.PREPROCESSING) or None

    @property
    def spatial_dims(self) -> int:
        """2 (images) or 3 (volumes): the network's, so the data it is fed."""
        return self.model_spec.get("spatial_dims", 2)

    @classmethod
    def of(cls, site: str, model: FLModel) -> SiteTask:
        """The task `model` carries, as it is (`read_task` checks it first); a field left out takes its default."""
        meta = model.meta or {}
        optimizer = meta.get(protocol.OPTIMIZER) or {}
        return cls(
            site=site,
            round=int(model.current_round or 0),
            kind=meta.get(protocol.TASK, SEGMENTATION),
            model_spec=meta[protocol.MODEL_SPEC],
            params=model.params or {},
            meta=meta,
            start_from=meta.get(protocol.START_FROM, protocol.FROM_GLOBAL),
            evaluate=meta.get(protocol.EVALUATE, protocol.FROM_GLOBAL),
            send_params=meta.get(protocol.SEND_PARAMS, True),
            score_global=bool(meta.get(protocol.SCORE_GLOBAL)),
            submit_model=bool(meta.get(protocol.SUBMIT_MODEL)),
            held_out=tuple(meta.get(protocol.HELD_OUT, [])),
            optimizer=optimizer.get("name", "adam"),
            momentum=float(optimizer.get("momentum", 0.0)),
            keep_optimizer_state=bool(optimizer.get("keep_state")),
            betas=_pair(optimizer.get("betas", ADAM_BETAS)),
            run_name=meta.get(protocol.RUN_NAME) or None,
            dataset=meta.get(protocol.DATASET, "prostate"),
            data_seed=meta.get(protocol.DATA_SEED, 0),
            num_sites=meta.get(protocol.NUM_SITES),
            test_scale=meta.get(protocol.TEST_SCALE, 1.0),
            privacy=PrivacySettings.of(meta.get(protocol.PRIVACY), int(model.current_round or 0)),
        )


def _pair(values) -> tuple[float, float]:
    first, second = values
    return float(first), float(second)


def read_task(site: str, shareable, method_task: type[MethodTask] | None = None) -> SiteTask:
    """The server's task in `shareable`, checked (this module's docstring) and parsed; `method_task`: the method's
    own task it asks for, whose fields it must carry."""
    try:
        model = FLModelUtils.from_shareable(shareable)
    except (TypeError, ValueError, KeyError) as e:  # a negative or non-integer round, another kind of data
        raise DataError(site, SERVERS_TASK, f"cannot be read as a model task: {e}") from e
    check_meta(site, model.meta or {}, method_task)
    check_sent(site, model)
    return SiteTask.of(site, model)


def check_meta(site: str, meta: dict, method_task: type[MethodTask] | None = None) -> None:
    """The server's model spec and settings (the executor's, the methods' steps' and `method_task`'s fields) within
    what this site builds and loops over; else bad task data naming the field."""
    problem = check_model_spec(meta.get(protocol.MODEL_SPEC), site_settings(site).max_model_parameters)
    if problem:
        raise DataError(site, SERVERS_TASK, f"{protocol.MODEL_SPEC} {problem}")
    problems = field_problems(meta, TASK_FIELDS) + step_problems(meta, task=method_task)
    if problems:
        raise DataError(site, SERVERS_TASK, "; ".join(problems))
    problem = step_refusal(applying(meta)) if meta.get(protocol.PRIVACY) else None
    if problem:  # the server refuses such a job; a site never trains without the DP it was asked for
        raise DataError(site, SERVERS_TASK, f"{protocol.PRIVACY} asks for DP-SGD, but {problem}")
    problem = check_optimizer_settings(meta[protocol.OPTIMIZER]) if protocol.OPTIMIZER in meta else None
    if problem:
        raise DataError(site, SERVERS_TASK, f"{protocol.OPTIMIZER} settings: {problem}")
    held_out = meta.get(protocol.HELD_OUT, [])
    if not (isinstance(held_out, list) and all(isinstance(s, str) for s in held_out)):
        raise DataError(site, SERVERS_TASK, f"{protocol.HELD_OUT} is not a list of site names")


def check_sent(site: str, model: FLModel) -> None:
    """The task's round and its weights (this module's docstring); the network is built on torch's meta device:
    nothing allocated."""
    problem = None if model.current_round is None else Integer(0, MAX_ROUND).problem(model.current_round)
    if problem:
        raise DataError(site, SERVERS_TASK, f"round {problem}")
    if model.params is None or (isinstance(model.params, dict) and not model.params):
        return
    state, problem = tensor_state(model.params)
    if state is not None:
        problem = check_site_state(state, meta_state(model.meta[protocol.MODEL_SPEC]))
    if problem:
        raise DataError(site, SERVERS_TASK, f"the weights sent: {problem}")
