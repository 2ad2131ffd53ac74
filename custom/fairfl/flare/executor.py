"""The one client Executor of every fairfl job: it answers `train`, `validate` and the methods' own site tasks.

The executor keeps the data, the loaders, the seeding, the site's state dir and the task protocol: the server decides
per task whether the site trains from the global model or from its own, which it evaluates, segmentation or
classification. What a method changes at the sites (a probe of the model sent, a loss, a training loop, a step after
training, another evaluated model) is a step of its unit run in fixed phases, switched on by the task's meta, and a
measurement a method asks for between its tasks is a site task of its unit, answered by its name
(fairfl.methods.steps); so every method shares this class.

Every task is read and checked once, before anything is built (fairfl.flare.site_task), into the `SiteTask` the
helpers below share. Classification (meta `task` "classification") trains with the logit-adjusted cross-entropy of the
site's training labels and reports accuracy, balanced accuracy and AUC on a clean and a corrupted test set
(`_validate`). What a site must remember between tasks (its trained local model; what a method's step keeps) lives on
disk in the site's state dir (`_state_dir`: the job's run workspace, or the named run's, so a resumed run finds it):
with `nvflare simulator -t` smaller than `-n`, or after a restart, the process is new."""

from __future__ import annotations

import contextlib
import functools
import os
import time

import torch
from nvflare.apis.dxo import MetaKey
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.shareable import make_reply
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from fairfl.arguments import check_all
from fairfl.classification import LogitAdjustedCrossEntropy, class_counts, evaluate_classification
from fairfl.data.builtin import builtin_dataset, check_test_scale, ensure_builtin
from fairfl.data.datalist import CORRUPTED_SPLIT, load_datalist, load_dataset_info, site_load_options
from fairfl.data.free_rider import free_rider_datalist
from fairfl.data.loaders import make_loader
from fairfl.data.volumes import VolumeSettings
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_state import keep_version, kept_model_versions, kept_versions, newest_before
from fairfl.flare.site_task import CLASSIFICATION, SEGMENTATION, SERVERS_TASK, SiteTask, read_task
from fairfl.flare.update_filters import make_filter
from fairfl.methods.steps import MethodTask, StepContext, TaskSteps, registered_tasks
from fairfl.models import build_model, is_int_in, load_numpy_state, meta_state, state_to_numpy
from fairfl.presets import apply_preset
from fairfl.privacy.settings import METRICS as PRIVACY_METRICS
from fairfl.results import GLOBAL_PREFIX
from fairfl.site_settings import SHARE_OWN_MODEL_ENV, site_settings
from fairfl.training import (
    TrainSettings,
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
    sliding_window,
    train_local,
)
from fairfl.updates import in_dtypes, weight_difference

# the score of a model on the validation split (StepContext.validation_score), per task
VALIDATION_METRIC = {SEGMENTATION: "dice", CLASSIFICATION: "balanced_accuracy"}
MAX_SITES = 1000  # the most built-in sites a server may ask a site to generate


class Declined(Exception):
    """A task this site will not do by its own settings (sending its own model); answered TASK_UNSUPPORTED."""


