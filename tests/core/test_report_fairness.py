"""The report's fairness tables on synthetic results files, their numbers against hand computations: performance
fairness against Solo, the sites' contributions (FedCE, CFFL and CGSV) and their agreement with leave-one-out, and
FedISM+'s clean and corrupted test sets, and every method against FedAvg."""

import json
import math

import pytest

from fairfl.fairness import contribution_agreement
from fairfl.loo import load_loo
from fairfl.methods.fedce.report import contribution_table
from fairfl.methods.fedism.report import quality_shift_table
from fairfl.report.baseline import baseline_table
from fairfl.report.document import make_report
from fairfl.report.fairness_tables import (
    contribution_agreement_table,
    contribution_estimates,
    performance_fairness_table,
)
from fairfl.report.runs import load_runs

from report_runs import LOO, SITES, fedavg_weights, per_site, table_rows, write_run


def test_performance_fairness_table_by_hand(runs_dir):
    table, stats = performance_fairness_table(load_runs(runs_dir))
    # Solo (70, 80, 60); FedAvg (80, 90, 70): r = 1, d = sqrt(3 * 10^2)
    assert stats["fedavg"]["pearson"] == pytest.approx(1.0)
    assert stats["fedavg"]["euclidean"] == pytest.approx(300**0.5)
    # Fed-LWR averaged over its two seeds first: (86, 89, 84); minus means (-1/3, 8/3, -7/3) and (0, 10, -10)
    assert stats["fedlwr"]["pearson"] == pytest.approx(50 / math.sqrt((38 / 3) * 200))
    assert stats["fedlwr"]["euclidean"] == pytest.approx(math.sqrt(16**2 + 9**2 + 24**2))
    assert stats["fedlwr"]["seeds"] == 2 and stats["fedlwr"]["reference"] == "solo"
    rows, header = table_rows(table)
    assert header == ["Method", "Pearson r (p)", "Euclidean distance", "compared with", "seeds (method / Solo)"]
    assert rows["FedAvg"][0].startswith("**1.000** (") and rows["FedAvg"][1] == "**17.32**"
    assert rows["Fed-LWR"][1:] == ["30.22", "Solo", "2 / 1"] and "Solo" not in rows


def test_performance_fairness_needs_solo_and_the_same_sites(tmp_path, runs_dir):
    runs = load_runs(runs_dir)
    assert performance_fairness_table([r for r in runs if r["method"] != "solo"]) == ("", {})
    other = write_run(tmp_path / "x" / "results.json", "fedprox", 0, [0.8, 0.9, 0.7])
    data = json.loads(other.read_text())
    data["final"]["per_site"]["site-4"] = {"dice": 0.5}
    other.write_text(json.dumps(data))
    table, stats = performance_fairness_table(runs + load_runs(other))
    assert "fedprox" not in stats and "FedProx is not compared: its sites differ from Solo's" in table


def test_contribution_table_marks_free_riders(fedce_dir):
    runs = load_runs(fedce_dir)
    table, stats = contribution_table(runs)
    key = "fedce_sum (free riders: site-3)"
    assert list(stats) == [key]
    assert stats[key]["contributions"]["site-1"] == pytest.approx((0.55, math.sqrt(0.005)))
    assert stats[key]["gradient"]["site-3"] == pytest.approx((0.2, 0.0))
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| FedCE")]
    assert rows[0][1:] == ["contribution", "0.550 ± 0.071", "0.350 ± 0.071", "0.100 ± 0.000 †", "2 |"]
    assert [r[1] for r in rows] == ["contribution", "gradient term", "data term"]
    assert rows[0][0] == "| FedCE (Sum.) (free riders: site-3)" and "† free rider" in table


