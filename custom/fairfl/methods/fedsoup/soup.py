"""FedSoup's math (Chen, Jiang, Dou, Wang and Li, "FedSoup: Improving Generalization and Personalization in Federated
Learning via Selective Model Interpolation", MICCAI 2023): a site's soup of global models, the patched model it is
scored with, and the greedy test that grows its soup. Plain PyTorch, no FLARE.

A site's soup is the uniform average S of the n global models it has selected (the paper's client-specific global
model pool), kept as that mean with the rounds of its n ingredients: a mean of one model's size however many joined.
Its personalised model is its local model L (the model it trained in its last round) averaged uniformly with the
pool's models, L counted as one more ingredient (federated model patching, with the authors' code's weights):

    P(L, S, n) = (L + n S) / (n + 1)          P(L, S, 0) = L exactly

From the soup's start on, after its local training of a round, the site offers the global model g it was sent that
round to its soup (temporal model selection: the greedy soup of Wortsman et al., ICML 2022). With g the soup would be

    S' = S + (g - S) / (n + 1)                the mean of the n + 1 models

and g joins when P(L, S', n + 1) scores at least as well on the site's validation split as P(L, S, n) (`joins`).

Every floating tensor is averaged, buffers included (batch norm's running statistics); an integer tensor (batch norm's
step counter) is the local model's in P and the newest ingredient's in S."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from fairfl.methods.fedsoup.arguments import START
from fairfl.site_checks import check_site_state


def first_soup_round(start: float, num_rounds: int) -> int:
    """The first round, counted from 0, of a run of `num_rounds` rounds whose training offers the model sent to the
    soup: floor(start x num_rounds), as the authors' code starts when its round counted from 1 is above
    wa_alpha x rounds; num_rounds itself (never) at start 1."""
    START.checked("fedsoup_start", start)
    if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or num_rounds < 1:
        raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
    return math.floor(round(start * num_rounds, 9))  # rounded first: 0.29 x 100 is 28.999999999999996 in floats


def _same_tensors(state: Mapping, other: Mapping, what: str) -> None:
    """A ValueError naming the first tensor `state` and `other` (`what` names them) do not share by name and shape."""
    differ = sorted(set(state) ^ set(other))
    if differ:
        raise ValueError(f"{what} differ in their tensors: {differ[:3]}")
    for key, tensor in state.items():
        if tensor.shape != other[key].shape:
            raise ValueError(f"{what} differ in the shape of {key}: {tuple(tensor.shape)}, {tuple(other[key].shape)}")


def _count(count: int, soup: Mapping) -> int:
    """`count` (the soup's number of ingredients) if it is a whole number >= 0 that fits `soup` (empty at 0 only)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"a soup's number of ingredients must be an integer >= 0, got {count!r}")
    if (count == 0) != (not soup):
        raise ValueError(f"a soup of {count} ingredients holds {len(soup)} tensors")
    return count


def patched_state(local: Mapping[str, torch.Tensor], soup: Mapping[str, torch.Tensor], count: int) -> dict:
    """P(L, S, n): the local model `local` averaged with the `count` global models whose mean is `soup`, L weighing
    1 / (n + 1), in L's dtype and on its device; exactly L (cloned) with an empty soup; integer tensors L's. Nothing
    given is changed."""
    if _count(count, soup) == 0:
        return {key: tensor.detach().clone() for key, tensor in local.items()}
    _same_tensors(local, soup, "the local model and the soup")
    share = count / (count + 1)
    return {
        key: torch.lerp(tensor.detach(), soup[key].to(tensor.device, tensor.dtype), share)
        if tensor.is_floating_point()
        else tensor.detach().clone()
        for key, tensor in local.items()
    }


def with_ingredient(soup: Mapping[str, torch.Tensor], count: int, new: Mapping[str, torch.Tensor]) -> dict:
    """S': the mean of the `count` models whose mean is `soup` and the model `new`, in `new`'s dtype and on its
    device; `new` itself (cloned) for an empty soup; integer tensors `new`'s. A `new` holding NaN or Inf is refused,
    naming the tensor: it would spoil every later round's soup. Nothing given is changed."""
    for key, tensor in new.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"the model offered to the soup holds NaN or Inf in {key}")
    if _count(count, soup) == 0:
        return {key: tensor.detach().clone() for key, tensor in new.items()}
    _same_tensors(soup, new, "the soup and the model offered to it")
    return {
        key: torch.lerp(soup[key].to(tensor.device, tensor.dtype), tensor.detach(), 1.0 / (count + 1))
        if tensor.is_floating_point()
        else tensor.detach().clone()
        for key, tensor in new.items()
    }


def _usable(score) -> float | None:
    """`score` as a float, None for None or NaN (a validation split with nothing to score); another value is refused."""
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise ValueError(f"a validation score must be a number or None, got {score!r}")
    return None if math.isnan(score) else float(score)


def joins(current, candidate) -> bool:
    """Whether the global model offered joins the soup: the validation score of the site's model patched with the soup
    and it (`candidate`) is at least that of its model patched with the soup as it is (`current`): Wortsman et al.'s
    greedy test, a tie joining. A score that cannot be computed (None or NaN) ranks below every number, and two such
    tie: a site whose validation split scores nothing adds every model offered (the uniform soup)."""
    current, candidate = _usable(current), _usable(candidate)
    if candidate is None:
        return current is None
    return current is None or candidate >= current


def soup_problem(saved: Mapping, reference: Mapping[str, torch.Tensor]) -> str | None:
    """Why `saved` (a kept version, {"round", "soup", "ingredients"}) is no soup of the network `reference` (its state
    dict; meta tensors will do), or None: its ingredients not distinct rounds in ascending order up to its own round,
    its soup not empty exactly when they are, or not fitting `reference` (names, shapes, dtypes, finite values)."""
    ingredients, soup = saved.get("ingredients"), saved.get("soup")
    if not (
        isinstance(ingredients, list)
        and all(type(r) is int and 0 <= r <= saved["round"] for r in ingredients)
        and ingredients == sorted(set(ingredients))
    ):
        return f"ingredients are {ingredients!r}, not distinct rounds in ascending order up to the file's round"
    if not isinstance(soup, dict):
        return f"is a {type(soup).__name__}, not a dict of tensors"
    if not ingredients:
        return None if not soup else "holds tensors but no ingredients"
    problem = check_site_state(soup, reference)
    return f"does not fit this job's network: {problem}" if problem else None
