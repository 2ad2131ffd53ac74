"""Ditto's client side (Li et al., ICML 2021, Alg. 1): after the model sent is trained (and returned), the site's
personal model v_k is trained on its usual loss + (lambda / 2) ||v - w_t||^2, w_t the model sent this round, and
kept in the site's state dir; `validate` scores it instead of the global model."""

from __future__ import annotations

import copy

from fairfl.flare import protocol
from fairfl.flare.site_state import keep_version, kept_model_versions
from fairfl.kinds import Real
from fairfl.methods.ditto.protocol import DITTO_LAMBDA, PERSONAL_MODEL_FILES
from fairfl.methods.fedprox.arguments import MAX_PROXIMAL_WEIGHT
from fairfl.methods.fedprox.client import with_proximal_term
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.models import build_model, meta_state
from fairfl.training import TrainSettings, train_local


def train_personal(
    personal, sent, loader, settings: TrainSettings, device, loss_fn, lam: float, amp: bool = False
) -> dict:
    """Ditto's personal objective h_k(v; w_t) = loss_k(v) + (lam / 2) ||v - w_t||^2 (Li et al., ICML 2021, Eq. 2),
    minimised in place on `personal` (v) by the repo's ordinary local loop (fairfl.training.train_local); `sent`
    (w_t) is only read. The proximal term is NVFlare's PTFedProxLoss's, the one its PTDittoHelper uses (fused:
    fairfl.methods.fedprox.proximal). PTDittoHelper
    itself is not used: its training step (`local_train`) is abstract, it wants a torch `_Loss` criterion and its
    own optimiser, and it saves `personalized_model.pt` / best-metric files in the app folder of the job run,
    where a resumed run (run_name) would not find them; the site's state dir and train_local already do the rest.
    Returns train_local's statistics (train_loss is the mean personal objective)."""
    loss_fn = with_proximal_term(loss_fn, personal, lam, sent)
    return train_local(personal, loader, settings, device, loss_fn=loss_fn, amp=amp)


def personal_versions(ctx: StepContext) -> list:
    """[(round, model, file name)] of this site's Ditto personal models on disk, newest first (the current file, then
    the previous round's; fairfl.flare.site_state). A file that cannot be read, is of another network or holds
    NaN/Inf is an error naming the site and the file, never silently replaced."""
    remedy = "delete it (or use another run_name) to restart this site's personalisation from the global model"
    reference = meta_state(ctx.meta[protocol.MODEL_SPEC])
    versions = []
    for saved_round, saved, name in kept_model_versions(
        ctx.site, ctx.state_dir, PERSONAL_MODEL_FILES, "Ditto personal model", remedy, reference
    ):
        model = build_model(ctx.meta[protocol.MODEL_SPEC])
        model.load_state_dict(saved["model"])
        versions.append((saved_round, model, name))
    return versions


class PersonalTraining(ClientStep):
    """The personal step, with meta[DITTO_LAMBDA]: the site's personal model (the model sent, the first time)
    trained for the same local epochs/steps, with the same optimiser settings and batches; saved for the next round
    and for evaluation. Reports personal_train_loss (the personal objective's mean) and personal_train_seconds.

    Round r starts from the newest personal model of a round before r: when a resumed run repeats round r (the
    server died after this site's answer but before its checkpoint), the repeat starts where the first try did, so
    the run matches one that never stopped. For that the site keeps the previous round's model as well."""

    fields = {DITTO_LAMBDA: Real(0.0, MAX_PROXIMAL_WEIGHT)}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return DITTO_LAMBDA in meta

    def before_training(self, ctx: StepContext, model) -> None:
        self.sent = copy.deepcopy(model)  # w_t, before any probe or training touches it

    def after_training(self, ctx: StepContext, model) -> None:
        versions = personal_versions(ctx)
        personal = next((saved for saved_round, saved, _ in versions if saved_round < ctx.round), None)
        personal = copy.deepcopy(self.sent) if personal is None else personal
        loader = ctx.loader("training", train=True, seed=ctx.seed)
        with ctx.timed("personal_train_seconds"):
            stats = train_personal(
                personal,
                self.sent,
                loader,
                ctx.train_settings(),
                ctx.device,
                ctx.base_loss(),
                float(ctx.meta[DITTO_LAMBDA]),
                amp=ctx.amp,
            )
        saved = {"round": ctx.round, "model": personal.state_dict()}
        keep_version(saved, ctx.state_dir, PERSONAL_MODEL_FILES, versions)
        ctx.metrics["personal_train_loss"] = float(stats["train_loss"])


class PersonalEvaluation(ClientStep):
    """`validate` with meta[EVALUATE] FROM_PERSONAL scores the site's newest personal model; before its first
    personal step the model sent (Ditto's v_k start). Metric personal_model: 1.0 when it had one, else 0.0."""

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return meta.get(protocol.EVALUATE) == protocol.FROM_PERSONAL

    def evaluated_model(self, ctx: StepContext):
        versions = personal_versions(ctx)
        ctx.metrics["personal_model"] = float(bool(versions))
        return versions[0][1] if versions else None
