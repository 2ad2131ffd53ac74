"""FedNPR's client side: its local objective on prototypes of the model sent and, for FedNPR-Per, the site's own
classifier head, which trains and is evaluated at the site but never leaves it."""

from __future__ import annotations

import os

from fairfl.flare import protocol
from fairfl.methods.fednpr.npr import check_npr_settings, class_prototypes, extract_features, fednpr_objective
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.models import head_state_keys
from fairfl.training import load_tensors


class NPRObjective(ClientStep):
    """With meta[NPR]: the local loss is balanced softmax with this site's class prior + weight * NPR (logits
    normalised as settings["logits"] says) on K prototypes per class from the features of the model sent, computed
    before training moves it (fairfl.methods.fednpr.npr.fednpr_objective). Reports prototype_seconds and
    npr_grad_ratio."""

    replaces_loss = True

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return protocol.NPR in meta

    @classmethod
    def check(cls, meta: dict) -> str | None:
        problem = check_npr_settings(meta[protocol.NPR])
        return f"{protocol.NPR} settings: {problem}" if problem else None

    def loss(self, ctx: StepContext, loss_fn, model, stack):
        settings, num_classes = ctx.meta[protocol.NPR], ctx.meta[protocol.MODEL_SPEC]["num_classes"]
        with ctx.timed("prototype_seconds"):
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


class PersonalHead(ClientStep):
    """FedNPR-Per (meta[PERSONAL_HEAD]): the model sent carries this site's own classifier head once it has one (for
    training and evaluation alike), and the head is left out of what the site sends back."""

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return bool(meta.get(protocol.PERSONAL_HEAD))

    def received(self, ctx: StepContext, model) -> None:
        local_path = os.path.join(ctx.state_dir, protocol.LOCAL_MODEL_FILE)
        if os.path.exists(local_path):
            own = load_tensors(local_path)
            model.load_state_dict({k: own[k] for k in head_state_keys(model)}, strict=False)

    def outgoing(self, ctx: StepContext, params: dict, model) -> dict:
        head = set(head_state_keys(model))
        return {k: v for k, v in params.items() if k not in head}
