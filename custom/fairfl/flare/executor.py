"""The one client Executor of every fairfl job: it answers `train`, `validate` and `cka`.

The executor keeps the data, the loaders, the seeding, the site's state dir and the task protocol: the server decides
per task whether the site trains from the global model or from its own, which it evaluates, segmentation or
classification. What a method changes at the sites (a probe of the model sent, a loss, a training loop, a step after
training, another evaluated model) is a step of its unit run in fixed phases (fairfl.methods.steps), switched on by
the task's meta, so every method shares this class.

Classification (meta `task` "classification") trains with the logit-adjusted cross-entropy of the site's
training labels and reports accuracy, balanced accuracy and AUC on a clean and a corrupted test set (`_validate`).
What a site must remember between tasks (its trained local model; Ditto's personal model) lives on disk in the
site's state dir (`_state_dir`: the job's run workspace, or the named run's, so a resumed run finds it):
with `nvflare simulator -t` smaller than `-n`, or after a restart, the process is new."""

from __future__ import annotations

import contextlib
import functools
import os
import time

import torch
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.shareable import make_reply
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from fairfl.arguments import check_all
from fairfl.classification import LogitAdjustedCrossEntropy, class_counts, evaluate_classification
from fairfl.data.builtin import BUILTIN_DATASETS, builtin_dataset, check_test_scale, ensure_builtin
from fairfl.data.classification_sites import CORRUPTED_SPLIT
from fairfl.data.datalist import load_datalist, load_dataset_info
from fairfl.data.free_rider import free_rider_datalist
from fairfl.data.loaders import make_loader
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_state import keep_version, kept_model_versions, kept_versions, newest_before
from fairfl.kinds import Boolean, Checked, Integer, OneOf
from fairfl.methods.fedlwr.cka import layerwise_cka
from fairfl.methods.steps import StepContext, TaskSteps, field_problems
from fairfl.methods.steps import problems as step_problems
from fairfl.models import build_model, check_model_spec, is_int_in, load_numpy_state, state_to_numpy
from fairfl.names import safe_name
from fairfl.presets import apply_preset
from fairfl.results import GLOBAL_PREFIX
from fairfl.site_checks import check_site_state, tensor_state
from fairfl.site_settings import SHARE_OWN_MODEL_ENV, site_settings
from fairfl.training import (
    TrainSettings,
    check_optimizer_settings,
    configure_threads,
    evaluate_dice,
    load_optimizer_state,
    make_optimizer,
    mixed_precision,
    optimizer_state,
    seed_everything,
    segmentation_loss,
    select_device,
    site_seed,
    train_local,
)

SEGMENTATION, CLASSIFICATION = "segmentation", "classification"
LOO_SCORE = {SEGMENTATION: "dice", CLASSIFICATION: "balanced_accuracy"}  # validation_score (FedCE: 1 - this, CFFL)
MAX_SITES = 1000  # the most built-in sites a server may ask a site to generate
MAX_ROUND = 10**6  # the highest round number a task may carry (it names the site's kept files' rounds)
# the task meta keys this executor reads itself (the methods' steps declare theirs: fairfl.methods.steps)
TASK_FIELDS = {
    protocol.TASK: OneOf((SEGMENTATION, CLASSIFICATION)),
    protocol.START_FROM: OneOf((protocol.FROM_GLOBAL, protocol.FROM_LOCAL)),
    protocol.EVALUATE: OneOf((protocol.FROM_GLOBAL, protocol.FROM_LOCAL, protocol.FROM_PERSONAL)),
    protocol.SEND_PARAMS: Boolean(),
    protocol.SCORE_GLOBAL: Boolean(),
    protocol.SUBMIT_MODEL: Boolean(),
    protocol.DATASET: OneOf(tuple(BUILTIN_DATASETS)),
    protocol.RUN_NAME: Checked(lambda value: safe_name(value, protocol.RUN_NAME), "a safe name (a folder at the site)"),
}


class Declined(Exception):
    """A task this site will not do by its own settings (sending its own model); answered TASK_UNSUPPORTED."""


