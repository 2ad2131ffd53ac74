"""The test splits' noise in a paired comparison (fairfl.split_noise, fairfl.uncertainty's influences): against a
brute-force cluster bootstrap that redraws each site's patients, zero for two identical arms (the same patients score
both), independent for splits drawn anew, the statistics' gradients against finite differences, the site's records
invariant to the order of its images, hostile records refused, and the claims' intervals widened by it."""

import math
from dataclasses import replace

import numpy as np
import pytest

from fairfl.benchmark.claims import check_claims, claims_markdown
from fairfl.classification import classification_influence
from fairfl.methods import Claim
from fairfl.paired import mean_interval
from fairfl.site_checks import influence_problem
from fairfl.split_noise import ScoredRun, SplitNoise, split_noise, statistic_columns, statistic_value
from fairfl.uncertainty import (
    balanced_accuracy_influence,
    case_fingerprint,
    case_influence_record,
    cluster_se,
    macro_auc_influence,
    mean_influence,
)

SITES = ("site-1", "site-2", "site-3", "site-4")
T_975_2DOF = 4.302652729911275  # scipy.stats.t.ppf(0.975, 2)


def test_the_statistics_and_their_names():
    scores = {"site-1": 71.0, "site-2": 64.5, "site-3": 58.25, "site-4": 80.0}
    values = np.array(list(scores.values()))
    assert statistic_value(scores, "avg") == pytest.approx(values.mean())
    assert statistic_value(scores, "std") == pytest.approx(values.std())  # population std, as the papers
    assert statistic_value(scores, "worst") == 58.25 and statistic_value(scores, "site:site-4") == 80.0
    for wrong in ("median", "site:site-9", "site-1"):
        with pytest.raises(ValueError):
            statistic_value(scores, wrong)


def simulated_runs(rng, patients=15, slices=3, seeds=3, effect=0.0):
    """Two methods' per-image Dice at 4 sites (patients x slices, the same patients for every run): a patient's
    difficulty shared by both methods and every seed, a method-by-patient interaction, per-run noise."""
    difficulty = {s: rng.normal(0.7, 0.12, patients) for s in SITES}
    interaction = {s: rng.normal(0.0, 0.05, patients) for s in SITES}
    cases = np.repeat(np.arange(patients), slices)
    images = {}
    for method, shift in (("a", effect), ("b", 0.0)):
        for seed in range(seeds):
            per_site = {}
            for site in SITES:
                patient = difficulty[site] + shift + (interaction[site] if method == "a" else 0.0)
                values = np.repeat(patient, slices) + rng.normal(0, 0.03, cases.size) + rng.normal(0, 0.01)
                per_site[site] = np.clip(values, 0, 1)
            images[method, seed] = per_site
    return images, cases


def scored(per_site: dict, cases, rows=None) -> ScoredRun:
    rows = np.arange(cases.size) if rows is None else rows
    scores = {s: 100 * float(v[rows].mean()) for s, v in per_site.items()}
    influences = {s: case_influence_record(mean_influence(v[rows], cases[rows])) for s, v in per_site.items()}
    return ScoredRun(scores, influences)


@pytest.mark.parametrize("statistic", ["avg", "std", "worst", "site:site-2"])
def test_it_agrees_with_a_cluster_bootstrap_of_the_images(statistic):
    """Redraw every site's patients (the same redraw for every run of that site), recompute each run's site scores
    from its images and the mean paired difference: its variance over 3000 redraws is what split_noise tells from the
    influences alone (within 20%: both are Monte Carlo estimates, and a site's score is linearised)."""
    rng = np.random.default_rng(0)
    images, cases = simulated_runs(rng)
    seeds = range(3)
    method = {s: scored(images["a", s], cases) for s in seeds}
    baseline = {s: scored(images["b", s], cases) for s in seeds}
    predicted = split_noise(method, baseline, statistic, seeds)
    patients = int(cases.max()) + 1
    correction = patients / (patients - 1)  # the sandwich's small-sample factor, which split_noise applies
    # each site's score after a redraw: its drawn patients' image sums over their image counts (every image kept)
    counts = np.bincount(cases, minlength=patients)
    drawn = {site: rng.multinomial(patients, np.full(patients, 1 / patients), size=3000) for site in SITES}
    total = np.zeros(3000)
    for s in seeds:
        for sign, key in ((1, "a"), (-1, "b")):
            redrawn = np.stack(
                [
                    100 * (drawn[site] @ np.bincount(cases, images[key, s][site], patients)) / (drawn[site] @ counts)
                    for site in SITES
                ],
                axis=1,
            )
            total += sign * statistic_columns(redrawn, list(SITES), statistic)
    draws = total / len(seeds)
    assert predicted.variance == pytest.approx(correction * np.var(draws), rel=0.2)