class FairflExecutor(Executor):
    def __init__(self, **arguments):
        """Local training, evaluation and the methods' own site tasks for one site. Its arguments, each declared with
        its kind, default and meaning in fairfl.arguments (EXECUTOR), are checked there before anything is built, the
        error naming the argument, and each becomes an attribute of its own name. What a site reads beyond its data
        root, whether it is a free rider and how large a network it builds are the site's settings alone
        (fairfl.site_settings: its environment), never the job's. A CUDA `device` this site lacks is refused here,
        when the site loads the job."""
        checked = check_all(type(self), arguments)
        super().__init__()
        vars(self).update(checked)
        if self.augmentation is not None:  # null: the task's
            self.augmentation = list(self.augmentation)
        self._privacy_filter = make_filter(self.privacy_filter)  # NVFlare's, on what training sends
        if self.device.startswith("cuda"):
            index, count = int(self.device.partition(":")[2] or 0), torch.cuda.device_count()
            if index >= count:
                raise ValueError(
                    f"FairflExecutor: device {self.device!r}: this site has "
                    f"{f'CUDA devices cuda:0 to cuda:{count - 1}' if count else 'no CUDA device'}"
                )
        self._datalist, self._regions, self._corrupted_sites, self._declared_spacing = None, None, [], None
        # cached per process, for every task's loaders (CacheDataset reads the files once): the key is (split, train,
        # max_samples, batch_size), so a method's sample of a split is a loader of its own
        self._loaders = {}

    # --- task dispatch ---------------------------------------------------------------------------------
    def execute(self, task_name, shareable, fl_ctx, abort_signal):
        answers = {protocol.TASK_TRAIN: self._train, protocol.TASK_VALIDATE: self._validate}
        method_task = None if task_name in answers else registered_tasks().get(task_name)
        if task_name not in answers and method_task is None:
            known = sorted([*answers, *registered_tasks()])
            self.log_error(fl_ctx, f"unknown task {task_name!r}; this executor answers {known}")
            return make_reply(ReturnCode.TASK_UNKNOWN)
        site = fl_ctx.get_identity_name()
        try:
            task = read_task(site, shareable, method_task)
            if task_name == protocol.TASK_VALIDATE and task.submit_model:
                self._check_sharing(site, fl_ctx)
            apply_preset(self, self.preset, task.kind)
            configure_threads(self.num_threads)
            state_dir = self._state_dir(fl_ctx, task)
            if method_task is None:
                result = answers[task_name](task, state_dir)
            else:
                result = self._method_task(method_task, task, state_dir)
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
        if self._privacy_filter is not None and result.params_type == ParamsType.DIFF:
            return self._filtered(result, fl_ctx)
        return FLModelUtils.to_shareable(result)

    def _filtered(self, result: FLModel, fl_ctx):
        """`result`, a training update, through the job's privacy filter as NVFlare's filter chain passes it
        (`process`); NVFlare's filters compute in floats, so each tensor goes back to its own dtype (a counter's
        integer) as the server requires."""
        filtered = FLModelUtils.from_shareable(self._privacy_filter.process(FLModelUtils.to_shareable(result), fl_ctx))
        filtered.params = in_dtypes(filtered.params or {}, result.params)
        return FLModelUtils.to_shareable(filtered)

    # --- tasks -----------------------------------------------------------------------------------------
    def _train(self, task: SiteTask, state_dir: str) -> FLModel:
        """Local training from the model the task names (start_from), with the methods' steps
        (fairfl.methods.steps) in their phases; the trained model becomes the site's local model."""
        ctx, steps = self._context(task, state_dir, trains=True), TaskSteps(task.meta)
        seed_everything(ctx.seed)
        steps.before_start(ctx)  # the previous local model is still there
        model = self._model_for(ctx, steps, task.start_from)
        steps.before_training(ctx, model)
        if site_settings(task.site).free_rider:  # recorded by the server with the training metrics
            ctx.metrics[protocol.FREE_RIDER] = 1.0
        loader = self._loader(task, "training", train=True, seed=ctx.seed)
        with contextlib.ExitStack() as stack:
            loss_fn = steps.loss(ctx, self._loss(task), model, stack)
            started = time.time()
            settings = self._train_settings(task)
            optimizer = self._optimizer(task, model.to(ctx.device), settings, state_dir)
            stats = steps.train(ctx, model, loader, settings, loss_fn, optimizer)
            if stats is None:  # no step has a loop of its own
                stats = train_local(
                    model,
                    loader,
                    settings,
                    ctx.device,
                    loss_fn=loss_fn,
                    optimizer=optimizer,
                    amp=self.amp,
                    privacy=task.privacy,
                )
            ctx.metrics["train_seconds"] = time.time() - started  # local training alone (cost benchmarks)
            if task.keep_optimizer_state:
                self._keep_optimizer_state(task, optimizer, settings, state_dir)
        self._keep_local_model(task, state_dir, model)
        steps.after_training(ctx, model)
        params = state_to_numpy(model.state_dict()) if task.send_params else {}
        params = steps.outgoing(ctx, params, model)
        # sent as the difference from the weights received (NVFlare's WEIGHT_DIFF): what privacy filters work on
        params_type = ParamsType.DIFF if params and task.params else ParamsType.FULL
        if params_type == ParamsType.DIFF:
            params = weight_difference(params, task.params)
        metrics = {
            **ctx.metrics,
            **{
                k: float(stats[k])
                for k in ("train_loss", "train_perturbed_loss", "rho", *PRIVACY_METRICS)
                if k in stats
            },
        }
        return FLModel(
            params_type=params_type,
            params=params,
            metrics=metrics,
            meta={
                protocol.NUM_SAMPLES: len(loader.dataset),
                protocol.NUM_STEPS: stats["steps"],
                # NVFlare's own key for the same count: its percentile filter caps the change per step by it
                MetaKey.NUM_STEPS_CURRENT_ROUND: stats["steps"],
                protocol.LR: self.lr,
                **ctx.reply,
            },
        )

    def _validate(self, task: SiteTask, state_dir: str) -> FLModel:
        """Segmentation: Dice on the `testing` split. Classification: accuracy, balanced accuracy and macro
        one-vs-rest AUC on `testing` (clean_accuracy, clean_balanced_accuracy, clean_auc) and, when the datalist
        has it, `testing_corrupted`, the same images corrupted as the corrupted sites' are (corrupted_*); and,
        without prefix, on the test set of this site's own image quality (corrupted_* at a site listed under
        `corrupted_sites` in the data root's dataset.json, clean_* elsewhere; `corrupted_site` 1.0 or 0.0), so that
        the spread of `auc` across sites is the spread of client-level testing under quality shift.

        A site the server holds out of training (held_out) scores the model sent as it is. With score_global, a site
        scored with a model of its own (a step's own model, a part of the model it keeps) also scores the model sent
        as it is, in the same task: those metrics prefixed GLOBAL_PREFIX (global_dice, ...). With submit_model (the
        server's cross-site evaluation) the site returns the model it would score, as its params, unscored."""
        ctx, steps = self._context(task, state_dir, trains=False), TaskSteps(task.meta)
        held_out = task.site in task.held_out
        if held_out:
            model = self._sent_model(task)
        else:
            model = steps.evaluated_model(ctx)  # a model of the site's own that a step keeps, or None
            model = self._model_for(ctx, steps, task.evaluate) if model is None else model
        if task.submit_model:
            return FLModel(params_type=ParamsType.FULL, params=state_to_numpy(model.state_dict()), metrics={})
        loader = self._loader(task, "testing", train=False, seed=self.seed, whole=True)
        influence: dict = {}
        metrics = self._test_scores(task, model, loader, influence)
        if task.score_global and not held_out:
            sent = self._sent_model(task)
            metrics.update({GLOBAL_PREFIX + k: v for k, v in self._test_scores(task, sent, loader).items()})
        return FLModel(
            params_type=ParamsType.FULL,
            params={},
            metrics={**metrics, **ctx.metrics},
            meta={
                protocol.NUM_SAMPLES: len(loader.dataset),
                **({protocol.TEST_INFLUENCE: influence} if influence else {}),
            },
        )

    def _method_task(self, method_task: type[MethodTask], task: SiteTask, state_dir: str) -> FLModel:
        """A method's own site task (fairfl.methods.steps.MethodTask): its reply meta and metrics, no weights. It comes
        after the round's training, so it works from the local model this site trained in the task's round."""
        ctx = self._context(task, state_dir, trains=False)
        method_task().run(ctx)
        return FLModel(params_type=ParamsType.FULL, params={}, metrics=ctx.metrics or None, meta=ctx.reply)

    def _test_scores(self, task: SiteTask, model, loader, influence: dict | None = None) -> dict:
        """`model`'s metrics on this site's test split (`loader`) and corrupted test split, as `_validate` reports;
        `influence` (a dict) filled with each test patient's influence on the unprefixed metrics."""
        found: dict = {"clean": {}, "corrupted": {}}
        metrics = self._evaluate(model, loader, task, influence=found["clean"])
        if task.kind == CLASSIFICATION:  # under quality shift: clean, corrupted, and the site's own quality
            scores = {"clean": metrics}
            if CORRUPTED_SPLIT in self._datalist:
                scores["corrupted"] = self._evaluate(
                    model,
                    self._loader(task, CORRUPTED_SPLIT, train=False, seed=self.seed, whole=True),
                    task,
                    influence=found["corrupted"],
                )
            corrupted_site = task.site in self._corrupted_sites and "corrupted" in scores
            if influence is not None:
                influence.update(found["corrupted" if corrupted_site else "clean"])
            metrics = {
                **scores["corrupted" if corrupted_site else "clean"],
                "corrupted_site": float(corrupted_site),
                **{f"{quality}_{name}": v for quality, values in scores.items() for name, v in values.items()},
            }
        elif influence is not None:
            influence.update(found["clean"])
        return metrics

    def _validation_score(self, task: SiteTask, model, device, influence: dict | None = None):
        """Dice (classification: balanced accuracy) of `model` on the validation split; None when NaN (no foreground
        to score). `influence` (a dict): filled with the score's per-patient influence record
        (fairfl.uncertainty.case_influence_record: {"cases", "values"}) when the split gives one."""
        loader = self._loader(task, "validation", train=False, seed=self.seed, whole=True)
        metric = VALIDATION_METRIC[task.kind]
        found: dict | None = {} if influence is not None else None
        score = self._evaluate(model, loader, task, device, influence=found)[metric]
        if influence is not None and found and found.get(metric):
            influence.update(found[metric])
        return score if score == score else None

    def _evaluate(self, model, loader, task: SiteTask, device=None, influence: dict | None = None) -> dict:
        """Dice (segmentation; volumes whole, by sliding window, with HD95 and surface Dice) or accuracy, balanced
        accuracy and AUC (classification) of `model` on `loader`; `influence` filled as `_test_scores` says."""
        device = device or select_device(self.device)
        with mixed_precision(device, self.amp):
            if task.kind == CLASSIFICATION:
                return evaluate_classification(model, loader, task.num_classes, device, case_influence=influence)
            predict = sliding_window(self.patch_size, self.sliding_window_overlap) if task.spatial_dims == 3 else None
            return evaluate_dice(
                model,
                loader,
                task.num_classes,
                device,
                regions=self._regions,
                predict=predict,
                case_influence=influence,
            )

    # --- what the methods' steps and tasks see -----------------------------------------------------------
    def _context(self, task: SiteTask, state_dir: str, trains: bool) -> StepContext:
        """What the methods' steps and tasks see of this task and of this site (fairfl.methods.steps.StepContext).
        `trains`: a train task of round r works from the site's own model of a round before r, a later task of round r
        (its evaluation, a method's task) from the one it trained in round r."""
        device = select_device(self.device)
        before = task.round if trains else task.round + 1
        # read once per task: a probe, the start model and the parts a site keeps may all ask for it
        own_model = functools.cache(lambda: self._own_model(task, state_dir, before))
        return StepContext(
            site=task.site,
            meta=task.meta,
            params=task.params,
            round=task.round,
            seed=site_seed(self.seed, task.site) + task.round,
            device=device,
            state_dir=state_dir,
            task=task.kind,
            loader=lambda split, train, seed=None, max_samples=None, batch_size=None: self._loader(
                task, split, train, self.seed if seed is None else seed, max_samples, batch_size
            ),
            validation_score=lambda model, influence=None: (
                self._validation_score(task, model, device)
                if influence is None
                else self._validation_score(task, model, device, influence)
            ),
            base_loss=lambda: self._loss(task),
            class_counts=lambda: self._class_counts(task),
            train_settings=lambda: self._train_settings(task),
            own_model=own_model,
            own_network=lambda: self._model_of(task, own_model(), state_dir),
            sent_model=lambda: self._sent_model(task),
            log_error=self.logger.error,
            amp=self.amp,
        )

    @staticmethod
    def _model_for(ctx: StepContext, steps: TaskSteps, choice: str):
        """The model a task's `choice` (its start_from or evaluate) asks for: the site's own (FROM_LOCAL) or the one
        sent, as the task's steps receive it (with a part the site keeps on it).

        A site asked for its own model before it has one (the first round) starts from the one sent."""
        own = ctx.own_model() if choice == protocol.FROM_LOCAL else None
        if own is not None or (choice == protocol.FROM_LOCAL and not ctx.params):
            return ctx.own_network()
        model = ctx.sent_model()
        steps.received(ctx, model)
        return model

    # --- the site's models -----------------------------------------------------------------------------
    @staticmethod
    def _sent_model(task: SiteTask):
        """The job's network with the weights a task sent (numpy arrays), as they are."""
        return load_numpy_state(build_model(task.model_spec), task.params)

    @staticmethod
    def _model_of(task: SiteTask, state: dict | None, state_dir: str):
        """The job's network with the site's own weights `state` (`_own_model`); none is an error."""
        if state is None:
            path = os.path.join(state_dir, protocol.LOCAL_MODEL_FILE)
            raise RuntimeError(f"no local model at {path}: this site has not trained in this run yet")
        model = build_model(task.model_spec)
        model.load_state_dict(state)
        return model

    @staticmethod
    def _local_versions(task: SiteTask, state_dir: str) -> list:
        """The site's local models on disk (`fairfl.flare.site_state.kept_model_versions`)."""
        remedy = "delete it (or use another run_name) to start this site's local model afresh"
        reference = meta_state(task.model_spec)
        return kept_model_versions(task.site, state_dir, protocol.LOCAL_MODEL_FILES, "local model", remedy, reference)

    def _own_model(self, task: SiteTask, state_dir: str, before_round: int) -> dict | None:
        """The state dict of the site's newest local model trained before round `before_round`, None when none."""
        saved = newest_before(self._local_versions(task, state_dir), before_round)
        return None if saved is None else saved["model"]

    def _keep_local_model(self, task: SiteTask, state_dir: str, model) -> None:
        """Save the model trained in the task's round as the site's local model (the previous round's kept too)."""
        saved, versions = {"round": task.round, "model": model.state_dict()}, self._local_versions(task, state_dir)
        keep_version(saved, state_dir, protocol.LOCAL_MODEL_FILES, versions)

    # --- local training --------------------------------------------------------------------------------
    def _loss(self, task: SiteTask):
        """The local training loss: Dice for segmentation; for classification the logit-adjusted cross-entropy
        of this site's training labels (logit_adjustment 0: plain cross-entropy)."""
        if task.kind != CLASSIFICATION:
            return segmentation_loss()
        return LogitAdjustedCrossEntropy(self._class_counts(task), tau=self.logit_adjustment)

    def _class_counts(self, task: SiteTask) -> list[int]:
        """How many training images of each class this site has (its datalist is loaded by then)."""
        return class_counts([e["label"] for e in self._datalist["training"]], task.num_classes)

    def _train_settings(self, task: SiteTask) -> TrainSettings:
        return TrainSettings(
            lr=self.lr,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
            optimizer=task.optimizer,
            momentum=task.momentum,
            betas=task.betas,
        )

    def _optimizer(self, task: SiteTask, model, settings: TrainSettings, state_dir: str):
        """A fresh local optimiser for this round or, with keep_state, one carrying the state this site kept after
        the round before the task's (the current file, or the previous one when this round is a repeat after a
        restart). Settings are always the job's. No such state (the first round, a new run under an old run_name):
        fresh. A kept file that cannot be read or does not fit is an error naming the site and the file."""
        optimizer = make_optimizer(model, settings)
        if not task.keep_optimizer_state:
            return optimizer
        for saved_round, saved, name in self._optimizer_versions(task, state_dir):
            if saved_round == task.round - 1:
                problem = load_optimizer_state(optimizer, settings.optimizer, saved)
                if problem:
                    raise DataError(
                        task.site,
                        os.path.join(state_dir, name),
                        f"the kept optimiser state cannot be used ({problem}); delete it to "
                        f"start this site's optimiser afresh",
                    )
        return optimizer

    @staticmethod
    def _optimizer_versions(task: SiteTask, state_dir: str) -> list:
        """The site's kept optimiser states ({"round", "optimizer", "moments"}; fairfl.flare.site_state)."""
        remedy = "delete it to start this site's optimiser afresh"
        return kept_versions(task.site, state_dir, protocol.OPTIMIZER_STATE_FILES, "kept optimiser state", remedy)

    def _keep_optimizer_state(self, task: SiteTask, optimizer, settings: TrainSettings, state_dir: str):
        """Save the optimiser's state after the task's round; the state of an earlier round becomes the previous
        file, so a round repeated after a restart starts from the same state as its first try."""
        saved = optimizer_state(optimizer, settings.optimizer, task.round)
        keep_version(saved, state_dir, protocol.OPTIMIZER_STATE_FILES, self._optimizer_versions(task, state_dir))

    # --- the site's data -------------------------------------------------------------------------------
    def _loader(self, task: SiteTask, split, train, seed, max_samples=None, batch_size=None, whole=False):
        """The site's loader of `split` (a random sample of at most `max_samples`, in minibatches of `batch_size`,
        default the job's), built once per process and re-seeded with `seed` for this task. `whole`: for scoring, 3-D
        segmentation volumes come whole (fairfl.data.volumes); elsewhere it changes nothing."""
        if self._datalist is None:
            self._datalist = self._load_datalist(task)
        whole = whole and task.spatial_dims == 3 and task.kind == SEGMENTATION
        key = (split, train, max_samples, batch_size, whole)
        if key not in self._loaders:
            decoded = None
            if max_samples is not None:  # the server's task chooses a sample's size: one sampled loader per split
                for old in [k for k in self._loaders if k[:2] == key[:2] and k[2] is not None]:
                    del self._loaders[old]
                # a method's sample of the training split reads the training loader's cache, not the files
                training = self._loaders.get((split, True, None, None, False))
                decoded = training.dataset if training is not None and not train else None
            self._loaders[key] = make_loader(
                self._datalist[split],
                image_size=self.image_size,
                num_classes=task.num_classes,
                batch_size=batch_size or self.batch_size,
                train=train,
                seed=self.seed,
                max_samples=max_samples,
                in_channels=task.in_channels,
                task=task.kind,
                site=task.site,
                augmentation=self.augmentation,
                num_workers=self.loader_workers if train else 0,
                volume=self._volume_settings() if task.spatial_dims == 3 else None,
                whole=whole,
                preprocessing=task.preprocessing,
                decoded=decoded,
            )
        loader = self._loaders[key]
        # Re-seed shuffling and augmentation per round, so a round's batches do not depend on whether this
        # process is the one that ran the previous rounds (simulator -t < -n, restarts).
        if loader.generator is not None:
            loader.generator.manual_seed(seed)
        loader.dataset.transform.set_random_state(seed=seed % (2**32))
        return loader

    def _load_datalist(self, task: SiteTask) -> dict:
        """This site's datalist, the label regions Dice is reported for (`regions` in dataset.json) and the sites
        whose images are corrupted (`corrupted_sites`). Classification datalists may also have a corrupted test set
        (`testing_corrupted`)."""
        site, root = task.site, self._data_root(task)
        own = site_settings(site)
        options = site_load_options(own, task.kind, task.num_classes, task.spatial_dims)
        info = load_dataset_info(
            root, site, task.num_classes, task=task.kind, in_channels=task.in_channels, spatial_dims=task.spatial_dims
        )
        self._regions, self._corrupted_sites = info.get("regions"), info.get("corrupted_sites", [])
        self._declared_spacing = info.get("declared", {}).get("spacing")
        if own.free_rider:  # this site's own test switch: one image of another site, repeated
            return free_rider_datalist(load_datalist(root, own.free_rider_source, **options))
        return load_datalist(root, site, **options)

    def _data_root(self, task: SiteTask) -> str:
        """This site's data root, or the built-in data the server's task names (checked: the dataset, its seed, number
        of sites and test scale become a cache folder name)."""
        root = site_settings(task.site).data_root or self.data_root
        if root:
            return root
        seed, num_sites = task.data_seed, task.num_sites
        if not (is_int_in(seed, 0, 2**32 - 1) and is_int_in(num_sites, 1, MAX_SITES)):
            raise DataError(
                task.site,
                SERVERS_TASK,
                f"data_seed {seed!r} or num_sites {num_sites!r} out of range "
                f"(integers in [0, 2^32 - 1] and [1, {MAX_SITES}])",
            )
        try:
            dataset = builtin_dataset(task.dataset).name
            test_scale = check_test_scale(task.test_scale)
        except ValueError as e:
            raise DataError(task.site, SERVERS_TASK, str(e)) from e
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

    def _volume_settings(self) -> VolumeSettings:
        """How this site prepares 3-D volumes: the job's 3-D arguments, the spacing dataset.json declares unless the
        job sets one (read with the datalist)."""
        spacing = self.spacing or self._declared_spacing
        return VolumeSettings(
            patch_size=tuple(self.patch_size),
            patches_per_volume=self.patches_per_volume,
            spacing=None if spacing is None else (float(spacing[0]), float(spacing[1]), float(spacing[2])),
            intensity_window=None if self.intensity_window is None else tuple(self.intensity_window),
            intensity_percentiles=tuple(self.intensity_percentiles),
        )

    # --- the site's own settings and state dir ---------------------------------------------------------
    @staticmethod
    def _check_sharing(site, fl_ctx) -> None:
        """Declined unless this site sends its own model (or a model a step keeps) when the server asks for it
        (cross-site evaluation): its FAIRFL_SHARE_OWN_MODEL, or where unset only in NVFlare's simulator, whose sites
        are one person's data on one machine; POC and provisioned sites keep their models unless they set it to 1."""
        chosen = site_settings(site).share_own_model
        if chosen is None and not fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False):
            setting = f"{SHARE_OWN_MODEL_ENV} is unset, which shares only in NVFlare's simulator"
        elif chosen is False:
            setting = f"{SHARE_OWN_MODEL_ENV} is 0"
        else:
            return
        raise Declined(f"[{site}] declines to send its own model for cross-site evaluation: {setting} at this site")

    @staticmethod
    def _state_dir(fl_ctx, task: SiteTask) -> str:
        """This site's state (its local model): in the job's run directory, or for a named run where a
        resubmitted job finds it (protocol.run_state_dir)."""
        workspace = fl_ctx.get_engine().get_workspace()
        if task.run_name:  # checked there: a safe name, never a path
            return protocol.run_state_dir(workspace.get_root_dir(), fl_ctx.get_identity_name(), task.run_name)
        return os.path.join(workspace.get_run_dir(fl_ctx.get_job_id()), "fairfl_site")