def test_contribution_estimates(tmp_path):
    run = json.loads(write_run(tmp_path / "r.json", "fedavg", 0, [0.8] * 3, round_fields=fedavg_weights).read_text())
    # the mean over rounds counts the round where site-3 was rejected as weight 0
    assert contribution_estimates(run) == {
        "aggregation weights": pytest.approx(
            {"site-1": (3 * 0.5 + 0.625) / 4, "site-2": (3 * 0.3 + 0.375) / 4, "site-3": 3 * 0.2 / 4}
        )
    }


def test_contribution_agreement_table(tmp_path, fedce_dir):
    loo = load_loo(tmp_path / "loo.json")
    table, stats = contribution_agreement_table(load_runs(fedce_dir), loo)
    fedce = stats["fedce_sum (free riders: site-3)"]["final contributions"]
    expected = contribution_agreement({"site-1": 0.55, "site-2": 0.35, "site-3": 0.10}, LOO["marginal"])
    assert fedce == pytest.approx({**expected, "seeds": 2})
    fedavg = stats["fedavg"]["aggregation weights"]
    assert fedavg["seeds"] == 1  # only the FedAvg run that records weights
    assert fedavg["euclidean"] == pytest.approx(
        contribution_agreement({"site-1": 0.53125, "site-2": 0.31875, "site-3": 0.15}, LOO["marginal"])["euclidean"]
    )
    assert list(stats["fedlwr"]) == ["layer weights, mean over layers"] and "solo" not in stats
    lines = table.splitlines()
    assert "| leave-one-out | +0.500 | +0.333 | -0.167 |" in lines  # 0.03, 0.02, -0.01 over 0.06
    assert "| FedCE (Sum.) (free riders: site-3): final contributions | +0.550 | +0.350 | +0.100 |" in lines


def classification_sites(clean, corrupted, corrupted_sites=("site-3",)):
    """{site: metrics} as the executor reports them: clean_*, corrupted_*, and own quality unprefixed."""
    result = {}
    for site, c, k in zip(SITES, clean, corrupted, strict=True):
        own = k if site in corrupted_sites else c
        result[site] = {
            "clean_accuracy": c - 0.1,
            "clean_auc": c,
            "corrupted_accuracy": k - 0.1,
            "corrupted_auc": k,
            "accuracy": own - 0.1,
            "auc": own,
            "corrupted_site": float(site in corrupted_sites),
        }
    return result


def test_quality_shift_table_by_hand(tmp_path):
    for method, seed, clean, corrupted in (
        ("fedavg", 0, 0.90, 0.60),
        ("fedavg", 1, 0.92, 0.62),
        ("fedismplus_s", 0, 0.89, 0.70),
    ):
        data = {
            "schema": 1,
            "method": method,
            "task": "classification",
            "metric": "auc",
            "seed": seed,
            "sites": SITES,
            "config": {"dataset": "skin"},
            "rounds": [],
            "final": {"per_site": classification_sites([clean] * 3, [corrupted] * 3)},
        }
        (tmp_path / f"{method}{seed}").mkdir()
        (tmp_path / f"{method}{seed}" / "results.json").write_text(json.dumps(data))
    result = make_report([tmp_path], tmp_path / "report")
    stats = result["quality_shift"]
    assert stats["fedavg"]["Clean AUC"][0] == pytest.approx(91.0)
    assert stats["fedavg"]["Clean AUC"][1] == pytest.approx(math.sqrt(2))  # sample sd over the two seeds
    assert stats["fedavg"]["Corrupted ACC"][0] == pytest.approx(51.0)
    assert stats["fedavg"]["Average AUC"][0] == pytest.approx(76.0)
    # own quality: sites 1-2 clean (90), site 3 corrupted (60): population std sqrt(200)
    assert stats["fedavg"]["Std. AUC"][0] == pytest.approx((math.sqrt(200) + math.sqrt(200)) / 2)
    assert stats["fedismplus_s"]["Std. AUC"] == (pytest.approx(math.sqrt(2 * 19**2 / 9)), None)
    rows, header = table_rows(result["tables"]["quality_shift"])
    assert (
        header[-1] == "Std. AUC" and rows["FedISM+ (S)"][3] == "**70.00**" and rows["FedISM+ (S)"][-1].startswith("**")
    )
    assert "## Clean and corrupted test sets" in result["report"].read_text()
    assert quality_shift_table(
        [{**r, "final": {"per_site": per_site(v)}} for r, v in ((dict(method="fedavg", seed=0, config={}), [0.5] * 3),)]
    ) == ("", {})