def test_identical_arms_have_no_split_noise_but_independent_splits_do():
    """Two runs scored on the same patients share their noise: identical arms differ by exactly 0 on any redraw.
    Treating their errors as independent (the per-site standard errors added) would call it large."""
    rng = np.random.default_rng(1)
    images, cases = simulated_runs(rng)
    same = {s: scored(images["b", s], cases) for s in range(3)}
    assert split_noise(same, same, "avg", range(3)).variance == pytest.approx(0.0, abs=1e-20)
    # the baseline scored on other patients (another fingerprint): the two splits' variances add
    other = {
        s: ScoredRun(run.scores, {site: {**r, "cases": "f" * 16} for site, r in run.influences.items()})
        for s, run in same.items()
    }
    alone = split_noise(same, {s: ScoredRun({k: 0.0 for k in SITES}, {}) for s in range(3)}, "avg", range(3))
    assert alone is None  # a site the statistic depends on reported nothing: not told, never taken as 0
    apart = split_noise(same, other, "avg", range(3))
    single = split_noise(
        same, {s: ScoredRun(dict.fromkeys(SITES, 0.0), same[s].influences) for s in range(3)}, "avg", range(3)
    )
    assert single is not None and apart.variance > single.variance > 0


def test_one_patient_or_mismatched_records_cannot_tell_it():
    one = {
        0: ScoredRun(
            {"site-1": 70.0, "site-2": 60.0},
            {"site-1": {"cases": "a" * 16, "values": [0.0]}, "site-2": {"cases": "b" * 16, "values": [0.1, -0.1]}},
        )
    }
    assert split_noise(one, one, "avg", [0]) is None
    short = {0: ScoredRun({"site-1": 70.0}, {"site-1": {"cases": "a" * 16, "values": [0.1, -0.1, 0.0]}})}
    longer = {0: ScoredRun({"site-1": 70.0}, {"site-1": {"cases": "a" * 16, "values": [0.1, -0.1]}})}
    assert split_noise(short, longer, "avg", [0]) is None  # one fingerprint, two lengths
    assert split_noise(short, short, "avg", []) is None


def test_the_interval_adds_the_split_noise_and_is_never_narrower():
    differences = [1.0, 2.0, 3.0]
    seeds_only = mean_interval(differences)
    both = mean_interval(differences, split=SplitNoise(1.0))
    assert both.split_se == 1.0 and both.mean == seeds_only.mean
    # sd 1 over 3 seeds: variance 1/3 + 1, still t with 2 degrees of freedom
    assert both.high - 2.0 == pytest.approx(T_975_2DOF * math.sqrt(1 / 3 + 1))
    assert mean_interval([2.0, 2.0, 2.0], split=SplitNoise(1.0)).text() == "+2.00 [-2.30, +6.30]"
    assert (
        mean_interval(differences, split=SplitNoise(0.0)).low,
        mean_interval(differences, split=SplitNoise(0.0)).high,
    ) == (seeds_only.low, seeds_only.high)


def test_a_sites_records_do_not_depend_on_the_order_of_its_images():
    rng = np.random.default_rng(2)
    values, cases = rng.uniform(size=30), rng.integers(0, 7, 30).astype(str)
    order = rng.permutation(30)
    record = case_influence_record(mean_influence(values, cases))
    shuffled = case_influence_record(mean_influence(values[order], cases[order]))
    assert shuffled["cases"] == record["cases"] and shuffled["values"] == pytest.approx(record["values"])
    assert record["cases"] == case_fingerprint(sorted(set(cases))) and len(record["values"]) == 7
    assert record["cases"] != case_fingerprint(sorted(set(cases))[1:])
    assert sum(record["values"]) == pytest.approx(0.0, abs=1e-12)  # influences of a mean sum to 0


