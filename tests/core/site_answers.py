"""Site answers for the server-side tests of hostile sites (test_site_checks.py, test_method_answer_checks.py,
test_site_check_functions.py, test_round_loop_records.py): honest answers of four sites, one of them changed, and a
controller whose real `_train_round` gets them with the sending replaced."""

import numpy as np
import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController

SEG = {"model_channels": [4, 8], "model_strides": [2], "num_rounds": 3}
SITES = ["site-1", "site-2", "site-3", "site-4"]


def honest_params(global_state, i, scale=0.01):
    generator = torch.Generator().manual_seed(100 + i)
    return {
        k: (
            v + scale * torch.randn(v.shape, generator=generator).numpy().astype(v.dtype)
            if v.dtype.kind == "f"
            else v.copy()
        )
        for k, v in global_state.items()
    }


def answer(site, params, num_samples=20, metrics=None, **meta):
    return FLModel(
        params_type=ParamsType.FULL,
        params=params,
        metrics={"train_loss": 0.5} if metrics is None else metrics,
        meta={"client_name": site, protocol.NUM_SAMPLES: num_samples, protocol.LR: 1e-3, **meta},
    )


def make(cls=FairRoundController, tmp_path=None, **kwargs):
    controller = cls(**{**SEG, **kwargs})
    controller.trainers = controller.sites = list(SITES)
    controller.min_responses = len(SITES)
    controller.absent, controller.task_meta = [], {}
    if tmp_path is not None:
        controller.get_run_dir = lambda: str(tmp_path)
    return controller


def train_round(controller, global_state, answers, round_num=0):
    """The controller's real `_train_round` on these answers (the sending replaced)."""
    controller._ask_models = lambda *args, **kwargs: list(answers)
    return controller._train_round(round_num, global_state)


def honest_answers(global_state, **meta):
    return [answer(s, honest_params(global_state, i), num_samples=20 + i, **meta) for i, s in enumerate(SITES)]


def hostile(global_state, site_index, **change):
    """Honest answers, one of which (SITES[site_index]) is changed by `change` (params, num_samples, metrics, meta)."""
    answers = honest_answers(global_state)
    bad = answers[site_index]
    for field, value in change.items():
        if field in ("params", "metrics"):
            setattr(bad, field, value(bad.params) if callable(value) else value)
        elif field == "num_samples":
            bad.meta[protocol.NUM_SAMPLES] = value
        else:
            bad.meta[field] = value
    return answers


def huge_update(params):
    return {k: (v + 1e3 * np.ones_like(v) if v.dtype.kind == "f" else v) for k, v in params.items()}
