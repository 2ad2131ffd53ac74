"""FedCE's client side: the leave-one-out error of the model sent, measured before training overwrites the site's
previous local model (w_i in w^-i below)."""

from __future__ import annotations

import os

from nvflare.app_opt.pt.fedce import PTFedCEHelper

from fairfl.flare import protocol
from fairfl.kinds import MappingOf, Real
from fairfl.methods.fedce.contribution import leave_one_out_error
from fairfl.methods.fedce.protocol import LOO_ERROR, LOO_WEIGHTS
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.models import build_model, load_numpy_state

FULL_WEIGHT = 1.0 - 1e-6  # a site with this share of the global model is all of it: nothing is left without it


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


class LeaveOneOutError(ClientStep):
    """Replies LOO_ERROR: 1 - Dice (classification: 1 - balanced accuracy) of the leave-one-out model on the
    validation split; None when it cannot be built (the server then leaves this site out of the round). Its seconds
    are probe_seconds."""

    fields = {LOO_WEIGHTS: MappingOf(Real(0.0, 1.0), "site names")}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return LOO_WEIGHTS in meta

    def before_start(self, ctx: StepContext) -> None:
        with ctx.timed("probe_seconds"):
            ctx.reply[LOO_ERROR] = self.error(ctx)

    @staticmethod
    def error(ctx: StepContext):
        weight = float(ctx.meta[LOO_WEIGHTS].get(ctx.site, 0.0))
        if weight >= FULL_WEIGHT:
            return 1.0  # without this site there is no global model at all: the largest possible error
        previous = ctx.own_model() if weight > 0.0 else {}  # the local model the global one was averaged from
        if previous is None:
            path = os.path.join(ctx.state_dir, protocol.LOCAL_MODEL_FILE)
            ctx.log_error(
                f"[{ctx.site}] FedCE: my share of the global model is {weight:.4f} but my previous local "
                f"model {path} is gone; cannot build the leave-one-out model this round"
            )
            return None
        model = leave_one_out_model(ctx.meta[protocol.MODEL_SPEC], ctx.params, previous, weight)
        score = ctx.validation_score(model)
        return None if score is None else leave_one_out_error(score)
