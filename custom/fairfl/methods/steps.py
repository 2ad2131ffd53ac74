"""A method's client side: the steps a site runs in fixed phases of its `train` and `validate` tasks, and the site
tasks of a method's own.

The site's executor (fairfl.flare.executor) keeps the data, the loaders, the seeding, the state dir and the task
protocol; what a method changes at the sites is a `ClientStep` in its unit (`methods/<name>/client.py`), switched on
per task by the server's meta (`applies`). A task runs, in this order:

    before_start(ctx)                  before the start model is loaded (the site's previous local model is still
                                       there: a probe of the model sent against it)
    received(ctx, model)               the model sent, as this site uses it (with a part of the site's own on it)
    before_training(ctx, model)        probes on the model sent (its loss on the site's data; a copy kept for later)
    loss(ctx, loss_fn, model, stack)   the local loss: steps that replace it before those adding a term
    train(ctx, model, loader, settings, loss_fn, optimizer)   a training loop of the step's own; None: the usual
    after_training(ctx, model)         the trained model (a validation score of it; a second model trained beside it)
    outgoing(ctx, params, model)       what is sent back (a part of the model kept at home)
    evaluated_model(ctx)               `validate` only: a model of the site's own to score instead

Steps add reply meta (`ctx.reply`) and metrics (`ctx.metrics`). Every phase runs the applying steps in the registry's
order (fairfl.methods.CLIENT_STEPS). A method may also answer a task of its own beside `train` and `validate` (a
measurement the server asks for between them): a `MethodTask` of its unit, listed by its spec (`site_tasks`), which the
executor answers by name with the same services (`run(ctx)`).

Each step and task declares the task meta keys it reads and what each value must be (`fields`, of the kinds of
fairfl.kinds: `Real`, `Boolean`, `OneOf`, `MappingOf`, `Checked`); the site checks every declared key a task carries,
whether or not it switches the step on, before anything is built (`problems`), and a method's task refuses a task
that lacks one of its fields. This module imports neither torch nor FLARE."""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar

from fairfl.flare import protocol
from fairfl.kinds import Kind


@dataclass
class StepContext:
    """What a step may use of the task and the site: the task, this round's seed and the executor's services."""

    site: str
    meta: dict  # the server's task meta
    params: dict  # the weights sent
    round: int
    seed: int  # this site's seed for this round (training batches, prototypes)
    device: Any
    state_dir: str  # what the site keeps between tasks (fairfl.flare.executor)
    task: str  # "segmentation" or "classification"
    loader: Callable  # (split, train, seed=None, max_samples=None, batch_size=None): the site's loader, cached per
    # process and re-seeded (seed None: the base seed; max_samples: a random sample of the split; batch_size None: the
    # site's)
    validation_score: Callable  # (model, influence=None) -> Dice or balanced accuracy on the validation split; None
    # when NaN; a dict `influence` is filled with the score's per-patient influence record ({"cases", "values"})
    base_loss: Callable  # () -> the site's usual training loss (a new one per call)
    class_counts: Callable  # () -> the training split's count per class
    train_settings: Callable  # () -> TrainSettings of this task
    own_model: Callable  # () -> state dict of the site's own (local) model for this task, None before it has one
    own_network: Callable  # () -> the job's network with own_model's weights; an error before the site has one
    sent_model: Callable  # () -> the model sent, built afresh
    log_error: Callable  # (message)
    amp: bool = False  # the executor's: forward passes in mixed precision (fairfl.training.mixed_precision)
    reply: dict = field(default_factory=dict)  # reply meta to the server
    metrics: dict = field(default_factory=dict)  # training (or validation) metrics

    @contextlib.contextmanager
    def timed(self, key: str):
        """Adds the seconds the block takes to metrics[key] (probe_seconds, prototype_seconds, ...)."""
        started = time.time()
        yield
        self.metrics[key] = self.metrics.get(key, 0.0) + time.time() - started


class ClientStep:
    """One method's client side. A new instance serves one task, so a step may keep what it needs between phases."""

    replaces_loss = False  # True: `loss` ignores the loss it is given (runs before steps that add a term)
    fields: ClassVar[dict[str, Kind]] = {}  # the task meta keys this step reads, and what each must be

    @classmethod
    def applies(cls, meta: dict) -> bool:
        """Whether the server's task meta switches this step on."""
        return False

    def before_start(self, ctx: StepContext) -> None:
        pass

    def received(self, ctx: StepContext, model) -> None:
        pass

    def before_training(self, ctx: StepContext, model) -> None:
        pass

    def loss(self, ctx: StepContext, loss_fn, model, stack: contextlib.ExitStack):
        return loss_fn

    def train(self, ctx: StepContext, model, loader, settings, loss_fn, optimizer) -> dict | None:
        return None

    def after_training(self, ctx: StepContext, model) -> None:
        pass

    def outgoing(self, ctx: StepContext, params: dict, model) -> dict:
        return params

    def evaluated_model(self, ctx: StepContext):
        return None


class MethodTask:
    """A site task of a method's own, answered by the executor beside `train` and `validate` when the server asks for
    it by `name`: `run` measures what the method's server reads, with the same services as a step (the site's own model,
    the model sent, its loaders), into `ctx.reply` and `ctx.metrics`. A new instance serves one task."""

    name: ClassVar[str] = ""  # the task's name, as the server sends it and the method's job lists it
    fields: ClassVar[dict[str, Kind]] = {}  # the task meta keys it reads, and what each must be: every one required

    def run(self, ctx: StepContext) -> None:
        raise NotImplementedError


