"""Cross-site evaluation (`cross_site_eval`): after the last round, every federation site's own model is scored on
every site's test split, the server's second workflow beside the rounds. Its record is results.json's `cross_site`
(fairfl.results.ResultsLog.cross_site)."""

from __future__ import annotations

from typing import Protocol

from nvflare.apis.fl_constant import ReturnCode
from nvflare.app_common.abstract.fl_model import FLModel

from fairfl.flare import protocol
from fairfl.flare.round_settings import RoundSettings
from fairfl.models import state_to_numpy, state_to_torch
from fairfl.results import site_key
from fairfl.site_checks import check_site_state, distance, norm_outliers, tensor_state


class _Engine(Protocol):
    """What CrossSiteEvaluation uses of the round engine it is mixed into (FairRoundController), its own steps
    included, for the type checker."""

    settings: RoundSettings
    sites: list[str]
    trainers: list[str]
    task_meta: dict
    metric: str
    evaluate: str
    absent: list[str]
    failed: dict[str, str]

    def info(self, msg: str) -> None: ...

    def task_model(self, round_num: int, params: dict, meta: dict) -> FLModel: ...

    def ask(self, round_num, task_name, model: FLModel, targets) -> list: ...

    def _ask_models(self, round_num, task_name, model: FLModel, targets, global_state) -> list: ...

    def _scored_params(self, global_state) -> dict: ...

    def _screen_scores(self, result, with_global: bool) -> tuple: ...

    def reject(self, round_num, site, problem, rejected, what: str = ...) -> None: ...

    def _submitted_models(self, round_num, global_state, reference: dict, rejected) -> dict: ...

    def _bounded_models(self, round_num, states: dict, reference: dict, rejected) -> dict: ...


class CrossSiteEvaluation:
    """The cross-site evaluation of the round engine (a mixin of FairRoundController: it sends tasks as the rounds
    do, `_ask_models` and `ask`, and screens scores as the round's evaluation does, `_screen_scores`)."""

    # the engine's record of the round's sites that did not answer and of the tasks that failed, reset here
    absent: list[str]
    failed: dict[str, str]

    def _cross_site(self: _Engine, round_num, global_state) -> dict:
        """Every federation site returns the model it is scored with (`validate` with SUBMIT_MODEL), screened like a
        trained model (`_submitted_models`); each accepted one is sent to every site, which scores it as it is (as a
        held-out site scores the global model). A site whose own setting keeps its model at home is recorded under
        `declined`. Returns {"matrix": {model's site: {test site: main metric}}, "rejected", "absent", "failed",
        "declined"} (ResultsLog.cross_site)."""
        self.absent, self.failed = [], {}
        rejected: dict[str, str] = {}
        reference = state_to_torch(global_state)  # the whole network, the parts the sites keep included
        models = self._submitted_models(round_num, global_state, reference, rejected)
        # a site whose own setting keeps its model at home (FAIRFL_SHARE_OWN_MODEL) answers TASK_UNSUPPORTED: it
        # declined, it did not fail; it still scores the others' models
        declined = sorted((s for s, rc in self.failed.items() if rc == ReturnCode.TASK_UNSUPPORTED), key=site_key)
        for site in declined:
            del self.failed[site]
            self.info(f"{site} keeps its own model at home (its FAIRFL_SHARE_OWN_MODEL): not cross-evaluated")
        models = self._bounded_models(round_num, models, reference, rejected)
        matrix: dict[str, dict[str, float]] = {}
        for owner in sorted(models, key=site_key):
            meta = {**self.task_meta, protocol.EVALUATE: protocol.FROM_GLOBAL, protocol.HELD_OUT: list(self.sites)}
            sent = self.task_model(round_num, state_to_numpy(models[owner]), meta)
            for result in self.ask(round_num, protocol.TASK_VALIDATE, sent, self.sites):
                site = result.meta.get("client_name", "?")
                metrics, problem = self._screen_scores(result, with_global=False)
                if problem:
                    self.reject(
                        round_num, site, f"scoring {owner}'s model: {problem}", rejected, "cross-site evaluation"
                    )
                else:
                    matrix.setdefault(owner, {})[site] = metrics[self.metric]
        return {
            "matrix": matrix,
            "rejected": rejected,
            "absent": list(self.absent),
            "failed": dict(self.failed),
            "declined": declined,
        }

    def _submitted_models(self: _Engine, round_num, global_state, reference: dict, rejected) -> dict:
        """{site: the model it is scored with, as torch tensors} of every training site whose answer has every tensor
        of `reference`, finite; the others go to `rejected`."""
        meta = {**self.task_meta, protocol.EVALUATE: self.evaluate, protocol.SUBMIT_MODEL: True}
        model = self.task_model(round_num, self._scored_params(global_state), meta)
        states = {}
        for result in self._ask_models(round_num, protocol.TASK_VALIDATE, model, self.trainers, global_state):
            site = result.meta.get("client_name", "?")
            state, problem = tensor_state({} if result.params is None else result.params)
            if state is not None:  # else `problem` says why not
                problem = check_site_state(state, reference)
            if state is None or problem:
                self.reject(round_num, site, f"cross-site model: {problem}", rejected, "cross-site model")
            else:
                states[site] = state
        return states

    def _bounded_models(self: _Engine, round_num, states: dict, reference: dict, rejected) -> dict:
        """`states` without those far further from the global model than the others' (`max_update_ratio`, as an
        update is bounded: 1e30 weights are finite), which are never sent on to the other sites."""
        norms = {s: distance(state, reference) for s, state in states.items()}
        outliers = norm_outliers(norms, self.settings.max_update_ratio)
        for site, problem in outliers.items():
            self.reject(round_num, site, f"cross-site model: {problem}", rejected, "cross-site model")
        return {s: state for s, state in states.items() if s not in outliers}
