"""A site's training result as an update: its trained weights minus the weights it was sent (NVFlare's WEIGHT_DIFF).

Sites send differences, not weights, because NVFlare's privacy filters (fairfl.flare.update_filters, and a site's own
privacy scope) are defined on differences: on whole weights the percentile filter would zero a model's small weights.
Floating-point and integer tensors (counters such as batch norm's num_batches_tracked) travel as differences;
boolean tensors, which have no difference, as they are. The server adds each difference back to what it sent
(`weights_from_update`), checked as whole weights are, so every method reads whole weights as before."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from fairfl.site_checks import check_site_state


def weight_difference(trained: Mapping[str, np.ndarray], sent: Mapping[str, np.ndarray]) -> dict:
    """{name: trained - sent} over the tensors of `trained` (boolean ones as they are); `sent` must hold them all."""
    return {
        name: value if value.dtype == np.bool_ else value - np.asarray(sent[name], dtype=value.dtype)
        for name, value in trained.items()
    }


def in_dtypes(update: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray]) -> dict:
    """`update`'s tensors that `like` has, each in `like`'s dtype (a filter that computed in float64 or turned a
    counter into floats leaves the update as the site's weights are typed; rounding a counter's change is harmless)."""
    return {k: np.asarray(v).astype(like[k].dtype, copy=False) for k, v in update.items() if k in like}


def weights_from_update(update: Mapping, sent: Mapping[str, torch.Tensor]) -> tuple[dict | None, str | None]:
    """(the weights `update` makes from the weights `sent`, None), or (None, why the update cannot be used).

    `update` ({name: tensor}) is `weight_difference`'s; a tensor it leaves out (a filter kept it on the site) keeps its
    sent value: a site may send less, never other tensors, shapes or dtypes, nor a NaN (`check_site_state`, on the
    update and again on the sum, which a huge update could overflow)."""
    filled = {**{k: torch.zeros_like(v) for k, v in sent.items()}, **update}
    problem = check_site_state(filled, sent)
    if problem:
        return None, f"the update: {problem}"
    state = {k: filled[k] if v.dtype == torch.bool else v + filled[k] for k, v in sent.items()}
    problem = check_site_state(state, sent)
    return (None, f"the update: {problem}") if problem else (state, None)