def bootstrap_sd(statistic, n, rng, draws=4000):
    return float(np.std([statistic(rng.integers(0, n, n)) for _ in range(draws)]))


def test_classification_influences_against_an_image_bootstrap():
    """Balanced accuracy and macro AUC: the influences' standard error is the bootstrap's over redrawn test
    images (within 15%), and each record sums to 0."""
    from sklearn.metrics import balanced_accuracy_score

    from fairfl.classification import macro_ovr_auc

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, 240)
    logits = rng.normal(size=(240, 3)) + 1.5 * np.eye(3)[labels]
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    predictions = probs.argmax(axis=1)
    accuracy_se = cluster_se(balanced_accuracy_influence(labels, predictions))
    auc_se = cluster_se(macro_auc_influence(labels, probs))
    weights = rng.multinomial(240, np.full(240, 1 / 240), size=4000)  # each image drawn w times
    recalls = [
        (weights @ ((labels == c) & (predictions == c))) / (weights @ (labels == c)) for c in range(3)
    ]  # balanced_accuracy_score of each redrawn test set, all at once
    assert balanced_accuracy_score(labels, predictions) == pytest.approx(np.mean([r.mean() for r in recalls]), abs=0.01)
    assert accuracy_se == pytest.approx(float(np.std(np.mean(recalls, axis=0))), rel=0.15)
    assert auc_se == pytest.approx(
        bootstrap_sd(lambda i: macro_ovr_auc(labels[i], probs[i]), 240, rng, draws=800), rel=0.15
    )
    records = classification_influence(labels, probs)
    assert set(records) == {"balanced_accuracy", "auc"}
    assert all(abs(sum(r["values"])) < 1e-9 for r in records.values())
    assert macro_auc_influence(np.zeros(5, int), probs[:5]) is None  # one class: no AUC to move


@pytest.mark.parametrize(
    "record, why",
    [
        ("0.1", "test_influence"),
        ({"dice": {"cases": "a" * 16, "values": [float("nan"), 0.1]}}, "values"),
        ({"dice": {"cases": "a" * 16, "values": [math.inf]}}, "values"),
        ({"dice": {"cases": "a" * 16, "values": [2.0, -0.5]}}, "values"),
        ({"dice": {"cases": "a" * 16, "values": ["0.1"]}}, "values"),
        ({"dice": {"cases": "a" * 16, "values": []}}, "values"),
        ({"dice": {"cases": "a" * 16, "values": [0.0] * 100_001}}, "values"),
        ({"dice": {"cases": "../../etc", "values": [0.1]}}, "cases"),
        ({"dice": {"cases": "a" * 16, "values": [0.1], "ids": ["Case03"]}}, "unknown"),
        ({"dice": {"values": [0.1]}}, "lacks"),
        ({"hd95": {"cases": "a" * 16, "values": [0.1]}}, "does not score"),
    ],
)
def test_a_hostile_influence_record_is_refused(record, why):
    problem = influence_problem(record, {"dice": 0.7})
    assert problem and why in problem
    assert influence_problem({"dice": {"cases": "a" * 16, "values": [0.1, -0.1]}}, {"dice": 0.7}) is None


def run_with_influence(method, seed, images: dict, cases):
    run = scored(images, cases)
    per_site = {s: {"dice": v / 100} for s, v in run.scores.items()}
    return {
        "method": method,
        "seed": seed,
        "metric": "dice",
        "rounds": [{"round": 0, "seconds": 1.0}],
        "final": {"per_site": per_site, "test_influence": {s: {"dice": r} for s, r in run.influences.items()}},
    }