@cache
def registered_steps() -> tuple[type[ClientStep], ...]:
    """The registry's step classes, imported on first use (they import torch)."""
    from fairfl.methods import CLIENT_STEPS

    classes = []
    for path in CLIENT_STEPS:
        module, name = path.rsplit(".", 1)
        classes.append(getattr(importlib.import_module(module), name))
    return tuple(classes)


RESERVED_TASKS = (protocol.TASK_TRAIN, protocol.TASK_VALIDATE)  # the tasks every site's executor answers itself


@cache
def registered_tasks() -> dict[str, type[MethodTask]]:
    """{task name: MethodTask class} of every unit's site tasks (its spec's `site_tasks`), imported on first use (they
    import torch); two units' tasks of one name are an error."""
    from fairfl.methods import UNITS

    found: dict[str, type[MethodTask]] = {}
    for unit in UNITS:
        for path in unit.site_tasks:
            module, name = path.rsplit(".", 1)
            cls = getattr(importlib.import_module(module), name)
            if not (isinstance(cls, type) and issubclass(cls, MethodTask)) or not module.startswith(unit.package + "."):
                raise ValueError(f"site task {path} of unit {unit.name} is no MethodTask of its own package")
            if cls.name in RESERVED_TASKS or not cls.name:  # the executor's own tasks: the unit's would never run
                raise ValueError(f"site task {path} is named {cls.name!r}; a unit's task needs a name of its own")
            if found.setdefault(cls.name, cls) is not cls:
                raise ValueError(f"two site tasks named {cls.name!r}: {found[cls.name].__name__}, {cls.__name__}")
    return found


def applying(meta: dict, classes: tuple[type[ClientStep], ...] | None = None) -> list[type[ClientStep]]:
    """The step classes (default: the registry's) that `meta` switches on, in their order."""
    return [cls for cls in (registered_steps() if classes is None else classes) if cls.applies(meta)]


def declared_fields(classes: tuple[type[ClientStep] | type[MethodTask], ...] | None = None) -> dict[str, Kind]:
    """{meta key: Kind} of every step and method task (default: the registry's); two reading one key must agree on
    it."""
    found: dict[str, Kind] = {}
    readers: tuple[type[ClientStep] | type[MethodTask], ...] = (
        (*registered_steps(), *registered_tasks().values()) if classes is None else classes
    )
    for cls in readers:
        for key, field_ in cls.fields.items():
            if found.setdefault(key, field_) != field_:
                raise ValueError(f"two readers declare task field {key!r} differently: {found[key]}, {field_}")
    return found


def field_problems(meta: dict, fields: dict[str, Kind]) -> list[str]:
    """ "<key> is nan, expected ..." for every key of `fields` that `meta` carries with a value it cannot use."""
    found = []
    for key, field_ in fields.items():
        problem = field_.problem(meta[key]) if key in meta else None
        if problem:
            found.append(f"task field {key} {problem}")
    return found


def problems(
    meta: dict, classes: tuple[type[ClientStep], ...] | None = None, task: type[MethodTask] | None = None
) -> list[str]:
    """What is wrong with the server's settings for the steps and method tasks: every declared field the task carries
    (`declared_fields`), switched on or not, a field the method task `task` reads that the task lacks, and two steps
    that would both replace the loss or both run their own training loop (one would silently be lost)."""
    found = field_problems(meta, declared_fields(classes))
    found += [f"task field {key} is missing" for key in (task.fields if task else {}) if key not in meta]
    chosen = applying(meta, classes)
    for what, clash in (
        ("replace the local loss", [c for c in chosen if c.replaces_loss]),
        ("run their own training loop", [c for c in chosen if c.train is not ClientStep.train]),
    ):
        if len(clash) > 1:
            found.append(f"steps {[c.__name__ for c in clash]} would all {what}; a task asks for at most one")
    return found


class TaskSteps:
    """The steps one task runs: the registered steps its meta switches on, in registry order, one instance each
    (`problems` has ruled out two replacing the loss or two training loops)."""

    def __init__(self, meta: dict, classes: tuple[type[ClientStep], ...] | None = None):
        self.steps = [cls() for cls in applying(meta, classes)]

    def before_start(self, ctx: StepContext) -> None:
        for step in self.steps:
            step.before_start(ctx)

    def received(self, ctx: StepContext, model) -> None:
        for step in self.steps:
            step.received(ctx, model)

    def before_training(self, ctx: StepContext, model) -> None:
        for step in self.steps:
            step.before_training(ctx, model)

    def loss(self, ctx: StepContext, loss_fn, model, stack: contextlib.ExitStack):
        for step in sorted(self.steps, key=lambda s: not s.replaces_loss):  # stable: registry order otherwise
            loss_fn = step.loss(ctx, loss_fn, model, stack)
        return loss_fn

    def train(self, ctx: StepContext, model, loader, settings, loss_fn, optimizer) -> dict | None:
        """The statistics of the one step with a loop of its own; None: train with the usual loop."""
        for step in self.steps:
            stats = step.train(ctx, model, loader, settings, loss_fn, optimizer)
            if stats is not None:
                return stats
        return None

    def after_training(self, ctx: StepContext, model) -> None:
        for step in self.steps:
            step.after_training(ctx, model)

    def outgoing(self, ctx: StepContext, params: dict, model) -> dict:
        for step in self.steps:
            params = step.outgoing(ctx, params, model)
        return params

    def evaluated_model(self, ctx: StepContext):
        """The first step's own model to score, or None: the task's choice (sent or local)."""
        for step in self.steps:
            model = step.evaluated_model(ctx)
            if model is not None:
                return model
        return None
