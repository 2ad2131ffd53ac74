"""The one client Executor of every fairfl job: it answers `train`, `validate` and `cka`.

The server decides per task what the site does (train from the global model or from the site's own,
evaluate the global model or the site's own; segmentation or classification; plain or sharpness-aware
training; what to measure on the model it received before training) through the task's meta, so every
method shares this class.

Classification (meta `task` "classification") trains with the logit-adjusted cross-entropy of the site's
training labels and reports accuracy, balanced accuracy and AUC on a clean and a corrupted test set (`_validate`).
What a site must remember between tasks (its trained local model; Ditto's personal model) lives on disk in the
site's state dir (`_state_dir`: the job's run workspace, or the named run's, so a resumed run finds it):
with `nvflare simulator -t` smaller than `-n`, or after a restart, the process is new."""

from __future__ import annotations

import contextlib
import copy
import os
import time

import torch
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import make_reply
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.utils.fl_model_utils import FLModelUtils
from nvflare.app_opt.pt.fedce import PTFedCEHelper
from nvflare.app_opt.pt.fedproxloss import PTFedProxLoss

from fairfl.site_checks import check_site_state
from fairfl.classification import LogitAdjustedCrossEntropy, class_counts, evaluate_classification
from fairfl.methods.fedlwr.cka import MIN_BATCH, layerwise_cka
from fairfl.methods.fedce.contribution import leave_one_out_error
from fairfl.data.builtin import builtin_dataset, check_test_scale, ensure_builtin
from fairfl.data.datalist import load_dataset_info, load_datalist
from fairfl.data.free_rider import free_rider_datalist
from fairfl.data.loaders import check_augmentation, make_loader
from fairfl.data.classification_sites import CORRUPTED_SPLIT
from fairfl.errors import DataError
from fairfl.files import save_round_keeping_previous
from fairfl.flare import protocol
from fairfl.models import build_model, check_model_spec, head_state_keys, is_int_in, load_numpy_state, state_to_numpy
from fairfl.methods.fednpr.npr import check_npr_settings, class_prototypes, extract_features, fednpr_objective
from fairfl.presets import apply_preset
from fairfl.methods.fedism.sharpness import GSAM_ALPHA, dataset_loss, measure_sharpness, train_salt
from fairfl.site_settings import site_settings
from fairfl.training import (TrainSettings, check_optimizer_settings, configure_threads, evaluate_dice,
                             load_optimizer_state, load_tensors, make_optimizer, optimizer_state, save_model,
                             seed_everything, segmentation_loss, select_device, site_seed, train_local)

SEGMENTATION, CLASSIFICATION = "segmentation", "classification"
LOO_SCORE = {SEGMENTATION: "dice", CLASSIFICATION: "balanced_accuracy"}  # the validation score (FedCE: 1 - this, CFFL)
MAX_SITES = 1000  # the most built-in sites a server may ask a site to generate
FULL_WEIGHT = 1.0 - 1e-6  # a site with this share of the global model is all of it: nothing is left without it
CKA_SPLITS = ("training", "validation")
CKA_BATCH_SIZE = 32  # docs/methods/fedlwr.md: measured against 8 and 64


def leave_one_out_model(spec: dict, global_params: dict, previous_local_state: dict, weight: float):
    """FedCE's w^-i = (w - p_i w_i) / (1 - p_i): the global model without this site's share p_i of it, built from
    the site's previous local model w_i (NVFlare's PTFedCEHelper; integer buffers come from the global model).
    None when the site is the whole global model (p_i = 1): then no model without it exists."""
    if weight >= FULL_WEIGHT:
        return None
    global_model = load_numpy_state(build_model(spec), global_params)
    if weight <= 0.0:  # the site is not in the global model
        return global_model
    return PTFedCEHelper.make_minus_model(global_model, previous_local_state, weight)


