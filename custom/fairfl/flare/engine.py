"""Server side of every fairfl job: one round loop, with the aggregation step as the method's hook.

A round: send `train` (the global model, or nothing where the sites train their own) -> screen every answer
(`fairfl.site_checks`: the weights, the training-set size, the update's size against the round's others, the metrics;
a site that fails is rejected for the round, naming the site and the field) -> the method aggregates (its reports
checked by the same functions; no site above `max_share`) -> every `eval_every` rounds and at the end, send
`validate` and record per-site metrics -> results.json, NVFlare's analytics events (TensorBoard, MLflow:
fairfl.tracking), checkpoint. After the last round, `cross_site_eval` scores every site's own model on every site
(fairfl.flare.cross_site). The round's arguments are one RoundSettings (fairfl.flare.round_settings).
Nothing a site sends ends the job: a site whose task fails is recorded under `failed`, and a job that must stop
leaves results.json with `stopped` and why.

The task (segmentation or classification) comes from the dataset; so do the results file's main metric (`dice`;
classification: `auc`, the clean test set's macro one-vs-rest AUC) and the default network (U-Net; small CNN)."""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.aggregation import (
    cap_shares,
    robust_average,
    trim_count,
    weighted_average,
)
from fairfl.arguments import check_all
from fairfl.bundle import bundle_weights, read_bundle
from fairfl.data.builtin import builtin_dataset
from fairfl.files import save_atomic
from fairfl.flare import protocol
from fairfl.flare.analytics import fire_round_summary, fire_site_metrics
from fairfl.flare.checkpoint import Checkpointing
from fairfl.flare.cross_site import CrossSiteEvaluation
from fairfl.flare.fanout import TaskFanOut
from fairfl.flare.round_settings import ROUND_ARGUMENTS, RoundSettings
from fairfl.jobconfig import component_arguments
from fairfl.models import (
    SERVER_MAX_MODEL_PARAMETERS_ENV,
    check_model_spec,
    initial_state,
    server_parameter_limit,
    state_to_numpy,
    state_to_torch,
)
from fairfl.privacy.settings import job_refusal
from fairfl.quorum import quorum
from fairfl.results import GLOBAL_PREFIX, RESULTS_FILE, ResultsLog, site_key
from fairfl.site_checks import (
    DISTANCE_METRICS,
    answer_problem,
    check_site_state,
    distance,
    influence_problem,
    metrics_problem,
    norm_outliers,
    samples_problem,
    tensor_state,
)
from fairfl.updates import weights_from_update

GLOBAL_MODEL_FILE = "global_model.pt"
MAIN_METRIC = {"segmentation": "dice", "classification": "auc"}  # the results file's `metric`, per task


class SiteUpdate(NamedTuple):
    """One site's accepted answer to `train`."""

    state: dict  # its trained model, {name: torch.Tensor}
    num_samples: int  # its training-set size
    meta: dict  # everything else it reported (the method's own fields: `answer_fields`)


