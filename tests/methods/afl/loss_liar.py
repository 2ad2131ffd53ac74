"""A site that claims a loss of its choosing, for AFL's simulator test: a FLARE task-result filter run inside the real
client process after the executor, where a hostile hospital would change its report (put on PYTHONPATH by the test,
as tests/faults.py is)."""

from nvflare.apis.filter import Filter
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS


class ClaimedLoss(Filter):
    def __init__(self, site: str, loss: float):
        """`site` reports `loss` as the loss of the model it was sent, in every train answer."""
        super().__init__()
        self.site, self.loss = site, loss

    def process(self, shareable, fl_ctx):
        if fl_ctx.get_identity_name() != self.site:
            return shareable
        model = FLModelUtils.from_shareable(shareable)
        if GLOBAL_LOSS not in (model.meta or {}):
            return shareable
        model.meta[GLOBAL_LOSS] = self.loss
        return FLModelUtils.to_shareable(model)
