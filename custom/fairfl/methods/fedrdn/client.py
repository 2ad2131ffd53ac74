"""FedRDN's site side: training on images normalised with a randomly drawn site's statistics, scoring on images
normalised with the site's own (fairfl.methods.fedrdn.normalization)."""

from __future__ import annotations

import torch

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_task import SERVERS_TASK
from fairfl.kinds import Boolean, Checked
from fairfl.methods.fedrdn.normalization import (
    MAX_SITES,
    NormalisedBatches,
    channel_statistics,
    normalising,
    statistics_record,
    table,
)
from fairfl.methods.fedrdn.normalization import statistics_set_problem as set_problem
from fairfl.methods.fedrdn.protocol import FEDRDN, FEDRDN_STATISTICS, SITE_STATISTICS
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.training import train_local

STATISTICS_SET = Checked(
    set_problem, f"an object of 1 to {MAX_SITES} site names to statistics of one channel count", reports=True
)


def own_statistics(ctx: StepContext) -> dict:
    """The statistics record of this site's training images as the network receives them (its loader without
    augmentation, from the site's base seed: the same every task); an error naming the site when they are outside
    what FedRDN accepts (a channel of nearly constant images)."""
    loader = ctx.loader("training", train=False)
    record = channel_statistics(batch["image"] for batch in loader)
    problem = statistics_record(len(record) // 2).problem(record)
    if problem:
        raise DataError(ctx.site, "training split", f"FedRDN cannot normalise with its images' statistics: {problem}")
    return record


class RandomDomainNormalization(ClientStep):
    """FedRDN (meta[FEDRDN]). `train`: the site's usual local training (fairfl.training.train_local, the task's loss and
    optimiser) on its batches with every image normalised by a site drawn uniformly from the statistics the server
    sent (meta[FEDRDN_STATISTICS]) and the site's own, drawn from the task's seed; it replies its own statistics
    (SITE_STATISTICS) and the number of sites drawn from (metric fedrdn_sites). `evaluated_model`: the model sent,
    its inputs normalised with the site's own statistics (the paper's test-time rule)."""

    fields = {FEDRDN: Boolean(), FEDRDN_STATISTICS: STATISTICS_SET}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return meta.get(FEDRDN) is True

    def train(self, ctx: StepContext, model, loader, settings, loss_fn, optimizer) -> dict:
        sent, channels = ctx.meta.get(FEDRDN_STATISTICS, {}), ctx.meta[protocol.MODEL_SPEC]["in_channels"]
        other = {len(record) // 2 for record in sent.values()} - {channels}  # one count at most: checked as a field
        if other:
            raise DataError(
                ctx.site,
                SERVERS_TASK,
                f"task field {FEDRDN_STATISTICS} has statistics of {other.pop()} channels, the network takes "
                f"{channels}",
            )
        own = own_statistics(ctx)
        names, means, stds = table({**sent, ctx.site: own})
        batches = NormalisedBatches(loader, means, stds, torch.Generator().manual_seed(ctx.seed), ctx.device)
        stats = train_local(model, batches, settings, ctx.device, loss_fn=loss_fn, optimizer=optimizer, amp=ctx.amp)
        ctx.reply[SITE_STATISTICS] = own
        ctx.metrics["fedrdn_sites"] = float(len(names))
        return stats

    def evaluated_model(self, ctx: StepContext):
        _, mean, std = table({ctx.site: own_statistics(ctx)})
        return normalising(ctx.sent_model(), mean[0], std[0])