class FairflExecutor(Executor):
    def __init__(self, **arguments):
        """Local training, evaluation and CKA probing for one site. Its arguments, each declared with its kind, default
        and meaning in fairfl.arguments (EXECUTOR), are checked there before anything is built, the error naming the
        argument, and each becomes an attribute of its own name. What a site reads beyond its data root, whether it is
        a free rider and how large a network it builds are the site's settings alone (fairfl.site_settings: its
        environment), never the job's. A CUDA `device` this site lacks is refused here, when the site loads the job."""
        checked = check_all(type(self), arguments)
        super().__init__()
        vars(self).update(checked)
        if self.augmentation is not None:  # null: the task's
            self.augmentation = list(self.augmentation)
        if self.device.startswith("cuda"):
            index, count = int(self.device.partition(":")[2] or 0), torch.cuda.device_count()
            if index >= count:
                raise ValueError(
                    f"FairflExecutor: device {self.device!r}: this site has "
                    f"{f'CUDA devices cuda:0 to cuda:{count - 1}' if count else 'no CUDA device'}"
                )
        self._datalist, self._regions, self._corrupted_sites = None, None, []
        self._loaders = {}  # cached per process: CacheDataset reads the files once

    # --- task dispatch ---------------------------------------------------------------------------------
    def execute(self, task_name, shareable, fl_ctx, abort_signal):
        handlers = {
            protocol.TASK_TRAIN: self._train,
            protocol.TASK_VALIDATE: self._validate,
            protocol.TASK_CKA: self._cka,
        }
        if task_name not in handlers:
            self.log_error(fl_ctx, f"unknown task {task_name!r}; this executor answers {sorted(handlers)}")
            return make_reply(ReturnCode.TASK_UNKNOWN)
        site = fl_ctx.get_identity_name()
        try:
            task = self._read_task(site, shareable)
            self._check_task(site, task.meta or {})
            self._check_sent(site, task)
            if task_name == protocol.TASK_VALIDATE and (task.meta or {}).get(protocol.SUBMIT_MODEL):
                self._check_sharing(site, fl_ctx)
            apply_preset(self, self.preset, self._task(task.meta))
            configure_threads(self.num_threads)
            result = handlers[task_name](site, task, self._state_dir(fl_ctx, task.meta or {}))
        except DataError as e:
            self.log_error(fl_ctx, f"bad data: {e}")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        except Declined as e:
            self.log_warning(fl_ctx, str(e))
            return make_reply(ReturnCode.TASK_UNSUPPORTED)
        except Exception as e:  # anything else: report to the server instead of killing the client
            self.log_exception(fl_ctx, f"[{site}] task {task_name} failed: {e!r}")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        if abort_signal.triggered:
            return make_reply(ReturnCode.TASK_ABORTED)
        return FLModelUtils.to_shareable(result)

    # --- tasks -----------------------------------------------------------------------------------------
    def _train(self, site, task: FLModel, state_dir: str) -> FLModel:
        """Local training from the model the task names (meta[START_FROM]), with the methods' steps
        (fairfl.methods.steps) in their phases; the trained model becomes the site's local model."""
        ctx, steps = self._context(site, task, state_dir, trains=True), TaskSteps(task.meta)
        meta, device, seed = task.meta, ctx.device, ctx.seed
        seed_everything(seed)
        steps.before_start(ctx)  # the previous local model is still there (FedCE)
        model = self._model_for(ctx, steps, protocol.START_FROM)
        steps.before_training(ctx, model)
        if site_settings(site).free_rider:  # recorded by the server with the training metrics
            ctx.metrics[protocol.FREE_RIDER] = 1.0
        loader = self._loader(site, meta, "training", train=True, seed=seed)
        with contextlib.ExitStack() as stack:
            loss_fn = steps.loss(ctx, self._loss(meta), model, stack)
            started = time.time()
            settings = self._train_settings(meta)
            optimizer = self._optimizer(site, meta, model.to(device), settings, state_dir, ctx.round)
            stats = steps.train(ctx, model, loader, settings, loss_fn, optimizer)
            if stats is None:  # no step has a loop of its own
                stats = train_local(model, loader, settings, device, loss_fn=loss_fn, optimizer=optimizer, amp=self.amp)
            ctx.metrics["train_seconds"] = time.time() - started  # local training alone (cost benchmarks)
            if self._optimizer_settings(meta).get("keep_state"):
                self._keep_optimizer_state(site, optimizer, settings, state_dir, ctx.round)
        self._keep_local_model(site, meta, state_dir, model, ctx.round)
        steps.after_training(ctx, model)
        params = state_to_numpy(model.state_dict()) if meta.get(protocol.SEND_PARAMS, True) else {}
        params = steps.outgoing(ctx, params, model)
        metrics = {
            **ctx.metrics,
            **{k: float(stats[k]) for k in ("train_loss", "train_perturbed_loss", "rho") if k in stats},
        }
        return FLModel(
            params_type=ParamsType.FULL,
            params=params,
            metrics=metrics,
            meta={
                protocol.NUM_SAMPLES: len(loader.dataset),
                protocol.NUM_STEPS: stats["steps"],
                protocol.LR: self.lr,
                **ctx.reply,
            },
        )

    def _validate(self, site, task: FLModel, state_dir: str) -> FLModel:
        """Segmentation: Dice on the `testing` split. Classification: accuracy, balanced accuracy and macro
        one-vs-rest AUC on `testing` (clean_accuracy, clean_balanced_accuracy, clean_auc) and, when the datalist
        has it, `testing_corrupted`, the same images corrupted as the corrupted sites' are (corrupted_*); and,
        without prefix, on the test set of this site's own image quality (corrupted_* at a site listed under
        `corrupted_sites` in the data root's dataset.json, clean_* elsewhere; `corrupted_site` 1.0 or 0.0), so that
        the spread of `auc` across sites is FedISM+'s Table IV ("client-level testing").

        A site the server holds out of training (meta HELD_OUT) scores the model sent as it is. With meta SCORE_GLOBAL,
        a site scored with a model of its own (Ditto's personal model, its own head or normalisation layers) also
        scores the model sent as it is, in the same task: those metrics prefixed GLOBAL_PREFIX (global_dice, ...).
        With meta SUBMIT_MODEL (the server's cross-site evaluation) the site returns the model it would score, as
        its params, unscored."""
        meta, ctx, steps = task.meta, self._context(site, task, state_dir, trains=False), TaskSteps(task.meta)
        held_out = site in meta.get(protocol.HELD_OUT, [])
        if held_out:
            model = self._sent_model(meta, task.params)
        else:
            model = steps.evaluated_model(ctx)  # a model of the site's own (Ditto's personal one), or None
            model = self._model_for(ctx, steps, protocol.EVALUATE) if model is None else model
        if meta.get(protocol.SUBMIT_MODEL):
            return FLModel(params_type=ParamsType.FULL, params=state_to_numpy(model.state_dict()), metrics={})
        loader = self._loader(site, meta, "testing", train=False, seed=self.seed)
        metrics = self._test_scores(site, model, loader, meta)
        if meta.get(protocol.SCORE_GLOBAL) and not held_out:
            sent = self._sent_model(meta, task.params)
            metrics.update({GLOBAL_PREFIX + k: v for k, v in self._test_scores(site, sent, loader, meta).items()})
        return FLModel(
            params_type=ParamsType.FULL,
            params={},
            metrics={**metrics, **ctx.metrics},
            meta={protocol.NUM_SAMPLES: len(loader.dataset)},
        )

    def _test_scores(self, site, model, loader, meta: dict) -> dict:
        """`model`'s metrics on this site's test split (`loader`) and corrupted test split, as `_validate` reports."""
        metrics = self._evaluate(model, loader, meta)
        if self._task(meta) == CLASSIFICATION:  # under quality shift: clean, corrupted, and the site's own quality
            scores = {"clean": metrics}
            if CORRUPTED_SPLIT in self._datalist:
                scores["corrupted"] = self._evaluate(
                    model, self._loader(site, meta, CORRUPTED_SPLIT, train=False, seed=self.seed), meta
                )
            corrupted_site = site in self._corrupted_sites and "corrupted" in scores
            metrics = {
                **scores["corrupted" if corrupted_site else "clean"],
                "corrupted_site": float(corrupted_site),
                **{f"{quality}_{name}": v for quality, values in scores.items() for name, v in values.items()},
            }
        return metrics

    def _cka(self, site, task: FLModel, state_dir: str) -> FLModel:
        """Per-layer CKA between the site's local model and the anchor on a random sample of the site's images,
        drawn afresh every round from the site's seed and the round, in random order (make_loader's max_samples).
        Never in datalist order: minibatches of neighbouring slices of one or two patients show the unbiased
        HSIC only within-patient variation, and CKA comes out too high at exactly the small sites."""
        meta, round_num = task.meta, int(task.current_round or 0)
        local = self._model_of(meta, self._own_model(site, meta, state_dir, round_num + 1), state_dir)
        anchor = self._sent_model(meta, task.params)
        loader = self._loader(
            site,
            meta,
            self.cka_split,
            train=False,
            seed=site_seed(self.seed, site) + round_num,
            max_samples=self.cka_max_samples,
            batch_size=self.cka_batch_size,
        )
        device = select_device(self.device)
        with mixed_precision(device, self.amp):
            cka = layerwise_cka(local, anchor, (b["image"] for b in loader), device=device)
        return FLModel(params_type=ParamsType.FULL, params={}, meta={protocol.CKA: cka})

    def _validation_score(self, site, model, meta: dict, device):
        """Dice (classification: balanced accuracy) of `model` on the validation split; None when NaN (no foreground
        to score)."""
        score = self._evaluate(
            model, self._loader(site, meta, "validation", train=False, seed=self.seed), meta, device
        )[LOO_SCORE[self._task(meta)]]
        return score if score == score else None

    # --- helpers ---------------------------------------------------------------------------------------
    @staticmethod
    def _check_task(site, meta: dict) -> None:
        """The server's model spec and the methods' settings (fairfl.methods.steps) within what this site builds and
        loops over; else bad task data naming the field (the server is not trusted with this site's memory)."""
        problem = check_model_spec(meta.get(protocol.MODEL_SPEC), site_settings(site).max_model_parameters)
        if problem:
            raise DataError(site, "the server's task", f"{protocol.MODEL_SPEC} {problem}")
        problems = field_problems(meta, TASK_FIELDS) + step_problems(meta)  # this executor's fields, the methods'
        if problems:
            raise DataError(site, "the server's task", "; ".join(problems))
        problem = check_optimizer_settings(meta[protocol.OPTIMIZER]) if protocol.OPTIMIZER in meta else None
        if problem:
            raise DataError(site, "the server's task", f"{protocol.OPTIMIZER} settings: {problem}")
        held_out = meta.get(protocol.HELD_OUT, [])
        if not (isinstance(held_out, list) and all(isinstance(s, str) for s in held_out)):
            raise DataError(site, "the server's task", f"{protocol.HELD_OUT} is not a list of site names")

    @staticmethod
    def _read_task(site, shareable) -> FLModel:
        """The task as a model; a task NVFlare cannot read as one (a negative or non-integer round, another kind of
        data) is bad task data."""
        try:
            return FLModelUtils.from_shareable(shareable)
        except (TypeError, ValueError, KeyError) as e:
            raise DataError(site, "the server's task", f"cannot be read as a model task: {e}") from e

    @staticmethod
    def _check_sent(site, task: FLModel) -> None:
        """The task's round (a whole number: it seeds and names the site's kept files) and its weights: none, or every
        tensor of the task's network with its shape, finite (a NaN trained on would poison the site's own models
        too); else bad task data naming the tensor. The network is built on torch's meta device: nothing allocated."""
        problem = None if task.current_round is None else Integer(0, MAX_ROUND).problem(task.current_round)
        if problem:
            raise DataError(site, "the server's task", f"round {problem}")
        if task.params is None or (isinstance(task.params, dict) and not task.params):
            return
        state, problem = tensor_state(task.params)
        if problem is None:
            with torch.device("meta"):
                reference = build_model(task.meta[protocol.MODEL_SPEC]).state_dict()
            problem = check_site_state(state, reference)
        if problem:
            raise DataError(site, "the server's task", f"the weights sent: {problem}")

    @staticmethod
    def _check_sharing(site, fl_ctx) -> None:
        """Declined unless this site sends its own or personal model when the server asks for it (cross-site
        evaluation): its FAIRFL_SHARE_OWN_MODEL, or where unset only in NVFlare's simulator, whose sites are one
        person's data on one machine; POC and provisioned sites keep their models unless they set it to 1."""
        chosen = site_settings(site).share_own_model
        if chosen is None and not fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False):
            setting = f"{SHARE_OWN_MODEL_ENV} is unset, which shares only in NVFlare's simulator"
        elif chosen is False:
            setting = f"{SHARE_OWN_MODEL_ENV} is 0"
        else:
            return
        raise Declined(f"[{site}] declines to send its own model for cross-site evaluation: {setting} at this site")

    @staticmethod
    def _task(meta: dict) -> str:
        return meta.get(protocol.TASK, SEGMENTATION)

    def _evaluate(self, model, loader, meta: dict, device=None) -> dict:
        """Dice (segmentation) or accuracy, balanced accuracy and AUC (classification) of `model` on `loader`."""
        num_classes, device = meta[protocol.MODEL_SPEC]["num_classes"], device or select_device(self.device)
        with mixed_precision(device, self.amp):
            if self._task(meta) == CLASSIFICATION:
                return evaluate_classification(model, loader, num_classes, device)
            return evaluate_dice(model, loader, num_classes, device, regions=self._regions)

    def _loss(self, meta: dict):
        """The local training loss: Dice for segmentation; for classification the logit-adjusted cross-entropy
        of this site's training labels (logit_adjustment 0: plain cross-entropy)."""
        if self._task(meta) != CLASSIFICATION:
            return segmentation_loss()
        return LogitAdjustedCrossEntropy(self._class_counts(meta), tau=self.logit_adjustment)

    def _class_counts(self, meta: dict) -> list[int]:
        """How many training images of each class this site has (its datalist is loaded by then)."""
        return class_counts([e["label"] for e in self._datalist["training"]], meta[protocol.MODEL_SPEC]["num_classes"])

    def _model_for(self, ctx: StepContext, steps: TaskSteps, choice: str):
        """The model a task asks for under meta[choice]: the site's own (FROM_LOCAL) or the one sent, as the task's
        steps receive it (FedNPR-Per puts this site's own head on it).

        A site asked for its own model before it has one (Solo's first round) starts from the one sent."""
        own = ctx.own_model() if ctx.meta.get(choice) == protocol.FROM_LOCAL else None
        if own is not None or (ctx.meta.get(choice) == protocol.FROM_LOCAL and not ctx.params):
            return self._model_of(ctx.meta, own, ctx.state_dir)
        model = self._sent_model(ctx.meta, ctx.params)
        steps.received(ctx, model)
        return model

    def _context(self, site, task: FLModel, state_dir: str, trains: bool) -> StepContext:
        """What the methods' steps see of this task and of this site (fairfl.methods.steps.StepContext). `trains`: a
        train task of round r works from the site's own model of a round before r, a later task of round r (its
        evaluation, CKA) from the one it trained in round r."""
        meta, device, round_num = task.meta, select_device(self.device), int(task.current_round or 0)
        return StepContext(
            site=site,
            meta=meta,
            params=task.params,
            round=round_num,
            seed=site_seed(self.seed, site) + round_num,
            device=device,
            state_dir=state_dir,
            task=self._task(meta),
            loader=lambda split, train, seed=None: self._loader(
                site, meta, split, train=train, seed=self.seed if seed is None else seed
            ),
            validation_score=lambda model: self._validation_score(site, model, meta, device),
            base_loss=lambda: self._loss(meta),
            class_counts=lambda: self._class_counts(meta),
            train_settings=lambda: self._train_settings(meta),
            # read once per task: FedCE's probe, the start model and the parts a site keeps all ask for it
            own_model=functools.cache(
                lambda: self._own_model(site, meta, state_dir, round_num if trains else round_num + 1)
            ),
            sent_model=lambda: self._sent_model(meta, task.params),
            log_error=self.logger.error,
            amp=self.amp,
        )

    @staticmethod
    def _sent_model(meta: dict, params: dict):
        """The job's network with the weights a task sent (numpy arrays), as they are."""
        return load_numpy_state(build_model(meta[protocol.MODEL_SPEC]), params)

    @staticmethod
    def _model_of(meta: dict, state: dict | None, state_dir: str):
        """The job's network with the site's own weights `state` (`_own_model`); none is an error."""
        if state is None:
            path = os.path.join(state_dir, protocol.LOCAL_MODEL_FILE)
            raise RuntimeError(f"no local model at {path}: this site has not trained in this run yet")
        model = build_model(meta[protocol.MODEL_SPEC])
        model.load_state_dict(state)
        return model

    @staticmethod
    def _local_versions(site, meta: dict, state_dir: str) -> list:
        """The site's local models on disk (`fairfl.flare.site_state.kept_model_versions`)."""
        remedy = "delete it (or use another run_name) to start this site's local model afresh"
        reference = build_model(meta[protocol.MODEL_SPEC]).state_dict()
        return kept_model_versions(site, state_dir, protocol.LOCAL_MODEL_FILES, "local model", remedy, reference)

    def _own_model(self, site, meta: dict, state_dir: str, before_round: int) -> dict | None:
        """The state dict of the site's newest local model trained before round `before_round`, None when none."""
        saved = newest_before(self._local_versions(site, meta, state_dir), before_round)
        return None if saved is None else saved["model"]

    def _keep_local_model(self, site, meta: dict, state_dir: str, model, round_num: int) -> None:
        """Save the model trained in round `round_num` as the site's local model (the previous round's kept too)."""
        versions = self._local_versions(site, meta, state_dir)
        keep_version({"round": round_num, "model": model.state_dict()}, state_dir, protocol.LOCAL_MODEL_FILES, versions)

    @staticmethod
    def _optimizer_settings(meta: dict) -> dict:
        """The server's optimiser settings ({"name", "momentum", "keep_state"}; checked by `_check_task`)."""
        return meta.get(protocol.OPTIMIZER) or {}

    def _train_settings(self, meta: dict) -> TrainSettings:
        chosen = self._optimizer_settings(meta)
        return TrainSettings(
            lr=self.lr,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
            optimizer=chosen.get("name", "adam"),
            momentum=float(chosen.get("momentum", 0.0)),
        )

    def _optimizer(self, site, meta: dict, model, settings: TrainSettings, state_dir: str, round_num: int):
        """A fresh local optimiser for this round or, with keep_state, one carrying the state this site kept after
        round round_num - 1 (the current file, or the previous one when this round is a repeat after a restart).
        Settings are always the job's. No such state (the first round, a new run under an old run_name): fresh. A
        kept file that cannot be read or does not fit is an error naming the site and the file."""
        optimizer = make_optimizer(model, settings)
        if not self._optimizer_settings(meta).get("keep_state"):
            return optimizer
        versions = self._optimizer_versions(site, state_dir)
        for saved_round, saved, name in versions:
            if saved_round == round_num - 1:
                problem = load_optimizer_state(optimizer, settings.optimizer, saved)
                if problem:
                    raise DataError(
                        site,
                        os.path.join(state_dir, name),
                        f"the kept optimiser state cannot be used ({problem}); delete it to "
                        f"start this site's optimiser afresh",
                    )
        return optimizer

    @staticmethod
    def _optimizer_versions(site, state_dir: str) -> list:
        """The site's kept optimiser states ({"round", "optimizer", "moments"}; fairfl.flare.site_state)."""
        remedy = "delete it to start this site's optimiser afresh"
        return kept_versions(site, state_dir, protocol.OPTIMIZER_STATE_FILES, "kept optimiser state", remedy)

    def _keep_optimizer_state(self, site, optimizer, settings: TrainSettings, state_dir: str, round_num: int):
        """Save the optimiser's state after round `round_num`; the state of an earlier round becomes the previous
        file, so a round repeated after a restart starts from the same state as its first try."""
        saved = optimizer_state(optimizer, settings.optimizer, round_num)
        keep_version(saved, state_dir, protocol.OPTIMIZER_STATE_FILES, self._optimizer_versions(site, state_dir))

    def _loader(self, site, meta, split, train, seed, max_samples=None, batch_size=None):
        spec = meta[protocol.MODEL_SPEC]
        if self._datalist is None:
            self._datalist = self._load_datalist(site, meta)
        key = (split, train, max_samples, batch_size)
        if key not in self._loaders:
            self._loaders[key] = make_loader(
                self._datalist[split],
                image_size=self.image_size,
                num_classes=spec["num_classes"],
                batch_size=batch_size or self.batch_size,
                train=train,
                seed=self.seed,
                max_samples=max_samples,
                in_channels=spec["in_channels"],
                task=self._task(meta),
                site=site,
                augmentation=self.augmentation,
                num_workers=self.loader_workers if train else 0,
            )
        loader = self._loaders[key]
        # Re-seed shuffling and augmentation per round, so a round's batches do not depend on whether this
        # process is the one that ran the previous rounds (simulator -t < -n, restarts).
        if loader.generator is not None:
            loader.generator.manual_seed(seed)
        loader.dataset.transform.set_random_state(seed=seed % (2**32))
        return loader

    def _load_datalist(self, site, meta) -> dict:
        """This site's datalist, the label regions Dice is reported for (`regions` in dataset.json) and the sites
        whose images are corrupted (`corrupted_sites`). Classification datalists may also have a corrupted test set
        (`testing_corrupted`)."""
        root, num_classes = self._data_root(site, meta), meta[protocol.MODEL_SPEC]["num_classes"]
        own = site_settings(site)
        options = dict(
            num_classes=num_classes,
            task=self._task(meta),
            allow_absolute_paths=own.allow_absolute_paths,
            max_image_side=own.max_image_side,
            max_image_voxels=own.max_image_voxels,
            optional_splits=(CORRUPTED_SPLIT,) if self._task(meta) == CLASSIFICATION else (),
        )
        info = load_dataset_info(root, site, num_classes)
        self._regions, self._corrupted_sites = info.get("regions"), info.get("corrupted_sites", [])
        if own.free_rider:  # this site's own test switch: one image of another site, repeated
            return free_rider_datalist(load_datalist(root, own.free_rider_source, **options))
        return load_datalist(root, site, **options)

    def _data_root(self, site, meta: dict) -> str:
        """This site's data root, or the built-in data the server's task names (checked: the dataset, its seed, number
        of sites and test scale become a cache folder name)."""
        root = site_settings(site).data_root or self.data_root
        if root:
            return root
        seed, num_sites = meta.get(protocol.DATA_SEED, 0), meta.get(protocol.NUM_SITES)
        if not (is_int_in(seed, 0, 2**32 - 1) and is_int_in(num_sites, 1, MAX_SITES)):
            raise DataError(
                site,
                "the server's task",
                f"data_seed {seed!r} or num_sites {num_sites!r} out of range "
                f"(integers in [0, 2^32 - 1] and [1, {MAX_SITES}])",
            )
        try:
            dataset = builtin_dataset(meta.get(protocol.DATASET, "prostate")).name
            test_scale = check_test_scale(meta.get(protocol.TEST_SCALE, 1.0))
        except ValueError as e:
            raise DataError(site, "the server's task", str(e)) from e
        return str(
            ensure_builtin(
                dataset,
                image_size=self.image_size,
                seed=seed,
                num_sites=num_sites,
                size_scale=self.synthetic_size_scale,
                test_scale=test_scale,
            )
        )

    @staticmethod
    def _state_dir(fl_ctx, meta: dict) -> str:
        """This site's state (its local model): in the job's run directory, or for a named run where a
        resubmitted job finds it (protocol.run_state_dir)."""
        workspace = fl_ctx.get_engine().get_workspace()
        if meta.get(protocol.RUN_NAME):  # checked there: a safe name, never a path
            return protocol.run_state_dir(workspace.get_root_dir(), fl_ctx.get_identity_name(), meta[protocol.RUN_NAME])
        return os.path.join(workspace.get_run_dir(fl_ctx.get_job_id()), "fairfl_site")
