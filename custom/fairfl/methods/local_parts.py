"""Parts of the model a site keeps to itself (FedNPR-Per's classifier head, FedBN's normalisation layers).

The site trains and is evaluated with its own copy of the part (once it has trained one), and leaves it out of
what it sends; the server leaves it out of the update it expects and of the average (`FairRoundController.
local_keys`). One copy of that logic for every method that personalises a part."""

from __future__ import annotations

from fairfl.methods.steps import ClientStep, StepContext


class KeepPartLocal(ClientStep):
    """A site-side step keeping the part `part_keys(model)` local, switched on by the task meta flag `meta_key`."""

    meta_key = ""

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return bool(meta.get(cls.meta_key))

    @staticmethod
    def part_keys(model) -> list:
        raise NotImplementedError

    def received(self, ctx: StepContext, model) -> None:
        own = ctx.own_model()
        if own is not None:
            model.load_state_dict({k: own[k] for k in self.part_keys(model)}, strict=False)

    def outgoing(self, ctx: StepContext, params: dict, model) -> dict:
        part = set(self.part_keys(model))
        return {k: v for k, v in params.items() if k not in part}
