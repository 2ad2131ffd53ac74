"""FedSoup's math (fairfl.methods.fedsoup.soup) against the formulas written out: the soup's start round, the soup's
mean and the patched model by hand, an empty soup (the local model exactly), the mean independent of the order its
ingredients joined, the greedy test with scores that cannot be computed, a 2-D U-Net and a 3-D SegResNet, and hostile
input (NaN, mismatched tensors, a count that does not fit, a broken kept soup)."""

import itertools
import math

import pytest
import torch

from fairfl.methods.fedsoup.soup import first_soup_round, joins, patched_state, soup_problem, with_ingredient
from fairfl.models import build_model

UNET_2D = {"name": "unet", "in_channels": 1, "num_classes": 2, "channels": [4, 8], "strides": [2]}
SEGRESNET_3D = {
    "name": "SegResNet",
    "in_channels": 1,
    "num_classes": 2,
    "spatial_dims": 3,
    "args": {"init_filters": 4, "norm": ["group", {"num_groups": 2}], "blocks_down": [1, 1], "blocks_up": [1]},
}


def state(w, b, steps=0) -> dict:
    """A tiny state dict: two floating tensors and an integer buffer (batch norm's step counter)."""
    return {
        "w": torch.tensor(w, dtype=torch.float64),
        "b": torch.tensor(b, dtype=torch.float64),
        "steps": torch.tensor(steps),
    }


def soup_of(models) -> tuple[dict, int]:
    """The soup (mean, count) the models make, joining in the order given."""
    mean, count = {}, 0
    for model in models:
        mean, count = with_ingredient(mean, count, model), count + 1
    return mean, count


def random_states(spec, count) -> list[dict]:
    states = []
    for seed in range(count):
        torch.manual_seed(seed)
        states.append(build_model(spec).state_dict())
    return states


@pytest.mark.parametrize(
    "start, rounds, first",
    [(0.75, 20, 15), (0.75, 2, 1), (0.75, 1, 0), (0.0, 5, 0), (1.0, 5, 5), (0.29, 100, 29), (0.5, 3, 1)],
)
def test_the_soup_starts_at_floor_of_start_times_rounds_as_the_authors_code_counts(start, rounds, first):
    assert first_soup_round(start, rounds) == first
    # the authors' code: its round counted from 1 above wa_alpha x rounds
    assert first == next((r for r in range(rounds) if r + 1 > start * rounds + 1e-9), rounds)


@pytest.mark.parametrize("start", [-0.1, 1.5, math.nan, True, "0.75", None])
def test_a_bad_start_is_refused_naming_it(start):
    with pytest.raises(ValueError, match="fedsoup_start"):
        first_soup_round(start, 20)
    with pytest.raises(ValueError, match="num_rounds"):
        first_soup_round(0.75, 0)


def test_the_soup_and_the_patched_model_are_the_uniform_averages_written_out_by_hand():
    local, first, second = state([0.0, 0.0], [3.0], steps=7), state([3.0, 6.0], [0.0], 1), state([6.0, 0.0], [3.0], 2)
    mean, count = soup_of([first, second])
    assert count == 2
    assert mean["w"].tolist() == [4.5, 3.0] and mean["b"].tolist() == [1.5] and int(mean["steps"]) == 2  # the newest's
    patched = patched_state(local, mean, count)  # (L + 2 S) / 3 = (L + g1 + g2) / 3
    assert patched["w"].tolist() == pytest.approx([3.0, 2.0]) and patched["b"].tolist() == pytest.approx([2.0])
    assert int(patched["steps"]) == 7  # integer buffers: the local model's
    # the candidate the greedy test scores: the soup with the model offered, then patched
    offered = state([0.0, 3.0], [0.0])
    candidate = patched_state(local, with_ingredient(mean, count, offered), count + 1)  # (L + g1 + g2 + g) / 4
    assert candidate["w"].tolist() == pytest.approx([2.25, 2.25]) and candidate["b"].tolist() == pytest.approx([1.5])


def test_an_empty_soup_patches_nothing_and_its_first_ingredient_is_the_model_offered():
    local, offered = state([1.0, 2.0], [3.0], 4), state([5.0, 6.0], [7.0], 1)
    patched = patched_state(local, {}, 0)
    assert all(torch.equal(patched[k], local[k]) and patched[k] is not local[k] for k in local)
    first = with_ingredient({}, 0, offered)
    assert all(torch.equal(first[k], offered[k]) and first[k] is not offered[k] for k in offered)
    # the first candidate: the local and the offered model half and half
    assert patched_state(local, first, 1)["w"].tolist() == [3.0, 4.0]


def test_the_soup_does_not_depend_on_the_order_its_ingredients_joined():
    models = random_states(UNET_2D, 4)
    expected = {
        k: torch.stack([m[k].double() for m in models]).mean(0) for k in models[0] if models[0][k].is_floating_point()
    }
    for order in itertools.permutations(range(4)):
        mean, _ = soup_of([models[i] for i in order])
        assert all(torch.allclose(mean[k].double(), expected[k], atol=1e-6) for k in expected), order