class FairRoundController(Checkpointing, CrossSiteEvaluation, TaskFanOut):
    """FedAvg-shaped round loop; subclasses change where training starts and how results are aggregated."""

    default_max_share = 0.5  # `max_share` null
    start_from = protocol.FROM_GLOBAL
    evaluate = protocol.FROM_GLOBAL

    def __init__(self, **arguments):
        """The round's arguments and each method's own, every one declared with its kind, default and meaning in
        fairfl.arguments (ROUND; the method's) and checked there before anything is built, the error naming the
        controller and the argument. The round's become `settings` (RoundSettings, read as self.settings.<name>);
        each of the method's own becomes an attribute of its own name. config() records both. The network they
        describe is counted on torch's meta device and refused above FAIRFL_SERVER_MAX_MODEL_PARAMETERS."""
        checked = check_all(type(self), arguments)
        super().__init__(persistor_id="", task_check_period=checked["task_check_period"])
        self.settings = RoundSettings.resolve(checked, self.default_max_share)
        own = {k: v for k, v in checked.items() if k not in ROUND_ARGUMENTS}
        clash = sorted(name for name in own if hasattr(type(self), name) or name in vars(self))
        if clash:  # an argument named like the engine's own attribute (settings, method, ...) would replace it
            raise ValueError(f"{type(self).__name__}: its arguments {clash} are names of the controller's own")
        vars(self).update(own)
        self.task = self.settings.task
        self.metric = MAIN_METRIC[self.task]
        self.bundle = read_bundle(self.settings.bundle) if self.settings.bundle else None
        problem = check_model_spec(
            self.model_spec(), server_parameter_limit(), f"{SERVER_MAX_MODEL_PARAMETERS_ENV}, the server's"
        )
        if problem:
            raise ValueError(
                f"{type(self).__name__}: the network of model, model_args, model_channels, model_strides, model_norm, "
                f"num_classes, in_channels and spatial_dims, {self.model_spec()}, {problem}"
            )
        if self.settings.exclude_sites and self.start_from == protocol.FROM_LOCAL:
            raise ValueError(
                f"exclude_sites {self.settings.exclude_sites}: {self.method} has no global model to score held-out "
                f"sites with"
            )
        self.declared_samples = {}  # {site: num_samples of its first accepted answer}: it may not grow later
        self.failed = {}  # {site: return code} of the current round's tasks that failed at the site

    @property
    def method(self) -> str:
        """The name results.json records the run under (a registered variant's): a class attribute of a method's
        controller, or a property where its arguments choose the variant; FedAvg's here."""
        return "fedavg"

    # --- the round loop --------------------------------------------------------------------------------
    def run(self):
        """The rounds; whatever ends them early (too few sites, an abort, an error of the server's own) is written to
        results.json under `stopped` before the job ends."""
        try:
            self._run_rounds()
        except Exception as e:
            self._stop(f"the server stopped on an error: {e!r}")
            raise  # NVFlare logs the traceback and ends the job

    def _stop(self, reason: str, round_num=None, seconds: float = 0.0, **extras) -> None:
        """Record in results.json that the run ends early and why (created now if the run had not begun)."""
        if getattr(self, "results", None) is None:
            self.results = self._results_log(getattr(self, "sites", []))
        if round_num is None:
            self.results.data["stopped"] = reason
            self.results.write()
        else:
            self.results.stop(round_num, seconds, reason, **extras)

    def _results_log(self, sites: list) -> ResultsLog:
        """A new results.json of this run in the run folder."""
        return ResultsLog(
            os.path.join(self.get_run_dir(), RESULTS_FILE),
            method=self.method,
            task=self.task,
            metric=self.metric,
            seed=self.settings.seed,
            sites=sites,
            config=self.config(),
            held_out=self.settings.exclude_sites,
        )

    def _run_rounds(self):
        self.results = None
        settings = self.settings = self.settings.with_preset()  # the active preset applies as the run starts
        sites = sorted(self.sample_clients(), key=site_key)
        unknown = sorted(set(settings.exclude_sites) - set(sites))
        if unknown:
            raise ValueError(f"exclude_sites names sites that are not in this run: {unknown}")
        if settings.cross_site_eval and not (self.start_from == protocol.FROM_LOCAL or self.scores_global):
            raise ValueError(
                f"cross_site_eval: {self.method} scores every site with the one global model; there are no sites' own "
                f"models to cross-evaluate"
            )
        self.sites, self.trainers = sites, [s for s in sites if s not in settings.exclude_sites]
        if settings.robust_aggregation == "trimmed_mean" and len(self.trainers) < 3:
            raise ValueError(
                f"robust_aggregation trimmed_mean needs at least 3 training sites to trim anything, this run has "
                f"{len(self.trainers)}: use 'median' or 'none'"
            )
        self.min_responses = quorum(settings.min_clients, len(self.trainers))
        self.absent = []
        self.task_meta = self.common_task_meta(sites)
        problem = job_refusal(self.method, {**self.task_meta, **self.train_meta(0)}) if settings.privacy else None
        if problem:  # DP-SGD asked for where it cannot cover the method's local training or the network
            raise ValueError(problem)
        run_dir = self.get_run_dir()
        self.results = self._results_log(sites)
        global_state = initial_state(self.model_spec(), settings.seed, bundle_weights(self.bundle))
        first_round = 0
        if settings.run_name:
            checkpoint = self._load_checkpoint(self._checkpoint_path())
            if checkpoint:
                global_state, first_round = checkpoint["global_state"], checkpoint["round"] + 1
        self.info(
            f"{self.method}: rounds {first_round}..{settings.num_rounds - 1} on {len(sites)} sites; results -> "
            f"{self.results.path}"
        )
        per_site = None
        for round_num in range(first_round, settings.num_rounds):
            started, self.absent, self.failed = time.time(), [], {}
            updates, rejected, train_metrics = self._train_round(round_num, global_state)
            phases = {"train_task": time.time() - started}  # where the round's time goes (cost benchmark)
            if self.abort_signal.triggered:
                self._stop(f"aborted in round {round_num}")
                return
            required = self.min_responses
            if len(train_metrics) < required:  # too few sites answered: end, never wait forever
                failed = ", ".join(f"{s} ({rc})" for s, rc in sorted(self.failed.items()))
                reason = (
                    f"round {round_num}: {len(train_metrics)} of {len(self.trainers)} sites answered, fewer than "
                    f"min_clients {required}; absent: {', '.join(self.absent) or 'none'}; failed: "
                    f"{failed or 'none'}. The job ends here; the last global model and results are those of "
                    f"round {round_num - 1}"
                )
                self._stop(
                    reason,
                    round_num,
                    time.time() - started,
                    absent=list(self.absent) or None,
                    failed=dict(self.failed) or None,
                    rejected=rejected or None,
                )
                self.system_panic(reason, self.fl_ctx)
                return
            step_started = time.time()
            global_state, extras = self._server_step(round_num, global_state, updates, rejected)
            phases["server_step"] = time.time() - step_started  # aggregation, with any task of the method's own
            last = round_num == settings.num_rounds - 1
            per_site = None
            if (
                last
                or round_num >= settings.num_rounds - settings.average_last
                or (settings.eval_every > 0 and (round_num + 1) % settings.eval_every == 0)
            ):
                evaluation_started = time.time()
                per_site, influence = self._evaluate(round_num, global_state, rejected)
                phases["evaluation"] = time.time() - evaluation_started
            fire_site_metrics(self, round_num, per_site, train_metrics)  # TensorBoard, MLflow
            record = self.results.add_round(
                round_num,
                time.time() - started,
                per_site,
                test_influence=influence if per_site else None,
                train=train_metrics,
                rejected=rejected or None,
                absent=list(self.absent) or None,
                failed=dict(self.failed) or None,
                phases={name: round(seconds, 3) for name, seconds in phases.items()},
                **extras,
            )
            fire_round_summary(self, round_num, record, self.metric)  # the fairness series beside the sites'
            if per_site:
                self.info(
                    f"round {round_num}: mean {self.metric} {record.get('mean', float('nan')):.4f} "
                    f"std {record.get('std', float('nan')):.4f} worst {record.get('worst_site')}"
                )
            if self.start_from == protocol.FROM_GLOBAL:
                save_atomic(state_to_torch(global_state), os.path.join(run_dir, GLOBAL_MODEL_FILE))
            self._save_method_state(run_dir, round_num)
            if settings.run_name:
                self._save_checkpoint(self._checkpoint_path(), round_num, global_state)
        if per_site:
            mean_of_last = (
                self.results.mean_of_last(settings.num_rounds - 1, settings.average_last)
                if settings.average_last > 1
                else None
            )
            final = self.results.finish(
                per_site, mean_of_last=mean_of_last, test_influence=influence or None, **self.final_extras()
            )
            if settings.cross_site_eval:
                self.results.cross_site(
                    settings.num_rounds - 1, **self._cross_site(settings.num_rounds - 1, global_state)
                )
            if settings.run_name:  # with the final record: submitting the finished run again changes nothing
                self._save_checkpoint(self._checkpoint_path(), settings.num_rounds - 1, global_state)
            self.info(
                f"final: mean {self.metric} {final.get('mean', float('nan')):.4f} "
                f"std {final.get('std', float('nan')):.4f}; results: {self.results.path}"
            )
        elif first_round < settings.num_rounds:  # every site's last evaluation failed or was rejected
            self._stop(
                f"round {settings.num_rounds - 1}: no site's evaluation could be used (see the round's rejected, "
                f"failed and absent); there are no final results"
            )

    def _train_round(self, round_num, global_state):
        send_global = self.start_from == protocol.FROM_GLOBAL or round_num == 0
        meta = {
            **self.task_meta,
            protocol.START_FROM: self.start_from,
            protocol.SEND_PARAMS: self.start_from == protocol.FROM_GLOBAL,
            **self.train_meta(round_num),
        }
        results = self._ask_models(
            round_num,
            protocol.TASK_TRAIN,
            self.task_model(round_num, global_state if send_global else {}, meta),
            self.trainers,
            global_state,
        )
        updates, rejected, train_metrics = {}, {}, {}
        reference = self.update_reference(global_state)
        # per-site models: each site's own start, what its difference is from and its update's size is measured from
        own = self.models_for(round_num, global_state, self.trainers) or {}
        starts = {s: self.update_reference(model) for s, model in own.items()}
        for result in sorted(results, key=lambda r: r.meta.get("client_name", "?")):
            site = result.meta.get("client_name", "?")
            base = starts.get(site, reference)
            update, train_metrics[site], problem = self._screen_train_answer(site, result, base, round_num)
            if problem:
                self.reject(round_num, site, problem, rejected)
            elif update is not None:
                updates[site] = update
        norms = {s: distance(u.state, starts.get(s, reference)) for s, u in updates.items()}
        for site, problem in norm_outliers(norms, self.settings.max_update_ratio).items():
            del updates[site]
            self.reject(round_num, site, problem, rejected)
        return updates, rejected, train_metrics

    def _server_step(self, round_num, global_state, updates, rejected) -> tuple:
        """(the round's new global model, the method's fields of the round's record): the method's aggregation of the
        accepted `updates` (`aggregate_round`), or the global model unchanged when there is none to aggregate."""
        if not updates and self.start_from != protocol.FROM_LOCAL:
            self.error(f"round {round_num}: no acceptable site result; the global model is kept unchanged")
            return global_state, {}
        new_state, extras = self.aggregate_round(round_num, global_state, updates, rejected)
        extras.update(self._robust_record(len(updates)))
        return self._usable_aggregate(round_num, new_state, global_state, extras), extras

    def _screen_train_answer(self, site, result, reference, round_num) -> tuple:
        """(SiteUpdate or None, the metrics to record, why the answer is rejected or None): the metrics, then the
        weights (`check_site_state`), the training-set size (`samples_problem`) and every field the method reads
        (`answer_fields`). Where the sites train their own models (FROM_LOCAL) no weights are sent, nor read."""
        metrics = {} if result.metrics is None else result.metrics
        problem = metrics_problem(metrics)
        if problem:
            return None, {}, problem
        metrics = {name: float(v) for name, v in metrics.items()}
        if self.start_from == protocol.FROM_LOCAL:
            return None, metrics, None  # the sites' own models: weights never leave the site
        state, problem = tensor_state({} if result.params is None else result.params)
        if state is not None and result.params_type == ParamsType.DIFF:  # what sites send (fairfl.updates)
            state, problem = weights_from_update(state, reference)
        if state is None:  # not a mapping of tensors: `problem` says why
            return None, metrics, problem
        num_samples = result.meta.get(protocol.NUM_SAMPLES)
        problem = (
            check_site_state(state, reference)
            or samples_problem(num_samples, self.declared_samples.get(site), self.settings.max_samples)
            or self.answer_problem(protocol.TASK_TRAIN, round_num, result.meta)
        )
        if problem:
            return None, metrics, problem
        self.declared_samples.setdefault(site, int(num_samples))
        return SiteUpdate(state, int(num_samples), dict(result.meta)), metrics, None

    def update_reference(self, global_state) -> dict:
        """The tensors every site must return, as torch tensors: the global model's without the parts the sites keep
        to themselves (`local_keys`)."""
        local = set(self.local_keys())
        return {k: v for k, v in state_to_torch(global_state).items() if k not in local}

    def aggregate_round(self, round_num, global_state, updates, rejected):
        """The method's `aggregate`, with the parts the sites keep to themselves (`local_keys`) left as they were in
        the global model: they are never averaged."""
        new_state, extras = self.aggregate(round_num, global_state, updates, rejected)
        return {**new_state, **{k: global_state[k] for k in self.local_keys()}}, extras

    def local_keys(self) -> list:
        """State keys of the parts every site keeps to itself, never sent nor averaged (a classifier head, the
        normalisation layers: fairfl.methods.local_parts); none by default."""
        return []

    def reject(self, round_num, site, problem, rejected, what="update") -> None:
        """Leave `site` out of this round for `problem`: logged and recorded under the round's `rejected`."""
        rejected[site] = f"{rejected[site]}; {problem}" if site in rejected else problem
        self.error(f"round {round_num}: rejected the {what} of {site}: {problem}")

    @property
    def scores_global(self) -> bool:
        """Whether the federation's sites are scored with a model of their own rather than the global model there is
        (one a method keeps at the site beside it, FROM_PERSONAL; the one it trained in the round, FROM_LOCAL; or the
        global model with parts of their own, `local_keys`): then each also scores the global model it receives, as
        it is, in the same task (its metrics prefixed GLOBAL_PREFIX)."""
        return self.start_from == protocol.FROM_GLOBAL and (
            self.evaluate != protocol.FROM_GLOBAL or bool(self.local_keys())
        )

    def _usable_aggregate(self, round_num, new_state, global_state, extras: dict):
        """`new_state`, or `global_state` when the aggregate is not the network or not finite (the last line of
        defence: every answer was screened, but a method's arithmetic could still overflow): then the round's
        `global_model_kept` says why."""
        problem = check_site_state(state_to_torch(new_state), state_to_torch(global_state))
        if not problem:
            return new_state
        self.error(f"round {round_num}: the aggregate is unusable ({problem}); the global model is kept")
        extras["global_model_kept"] = problem
        return global_state

    def _robust_record(self, num_updates: int) -> dict:
        """The round's `robust` field with `robust_aggregation`: the statistic and over how many sites; a trimmed mean
        also says how many values it dropped at each end (0 with fewer than 3 sites: then it is the plain mean)."""
        if self.settings.robust_aggregation == "none" or not num_updates:
            return {}
        record = {"mode": self.settings.robust_aggregation, "sites": num_updates}
        if self.settings.robust_aggregation == "trimmed_mean":
            record["trimmed_per_side"] = trim_count(num_updates, self.settings.trim_fraction)
        return {"robust": record}

    def _evaluate(self, round_num, global_state, rejected) -> tuple[dict, dict]:
        """({site: metrics}, {site: its test patients' influence on them}) of the usable answers; the rest rejected."""
        meta = {**self.task_meta, protocol.EVALUATE: self.evaluate}
        if self.scores_global:
            meta[protocol.SCORE_GLOBAL] = True
        if self.settings.exclude_sites:
            meta[protocol.HELD_OUT] = list(self.settings.exclude_sites)
        results = self._ask_models(
            round_num,
            protocol.TASK_VALIDATE,
            self.task_model(round_num, self._scored_params(global_state), meta),
            self.sites,
            global_state,
        )
        per_site, influence = {}, {}
        for result in results:
            site = result.meta.get("client_name", "?")
            asked = self.scores_global and site not in self.settings.exclude_sites
            metrics, problem = self._screen_scores(result, asked)
            site_influence = result.meta.get(protocol.TEST_INFLUENCE)
            problem = problem or (site_influence is not None and influence_problem(site_influence, metrics))
            if problem:
                self.reject(round_num, site, f"evaluation: {problem}", rejected, "evaluation")
                continue
            per_site[site] = metrics
            if site_influence:
                influence[site] = site_influence
        return per_site, influence

    def _scored_params(self, global_state) -> dict:
        """What a validate task sends: the global model, or nothing where there is none (start_from FROM_LOCAL)."""
        return global_state if self.start_from == protocol.FROM_GLOBAL else {}

    def _screen_scores(self, result, with_global: bool) -> tuple:
        """(the answer's metrics as floats, None) or (None, why they cannot be recorded): every evaluation metric is a
        score in [0, 1] but a distance in mm (a volume's HD95: in [0, MAX_REPORTED]) and the main one must be there;
        the global model's scores (GLOBAL_PREFIX) are kept only `with_global`, and then the main one of them must be
        there too."""
        metrics = {} if result.metrics is None else result.metrics
        problem = metrics_problem(metrics, 0.0, 1.0, distances=DISTANCE_METRICS)
        if problem:
            return None, problem
        metrics = {k: float(v) for k, v in metrics.items() if with_global or not k.startswith(GLOBAL_PREFIX)}
        required = [self.metric, GLOBAL_PREFIX + self.metric] if with_global else [self.metric]
        missing = [m for m in required if m not in metrics]
        return (None, f"no {missing[0]}") if missing else (metrics, None)

    def task_model(self, round_num, params: dict, meta: dict) -> FLModel:
        """What a task of round `round_num` sends: the full `params` ({} for none) and `meta`."""
        return FLModel(
            params_type=ParamsType.FULL,
            params=params,
            current_round=round_num,
            total_rounds=self.settings.num_rounds,
            meta=meta,
        )

    def _ask_models(self, round_num, task_name, model: FLModel, targets, global_state) -> list:
        """`ask` with `model` for every target, or, when the method keeps a model per site (`models_for`), `ask_each`
        with `model`'s task carrying each site's own parameters."""
        own = self.models_for(round_num, global_state, targets)
        if own is None:
            return self.ask(round_num, task_name, model, targets)
        return self.ask_each(
            round_num,
            task_name,
            {
                s: FLModel(
                    params_type=model.params_type,
                    params=own[s],
                    current_round=model.current_round,
                    total_rounds=model.total_rounds,
                    meta=model.meta,
                )
                for s in targets
            },
        )

    # --- the method's hook -------------------------------------------------------------------------------
    def aggregate(self, round_num, global_state, updates, rejected):
        """Return (new global state as numpy arrays, extra fields for the round's results record)."""
        weights = self.site_weights({s: updates[s].num_samples for s in sorted(updates)})
        return self.average_updates(updates, weights), {"weights": weights}

    def average_updates(self, updates: dict, weights: dict) -> dict:
        """The sites' models averaged with `weights` (or by `robust_aggregation`), as numpy arrays."""
        sites = sorted(weights)
        states = [updates[s].state for s in sites]
        if self.settings.robust_aggregation != "none":
            return state_to_numpy(robust_average(states, self.settings.robust_aggregation, self.settings.trim_fraction))
        return state_to_numpy(weighted_average(states, [weights[s] for s in sites]))

    def bounded(self, weights: dict) -> dict:
        """`weights` with no site above `max_share` of their total (fairfl.aggregation.cap_shares)."""
        return cap_shares(weights, self.settings.max_share)

    def answer_fields(self, task_name: str, round_num: int) -> dict:
        """{meta key: a kind of fairfl.kinds, Real or Record} of every field the method's server reads from a site's
        answer to `task_name` in round `round_num` (a report of the site's, a score it measured for the method).
        The round loop checks them all before the method sees an answer (`answer_problem`): a site whose field is
        missing or unusable is rejected for the round, naming the field. None by default."""
        return {}

    def answer_problem(self, task_name: str, round_num: int, meta) -> str | None:
        """Why an answer's `meta` cannot be used by the method (a field of `answer_fields` missing or unusable)."""
        return answer_problem(self.answer_fields(task_name, round_num), meta)

    def site_weights(self, num_samples: dict) -> dict:
        if self.settings.weighting == "uniform":
            return {s: 1.0 / len(num_samples) for s in num_samples}
        total = sum(num_samples.values())
        return self.bounded({s: n / total for s, n in num_samples.items()})

    def train_meta(self, round_num) -> dict:
        """Extra meta of the round's `train` task (what the method asks the sites to do or measure this round)."""
        return {}

    def models_for(self, round_num, global_state, sites) -> dict | None:
        """{site: the parameters to send it} when the server keeps a model per site; None: send the global model to
        all."""
        return None

    def site_meta(self) -> dict:
        """Extra meta of every task (the method's settings the sites need in every task)."""
        return {}

    def final_extras(self) -> dict:
        """Extra fields of the results file's `final` record (what the method estimated over the run)."""
        return {}

    # --- the resume contract: what the method's server carries from one round to the next --------------------
    def method_state(self) -> dict | None:
        """Everything, JSON-safe, that the method's server carries from one round to the next (weights, reputations,
        accumulated contributions, a moving average, the sites it removed), or None when it carries nothing.

        The contract: a fresh controller of the same arguments, given this (`load_method_state`) and
        `method_tensors` (`load_method_tensors`) from a round's checkpoint, continues exactly as the controller that
        never stopped: the same next global model and weights. So whatever an aggregation reads that an earlier round
        wrote is here or in `method_tensors`; only what the settings alone determine (the network's key lists) may be
        left out. tests/core/test_checkpoint_contract.py holds every registered method variant to it. Saved to
        method_state.json after every round and into a named run's checkpoint (fairfl.flare.checkpoint)."""
        return None

    def method_tensors(self) -> dict | None:
        """The tensors of that state (models the server keeps per site), {name: tensor or a dict of them}: in a named
        run's checkpoint, not in method_state.json; None when there are none."""
        return None

    def load_method_state(self, state: dict) -> None:
        """Restore what `method_state` returned: a method with state overrides the two together."""
        raise NotImplementedError(f"{type(self).__name__} has no method state to restore")

    def load_method_tensors(self, tensors: dict) -> None:
        """Restore what `method_tensors` returned: a method with tensors overrides the two together."""
        raise NotImplementedError(f"{type(self).__name__} has no method tensors to restore")

    # --- plumbing ----------------------------------------------------------------------------------------
    def common_task_meta(self, sites: list[str]) -> dict:
        """What every task of the run tells every site: the model, the data (built-in: which, its seed, sites and
        test scale), the local optimiser, the run's name and the method's own settings (`site_meta`)."""
        settings = self.settings
        meta = {
            protocol.MODEL_SPEC: self.model_spec(),
            protocol.DATASET: settings.dataset,
            protocol.TASK: self.task,
            protocol.NUM_SITES: max(builtin_dataset(settings.dataset).min_sites, len(sites)),
            protocol.DATA_SEED: settings.data_seed,
            protocol.TEST_SCALE: settings.test_scale,
            protocol.OPTIMIZER: settings.optimizer,
        }
        if settings.run_name:
            meta[protocol.RUN_NAME] = settings.run_name
        if settings.privacy:
            meta[protocol.PRIVACY] = settings.privacy
        if self.bundle is not None and self.bundle.preprocessing:
            meta[protocol.PREPROCESSING] = self.bundle.preprocessing
        return {**meta, **self.site_meta()}

    def model_spec(self) -> dict:
        """The network of the settings, as fairfl.models.build_model takes it (and every task sends it): the
        bundle's, as it defines it, or the settings' (`RoundSettings.model_spec`)."""
        return dict(self.bundle.network) if self.bundle is not None else self.settings.model_spec()

    def config(self) -> dict:
        """The run's settings as results.json records them and a resumed run must match: every constructor argument
        of the controller under its own name (the round's as `settings` resolved them, the method's own as its
        attributes hold them), the task and the preset environment; not how often the server polls for answers,
        which changes no result."""
        arguments = [k for k in component_arguments(type(self)) if k != "task_check_period"]
        return {
            "controller": type(self).__name__,
            **{k: getattr(self.settings if k in ROUND_ARGUMENTS else self, k) for k in arguments},
            "task": self.task,
            "preset_env": os.environ.get("FAIRFL_PRESET", ""),
        }
