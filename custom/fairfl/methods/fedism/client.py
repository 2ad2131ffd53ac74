"""FedISM(+)'s client side: SAGA's sharpness probe of the model sent (shared with q-FedAvg's loss measurement) and
SALT training (GSAM over the site's optimiser at the server's search distance)."""

from __future__ import annotations

import torch

from fairfl.kinds import Boolean, Real
from fairfl.methods.fedism.arguments import MAX_SEARCH_DISTANCE
from fairfl.methods.fedism.protocol import SALT_ALPHA, SALT_RHO, SHARPNESS, SHARPNESS_RHO
from fairfl.methods.fedism.sharpness import GSAM_ALPHA, dataset_loss, measure_sharpness, train_salt
from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS, MEASURE_LOSS
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.training import segmentation_loss


class ProbeModelSent(ClientStep):
    """What the server asked to measure on the model it sent, before training changes it: the sharpness and
    perturbed loss at meta[SHARPNESS_RHO] (FedISM(+)'s SAGA) and the loss (q-FedAvg, meta[MEASURE_LOSS]), in eval
    mode over the whole unaugmented training split. Classification measures plain cross-entropy, as the FFL4MIA code
    does: the model's loss on the site's data, not the prior-adjusted training objective. Reports probe_seconds."""

    fields = {SHARPNESS_RHO: Real(0.0, MAX_SEARCH_DISTANCE), MEASURE_LOSS: Boolean()}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return SHARPNESS_RHO in meta or bool(meta.get(MEASURE_LOSS))

    def before_training(self, ctx: StepContext, model) -> None:
        with ctx.timed("probe_seconds"):
            self.probe(ctx, model)

    @staticmethod
    def probe(ctx: StepContext, model) -> None:
        loader = ctx.loader("training", train=False)
        loss_fn = torch.nn.CrossEntropyLoss() if ctx.task == "classification" else segmentation_loss()
        if SHARPNESS_RHO in ctx.meta:
            ctx.reply[SHARPNESS] = measure_sharpness(
                model, loader, loss_fn, float(ctx.meta[SHARPNESS_RHO]), ctx.device, amp=ctx.amp
            )
        if ctx.meta.get(MEASURE_LOSS):
            if SHARPNESS in ctx.reply:
                ctx.reply[GLOBAL_LOSS] = ctx.reply[SHARPNESS]["loss"]
            else:
                ctx.reply[GLOBAL_LOSS] = dataset_loss(
                    model.to(ctx.device).eval(), loader, loss_fn, ctx.device, amp=ctx.amp
                )


class SALTTraining(ClientStep):
    """FedISM(+): trains with GSAM at meta[SALT_RHO] and alpha meta[SALT_ALPHA] (default GSAM_ALPHA; GSAM's alpha
    weighs the surrogate gap against the loss, in [0, 1])."""

    fields = {SALT_RHO: Real(0.0, MAX_SEARCH_DISTANCE), SALT_ALPHA: Real(0.0, 1.0)}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return SALT_RHO in meta

    def train(self, ctx: StepContext, model, loader, settings, loss_fn, optimizer) -> dict:
        return train_salt(
            model,
            loader,
            settings,
            ctx.device,
            loss_fn,
            rho=float(ctx.meta[SALT_RHO]),
            alpha=float(ctx.meta.get(SALT_ALPHA, GSAM_ALPHA)),
            optimizer=optimizer,
            amp=ctx.amp,
        )