@pytest.mark.parametrize("spec", [UNET_2D, SEGRESNET_3D], ids=["unet_2d", "segresnet_3d"])
def test_2d_and_3d_networks_take_the_patched_model_and_its_ends_are_exact(spec):
    local, *globals_ = random_states(spec, 4)
    network = build_model(spec)
    mean, count = soup_of(globals_)
    patched = patched_state(local, mean, count)
    network.load_state_dict(patched)  # every tensor, by name, shape and dtype
    floating = [k for k in local if local[k].is_floating_point()]
    assert floating and all(
        torch.allclose(patched[k], (local[k] + sum(g[k] for g in globals_)) / 4, atol=1e-6) for k in floating
    )
    assert all(torch.equal(patched_state(local, {}, 0)[k], local[k]) for k in local)
    assert soup_problem({"round": 3, "soup": mean, "ingredients": [1, 2, 3]}, network.state_dict()) is None


@pytest.mark.parametrize(
    "current, candidate, joined",
    [
        (0.5, 0.5, True),  # a tie joins (Wortsman et al.'s >=)
        (0.5, 0.4, False),
        (0.4, 0.5, True),
        (None, 0.1, True),  # a score beats none
        (0.1, None, False),
        (None, None, True),  # nothing to score: no evidence against the model offered
        (math.nan, math.nan, True),
        (math.nan, 0.0, True),
        (0.0, math.nan, False),
        (1, 1.0, True),
    ],
)
def test_the_greedy_test_a_tie_joins_and_a_score_that_cannot_be_computed_ranks_below_any(current, candidate, joined):
    assert joins(current, candidate) is joined


@pytest.mark.parametrize("bad", ["0.5", True, [0.5]])
def test_a_score_that_is_no_number_is_refused(bad):
    with pytest.raises(ValueError, match="a validation score must be a number or None"):
        joins(bad, 0.5)


def test_hostile_input_is_refused_and_nothing_given_is_changed():
    local, offered = state([1.0, 2.0], [3.0]), state([5.0, 6.0], [7.0])
    before = {k: v.clone() for k, v in local.items()}
    mean, count = soup_of([state([0.0, 0.0], [0.0])])
    broken = {**offered, "b": torch.tensor([math.nan], dtype=torch.float64)}
    with pytest.raises(ValueError, match="NaN or Inf in b"):
        with_ingredient(mean, count, broken)
    with pytest.raises(ValueError, match="NaN or Inf in w"):
        with_ingredient({}, 0, {**offered, "w": torch.tensor([math.inf, 0.0], dtype=torch.float64)})
    with pytest.raises(ValueError, match=r"the local model and the soup differ in their tensors: \['extra'\]"):
        patched_state({**local, "extra": torch.zeros(1)}, mean, count)
    with pytest.raises(ValueError, match=r"the soup and the model offered to it differ in their tensors: \['w'\]"):
        with_ingredient(mean, count, {k: v for k, v in offered.items() if k != "w"})
    with pytest.raises(ValueError, match=r"differ in the shape of w: \(3,\), \(2,\)"):
        patched_state({**local, "w": torch.zeros(3, dtype=torch.float64)}, mean, count)
    for bad_count, soup in ((0, mean), (2, {}), (-1, mean), (True, mean), (1.0, mean)):
        with pytest.raises(ValueError, match="ingredients"):
            patched_state(local, soup, bad_count)
    assert all(torch.equal(local[k], before[k]) for k in local) and mean["w"].tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    "damage, message",
    [
        ("unsorted", "not distinct rounds in ascending order"),
        ("repeated", "not distinct rounds in ascending order"),
        ("after_its_round", "not distinct rounds in ascending order"),
        ("not_a_list", "not distinct rounds in ascending order"),
        ("no_soup", "is a NoneType, not a dict of tensors"),
        ("tensors_without_ingredients", "holds tensors but no ingredients"),
        ("missing_tensor", "missing keys"),
        ("other_shape", "shape mismatch"),
        ("other_dtype", "dtype mismatch"),
        ("nan", "NaN in"),
    ],
)
def test_a_broken_kept_soup_is_found_and_said_why(damage, message):
    reference = build_model(UNET_2D).state_dict()
    mean, _ = soup_of(random_states(UNET_2D, 2))
    saved = {"round": 5, "soup": mean, "ingredients": [3, 5]}
    key = next(iter(mean))
    if damage == "unsorted":
        saved["ingredients"] = [5, 3]
    elif damage == "repeated":
        saved["ingredients"] = [3, 3]
    elif damage == "after_its_round":
        saved["ingredients"] = [3, 6]
    elif damage == "not_a_list":
        saved["ingredients"] = "3, 5"
    elif damage == "no_soup":
        saved["soup"] = None
    elif damage == "tensors_without_ingredients":
        saved["ingredients"] = []
    elif damage == "missing_tensor":
        del mean[key]
    elif damage == "other_shape":
        mean[key] = torch.zeros(3)
    elif damage == "other_dtype":
        mean[key] = mean[key].double()
    else:
        mean[key].view(-1)[0] = math.nan
    assert message in soup_problem(saved, reference)
    assert soup_problem({"round": 2, "soup": {}, "ingredients": []}, reference) is None  # empty: nothing joined yet
