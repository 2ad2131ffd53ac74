"""Sending a task to the sites and waiting for their answers: the one place that touches NVFlare's private task
fields (`_current_failed_clients`, `_current_num_targets`, `_current_min_responses`, `_task_check_period` of
ModelController), so an NVFlare upgrade that changes them breaks here, under tests/core/test_site_checks.py, and nowhere
else.

The rules: a task waits until every target has answered, or `straggler_timeout` seconds after `min_responses` have,
or `task_timeout`; a site that did not answer is recorded `absent` for the round, a site whose task failed is
recorded under `failed` with its return code; neither ends the job here."""

from __future__ import annotations

import time

from nvflare.apis.fl_constant import ReturnCode
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.workflows.model_controller import ModelController


class TaskFanOut(ModelController):
    """ModelController with fairfl's waiting rules: `task_timeout` and `straggler_timeout` of the engine's
    `settings` (fairfl.flare.round_settings); the round engine sets `min_responses` and resets the round's `absent`
    list and `failed` dict."""

    def _accept_train_result(self, client_name, result, fl_ctx, is_unknown_task=False) -> bool:
        """NVFlare's hook for every answer's return code (train, validate, a method's own task): a site whose task
        failed (an exception, bad task data) is recorded under `failed` with its return code and never ends the job
        here; the round decides whether enough sites are left."""
        rc = result.get_return_code()
        if is_unknown_task or not rc or rc == ReturnCode.OK:
            return super()._accept_train_result(client_name, result, fl_ctx, is_unknown_task)
        self.fl_ctx = fl_ctx
        self.failed[client_name] = str(rc)
        self._current_failed_clients.add(client_name)  # counts as answered (ask_each)
        self.error(f"{client_name} failed its task: return code {rc}; left out of this round")
        return False

    def ask(self, round_num, task_name, model: FLModel, targets) -> list:
        """Send a task to `targets` and return the answers received when all have answered, or `straggler_timeout`
        seconds after `min_clients` of them have, or after `task_timeout`, whichever comes first. Sites that did
        not answer are added to the round's `absent` list. (NVFlare's `send_model_and_wait` would end the task
        the moment `min_clients` have answered, dropping a slow but healthy site every round.)"""
        results = self.broadcast_model(
            data=model,
            task_name=task_name,
            targets=list(targets),
            min_responses=min(self.min_responses, len(targets)),
            timeout=self.settings.task_timeout,
            wait_time_after_min_received=self.settings.straggler_timeout,
        )
        self._record_absent(round_num, task_name, targets, results)
        return results

    def _record_absent(self, round_num, task_name, targets, results):
        answered = {r.meta.get("client_name") for r in results} | set(self.failed)
        for site in targets:
            if site not in answered and site not in self.absent:
                self.absent.append(site)
                self.error(
                    f"round {round_num}: no {task_name} answer from {site} within straggler_timeout "
                    f"{self.settings.straggler_timeout} s of min_clients answers or task_timeout "
                    f"{self.settings.task_timeout} s "
                    f"(crashed, disconnected or too slow); absent this round"
                )

    def ask_each(self, round_num, task_name, models: dict) -> list:
        """`ask` with its own task for every site, {site: FLModel} (a method that keeps a model per site), with the
        same waiting rules: all answered, or `straggler_timeout` after `min_clients` have, or `task_timeout`; the
        sites that did not answer are recorded `absent` and their tasks cancelled."""
        targets = list(models)
        answers: list[FLModel] = []
        for site in targets:  # non-blocking: every site works at once
            self.broadcast_model(
                data=models[site],
                task_name=task_name,
                targets=[site],
                min_responses=1,
                timeout=self.settings.task_timeout,
                blocking=False,
                callback=answers.append,
            )
        # an error is judged against the whole task, as for one broadcast (NVFlare's dynamic ignore_result_error)
        required = min(self.min_responses, len(targets))
        self._current_num_targets, self._current_min_responses = len(targets), required
        self._current_failed_clients: set[str] = set()
        started, enough_at = time.time(), None
        while not self.abort_signal.triggered:
            # a site whose task failed is done too (NVFlare counts it in _current_failed_clients when it may be ignored)
            answered = len({r.meta.get("client_name") for r in answers} | self._current_failed_clients)
            if answered >= len(targets) or time.time() - started > self.settings.task_timeout:
                break
            if answered >= required:
                enough_at = enough_at or time.time()
                if time.time() - enough_at > self.settings.straggler_timeout:
                    break
            time.sleep(self._task_check_period)
        results = list(answers)
        if len(results) < len(targets):
            self.cancel_all_tasks()  # the only tasks standing are this call's
        self._record_absent(round_num, task_name, targets, results)
        return results
