"""FedSoup's client side (Chen et al., MICCAI 2023): from the soup's start on, the `train` task offers the global
model sent to the site's soup after its local training, which it joins when the site's validation split does not
score the patched model worse (fairfl.methods.fedsoup.soup), the soup kept in the site's state dir; `validate` scores
the site's local model averaged with its soup."""

from __future__ import annotations

import os

from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.site_state import keep_version, kept_versions, newest_before
from fairfl.flare.site_task import MAX_ROUND
from fairfl.kinds import Integer, Kind
from fairfl.methods.fedsoup.protocol import FEDSOUP_START_ROUND, SOUP_FILES
from fairfl.methods.fedsoup.soup import joins, patched_state, soup_problem, with_ingredient
from fairfl.methods.steps import ClientStep, StepContext
from fairfl.models import meta_state

FIELDS: dict[str, Kind] = {FEDSOUP_START_ROUND: Integer(0, MAX_ROUND)}
REMEDY = "delete it (or use another run_name) to start this site's soup afresh"


def kept_soups(ctx: StepContext) -> list:
    """[(round, {"round", "soup", "ingredients"}, file name)] of this site's soups on disk, newest first (the current
    file, then the previous round's; fairfl.flare.site_state). A file that cannot be read, or is no soup of this job's
    network (fairfl.methods.fedsoup.soup.soup_problem), is an error naming the site and the file, never replaced."""
    versions = kept_versions(ctx.site, ctx.state_dir, SOUP_FILES, "FedSoup soup", REMEDY)
    reference = meta_state(ctx.meta[protocol.MODEL_SPEC])
    for _, saved, name in versions:
        problem = soup_problem(saved, reference)
        if problem:
            raise DataError(ctx.site, os.path.join(ctx.state_dir, name), f"the FedSoup soup {problem}; {REMEDY}")
    return versions


def soup_before(versions: list, round_num: int) -> tuple[dict, list]:
    """(the soup's mean, its ingredients' rounds) as the newest version kept from a round before `round_num` has
    them; empty before the first."""
    saved = newest_before(versions, round_num)
    return ({}, []) if saved is None else (saved["soup"], saved["ingredients"])


class SoupSelection(ClientStep):
    """`train` with meta[FEDSOUP_START_ROUND], from that round on: after the site's usual local training (what goes
    back is FedAvg's update, untouched), the model sent, g, is offered to the site's soup. The site's validation split
    scores its trained model patched with the soup as it is and with g added (two passes); g joins unless the second
    scores worse (`soup.joins`: a score that cannot be computed ranks below every number; two such tie). The soup
    starts from the newest version kept from a round before this one (a repeated round starts where its first try
    did) and is kept as this round's. Reports fedsoup_soup_size (its ingredients after the round; 0 before the
    start), fedsoup_added (1.0 when g joined), fedsoup_scored (1.0 when both scores could be computed) and
    fedsoup_seconds."""

    fields = FIELDS

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return FEDSOUP_START_ROUND in meta

    def after_training(self, ctx: StepContext, model) -> None:
        ctx.metrics["fedsoup_soup_size"] = 0.0
        if ctx.round < ctx.meta[FEDSOUP_START_ROUND]:
            return
        with ctx.timed("fedsoup_seconds"):
            versions = kept_soups(ctx)
            soup, ingredients = soup_before(versions, ctx.round)
            scratch = ctx.sent_model()  # g, then scored in turn with each patched model; `model` goes back as it is
            grown = with_ingredient(soup, len(ingredients), scratch.state_dict())  # new tensors, before any load
            local = model.state_dict()
            scores = []
            for mean, count in ((soup, len(ingredients)), (grown, len(ingredients) + 1)):
                scratch.load_state_dict(patched_state(local, mean, count))
                scores.append(ctx.validation_score(scratch))
            added = joins(*scores)
            if added:
                soup, ingredients = grown, [*ingredients, ctx.round]
            keep_version(
                {"round": ctx.round, "soup": soup, "ingredients": ingredients}, ctx.state_dir, SOUP_FILES, versions
            )
        ctx.metrics.update(
            fedsoup_soup_size=float(len(ingredients)),
            fedsoup_added=float(added),
            fedsoup_scored=float(None not in scores),
        )


class SoupEvaluation(ClientStep):
    """`validate` with meta[FEDSOUP_START_ROUND] and EVALUATE FROM_PERSONAL: the site is scored with its local model
    (the one it trained in its last round) averaged with the soup it kept in that round, the local model weighing
    1 / (ingredients + 1) (metrics personal_model 1.0 and fedsoup_local_share, that weight: 1.0 before the soup has an
    ingredient, when it is the local model alone). Before the site has a local model: the model sent (personal_model
    0.0). Runs before Ditto's PersonalEvaluation, which it replaces."""

    fields = FIELDS

    @classmethod
    def applies(cls, meta: dict) -> bool:
        return FEDSOUP_START_ROUND in meta and meta.get(protocol.EVALUATE) == protocol.FROM_PERSONAL

    def evaluated_model(self, ctx: StepContext):
        sent, local = ctx.sent_model(), ctx.own_model()
        ctx.metrics["personal_model"] = float(local is not None)
        if local is None:
            return sent
        soup, ingredients = soup_before(kept_soups(ctx), ctx.round + 1)  # the one kept with the local model
        sent.load_state_dict(patched_state(local, soup, len(ingredients)))
        ctx.metrics["fedsoup_local_share"] = 1.0 / (len(ingredients) + 1)
        return sent