def test_claims_count_the_split_noise_where_the_runs_recorded_it():
    rng = np.random.default_rng(4)
    images, cases = simulated_runs(rng, patients=4, effect=0.02)
    runs = {
        "ditto": [run_with_influence("ditto", s, images["a", s], cases) for s in range(3)],
        "fedavg": [run_with_influence("fedavg", s, images["b", s], cases) for s in range(3)],
    }
    claim = Claim("Ditto", "ditto", "fedavg", "dice", "avg")
    [counted] = check_claims([claim], runs)
    # the same records taken as one shared test set (the same patients at every site): one redraw for all sites
    [shared] = check_claims([claim], runs, shared_test=True)
    assert shared["difference"] == counted["difference"]
    assert shared["interval"]["split_se"] != pytest.approx(counted["interval"]["split_se"], rel=0.05)
    for run_list in runs.values():
        for run in run_list:
            del run["final"]["test_influence"]
    [seeds_only] = check_claims([claim], runs)
    assert counted["difference"] == pytest.approx(seeds_only["difference"])
    width = lambda c: c["interval"]["high"] - c["interval"]["low"]  # noqa: E731
    assert counted["interval"]["split_se"] > 0 and "split_se" not in seeds_only["interval"]
    assert width(counted) > width(seeds_only)
    table = "\n".join(claims_markdown([counted]))
    assert "(test splits: se " in table and "patients as clusters" in table
    assert "test splits" not in "\n".join(claims_markdown([seeds_only]))


@pytest.mark.parametrize("statistic", ["avg", "std", "worst"])
def test_a_shared_test_set_is_redrawn_once_for_every_site(statistic):
    """The quality-shift data scores every site on one shared test set: a redraw of its images moves every site's
    score together. split_noise with `shared_test` agrees with a bootstrap that redraws the images once for all sites
    (within 20%, both Monte Carlo); taking the sites as independent misses the shared part, here most of the mean's."""
    rng = np.random.default_rng(3)
    images, seeds = 60, range(3)
    cases = np.arange(images)
    difficulty = rng.normal(0.0, 0.25, images)  # an image hard for one site is hard for all of them
    values = {
        (method, seed): {
            # method a gains most on the hard images, at every site: the paired differences share the image's part
            site: np.clip(0.6 + difficulty + rng.normal(0.0, 0.1, images) - (method == "a") * 0.3 * difficulty, 0, 1)
            for site in SITES
        }
        for method in ("a", "b")
        for seed in seeds
    }

    def runs(method, shared):
        return {s: replace(scored(values[method, s], cases), shared_test=shared) for s in seeds}

    shared = split_noise(runs("a", True), runs("b", True), statistic, seeds)
    independent = split_noise(runs("a", False), runs("b", False), statistic, seeds)
    drawn = rng.multinomial(images, np.full(images, 1 / images), size=4000)  # one redraw of the images, every site
    total = np.zeros(len(drawn))
    for seed in seeds:
        for sign, method in ((1, "a"), (-1, "b")):
            redrawn = np.stack([100 * drawn @ values[method, seed][site] / images for site in SITES], axis=1)
            total += sign * statistic_columns(redrawn, list(SITES), statistic)
    truth = images / (images - 1) * np.var(total / len(seeds))
    assert shared.variance == pytest.approx(truth, rel=0.2)
    if statistic == "avg":
        assert independent.variance < 0.6 * truth


def test_a_shared_test_set_is_the_built_in_quality_shift_data_and_never_a_data_roots():
    from fairfl.data.builtin import BUILTIN_DATASETS, shared_test_set

    assert {name for name in BUILTIN_DATASETS if shared_test_set(name, "")} == {"skin", "skin_blur", "ich", "ich_blur"}
    assert shared_test_set("skin", None) and not shared_test_set("skin", "/data/hospitals")
    assert not shared_test_set("skin_imbalanced", "") and not shared_test_set("my_own", "")


def test_one_sites_statistic_reads_only_that_sites_record_even_on_a_shared_test_set():
    """`site:site-1` on a shared test set: another site's record under the shared fingerprint but of another length
    (a hostile or broken site) is neither read nor a crash; the noise is site-1's alone."""
    rng = np.random.default_rng(5)
    cases = np.arange(30)
    values = {site: rng.uniform(0, 1, cases.size) for site in SITES}
    honest = replace(scored(values, cases), shared_test=True)
    longer = dict(honest.influences["site-1"], values=[0.5] * (cases.size + 1))
    broken = replace(honest, influences={**honest.influences, "site-2": longer})
    base = {0: replace(scored({site: rng.uniform(0, 1, cases.size) for site in SITES}, cases), shared_test=True)}
    alone = split_noise({0: honest}, base, "site:site-1", [0])
    assert alone is not None and alone.variance > 1.0  # points²: 30 images, scores spread over [0, 100]
    assert split_noise({0: broken}, base, "site:site-1", [0]).variance == alone.variance
