"""FedRDN's server side: FedAvg's aggregation; it gathers every site's channel statistics from its train answers and
sends the set with every later train task."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.methods.fedrdn.normalization import statistics_record
from fairfl.methods.fedrdn.protocol import FEDRDN, FEDRDN_STATISTICS, SITE_STATISTICS


class FedRDNController(FairRoundController):
    """FedRDN (Yan et al., CVPR 2025): the global model is FedAvg's; every site sends, with each train answer, the
    per-channel mean and std of its training images (fairfl.methods.fedrdn.normalization), which the round loop checks
    like any field a method reads (`answer_fields`: one pair per input channel, finite, a std of at least 1e-3, no
    value huge). The statistics of every accepted answer replace that site's earlier ones; the next train task sends
    them all (FEDRDN_STATISTICS), and each site trains on images normalised with a randomly drawn site's statistics,
    its own included (fairfl.methods.fedrdn.client). An answer rejected for any reason adds nothing: its statistics
    are never sent. Every site is scored on images normalised with its own statistics. The statistics gathered are
    the method's state (`method_state`) and the final record's `statistics`."""

    method = "fedrdn"

    def __init__(self, **arguments) -> None:
        """The round's arguments (FairRoundController); held-out sites (exclude_sites) are refused: the executor scores
        a held-out site with the model sent as it is, on images FedRDN has not normalised."""
        super().__init__(**arguments)
        if self.settings.exclude_sites:
            raise ValueError(
                f"exclude_sites {self.settings.exclude_sites}: FedRDN scores a site on images normalised with its "
                f"own statistics, and a held-out site is scored with the model sent as it is"
            )
        self.statistics: dict[str, dict] = {}  # {site: its statistics record}, of its latest accepted answer

    def site_meta(self) -> dict:
        return {FEDRDN: True}

    def train_meta(self, round_num) -> dict:
        return {FEDRDN_STATISTICS: self.sent_statistics()} if self.statistics else {}

    def sent_statistics(self) -> dict:
        """The statistics the next train task sends: every site's accepted, by site name."""
        return {site: dict(self.statistics[site]) for site in sorted(self.statistics)}

    def answer_fields(self, task_name, round_num) -> dict:
        """A train answer's statistics: one mean and std per channel of the network's input."""
        if task_name != protocol.TASK_TRAIN:
            return {}
        return {SITE_STATISTICS: statistics_record(int(self.model_spec()["in_channels"]))}

    def aggregate(self, round_num, global_state, updates, rejected):
        new_state, extras = super().aggregate(round_num, global_state, updates, rejected)
        for site in sorted(updates):  # accepted answers only: screened (`answer_fields`), not rejected
            self.statistics[site] = {k: float(v) for k, v in updates[site].meta[SITE_STATISTICS].items()}
        return new_state, {**extras, "statistics_sites": sorted(self.statistics)}

    def final_extras(self) -> dict:
        return {"statistics": self.sent_statistics()}

    def method_state(self) -> dict | None:
        return {"statistics": self.sent_statistics()}

    def load_method_state(self, state: dict) -> None:
        self.statistics = {site: dict(record) for site, record in state["statistics"].items()}
