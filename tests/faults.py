"""A faulty site for integration tests: a FLARE task-result filter that corrupts one site's answers.

It runs inside the real client process, after the executor, exactly where a buggy or malicious site would
send bad numbers. Only used by tests (put on PYTHONPATH by them)."""

import json
import os
import time

import numpy as np
from nvflare.apis.filter import Filter
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import make_reply
from nvflare.app_common.utils.fl_model_utils import FLModelUtils


class CorruptResult(Filter):
    def __init__(self, site: str, mode: str = "nan", round: int = 1, rounds=None, release: str = ""):
        """mode: "nan" puts NaN in every float tensor; "shape" drops a tensor's last row; "cka" reports CKA 7;
        "loo" reports a NaN leave-one-out error (FedCE); "sharpness" a NaN sharpness (FedISM+); "crash" ends the
        site's process after it trained in round `round`, before it answers (a site that dies mid-round);
        "string_metric" turns every metric of every answer (train and validate) into a string; "huge_samples" claims
        10**18 training samples; "huge_update" adds 1000 to every float weight (a finite, huge update); "lr" reports
        a learning rate 10 times its own (q-FedAvg's L = 1 / lr); "out_of_range" makes every metric of an evaluation
        7.0 (a score outside [0, 1]); "path_metric" adds metrics named `../x` and `a/../../b`. Faults of a site that
        comes back, waiting on events, never on the clock: "fail"
        answers the train tasks of `rounds` (all when null) with an execution error, as a site whose training raised;
        "stall" holds its answer to the train task of round `round` until the server's results file `release` records
        that round (the server has gone on without it), then sends it, late."""
        super().__init__()
        self.site, self.mode, self.round, self.rounds, self.release = site, mode, round, rounds, release
        self.train_results = 0  # train answers this process has sent

    def process(self, shareable, fl_ctx):
        if fl_ctx.get_identity_name() != self.site:
            return shareable
        if self.mode in ("fail", "stall"):
            train_round, self.train_results = self.train_results, self.train_results + 1
            if self.mode == "fail" and (self.rounds is None or train_round in self.rounds):
                return make_reply(ReturnCode.EXECUTION_EXCEPTION)
            if self.mode == "stall" and train_round == self.round:
                wait_for_round(self.release, train_round)
            return shareable
        model = FLModelUtils.from_shareable(shareable)
        if self.mode == "crash":
            if model.params:
                self.train_results += 1
                if self.train_results == self.round + 1:
                    os._exit(1)
            return shareable
        if self.mode == "path_metric" and model.metrics:  # names MLflow refuses as paths
            set_metrics(model, {**model.metrics, "../x": 0.5, "a/../../b": 0.5})
        elif self.mode == "string_metric" and model.metrics:
            set_metrics(model, {name: f"{value}; DROP TABLE results" for name, value in model.metrics.items()})
        elif self.mode == "huge_samples" and model.params:
            model.meta["num_samples"] = 10**18
        elif self.mode == "out_of_range" and model.metrics and not model.params:
            set_metrics(model, {name: 7.0 for name in model.metrics})
        elif self.mode == "lr" and model.params:
            model.meta["lr"] = model.meta["lr"] * 10
        elif self.mode == "cka" and "cka" in (model.meta or {}):
            model.meta["cka"] = {name: 7.0 for name in model.meta["cka"]}
        elif self.mode == "loo":
            if "loo_error" not in (model.meta or {}):
                return shareable
            model.meta["loo_error"] = float("nan")
        elif self.mode == "sharpness":
            if "sharpness" not in (model.meta or {}):
                return shareable
            model.meta["sharpness"] = {**model.meta["sharpness"], "sharpness": float("nan")}
        elif model.params:
            for i, name in enumerate(sorted(model.params)):
                value = np.asarray(model.params[name])
                if self.mode == "nan" and value.dtype.kind == "f":
                    model.params[name] = np.full_like(value, np.nan)
                elif self.mode == "shape" and i == 0:
                    model.params[name] = value[:-1]
                elif self.mode == "huge_update" and value.dtype.kind == "f":
                    model.params[name] = value + 1000.0
        else:
            return shareable
        return FLModelUtils.to_shareable(model)


def set_metrics(model, metrics):
    model.metrics = metrics
    if "initial_metrics" in (model.meta or {}):  # where NVFlare's result carries its metrics too (it wins)
        model.meta["initial_metrics"] = metrics


def wait_for_round(results_path: str, round_num: int, limit: float = 300.0) -> None:
    """Block until the results file records round `round_num` (written atomically by the server), or `limit` s."""
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            with open(results_path) as f:
                if any(r.get("round") == round_num for r in json.load(f).get("rounds", [])):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
