"""Solo's server side: nothing is aggregated; every site keeps and is scored with its own model."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController


class SoloController(FairRoundController):
    """Solo: every site trains only on its own data and is evaluated with its own model; nothing is shared."""

    method = "solo"
    start_from = protocol.FROM_LOCAL
    evaluate = protocol.FROM_LOCAL

    def aggregate(self, round_num, global_state, updates, rejected):
        return global_state, {}
