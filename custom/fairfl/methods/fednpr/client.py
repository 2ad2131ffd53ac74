"""FedNPR's client side: its local objective on prototypes of the model sent and, for FedNPR-Per, the site's own
classifier head, which trains and is evaluated at the site but never leaves it."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.kinds import Boolean, Checked
from fairfl.methods.fednpr.npr import check_npr_settings, class_prototypes, extract_features, fednpr_objective
from fairfl.methods.fednpr.protocol import NPR, PERSONAL_HEAD
from fairfl.methods.local_parts import KeepPartLocal
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.models import head_state_keys
from fairfl.training import mixed_precision


class NPRObjective(ClientStep):
    """With meta[NPR]: the local loss is balanced softmax with this site's class prior + weight * NPR (logits
    normalised as settings["logits"] says) on K prototypes per class from the features of the model sent, computed
    before training moves it (fairfl.methods.fednpr.npr.fednpr_objective). Reports prototype_seconds and
    npr_grad_ratio."""

    replaces_loss = True
    fields = {NPR: Checked(check_npr_settings, "FedNPR's settings", reports=True)}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return NPR in meta

    def loss(self, ctx: StepContext, loss_fn, model, stack):
        settings, num_classes = ctx.meta[NPR], ctx.meta[protocol.MODEL_SPEC]["num_classes"]
        with ctx.timed("prototype_seconds"):
            with mixed_precision(ctx.device, ctx.amp):
                features, labels = extract_features(model, ctx.loader("training", train=False), ctx.device)
            prototypes, mask = class_prototypes(
                features,
                labels,
                num_classes,
                k=settings["k"],
                epsilon=float(settings["epsilon"]),
                iterations=settings["iterations"],
                seed=ctx.seed,
            )
            npr = stack.enter_context(
                fednpr_objective(
                    model,
                    ctx.class_counts(),
                    prototypes.to(ctx.device),
                    mask.to(ctx.device),
                    lam=float(settings["weight"]),
                    temperature=float(settings["temperature"]),
                    npr_form=settings["logits"],
                )
            )
        stack.callback(lambda: ctx.metrics.update(npr.metrics()))  # npr_grad_ratio, once training is done
        return npr


class PersonalHead(KeepPartLocal):
    """FedNPR-Per (meta[PERSONAL_HEAD]): the model sent carries this site's own classifier head once it has one (for
    training and evaluation alike), and the head is left out of what the site sends back."""

    meta_key = PERSONAL_HEAD
    fields = {meta_key: Boolean()}
    part_keys = staticmethod(head_state_keys)
