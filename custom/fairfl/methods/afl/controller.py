"""AFL's server side: the lambda-weighted average of the sites' models and lambda's projected ascent on their losses."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.flare.engine import FairRoundController
from fairfl.methods.afl.minimax import minimax_round, uniform_mixture
from fairfl.methods.qfedavg.protocol import GLOBAL_LOSS, GLOBAL_LOSS_KIND, MEASURE_LOSS


class MinimaxAggregation(FairRoundController):
    """AFL's aggregation for any round controller: mixed in before it (`class X(MinimaxAggregation, Base)`), it asks
    every site for the loss of the model sent, averages the sites' models under lambda and steps lambda (see
    AFLController); while `minimax` is False (a class attribute, or set by the subclass's __init__) every hook is the
    base's, untouched. The mixture joins the base's method state, final record and train task fields."""

    minimax = True

    def __init__(self, **arguments) -> None:
        super().__init__(**arguments)
        self.mixture: dict[str, float] = {}  # mu over the federation's sites; set in the first aggregation

    def train_meta(self, round_num) -> dict:
        meta = super().train_meta(round_num)
        return {**meta, MEASURE_LOSS: True} if self.minimax else meta

    def answer_fields(self, task_name, round_num) -> dict:
        """Every train answer carries the loss of the model sent (besides what the base reads)."""
        fields = super().answer_fields(task_name, round_num)
        if self.minimax and task_name == protocol.TASK_TRAIN:
            return {**fields, GLOBAL_LOSS: GLOBAL_LOSS_KIND}
        return fields

    def aggregate(self, round_num, global_state, updates, rejected):
        if not self.minimax:
            return super().aggregate(round_num, global_state, updates, rejected)
        sites = sorted(updates)
        losses = {s: float(updates[s].meta[GLOBAL_LOSS]) for s in sites}  # checked: answer_fields
        fedavg = self.site_weights({s: updates[s].num_samples for s in sites})
        if not self.mixture:
            self.mixture = uniform_mixture(self.trainers)
        step = minimax_round(
            self.mixture, fedavg, losses, self.afl_alpha, self.afl_step, self.afl_loss_cap, self.afl_max_gain
        )
        for site in step.capped:
            self.info(
                f"round {round_num}: {site}'s loss {losses[site]!r} counts as {self.afl_loss_cap:g} times the "
                f"round's median (afl_loss_cap)"
            )
        self.mixture = step.mixture
        weights = self.bounded(step.weights)
        record = {
            "weights": weights,
            "fedavg_weights": fedavg,
            "mixture": dict(step.mixture),
            "losses": losses,
            "loss_signal": step.signal,
            "capped_losses": step.capped,
        }
        if self.afl_max_gain is not None:  # the sites whose lambda sat at (1 + afl_max_gain) p_k
            record["at_ceiling"] = step.at_ceiling
        return self.average_updates(updates, weights), record

    def final_extras(self) -> dict:
        extras = super().final_extras()
        return {**extras, "mixture": dict(self.mixture)} if self.minimax and self.mixture else extras

    def method_state(self) -> dict | None:
        if not self.minimax:
            return super().method_state()
        return {**(super().method_state() or {}), "mixture": dict(self.mixture)}

    def load_method_state(self, state: dict) -> None:
        if not self.minimax:
            super().load_method_state(state)
            return
        self.mixture = {site: float(share) for site, share in state["mixture"].items()}
        rest = {key: value for key, value in state.items() if key != "mixture"}
        if rest:  # the base's own state
            super().load_method_state(rest)


class AFLController(MinimaxAggregation):
    """AFL (Mohri, Sivek and Suresh, ICML 2019), its stochastic form as DRFA runs it: every site measures, before
    training, the loss of the global model on its training set (the probe q-FedAvg uses: MEASURE_LOSS, GLOBAL_LOSS)
    and sends it with its trained model; the round loop checks it (`answer_fields`: a finite number in [0, 1e6]; a
    site sending anything else is rejected for the round). The global model is the average of the round's models
    under lambda = (1 - afl_alpha) p + afl_alpha mu (p: FedAvg's weights by `weighting`; mu: the mixture the server
    keeps over every site), capped at `max_share` as every method's weights are; lambda then ascends along the
    bounded losses (min(L_k / median, afl_loss_cap)) and is projected back onto its set
    (`fairfl.methods.afl.minimax`). With `afl_max_gain` (beta; null by default) the set also keeps every site's
    lambda_k at most (1 + beta) p_k: a site claiming a huge loss gains at most beta times its FedAvg weight in lambda
    (`max_share`, applied after, can lift it only where some site's ceiling is above max_share: docs/methods/afl.md).
    With `robust_aggregation` the model is the robust statistic of the sites' models, as for every weighted method:
    lambda is still stepped and recorded but weighs nothing.

    The mixture is the method's state (`method_state`, method_state.json, a named run's checkpoint); each round's
    record holds the weights its sites got (`weights`), FedAvg's (`fedavg_weights`), the mixture after the step
    (`mixture`), the losses reported, the signal ascended along (`loss_signal`), the sites whose loss was capped
    (`capped_losses`) and, with `afl_max_gain` only, the sites whose lambda sat at its ceiling (`at_ceiling`)."""

    method = "afl"
