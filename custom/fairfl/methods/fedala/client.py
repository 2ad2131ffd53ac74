"""FedALA's client side (Zhang et al., AAAI 2023): the `train` task starts the site's local training from theta_hat,
the global model sent mixed on its top layers with the site's local model by the element-wise weights W the site
learns first on a sample of its training data (adaptive local aggregation, fairfl.methods.fedala.adaptive), W kept in
the site's state dir; `validate` scores the theta_hat the site would start its next round from."""

from __future__ import annotations

import contextlib
import copy
import os

import torch

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_state import keep_version, kept_versions, newest_before
from fairfl.methods.fedala.adaptive import (
    Convergence,
    initial_weights,
    learn_weights,
    personalised_state,
    sample_size,
    top_parameter_names,
    weights_problem,
)
from fairfl.methods.fedala.arguments import FEDALA
from fairfl.methods.fedala.protocol import (
    FEDALA_ETA,
    FEDALA_LAYERS,
    FEDALA_MAX_PASSES,
    FEDALA_RAND_PERCENT,
    FEDALA_THRESHOLD,
    FEDALA_WINDOW,
    WEIGHTS_FILES,
)
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.training import train_local

FIELDS = {argument.name: argument.kind for argument in FEDALA}  # the job's arguments, sent under their own names
REMEDY = "delete it (or use another run_name) to restart this site's aggregation weights from 1"


def kept_weights(ctx: StepContext, reference: dict) -> list:
    """[(round, {"round", "weights"}, file name)] of this site's FedALA weights on disk, newest first (the current
    file, then the previous round's; fairfl.flare.site_state). A file that cannot be read, or whose weights are not
    one tensor in [0, 1] per tensor of `reference` (the network's top parameter tensors: names, shapes, dtypes),
    finite, is an error naming the site and the file, never replaced."""
    versions = kept_versions(ctx.site, ctx.state_dir, WEIGHTS_FILES, "FedALA aggregation weights", REMEDY)
    for _, saved, name in versions:
        problem = weights_problem(saved.get("weights"), reference)
        if problem:
            raise DataError(
                ctx.site, os.path.join(ctx.state_dir, name), f"the FedALA aggregation weights {problem}; {REMEDY}"
            )
    return versions


@contextlib.contextmanager
def seeded(seed: int, device):
    """torch's random state seeded with `seed` inside (dropout in W's passes), restored after, so that the local
    training that follows draws what it would have drawn without them."""
    device = torch.device(device)
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    )
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def adaptive_start(ctx: StepContext, sent: torch.nn.Module, items: int, before_round: int, keep: bool):
    """theta_hat (a state dict) for the model `sent` and the site's local model trained before round `before_round`
    (ctx.own_model), with W learned from the newest W kept from a round before it (the first time: all ones, and the
    start phase); None when the site has no local model yet (theta_hat is the model sent). W's sample: the task's
    percentage of the site's `items` training items, drawn from the site's seed of round `before_round`, so the
    `validate` task of round t computes exactly the start of the site's round t + 1. `keep`: save W as this round's.
    Adds fedala_passes, fedala_weight_mean to ctx.metrics (the first only where `keep`: an evaluation metric is a
    score in [0, 1])."""
    local = ctx.own_model()
    if local is None:
        return None
    names = top_parameter_names(sent, ctx.meta[FEDALA_LAYERS])
    parameters = dict(sent.named_parameters())
    reference = {name: parameters[name].detach() for name in names}
    versions = kept_weights(ctx, reference)
    saved = newest_before(versions, before_round)
    seed = ctx.seed + before_round - ctx.round  # the site's seed of round before_round
    size = sample_size(items, ctx.meta[FEDALA_RAND_PERCENT])
    convergence = Convergence(ctx.meta[FEDALA_WINDOW], ctx.meta[FEDALA_THRESHOLD], ctx.meta[FEDALA_MAX_PASSES])
    global_state = sent.state_dict()
    with seeded(seed, ctx.device):
        weights, losses = learn_weights(
            copy.deepcopy(sent),
            global_state,
            local,
            initial_weights(reference) if saved is None else saved["weights"],
            lambda: ctx.loader("training", train=False, seed=seed, max_samples=size),  # the same sample every pass
            ctx.base_loss(),
            float(ctx.meta[FEDALA_ETA]),
            ctx.device,
            start_phase=saved is None,
            convergence=convergence,
            amp=ctx.amp,
        )
    if keep:
        keep_version({"round": ctx.round, "weights": weights}, ctx.state_dir, WEIGHTS_FILES, versions)
        ctx.metrics["fedala_passes"] = float(len(losses))
    count = sum(w.numel() for w in weights.values())
    ctx.metrics["fedala_weight_mean"] = float(sum(float(w.double().sum()) for w in weights.values()) / count)
    return personalised_state(global_state, local, weights)


class AdaptiveStart(ClientStep):
    """`train` with meta[FEDALA_LAYERS]: the model sent, theta, becomes theta_hat (`adaptive_start`: W learned on a
    sample of the site's training items, kept), then the site's usual local training runs on it, the executor's own
    loop (fairfl.training.train_local, with the task's loss and optimiser): what is trained goes back as FedAvg's
    update (its difference from theta) and becomes the site's local model. Before the site has a local model (its
    first round) the start is theta itself. Reports fedala_passes (W's passes this round: 0 without a local model),
    fedala_weight_mean (mean of W) and fedala_seconds (ALA's time; train_seconds covers ALA and the training)."""

    fields = FIELDS

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return FEDALA_LAYERS in meta  # its own loop runs in `train` tasks only

    def train(self, ctx: StepContext, model, loader, settings, loss_fn, optimizer) -> dict:
        with ctx.timed("fedala_seconds"):
            start = adaptive_start(ctx, model, len(loader.dataset), ctx.round, keep=True)
        ctx.metrics.setdefault("fedala_passes", 0.0)
        if start is not None:
            model.load_state_dict(start)  # in place: the optimiser holds these very tensors
        return train_local(model, loader, settings, ctx.device, loss_fn=loss_fn, optimizer=optimizer, amp=ctx.amp)


class AdaptiveEvaluation(ClientStep):
    """`validate` with meta[FEDALA_LAYERS] and EVALUATE FROM_PERSONAL: the site is scored with theta_hat of the model
    sent (the newest global model) and its local model, W learned as its next round's `train` will learn it (from
    the same kept W, on the same sample; not kept), which is what the paper scores (its clients run ALA on the
    global model, then are evaluated, then train); personal_model 1.0, fedala_weight_mean. Before the site has a
    local model: the model sent (personal_model 0.0). Runs before Ditto's PersonalEvaluation, which it replaces."""

    fields = FIELDS

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return FEDALA_LAYERS in meta and meta.get(protocol.EVALUATE) == protocol.FROM_PERSONAL

    def evaluated_model(self, ctx: StepContext):
        sent = ctx.sent_model()
        start = None
        if ctx.own_model() is not None:
            items = len(ctx.loader("training", train=True, seed=ctx.seed).dataset)  # its cache serves the sample
            start = adaptive_start(ctx, sent, items, ctx.round + 1, keep=False)
        ctx.metrics["personal_model"] = float(start is not None)
        if start is not None:
            sent.load_state_dict(start)
        return sent
