"""Fed-LWR's client side: its own site task, CKA of the site's local model to the anchor the server sends."""

from __future__ import annotations

from fairfl.methods.fedlwr.arguments import CKA_SAMPLE
from fairfl.methods.fedlwr.cka import layerwise_cka
from fairfl.methods.fedlwr.protocol import (
    CKA,
    CKA_BATCH_SIZE,
    CKA_MAX_POSITIONS,
    CKA_MAX_SAMPLES,
    CKA_SPLIT,
    TASK_CKA,
)
from fairfl.methods.steps import MethodTask, StepContext
from fairfl.training import mixed_precision

SAMPLE_KINDS = {argument.name: argument.kind for argument in CKA_SAMPLE}  # what the job may set, a site accepts


class AnchorCKA(MethodTask):
    """Replies CKA: per-layer CKA between the site's local model (of this round) and the anchor sent, on a random
    sample of meta[CKA_MAX_SAMPLES] images of the site's meta[CKA_SPLIT] split in minibatches of meta[CKA_BATCH_SIZE],
    drawn afresh every round from the site's seed and the round, in random order (make_loader's max_samples). Never
    in datalist order: minibatches of neighbouring slices of one or two patients show the unbiased HSIC only
    within-patient variation, and CKA comes out too high at exactly the small sites. A 3-D layer's output is read at
    most at meta[CKA_MAX_POSITIONS] voxel positions (fairfl.methods.fedlwr.cka.layerwise_cka)."""

    name = TASK_CKA
    fields = {key: SAMPLE_KINDS[key] for key in (CKA_SPLIT, CKA_MAX_SAMPLES, CKA_BATCH_SIZE, CKA_MAX_POSITIONS)}

    def run(self, ctx: StepContext) -> None:
        local, anchor = ctx.own_network(), ctx.sent_model()
        loader = ctx.loader(
            ctx.meta[CKA_SPLIT],
            train=False,
            seed=ctx.seed,
            max_samples=ctx.meta[CKA_MAX_SAMPLES],
            batch_size=ctx.meta[CKA_BATCH_SIZE],
        )
        with mixed_precision(ctx.device, ctx.amp):
            ctx.reply[CKA] = layerwise_cka(
                local,
                anchor,
                (b["image"] for b in loader),
                device=ctx.device,
                max_volume_positions=ctx.meta[CKA_MAX_POSITIONS],
            )