class FairflExecutor(Executor):
    def __init__(self, data_root: str = "", image_size: int = 64, batch_size: int | None = None,
                 lr: float | None = None, weight_decay: float | None = None, local_epochs: int = 1, local_steps: int = 0,
                 cka_max_samples: int = 64, cka_batch_size: int = CKA_BATCH_SIZE, cka_split: str = "training",
                 synthetic_size_scale: float | None = None, seed: int = 0,
                 num_threads: int = 1, device: str = "auto", logit_adjustment: float = 1.0, preset: str = "",
                 augmentation=None):
        """Local training, evaluation and CKA probing for one site.

        Args:
            data_root: folder holding `<site>.json` datalists; empty = the built-in synthetic data.
                The site's own FAIRFL_DATA_ROOT overrides it; what a site reads beyond its data root, whether it
                is a free rider and how large a network it builds are the site's settings alone
                (fairfl.site_settings: its environment), never the job's.
            image_size: images and masks are resized to image_size x image_size.
            batch_size, lr, weight_decay: Adam settings of the local update; null = the task's
                (fairfl.presets.TASK_DEFAULTS: segmentation 8, 1e-3, 1e-4; classification 32, 3e-4, 5e-4).
            local_epochs: epochs per round, used when local_steps is 0.
            local_steps: if > 0, a fixed number of optimiser steps per round, equal for every site.
            cka_max_samples, cka_batch_size, cka_split: Fed-LWR measures CKA on a random sample of at most
                cka_max_samples images of the site's `cka_split` ("training" or "validation"), drawn afresh every
                round, in minibatches of cka_batch_size (at least 4, for the unbiased HSIC).
            synthetic_size_scale: scales the number of cases per site of the built-in data; null = the task's
                (segmentation 2.0, classification 1.0).
            seed: base seed; each site derives its own from it and its name.
            num_threads: torch intra-op threads of this client (0 = torch's default).
            device: "auto" (CUDA when present), "cpu", "cuda", "cuda:1", ...
            logit_adjustment: classification only: tau of the logit-adjusted cross-entropy (Menon et al.; FedISM+
                uses 1) against the site's label skew; 0 = plain cross-entropy.
            preset: named settings bundle (fairfl.presets); FAIRFL_PRESET overrides it.
            augmentation: the training augmentation, a list of "flip" (mirroring along both axes), "rotate90"
                (quarter turns) and "intensity" (scale/shift); [] = none; null = the task's (all three). Leave out
                flip and rotate90 where orientation carries meaning.
        """
        super().__init__()
        self.augmentation = None if augmentation is None else check_augmentation(augmentation)  # null: the task's
        self.data_root, self.image_size, self.batch_size = data_root, image_size, batch_size
        self.lr, self.weight_decay = lr, weight_decay
        self.local_epochs, self.local_steps = local_epochs, local_steps
        counts = (cka_batch_size, cka_max_samples)
        if cka_split not in CKA_SPLITS or not all(type(n) is int and n >= MIN_BATCH for n in counts):
            raise ValueError(f"need cka_split in {CKA_SPLITS} and integers cka_batch_size, cka_max_samples >= "
                             f"{MIN_BATCH}; got {cka_split!r}, {cka_batch_size!r}, {cka_max_samples!r}")
        self.cka_max_samples, self.cka_batch_size, self.cka_split = cka_max_samples, cka_batch_size, cka_split
        self.synthetic_size_scale = synthetic_size_scale
        self.seed, self.num_threads, self.device, self.preset = seed, num_threads, device, preset
        self.logit_adjustment = logit_adjustment
        self._datalist, self._regions, self._corrupted_sites = None, None, []
        self._loaders = {}  # cached per process: CacheDataset reads the files once

    # --- task dispatch ---------------------------------------------------------------------------------
    def execute(self, task_name, shareable, fl_ctx, abort_signal):
        handlers = {protocol.TASK_TRAIN: self._train, protocol.TASK_VALIDATE: self._validate,
                    protocol.TASK_CKA: self._cka}
        if task_name not in handlers:
            self.log_error(fl_ctx, f"unknown task {task_name!r}; this executor answers {sorted(handlers)}")
            return make_reply(ReturnCode.TASK_UNKNOWN)
        site = fl_ctx.get_identity_name()
        try:
            task = FLModelUtils.from_shareable(shareable)
            self._check_task(site, task.meta or {})
            apply_preset(self, self.preset, self._task(task.meta))
            configure_threads(self.num_threads)
            result = handlers[task_name](site, task, self._state_dir(fl_ctx, task.meta or {}))
        except DataError as e:
            self.log_error(fl_ctx, f"bad data: {e}")
            return make_reply(ReturnCode.BAD_TASK_DATA)
        except Exception as e:  # anything else: report to the server instead of killing the client
            self.log_exception(fl_ctx, f"[{site}] task {task_name} failed: {e!r}")
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        if abort_signal.triggered:
            return make_reply(ReturnCode.TASK_ABORTED)
        return FLModelUtils.to_shareable(result)

    # --- tasks -----------------------------------------------------------------------------------------
    def _train(self, site, task: FLModel, state_dir: str) -> FLModel:
        meta = task.meta
        device = select_device(self.device)
        seed = site_seed(self.seed, site) + int(task.current_round or 0)
        seed_everything(seed)
        reply_meta = {}
        if protocol.LOO_WEIGHTS in meta:  # FedCE: measured before training overwrites the previous local model
            reply_meta[protocol.LOO_ERROR] = self._leave_one_out_error(site, task, state_dir, device)
        model = self._model_for(task, state_dir, protocol.START_FROM)
        sent = copy.deepcopy(model) if protocol.DITTO_LAMBDA in meta else None  # Ditto's w_t, before training
        started = time.time()
        reply_meta.update(self._probe(site, meta, model, device))
        metrics = {"probe_seconds": time.time() - started} if reply_meta else {}
        if site_settings(site).free_rider:  # recorded by the server with the training metrics
            metrics[protocol.FREE_RIDER] = 1.0
        loader = self._loader(site, meta, "training", train=True, seed=seed)
        loss_fn = self._loss(meta)
        with contextlib.ExitStack() as stack:
            if protocol.NPR in meta:  # FedNPR: prototypes of the model sent, before training moves it
                started = time.time()
                loss_fn = npr = stack.enter_context(self._npr_objective(site, meta, model, device, seed))
                stack.callback(lambda: metrics.update(npr.metrics()))  # npr_grad_ratio
                metrics["prototype_seconds"] = time.time() - started
            if meta.get(protocol.PROX_MU):
                loss_fn = with_proximal_term(loss_fn, model, float(meta[protocol.PROX_MU]))
            started = time.time()
            settings = self._train_settings(meta)
            optimizer = self._optimizer(site, meta, model.to(device), settings, state_dir, int(task.current_round or 0))
            if protocol.SALT_RHO in meta:  # FedISM(+): GSAM over Adam at the server's search distance
                stats = train_salt(model, loader, settings, device, loss_fn, rho=float(meta[protocol.SALT_RHO]),
                                   alpha=float(meta.get(protocol.SALT_ALPHA, GSAM_ALPHA)), optimizer=optimizer)
            else:
                stats = train_local(model, loader, settings, device, loss_fn=loss_fn, optimizer=optimizer)
            metrics["train_seconds"] = time.time() - started  # local training alone (cost benchmarks)
            if self._optimizer_settings(meta).get("keep_state"):
                self._keep_optimizer_state(site, optimizer, settings, state_dir, int(task.current_round or 0))
        save_model(model, os.path.join(state_dir, protocol.LOCAL_MODEL_FILE))
        if meta.get(protocol.VALIDATE_TRAINED):  # CFFL: the trained model's score on the site's validation split
            reply_meta[protocol.VAL_METRIC] = self._validation_score(site, model, meta, device)
        if sent is not None:  # Ditto: the returned (global) copy is trained; now the personal model, from w_t
            metrics.update(self._train_personal(site, meta, sent, state_dir, device, seed,
                                                    int(task.current_round or 0)))
        params = state_to_numpy(model.state_dict()) if meta.get(protocol.SEND_PARAMS, True) else {}
        if meta.get(protocol.PERSONAL_HEAD):  # FedNPR-Per: the site's own head never leaves it
            params = {k: v for k, v in params.items() if k not in set(head_state_keys(model))}
        metrics.update({k: float(stats[k]) for k in ("train_loss", "train_perturbed_loss", "rho") if k in stats})
        return FLModel(params_type=ParamsType.FULL, params=params, metrics=metrics,
                       meta={protocol.NUM_SAMPLES: len(loader.dataset), protocol.NUM_STEPS: stats["steps"],
                             protocol.LR: self.lr, **reply_meta})

    def _validate(self, site, task: FLModel, state_dir: str) -> FLModel:
        """Segmentation: Dice on the `testing` split. Classification: accuracy, balanced accuracy and macro
        one-vs-rest AUC on `testing` (clean_accuracy, clean_balanced_accuracy, clean_auc) and, when the datalist
        has it, `testing_corrupted`, the same images corrupted as the corrupted sites' are (corrupted_*); and,
        without prefix, on the test set of this site's own image quality (corrupted_* at a site listed under
        `corrupted_sites` in the data root's dataset.json, clean_* elsewhere; `corrupted_site` 1.0 or 0.0), so that
        the spread of `auc` across sites is FedISM+'s Table IV ("client-level testing")."""
        meta = task.meta
        personal = self._load_personal(site, meta, state_dir) if meta.get(protocol.EVALUATE) == protocol.FROM_PERSONAL \
            else None
        model = personal if personal is not None else self._model_for(task, state_dir, protocol.EVALUATE)
        loader = self._loader(site, meta, "testing", train=False, seed=self.seed)
        metrics = self._evaluate(model, loader, meta)
        if self._task(meta) == CLASSIFICATION:  # under quality shift: clean, corrupted, and the site's own quality
            scores = {"clean": metrics}
            if CORRUPTED_SPLIT in self._datalist:
                scores["corrupted"] = self._evaluate(
                    model, self._loader(site, meta, CORRUPTED_SPLIT, train=False, seed=self.seed), meta)
            corrupted_site = site in self._corrupted_sites and "corrupted" in scores
            metrics = {**scores["corrupted" if corrupted_site else "clean"], "corrupted_site": float(corrupted_site),
                       **{f"{quality}_{name}": v for quality, values in scores.items() for name, v in values.items()}}
        if meta.get(protocol.EVALUATE) == protocol.FROM_PERSONAL:  # 0.0: no personal model yet, scored the one sent
            metrics["personal_model"] = float(personal is not None)
        return FLModel(params_type=ParamsType.FULL, params={}, metrics=metrics,
                       meta={protocol.NUM_SAMPLES: len(loader.dataset)})

    def _cka(self, site, task: FLModel, state_dir: str) -> FLModel:
        """Per-layer CKA between the site's local model and the anchor on a random sample of the site's images,
        drawn afresh every round from the site's seed and the round, in random order (make_loader's max_samples).
        Never in datalist order: minibatches of neighbouring slices of one or two patients show the unbiased
        HSIC only within-patient variation, and CKA comes out too high at exactly the small sites."""
        meta = task.meta
        local = self._load_local(meta, state_dir)
        anchor = load_numpy_state(build_model(meta[protocol.MODEL_SPEC]), task.params)
        loader = self._loader(site, meta, self.cka_split, train=False,
                              seed=site_seed(self.seed, site) + int(task.current_round or 0),
                              max_samples=self.cka_max_samples, batch_size=self.cka_batch_size)
        cka = layerwise_cka(local, anchor, (b["image"] for b in loader), device=select_device(self.device))
        return FLModel(params_type=ParamsType.FULL, params={}, meta={protocol.CKA: cka})

    def _leave_one_out_error(self, site, task: FLModel, state_dir: str, device):
        """1 - Dice (classification: 1 - balanced accuracy) of the leave-one-out model on the validation split;
        None when it cannot be built (the server then leaves this site out of the round)."""
        weight = float(task.meta[protocol.LOO_WEIGHTS].get(site, 0.0))
        path = os.path.join(state_dir, protocol.LOCAL_MODEL_FILE)
        if weight >= FULL_WEIGHT:
            return 1.0  # without this site there is no global model at all: the largest possible error
        if weight > 0.0 and not os.path.exists(path):
            self.logger.error(f"[{site}] FedCE: my share of the global model is {weight:.4f} but my previous local "
                              f"model {path} is gone; cannot build the leave-one-out model this round")
            return None
        previous = load_tensors(path) if weight > 0.0 else {}
        model = leave_one_out_model(task.meta[protocol.MODEL_SPEC], task.params, previous, weight)
        score = self._validation_score(site, model, task.meta, device)
        return None if score is None else leave_one_out_error(score)

    def _validation_score(self, site, model, meta: dict, device):
        """Dice (classification: balanced accuracy) of `model` on the validation split; None when NaN (no foreground
        to score)."""
        score = self._evaluate(model, self._loader(site, meta, "validation", train=False, seed=self.seed), meta,
                               device)[LOO_SCORE[self._task(meta)]]
        return score if score == score else None

    def _probe(self, site, meta: dict, model, device) -> dict:
        """What the server asked to measure on the model it sent, before training changes it: the sharpness and
        perturbed loss at meta[SHARPNESS_RHO] (FedISM(+)'s SAGA) and the loss (q-FedAvg), in eval mode over the
        whole unaugmented training split. Classification measures plain cross-entropy, as the FFL4MIA code does:
        the model's loss on the site's data, not the prior-adjusted training objective."""
        if protocol.SHARPNESS_RHO not in meta and not meta.get(protocol.MEASURE_LOSS):
            return {}
        loader = self._loader(site, meta, "training", train=False, seed=self.seed)
        loss_fn = torch.nn.CrossEntropyLoss() if self._task(meta) == CLASSIFICATION else segmentation_loss()
        result = {}
        if protocol.SHARPNESS_RHO in meta:
            result[protocol.SHARPNESS] = measure_sharpness(model, loader, loss_fn, float(meta[protocol.SHARPNESS_RHO]),
                                                           device)
        if meta.get(protocol.MEASURE_LOSS):
            if protocol.SHARPNESS in result:
                result[protocol.GLOBAL_LOSS] = result[protocol.SHARPNESS]["loss"]
            else:
                result[protocol.GLOBAL_LOSS] = dataset_loss(model.to(device).eval(), loader, loss_fn, device)
        return result

    # --- helpers ---------------------------------------------------------------------------------------
    @staticmethod
    def _check_task(site, meta: dict) -> None:
        """The server's model spec and FedNPR settings within what this site builds and loops over; else bad task
        data naming the field (the server is not trusted with this site's memory)."""
        problem = check_model_spec(meta.get(protocol.MODEL_SPEC), site_settings(site).max_model_parameters)
        if problem:
            raise DataError(site, "the server's task", f"{protocol.MODEL_SPEC} {problem}")
        problem = check_npr_settings(meta[protocol.NPR]) if protocol.NPR in meta else None
        if problem:
            raise DataError(site, "the server's task", f"{protocol.NPR} settings: {problem}")
        problem = check_optimizer_settings(meta[protocol.OPTIMIZER]) if protocol.OPTIMIZER in meta else None
        if problem:
            raise DataError(site, "the server's task", f"{protocol.OPTIMIZER} settings: {problem}")

    @staticmethod
    def _task(meta: dict) -> str:
        return meta.get(protocol.TASK, SEGMENTATION)

    def _evaluate(self, model, loader, meta: dict, device=None) -> dict:
        """Dice (segmentation) or accuracy, balanced accuracy and AUC (classification) of `model` on `loader`."""
        num_classes, device = meta[protocol.MODEL_SPEC]["num_classes"], device or select_device(self.device)
        if self._task(meta) == CLASSIFICATION:
            return evaluate_classification(model, loader, num_classes, device)
        return evaluate_dice(model, loader, num_classes, device, regions=self._regions)

    def _loss(self, meta: dict):
        """The local training loss: Dice for segmentation; for classification the logit-adjusted cross-entropy
        of this site's training labels (logit_adjustment 0: plain cross-entropy)."""
        if self._task(meta) != CLASSIFICATION:
            return segmentation_loss()
        counts = class_counts([e["label"] for e in self._datalist["training"]], meta[protocol.MODEL_SPEC]["num_classes"])
        return LogitAdjustedCrossEntropy(counts, tau=self.logit_adjustment)

    def _model_for(self, task: FLModel, state_dir: str, choice: str):
        """The model a task asks for under meta[choice]: the site's own (FROM_LOCAL) or the one sent; with
        meta[PERSONAL_HEAD] the one sent carries this site's own classifier head once it has one (FedNPR-Per).

        A site asked for its own model before it has one (Solo's first round) starts from the one sent."""
        local_path = os.path.join(state_dir, protocol.LOCAL_MODEL_FILE)
        if task.meta.get(choice) == protocol.FROM_LOCAL and (os.path.exists(local_path) or not task.params):
            return self._load_local(task.meta, state_dir)
        model = load_numpy_state(build_model(task.meta[protocol.MODEL_SPEC]), task.params)
        if task.meta.get(protocol.PERSONAL_HEAD) and os.path.exists(local_path):
            own = load_tensors(local_path)
            model.load_state_dict({k: own[k] for k in head_state_keys(model)}, strict=False)
        return model

    def _train_personal(self, site, meta: dict, sent, state_dir: str, device, seed: int, round_num: int) -> dict:
        """Ditto's personal step (Li et al., ICML 2021, Alg. 1): the site's personal model v_k (the model sent, the
        first time) trained for the same local epochs/steps, with the same optimiser settings and batches, on the
        site's usual loss + (lambda / 2) ||v - w_t||^2, w_t the model sent this round; saved for the next round and
        for evaluation. Reports the personal objective's mean and the step's seconds.

        Round r starts from the newest personal model of a round before r: when a resumed run repeats round r (the
        server died after this site's answer but before its checkpoint), the repeat starts where the first try did,
        so the run matches one that never stopped. For that the site keeps the previous round's model as well."""
        versions = self._personal_versions(site, meta, state_dir)
        personal = next((model for saved_round, model, _ in versions if saved_round < round_num), None)
        personal = copy.deepcopy(sent) if personal is None else personal
        loader = self._loader(site, meta, "training", train=True, seed=seed)
        started = time.time()
        stats = train_personal(personal, sent, loader, self._train_settings(meta), device, self._loss(meta),
                               float(meta[protocol.DITTO_LAMBDA]))
        seconds = time.time() - started
        current = next((saved_round for saved_round, _, name in versions if name == protocol.PERSONAL_MODEL_FILE), None)
        save_round_keeping_previous({"round": round_num, "model": personal.state_dict()},
                                    os.path.join(state_dir, protocol.PERSONAL_MODEL_FILE),
                                    os.path.join(state_dir, protocol.PREVIOUS_PERSONAL_MODEL_FILE), current, round_num)
        return {"personal_train_loss": float(stats["train_loss"]), "personal_train_seconds": seconds}

    def _load_personal(self, site, meta: dict, state_dir: str):
        """This site's newest Ditto personal model, or None before its first personal step."""
        versions = self._personal_versions(site, meta, state_dir)
        return versions[0][1] if versions else None

    def _personal_versions(self, site, meta: dict, state_dir: str) -> list:
        """[(round, model, file name)] of this site's Ditto personal models on disk, newest first (the current file, then the
        previous round's). A file that cannot be read, is of another network or holds NaN/Inf is an error naming
        the site and the file, never silently replaced."""
        versions = []
        for name in (protocol.PERSONAL_MODEL_FILE, protocol.PREVIOUS_PERSONAL_MODEL_FILE):
            path = os.path.join(state_dir, name)
            if not os.path.exists(path):
                continue
            model = build_model(meta[protocol.MODEL_SPEC])
            try:
                saved = load_tensors(path)
            except ValueError as e:
                raise DataError(site, path, f"unreadable Ditto personal model ({e}); delete it to restart this "
                                            f"site's personalisation from the global model") from e
            if not isinstance(saved, dict) or not isinstance(saved.get("round"), int) \
                    or not isinstance(saved.get("model"), dict):
                problem = "not a Ditto personal model ({'round': int, 'model': state dict})"
            else:
                problem = check_site_state(saved["model"], model.state_dict())
            if problem:
                raise DataError(site, path, f"the Ditto personal model does not fit this job's network "
                                            f"{meta[protocol.MODEL_SPEC]}: {problem}; delete it (or use another "
                                            f"run_name) to restart this site's personalisation from the global model")
            model.load_state_dict(saved["model"])
            versions.append((saved["round"], model, name))
        return sorted(versions, key=lambda version: -version[0])

    def _npr_objective(self, site, meta: dict, model, device, seed):
        """FedNPR's local loss (a context, see fairfl.methods.fednpr.npr.fednpr_objective): balanced softmax with this site's
        class prior + weight * NPR (logits normalised as settings["logits"] says) on K prototypes per class from
        the features of the model sent."""
        settings, num_classes = meta[protocol.NPR], meta[protocol.MODEL_SPEC]["num_classes"]
        features, labels = extract_features(model, self._loader(site, meta, "training", train=False, seed=self.seed),
                                            device)
        prototypes, mask = class_prototypes(features, labels, num_classes, k=settings["k"],
                                            epsilon=float(settings["epsilon"]), iterations=settings["iterations"],
                                            seed=seed)
        counts = class_counts([e["label"] for e in self._datalist["training"]], num_classes)
        return fednpr_objective(model, counts, prototypes.to(device), mask.to(device),
                                lam=float(settings["weight"]), temperature=float(settings["temperature"]),
                                npr_form=settings["logits"])

    def _load_local(self, meta: dict, state_dir: str):
        path = os.path.join(state_dir, protocol.LOCAL_MODEL_FILE)
        if not os.path.exists(path):
            raise RuntimeError(f"no local model at {path}: this site has not trained in this run yet")
        model = build_model(meta[protocol.MODEL_SPEC])
        model.load_state_dict(load_tensors(path))
        return model

    @staticmethod
    def _optimizer_settings(meta: dict) -> dict:
        """The server's optimiser settings ({"name", "momentum", "keep_state"}; checked by `_check_task`)."""
        return meta.get(protocol.OPTIMIZER) or {}

    def _train_settings(self, meta: dict) -> TrainSettings:
        chosen = self._optimizer_settings(meta)
        return TrainSettings(lr=self.lr, weight_decay=self.weight_decay, batch_size=self.batch_size,
                             local_epochs=self.local_epochs, local_steps=self.local_steps,
                             optimizer=chosen.get("name", "adam"), momentum=float(chosen.get("momentum", 0.0)))

    def _optimizer(self, site, meta: dict, model, settings: TrainSettings, state_dir: str, round_num: int):
        """A fresh local optimiser for this round or, with keep_state, one carrying the state this site kept after
        round round_num - 1 (the current file, or the previous one when this round is a repeat after a restart).
        Settings are always the job's. No such state (the first round, a new run under an old run_name): fresh. A
        kept file that cannot be read or does not fit is an error naming the site and the file."""
        optimizer = make_optimizer(model, settings)
        if not self._optimizer_settings(meta).get("keep_state"):
            return optimizer
        for name in (protocol.OPTIMIZER_STATE_FILE, protocol.PREVIOUS_OPTIMIZER_STATE_FILE):
            path = os.path.join(state_dir, name)
            saved = self._kept_optimizer_state(site, path)
            if saved is not None and saved.get("round") == round_num - 1:
                problem = load_optimizer_state(optimizer, settings.optimizer, saved)
                if problem:
                    raise DataError(site, path, f"the kept optimiser state cannot be used ({problem}); delete it to "
                                                f"start this site's optimiser afresh")
                return optimizer
        return optimizer

    @staticmethod
    def _kept_optimizer_state(site, path: str):
        """The kept optimiser state in `path` ({"round", "optimizer", "moments"}), None when there is none."""
        if not os.path.exists(path):
            return None
        try:
            saved = load_tensors(path)
        except ValueError as e:
            raise DataError(site, path, f"unreadable kept optimiser state ({e}); delete it to start this site's "
                                        f"optimiser afresh") from e
        if not isinstance(saved, dict) or isinstance(saved.get("round"), bool) or not isinstance(saved.get("round"), int):
            raise DataError(site, path, "not a kept optimiser state ({'round': int, 'optimizer', 'moments'}); delete "
                                        "it to start this site's optimiser afresh")
        return saved

    def _keep_optimizer_state(self, site, optimizer, settings: TrainSettings, state_dir: str, round_num: int):
        """Save the optimiser's state after round `round_num`; the state of an earlier round becomes the previous
        file, so a round repeated after a restart starts from the same state as its first try."""
        path = os.path.join(state_dir, protocol.OPTIMIZER_STATE_FILE)
        current = self._kept_optimizer_state(site, path)
        save_round_keeping_previous(optimizer_state(optimizer, settings.optimizer, round_num), path,
                                    os.path.join(state_dir, protocol.PREVIOUS_OPTIMIZER_STATE_FILE),
                                    None if current is None else current["round"], round_num)

    def _loader(self, site, meta, split, train, seed, max_samples=None, batch_size=None):
        spec = meta[protocol.MODEL_SPEC]
        if self._datalist is None:
            self._datalist = self._load_datalist(site, meta)
        key = (split, train, max_samples, batch_size)
        if key not in self._loaders:
            self._loaders[key] = make_loader(self._datalist[split], image_size=self.image_size,
                                             num_classes=spec["num_classes"], batch_size=batch_size or self.batch_size,
                                             train=train, seed=self.seed, max_samples=max_samples,
                                             in_channels=spec["in_channels"], task=self._task(meta), site=site,
                                             augmentation=self.augmentation)
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
        options = dict(num_classes=num_classes, task=self._task(meta), allow_absolute_paths=own.allow_absolute_paths,
                       optional_splits=(CORRUPTED_SPLIT,) if self._task(meta) == CLASSIFICATION else ())
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
            raise DataError(site, "the server's task", f"data_seed {seed!r} or num_sites {num_sites!r} out of range "
                                                       f"(integers in [0, 2^32 - 1] and [1, {MAX_SITES}])")
        try:
            dataset = builtin_dataset(meta.get(protocol.DATASET, "prostate")).name
            test_scale = check_test_scale(meta.get(protocol.TEST_SCALE, 1.0))
        except ValueError as e:
            raise DataError(site, "the server's task", str(e)) from e
        return str(ensure_builtin(dataset, image_size=self.image_size, seed=seed, num_sites=num_sites,
                                  size_scale=self.synthetic_size_scale, test_scale=test_scale))

    @staticmethod
    def _state_dir(fl_ctx, meta: dict) -> str:
        """This site's state (its local model): in the job's run directory, or for a named run where a
        resubmitted job finds it (protocol.run_state_dir)."""
        workspace = fl_ctx.get_engine().get_workspace()
        if meta.get(protocol.RUN_NAME):  # checked there: a safe name, never a path
            return protocol.run_state_dir(workspace.get_root_dir(), fl_ctx.get_identity_name(), meta[protocol.RUN_NAME])
        return os.path.join(workspace.get_run_dir(fl_ctx.get_job_id()), "fairfl_site")


