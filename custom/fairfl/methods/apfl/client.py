"""APFL's client side (Deng, Kamani and Mahdavi, 2020): the `train` task trains the model sent as FedAvg does and,
step by step beside it, the site's personal model v and mixing weight alpha on the loss of alpha v + (1 - alpha) w
(fairfl.methods.apfl.mixing), both kept in the site's state dir; `validate` scores that mix with the model sent."""

from __future__ import annotations

import copy
import os

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_state import keep_version, kept_model_versions, newest_before
from fairfl.methods.apfl.arguments import ALPHA_INIT, ALPHA_LR
from fairfl.methods.apfl.mixing import check_alpha, mixed_state, train_apfl
from fairfl.methods.apfl.protocol import APFL_ALPHA_INIT, APFL_ALPHA_LR, PERSONAL_MODEL_FILES
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.models import build_model, meta_state


def kept_personal(ctx: StepContext) -> list:
    """[(round, {"round", "model", "alpha"}, file name)] of this site's APFL personal models on disk, newest first
    (the current file, then the previous round's; fairfl.flare.site_state). A file that cannot be read, is of another
    network, holds NaN/Inf or an alpha outside [0, 1] is an error naming the site and the file, never replaced."""
    remedy = "delete it (or use another run_name) to restart this site's personalisation from the global model"
    reference = meta_state(ctx.meta[protocol.MODEL_SPEC])
    versions = kept_model_versions(
        ctx.site, ctx.state_dir, PERSONAL_MODEL_FILES, "APFL personal model", remedy, reference
    )
    for _, saved, name in versions:
        try:
            check_alpha(saved.get("alpha"))
        except ValueError as e:
            path = os.path.join(ctx.state_dir, name)
            raise DataError(ctx.site, path, f"the APFL personal model's {e}; {remedy}") from e
    return versions


def network(ctx: StepContext, state: dict):
    """The job's network with `state`."""
    model = build_model(ctx.meta[protocol.MODEL_SPEC])
    model.load_state_dict(state)
    return model


class MixedTraining(ClientStep):
    """`train` with meta[APFL_ALPHA_INIT]: a training loop of its own (fairfl.methods.apfl.mixing.train_apfl), which
    trains the model sent with the site's loss and optimiser exactly as FedAvg's loop does (that is what goes back),
    and per step v and alpha on the mixed model's loss (the site's usual loss). v and alpha start from the newest
    version kept from a round before this one (a repeated round starts where its first try did), the first time from
    the model sent and meta[APFL_ALPHA_INIT]; alpha steps at meta[APFL_ALPHA_LR], without it at the site's lr.
    Reports apfl_alpha (alpha after the round) and personal_train_loss (the mixed model's mean loss); train_seconds
    covers both models."""

    fields = {APFL_ALPHA_INIT: ALPHA_INIT, APFL_ALPHA_LR: ALPHA_LR}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return APFL_ALPHA_INIT in meta  # its own loop runs in `train` tasks only

    def train(self, ctx: StepContext, model, loader, settings, loss_fn, optimizer) -> dict:
        versions = kept_personal(ctx)
        saved = newest_before(versions, ctx.round)
        if saved is None:
            personal, alpha = copy.deepcopy(model), float(ctx.meta[APFL_ALPHA_INIT])
        else:
            personal, alpha = network(ctx, saved["model"]), float(saved["alpha"])
        lr = ctx.meta.get(APFL_ALPHA_LR)
        stats = train_apfl(
            model,
            personal,
            alpha,
            loader,
            settings,
            ctx.device,
            loss_fn,
            ctx.base_loss(),
            optimizer=optimizer,
            alpha_lr=None if lr is None else float(lr),
            amp=ctx.amp,
        )
        kept = {"round": ctx.round, "model": personal.state_dict(), "alpha": stats["alpha"]}
        keep_version(kept, ctx.state_dir, PERSONAL_MODEL_FILES, versions)
        ctx.metrics["apfl_alpha"] = stats["alpha"]
        ctx.metrics["personal_train_loss"] = stats["mixed_loss"]
        return stats


class MixedEvaluation(ClientStep):
    """`validate` with meta[APFL_ALPHA_INIT] and EVALUATE FROM_PERSONAL: the site is scored with alpha v + (1 - alpha)
    w, its newest personal model v and alpha mixed with the model sent w (metrics apfl_alpha, personal_model 1.0);
    before its first round with the model sent (personal_model 0.0, apfl_alpha the one it would start from: v starts
    as w, so every mix is w). Runs before Ditto's PersonalEvaluation, which it replaces."""

    fields = {APFL_ALPHA_INIT: ALPHA_INIT}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return APFL_ALPHA_INIT in meta and meta.get(protocol.EVALUATE) == protocol.FROM_PERSONAL

    def evaluated_model(self, ctx: StepContext):
        versions = kept_personal(ctx)
        sent = ctx.sent_model()
        ctx.metrics["personal_model"] = float(bool(versions))
        if not versions:
            ctx.metrics["apfl_alpha"] = float(ctx.meta[APFL_ALPHA_INIT])
            return sent
        saved = versions[0][1]
        ctx.metrics["apfl_alpha"] = float(saved["alpha"])
        sent.load_state_dict(mixed_state(sent.state_dict(), saved["model"], float(saved["alpha"])))
        return sent
