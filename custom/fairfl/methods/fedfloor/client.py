"""FedFloor's site side: the validate task scores the interpolation of the global and the site's personal model
that the site's own validation split favours (fairfl.methods.fedfloor.mixing)."""

from __future__ import annotations

from fairfl.flare import protocol
from fairfl.kinds import Checked, Real
from fairfl.methods.ditto.client import PersonalEvaluation
from fairfl.methods.fedfloor.mixing import check_grid, choose_alpha_guarded, mix_states
from fairfl.methods.fedfloor.protocol import MIX_GRID, MIX_GUARD
from fairfl.methods.steps import StepContext

MAX_GRID = 101  # alphas a site scores on its validation split in one task (0, 0.01, ..., 1): one pass each


def grid_problem(grid) -> str | None:
    """Why the server's mix_grid must not be used (`check_grid`, at most MAX_GRID values), or None."""
    try:
        values = check_grid(grid)
    except ValueError as err:
        return str(err)
    return f"{len(values)} values, more than the {MAX_GRID} a site scores" if len(values) > MAX_GRID else None


class ValidatedMix(PersonalEvaluation):
    """`validate` with meta[MIX_GRID] and EVALUATE FROM_PERSONAL: every alpha of the grid is scored on the site's
    validation split, and the test split scores the best (metric mix_alpha); with meta[MIX_GUARD] z > 0 the best
    whose gain over the global model stands z standard errors of the gain above 0, else the global model. Before
    the site has a personal model it is scored with the model sent (mix_alpha 0). Runs before Ditto's
    PersonalEvaluation, which it replaces."""

    fields = {MIX_GRID: Checked(grid_problem, "FedFloor's grid of mixes", reports=True), MIX_GUARD: Real(0, 10)}

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return MIX_GRID in meta and meta.get(protocol.EVALUATE) == protocol.FROM_PERSONAL

    def evaluated_model(self, ctx: StepContext):
        personal = super().evaluated_model(ctx)  # Ditto's newest personal model (and its metric), or None
        sent = ctx.sent_model()
        if personal is None:
            ctx.metrics["mix_alpha"] = 0.0
            return sent
        # copies: state_dict() aliases the model's tensors, which every load_state_dict below overwrites
        global_state = {k: v.clone() for k, v in sent.state_dict().items()}
        personal_state = personal.state_dict()
        guard = float(ctx.meta.get(MIX_GUARD, 0.0))
        scores, influences = {}, {}
        for alpha in check_grid(ctx.meta[MIX_GRID]):
            sent.load_state_dict(mix_states(global_state, personal_state, alpha))
            record: dict = {}
            scores[alpha] = ctx.validation_score(sent, record if guard > 0.0 else None)
            influences[alpha] = record.get("values")
        alpha = choose_alpha_guarded(scores, influences, guard)
        sent.load_state_dict(mix_states(global_state, personal_state, alpha))
        ctx.metrics["mix_alpha"] = alpha
        return sent
