"""FedFloor's math: the interpolation of the global and personal models, the grid and the choice."""

import math

import pytest
import torch

from fairfl.methods.fedfloor.mixing import DEFAULT_GRID, check_grid, choose_alpha, mix_states
from fairfl.models import build_model


def _two_models():
    torch.manual_seed(0)
    spec = {"name": "unet", "channels": [4, 8], "strides": [2], "norm": "batch"}
    global_model, personal_model = build_model(spec), build_model(spec)
    for p in personal_model.parameters():
        p.data.add_(torch.randn_like(p))
    for b in personal_model.buffers():
        if b.is_floating_point():
            b.add_(1.0)
        else:
            b.fill_(7)
    return global_model.state_dict(), personal_model.state_dict()


def test_the_ends_are_exactly_the_two_models_and_the_middle_is_their_mean():
    g, p = _two_models()
    assert all(torch.equal(mix_states(g, p, 0.0)[k], g[k]) for k in g)
    assert all(torch.equal(mix_states(g, p, 1.0)[k], p[k]) for k in g)
    half = mix_states(g, p, 0.5)
    for k in g:
        if g[k].is_floating_point():
            assert torch.allclose(half[k], (g[k] + p[k]) / 2, atol=1e-6), k
        else:  # batch norm's step counter: the nearer model's (a tie: the personal one)
            assert torch.equal(half[k], p[k]) and torch.equal(mix_states(g, p, 0.25)[k], g[k])
    quarter = mix_states(g, p, 0.25)
    key = next(k for k in g if g[k].is_floating_point() and not torch.equal(g[k], p[k]))
    assert torch.allclose(quarter[key], 0.75 * g[key] + 0.25 * p[key], atol=1e-6)


def test_mixing_never_changes_its_inputs():
    g, p = _two_models()
    g0, p0 = {k: v.clone() for k, v in g.items()}, {k: v.clone() for k, v in p.items()}
    for alpha in DEFAULT_GRID:
        mixed = mix_states(g, p, alpha)
        for v in mixed.values():
            v.add_(1) if v.is_floating_point() else None  # a caller changing the result changes neither input
    assert all(torch.equal(g[k], g0[k]) and torch.equal(p[k], p0[k]) for k in g)


def test_models_that_do_not_match_are_an_error():
    g, p = _two_models()
    with pytest.raises(ValueError, match="differ in their tensors"):
        mix_states(g, {k: v for k, v in list(p.items())[1:]}, 0.5)
    key = next(iter(g))
    with pytest.raises(ValueError, match=f"{key}: global"):
        mix_states(g, {**p, key: torch.zeros(3)}, 0.5)
    with pytest.raises(ValueError, match="alpha must be in"):
        mix_states(g, p, 1.5)


def test_the_choice_takes_the_best_score_and_a_tie_goes_to_the_global_side():
    assert choose_alpha({0.0: 0.70, 0.25: 0.74, 0.5: 0.72, 1.0: 0.60}) == 0.25
    assert choose_alpha({1.0: 0.8, 0.5: 0.8, 0.0: 0.7}) == 0.5  # the tie: nearer the global model
    # the order the scores come in does not matter
    scores = {0.0: 0.5, 0.25: 0.9, 0.5: 0.9, 0.75: 0.1, 1.0: 0.9}
    assert choose_alpha(dict(reversed(list(scores.items())))) == choose_alpha(scores) == 0.25


def test_nothing_to_score_never_wins_and_no_score_at_all_keeps_the_global_model():
    assert choose_alpha({0.0: None, 0.5: 0.3, 1.0: math.nan}) == 0.5
    assert choose_alpha({0.0: None, 1.0: math.nan}) == 0.0
    assert choose_alpha({}) == 0.0


@pytest.mark.parametrize("bad", [[], [0.5, 0.5], [-0.1, 1], [0, 1.01], "0,1", None, [True, 1], [0, "1"], 0.5])
def test_a_bad_grid_is_refused(bad):
    with pytest.raises(ValueError, match="mix_grid"):
        check_grid(bad)


def test_the_grid_is_sorted_floats():
    assert check_grid([1, 0, 0.5]) == (0.0, 0.5, 1.0)


def test_the_report_shows_each_sites_final_mix_and_which_model_was_scored():
    from fairfl.methods.fedfloor.report import mix_table

    def run(seed, mixes):
        per_site = {s: {"dice": 0.7, "mix_alpha": a} for s, a in mixes.items()}
        return {"method": "fedfloor", "seed": seed, "config": {}, "final": {"per_site": per_site}}

    runs = [run(0, {"site-1": 0.0, "site-2": 0.5}), run(1, {"site-1": 1.0, "site-2": 0.5}), run(2, {"site-1": 0.0})]
    text, stats = mix_table(runs)
    assert "| FedFloor | 0.33 ± 0.58 (2/0/1) | 0.50 ± 0.00 (0/2/0) |" in text
    assert stats["fedfloor"]["site-2"] == [0.5, 0.5]
    assert mix_table([{"method": "fedavg", "seed": 0, "final": {"per_site": {"site-1": {"dice": 0.7}}}}]) == ("", {})