def test_contribution_tables_include_cffl_and_cgsv_reputations(tmp_path):
    for method, final in (("cffl", [0.5, 0.3, 0.2]), ("cgsv", [0.2, 0.2, 0.6])):
        write_run(
            tmp_path / method / "results.json",
            method,
            0,
            [0.8, 0.9, 0.7],
            final_fields={"contributions": dict(zip(SITES, final, strict=True))},
        )
    runs = load_runs(tmp_path)
    table, stats = contribution_table(runs)
    assert set(stats) == {"cffl", "cgsv"} and stats["cgsv"]["contributions"]["site-3"] == pytest.approx((0.6, None))
    assert "| CFFL | contribution | 0.500" in table and "| CGSV | contribution |" in table
    _, values = contribution_agreement_table(runs, LOO)  # compared with leave-one-out like FedCE's
    assert {"final contributions"} == set(values["cffl"]) == set(values["cgsv"])


def test_the_report_compares_each_method_with_fedavg_seed_by_seed_per_site_and_in_mean_worst_and_std(tmp_path):
    finals = {
        ("fedavg", 0): [0.80, 0.90, 0.70],
        ("fedavg", 1): [0.82, 0.92, 0.74],
        ("fedlwr", 0): [0.85, 0.88, 0.82],
        ("fedlwr", 1): [0.87, 0.90, 0.86],
        ("solo", 0): [0.70, 0.80, 0.60],  # seed 0 only: one paired seed, no interval
    }
    for (method, seed), final in finals.items():
        write_run(tmp_path / "runs" / f"{method}{seed}" / "results.json", method, seed, final)
    runs = load_runs([tmp_path / "runs"])
    table, stats = baseline_table(runs)
    assert list(stats) == ["solo", "fedlwr"]  # FedAvg itself is the baseline
    lwr = stats["fedlwr"]
    assert [lwr["sites"][s].mean for s in SITES] == [pytest.approx(5.0), pytest.approx(-2.0), pytest.approx(12.0)]
    assert lwr["mean"].mean == pytest.approx(5.0) and lwr["worst"].mean == pytest.approx(12.0)
    population_std = lambda v: math.sqrt(sum((x - sum(v) / 3) ** 2 for x in v) / 3)  # noqa: E731
    std_differences = [
        100 * (population_std(finals[("fedlwr", s)]) - population_std(finals[("fedavg", s)])) for s in (0, 1)
    ]
    assert lwr["std"].mean == pytest.approx(sum(std_differences) / 2) and lwr["std"].n == 2
    assert lwr["std"].low < lwr["std"].mean < lwr["std"].high  # the two seeds differ: an interval of some width
    rows, header = table_rows(table)
    assert header == ["Method", *SITES, "Avg.", "Worst", "Std.", "paired seeds"]
    assert rows["Solo"][-1] == "1" and rows["Solo"][0] == "-10.00 (1 seed)" and rows["Fed-LWR"][-1] == "2"
    assert rows["Fed-LWR"][0] == "+5.00 [+5.00, +5.00]"  # the same difference in both seeds
    report = make_report([tmp_path / "runs"], tmp_path / "report")
    assert report["against_fedavg"] == stats and "## Against FedAvg" in report["report"].read_text()
    # without a FedAvg run there is nothing to compare with: no section
    assert baseline_table([r for r in runs if r["method"] != "fedavg"]) == ("", {})