def with_proximal_term(loss_fn, model, mu: float, reference=None):
    """FedProx (Li et al., MLSys 2020): loss_fn plus NVFlare's proximal term (mu / 2) ||w - w_ref||^2 against a
    frozen copy of `reference`, by default of the model as it is now (as received)."""
    reference = copy.deepcopy(model if reference is None else reference).requires_grad_(False)
    proximal = PTFedProxLoss(mu=mu)
    return lambda logits, target: loss_fn(logits, target) + proximal(model, reference.to(logits.device))


def train_personal(personal, sent, loader, settings: TrainSettings, device, loss_fn, lam: float) -> dict:
    """Ditto's personal objective h_k(v; w_t) = loss_k(v) + (lam / 2) ||v - w_t||^2 (Li et al., ICML 2021, Eq. 2),
    minimised in place on `personal` (v) by the repo's ordinary local loop (fairfl.training.train_local); `sent`
    (w_t) is only read. The proximal term is NVFlare's PTFedProxLoss, the one its PTDittoHelper uses. PTDittoHelper
    itself is not used: its training step (`local_train`) is abstract, it wants a torch `_Loss` criterion and its
    own optimiser, and it saves `personalized_model.pt` / best-metric files in the app folder of the job run,
    where a resumed run (run_name) would not find them; the site's state dir and train_local already do the rest.
    Returns train_local's statistics (train_loss is the mean personal objective)."""
    return train_local(personal, loader, settings, device, loss_fn=with_proximal_term(loss_fn, personal, lam, sent))
