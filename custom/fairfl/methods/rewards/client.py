"""CFFL's client side: the trained model's score on the site's validation split, the server's reputation signal."""

from __future__ import annotations

from fairfl.kinds import Boolean
from fairfl.methods.rewards.protocol import VAL_METRIC, VALIDATE_TRAINED
from fairfl.methods.steps import ClientStep, StepContext


class ValidateTrained(ClientStep):
    """Replies VAL_METRIC: Dice (classification: balanced accuracy) of the trained model; None when NaN."""

    fields = {VALIDATE_TRAINED: Boolean()}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return bool(meta.get(VALIDATE_TRAINED))

    def after_training(self, ctx: StepContext, model) -> None:
        ctx.reply[VAL_METRIC] = ctx.validation_score(model)
