"""FedSoup's server side: FedAvg's global model; the sites keep their soups of it and are scored with them."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.methods.fedsoup.protocol import FEDSOUP_START_ROUND
from fairfl.methods.fedsoup.soup import first_soup_round


class FedSoupController(FairRoundController):
    """FedSoup (Chen, Jiang, Dou, Wang and Li, MICCAI 2023): the global model is FedAvg's (every site sends the model
    it trained from the model sent, as its difference from it; the server averages by training-set size, or
    uniformly). From round floor(`fedsoup_start` x num_rounds) on, each site, after its local training, offers the
    global model it was sent to its soup (the mean of the global models it selected) and keeps it there unless its
    validation split scores its trained model averaged with the soup worse with it than without (temporal model
    selection, a greedy soup). Nothing of the soup leaves the site; each site is scored with its local model averaged
    uniformly with the soup's models (federated model patching: `personal_model` 1.0 and `fedsoup_local_share` in its
    metrics) and, in the same task, with the global model alone (`global_dice`, ...); `fedsoup_soup_size`,
    `fedsoup_added` and `fedsoup_scored` are among its training metrics. A site held out of training
    (`exclude_sites`) is scored with the global model alone. The soup lives in the site's state dir
    (fairfl.methods.fedsoup.protocol.SOUP_FILE, with the previous round's) beside its local model, so a named run
    (run_name) resumes with it, a repeated round included. The server keeps nothing of its own between rounds but the
    global model; global_model.pt is FedAvg's."""

    method = "fedsoup"
    evaluate = protocol.FROM_PERSONAL

    def __init__(self, **arguments):
        """fedsoup_start (arguments.py: FEDSOUP) besides the round's arguments (FairRoundController)."""
        super().__init__(**arguments)
        self.fedsoup_start = float(self.fedsoup_start)

    def site_meta(self) -> dict:
        """The first round of the sites' soups (counted from 0; num_rounds: never), in every task (protocol.py)."""
        start = first_soup_round(self.fedsoup_start, self.settings.num_rounds)
        return {**super().site_meta(), FEDSOUP_START_ROUND: start}
