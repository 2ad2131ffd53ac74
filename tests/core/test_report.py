"""`fairfl report` on synthetic results files: the table's numbers, the files found, the figures written."""

import csv
import json
import math

import numpy as np
import pytest

from fairfl.fairness import contribution_agreement
from fairfl.loo import load_loo
from fairfl.methods.fedce.report import contribution_table, plot_contributions
from fairfl.methods.fedism.report import quality_shift_table
from fairfl.methods.fedlwr.report import plot_layer_weights, short_names
from fairfl.report.command import main as report_main
from fairfl.report.document import SECTIONS, make_report, report_sections
from fairfl.report.fairness_tables import (
    contribution_agreement_table,
    contribution_estimates,
    performance_fairness_table,
)
from fairfl.report.figures import plot_cross_site
from fairfl.report.global_model import personal_global_table
from fairfl.report.parts import GroupFigure, RunFigure, Section, method_parts, ordered
from fairfl.report.runs import find_results, load_runs, with_final
from fairfl.report.site_tables import paper_table, spread_table, write_csv

SITES = ["site-1", "site-2", "site-3"]
LAYERS = [
    "model.0.conv.unit0.conv",
    "model.0.residual",
    "model.1.submodule.0.conv.unit0.conv",
    "model.1.submodule.1.submodule.0.conv.unit0.conv",
    "model.2.1.conv.unit0.conv",
]
FINAL = {  # (method, seed): final Dice per site
    ("solo", 0): [0.70, 0.80, 0.60],  # Avg. 70.00, Std. 8.16 (population; the sample sd would be 10.00)
    ("fedavg", 0): [0.80, 0.90, 0.70],  # Avg. 80.00, Std. 8.16
    ("fedlwr", 0): [0.85, 0.88, 0.82],  # Avg. 85.00, Std. sqrt(6) = 2.449
    ("fedlwr", 1): [0.87, 0.90, 0.86],  # Avg. 87.67, Std. 1.700
}


def per_site(values, regions=False):
    """{site: {"dice": v}}; with regions also fundus-like dice_disc = v + 0.05 and dice_cup = v - 0.05."""
    return {
        s: {"dice": v, **({"dice_disc": v + 0.05, "dice_cup": v - 0.05} if regions else {})}
        for s, v in zip(SITES, values)
    }


def write_run(
    path,
    method,
    seed,
    final,
    schema=1,
    layer_weights=False,
    finished=True,
    config=None,
    regions=False,
    round_fields=None,
    final_fields=None,
):
    """A results.json like fairfl.results.ResultsLog writes: 4 rounds, evaluated at 0, 2 and 3, then `final`.
    round_fields(r) -> extra fields of round r; final_fields: extra fields of `final`."""
    rounds = []
    for r in range(4):
        record = {"round": r, "seconds": 10.0, "train": {s: {"train_loss": 0.5 - 0.1 * r} for s in SITES}}
        if r != 1:
            record["per_site"] = per_site([v - 0.05 * (3 - r) for v in final], regions)
        if layer_weights:
            w = [1 / 3 + 0.02 * r, 1 / 3, 1 / 3 - 0.02 * r]
            record["layer_weights"] = {
                layer: dict(zip(SITES, np.roll(w, i).tolist())) for i, layer in enumerate(LAYERS)
            }
        if r == 2:
            record["rejected"] = {"site-3": "NaN in model.0.conv.weight"}
        record.update(round_fields(r) if round_fields else {})
        rounds.append(record)
    data = {
        "schema": schema,
        "method": method,
        "task": "segmentation",
        "metric": "dice",
        "seed": seed,
        "sites": SITES,
        "config": config or {},
        "started": "2026-11-22T13:00:00",
        "rounds": rounds,
        "final": {"per_site": per_site(final, regions), **(final_fields or {})} if finished else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def runs_dir(tmp_path):
    """Simulator-shaped workspaces, one per run, plus a Fed-LWR run that never finished."""
    for (method, seed), final in FINAL.items():
        write_run(
            tmp_path / "runs" / f"{method}_s{seed}" / "server" / "simulate_job" / "results.json",
            method,
            seed,
            final,
            layer_weights=method == "fedlwr",
        )
    write_run(
        tmp_path / "runs" / "fedlwr_s2" / "server" / "simulate_job" / "results.json",
        "fedlwr",
        2,
        [0.5, 0.6, 0.7],
        finished=False,
    )
    return tmp_path / "runs"


def table_rows(table):
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("|")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[2:]}, [c.strip() for c in rows[0]]


def test_find_results(tmp_path, runs_dir):
    ws = runs_dir / "fedavg_s0"
    results = ws / "server" / "simulate_job" / "results.json"
    assert find_results(results) == [results]
    assert find_results(ws) == [results]
    assert find_results(results.parent) == [results]
    found = find_results(runs_dir)
    assert len(found) == 5 and found == sorted(found)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        find_results(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="missing"):
        find_results(tmp_path / "missing")


def test_load_runs_checks_schema_and_deduplicates(tmp_path, runs_dir):
    bad = write_run(tmp_path / "old" / "results.json", "fedavg", 0, [0.5] * 3, schema=0)
    with pytest.raises(ValueError, match=f"{bad}.*schema 0"):
        load_runs([bad])
    broken = tmp_path / "broken" / "results.json"
    broken.parent.mkdir()
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=str(broken)):
        load_runs(broken)
    ws = runs_dir / "solo_s0"
    runs = load_runs([ws, ws / "server" / "simulate_job" / "results.json"])
    assert len(runs) == 1 and runs[0]["method"] == "solo" and runs[0]["file"].endswith("results.json")


def test_paper_table_numbers(runs_dir):
    table = paper_table(load_runs([runs_dir]))
    rows, header = table_rows(table)
    assert header == ["Method", *SITES, "Avg.", "Std.", "Seeds"]
    assert list(rows) == ["Solo", "FedAvg", "Fed-LWR"]
    assert rows["Solo"] == ["70.00", "80.00", "60.00", "70.00", "8.16", "1"]  # population std, not 10.00
    assert rows["FedAvg"] == ["80.00", "90.00", "70.00", "80.00", "8.16", "1"]
    stds = [np.std([85, 88, 82]), np.std([87, 90, 86])]
    assert rows["Fed-LWR"] == [
        "86.00 ± 1.41",
        "89.00 ± 1.41",
        "84.00 ± 2.83",
        f"**{np.mean([85, 87.6667]):.2f} ± {np.std([85, 87.6667], ddof=1):.2f}**",
        f"**{np.mean(stds):.2f} ± {np.std(stds, ddof=1):.2f}**",
        "2",
    ]
    assert rows["Fed-LWR"][3] == "**86.33 ± 1.89**" and rows["Fed-LWR"][4] == "**2.07 ± 0.53**"
    assert "fedlwr_s2" in table and "no final evaluation" in table  # the unfinished run is named, not counted


def test_single_runs_have_no_seed_column_and_bold_the_best(runs_dir):
    runs = [r for r in load_runs(runs_dir) if r["seed"] == 0]
    rows, header = table_rows(paper_table(runs))
    assert header[-1] == "Std." and "Seeds" not in header
    assert rows["Fed-LWR"][-2:] == ["**85.00**", "**2.45**"] and rows["FedAvg"][-2:] == ["80.00", "8.16"]


def test_csv(tmp_path, runs_dir):
    path = write_csv(load_runs(runs_dir), tmp_path / "results.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * (len(SITES) + 3)  # 4 finished runs x (sites + mean, std, worst)
    solo = {r["site"]: float(r["percent"]) for r in rows if r["method"] == "solo"}
    assert solo == pytest.approx(
        {"site-1": 70, "site-2": 80, "site-3": 60, "mean": 70, "std": 8.165, "worst": 60}, abs=1e-3
    )


def test_short_layer_names_are_unique():
    labels = short_names(LAYERS)
    assert labels == [
        "0.conv.unit0.conv",
        "0.residual",
        "1.s.0.conv.unit0.conv",
        "1.s.1.s.0.conv.unit0.conv",
        "2.1.conv.unit0.conv",
    ]
    assert short_names(["a.sequence.x", "a.submodule.x"]) == ["sequence.x", "submodule.x"]  # no clash


def is_png(path, min_bytes=10_000):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > min_bytes


def test_make_report(tmp_path, runs_dir):
    out = tmp_path / "report"
    result = make_report([runs_dir], out)
    names = sorted(f.name for f in result["figures"])
    assert names == [
        "convergence.png",
        "layer_weights_fedlwr_seed0.png",
        "layer_weights_fedlwr_seed1.png",
        "per_site.png",
    ]
    assert all(is_png(f) for f in result["figures"])
    text = result["report"].read_text()
    assert result["table"] in text and (out / "results.csv").exists()
    assert all(f"]({name})" in text for name in names)
    assert text.count("1 rejected site update(s)") == 5 and "40.0 s" in text and "not finished" in text
    assert "## Spread across sites" in text and result["tables"]["spread"] in text
    assert result["spread"]["solo"]["p50"] == (70.0, None)


def test_layer_weights_skipped_without_them(tmp_path, runs_dir):
    run = load_runs(runs_dir / "fedavg_s0")[0]
    assert plot_layer_weights(run, tmp_path / "lw.png") is None and not (tmp_path / "lw.png").exists()


def test_command_line(runs_dir, capsys):
    assert report_main([str(runs_dir / "fedlwr_s0"), str(runs_dir / "fedavg_s0")]) == 0
    printed = capsys.readouterr().out
    assert "| Fed-LWR |" in printed and str(runs_dir / "fedlwr_s0" / "report" / "report.md") in printed
    assert report_main([str(runs_dir / "nowhere")]) == 1
    assert "nowhere" in capsys.readouterr().err


# ---------------------------------------------------------------- the FedCE paper's tables

FEDCE_CONTRIBUTIONS = {0: [0.5, 0.4, 0.1], 1: [0.6, 0.3, 0.1]}  # seed -> final contributions; site-3 free rider
FEDAVG_WEIGHTS = [0.5, 0.3, 0.2]  # every round but round 2, where site-3 was rejected: (0.625, 0.375, -)
LOO = {
    "job": "jobs/fedavg",
    "overrides": {"num_rounds": 4},
    "sites": SITES,
    "metric": "dice",
    "full": {"mean": 0.80, "per_site": dict(zip(SITES, [0.80, 0.90, 0.70]))},
    "without": {"site-1": {"mean": 0.77}, "site-2": {"mean": 0.78}, "site-3": {"mean": 0.81}},
    "marginal": {"site-1": 0.03, "site-2": 0.02, "site-3": -0.01},
}


def fedavg_weights(r):
    return {"weights": dict(zip(SITES, FEDAVG_WEIGHTS)) if r != 2 else {"site-1": 0.625, "site-2": 0.375}}


def write_fedce(path, seed, free_riders=("site-3",)):
    """A FedCE (Sum.) run: contributions from round 1 on (round 0 has no leave-one-out model), terms, free riders."""
    final = FEDCE_CONTRIBUTIONS[seed]

    # seed 0 as the sites report free riders today (a training metric), other seeds as older files did (config)
    reported = seed == 0
    train = {s: {"train_loss": 0.5, **({"free_rider": 1.0} if reported and s in free_riders else {})} for s in SITES}

    def fields(r):
        if r == 0:
            return {"weights": dict(zip(SITES, FEDAVG_WEIGHTS)), "train": train}
        shares = [1 / 3 + (c - 1 / 3) * r / 3 for c in final]  # from uniform towards the final estimate
        terms = {
            s: {"gradient": 0.4, "data": c, "combined": 0.4 + c, "cosine": 0.9, "error": 0.2}
            for s, c in zip(SITES, final)
        }
        return {
            "weights": dict(zip(SITES, shares)),
            "contributions": dict(zip(SITES, shares)),
            "contribution_terms": terms,
        }

    return write_run(
        path,
        "fedce_sum",
        seed,
        [0.82, 0.91, 0.72],
        config={} if reported else {"free_riders": list(free_riders)},
        round_fields=fields,
        final_fields={
            "contributions": dict(zip(SITES, final)),
            "contribution_terms": {s: {"gradient": g, "data": d} for s, g, d in zip(SITES, [0.4, 0.4, 0.2], final)},
        },
    )


@pytest.fixture
def fedce_dir(tmp_path, runs_dir):
    """runs_dir (Solo, FedAvg, Fed-LWR) plus FedAvg with weights and two seeds of FedCE with a free rider."""
    write_run(runs_dir / "fedavg_w" / "results.json", "fedavg", 1, [0.80, 0.90, 0.70], round_fields=fedavg_weights)
    for seed in FEDCE_CONTRIBUTIONS:
        write_fedce(runs_dir / f"fedce_s{seed}" / "results.json", seed)
    (tmp_path / "loo.json").write_text(json.dumps(LOO))
    return runs_dir


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


def test_region_tables(tmp_path):
    for method, final in (("solo", [0.7, 0.8, 0.6]), ("fedavg", [0.8, 0.9, 0.7])):
        write_run(tmp_path / method / "results.json", method, 0, final, regions=True, config={"dataset": "fundus"})
    result = make_report([tmp_path], tmp_path / "report")
    assert list(result["region_tables"]) == ["dice_disc", "dice_cup"]
    rows, _ = table_rows(result["region_tables"]["dice_cup"])
    assert rows["FedAvg"][:4] == ["75.00", "85.00", "65.00", "**75.00**"]
    text = result["report"].read_text()
    assert "# fairfl report: fundus, Dice" in text and "### Dice (disc)" in text and "### Dice (cup)" in text
    write_run(tmp_path / "p" / "results.json", "fedavg", 1, [0.8] * 3, config={"dataset": "prostate"})
    with pytest.raises(ValueError, match="different datasets"):
        make_report([tmp_path], tmp_path / "report")


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


def test_runs_with_other_free_riders_or_left_out_sites_are_separate_rows(tmp_path, runs_dir):
    write_fedce(runs_dir / "fedce_plain" / "results.json", 0, free_riders=())
    write_run(
        runs_dir / "without2" / "results.json", "fedavg", 0, [0.8, 0.88, 0.7], config={"exclude_sites": ["site-2"]}
    )
    rows, _ = table_rows(paper_table(load_runs(runs_dir)))
    assert list(rows) == ["Solo", "FedAvg", "FedAvg (without site-2)", "FedCE (Sum.)", "Fed-LWR"]


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


def test_make_report_with_contributions_and_loo(tmp_path, fedce_dir, capsys):
    out = tmp_path / "report"
    assert report_main([str(fedce_dir), "--out", str(out), "--loo", str(tmp_path / "loo.json")]) == 0
    printed = capsys.readouterr().out
    assert "Performance fairness against Solo:" in printed
    assert "Contribution estimates against leave-one-out:" in printed
    text = (out / "report.md").read_text()
    for section in (
        "## Performance fairness",
        "## Client contributions",
        "## Contribution estimates against leave-one-out",
        "Full federation: mean dice 80.00%",
        "| marginal value (points) | +3.00 | +2.00 | -1.00 |",
    ):
        assert section in text
    figure = out / "contributions_fedce_sum_free_riders_site_3.png"
    assert is_png(figure) and f"]({figure.name})" in text
    assert report_main([str(fedce_dir), "--out", str(out), "--force", "--loo", str(tmp_path / "nowhere.json")]) == 1
    assert "nowhere.json" in capsys.readouterr().err


def test_plot_contributions_skips_runs_without_them(tmp_path, runs_dir):
    runs = load_runs(runs_dir / "fedavg_s0")
    assert plot_contributions(runs, tmp_path / "c.png", "x") is None and not (tmp_path / "c.png").exists()


def classification_sites(clean, corrupted, corrupted_sites=("site-3",)):
    """{site: metrics} as the executor reports them: clean_*, corrupted_*, and own quality unprefixed."""
    result = {}
    for site, c, k in zip(SITES, clean, corrupted):
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
            final_fields={"contributions": dict(zip(SITES, final))},
        )
    runs = load_runs(tmp_path)
    table, stats = contribution_table(runs)
    assert set(stats) == {"cffl", "cgsv"} and stats["cgsv"]["contributions"]["site-3"] == pytest.approx((0.6, None))
    assert "| CFFL | contribution | 0.500" in table and "| CGSV | contribution |" in table
    _, values = contribution_agreement_table(runs, LOO)  # compared with leave-one-out like FedCE's
    assert {"final contributions"} == set(values["cffl"]) == set(values["cgsv"])


def test_the_mean_of_the_last_rounds_is_each_sites_own_mean_and_the_report_can_use_it(tmp_path):
    """ResultsLog.mean_of_last averages each site over the evaluated rounds it was scored in (a site absent from one
    round is not dragged down by it), and `--final mean_of_last` reports that instead of the
    last round; runs without it are refused, never silently reported as the last round."""
    from fairfl.results import ResultsLog

    log = ResultsLog(
        str(tmp_path / "results.json"),
        method="fedavg",
        task="segmentation",
        metric="dice",
        seed=0,
        sites=["site-1", "site-2"],
        config={},
    )
    log.add_round(0, 1.0, {"site-1": {"dice": 0.1}, "site-2": {"dice": 0.1}})
    log.add_round(1, 1.0, None)
    log.add_round(2, 1.0, {"site-1": {"dice": 0.5}, "site-2": {"dice": 0.3}})
    log.add_round(3, 1.0, {"site-1": {"dice": 0.7}})  # site-2 absent
    mean = log.mean_of_last(3, 2)  # rounds 2 and 3
    assert mean["rounds"] == [2, 3] and mean["asked"] == 2
    assert log.mean_of_last(3, 3)["rounds"] == [2, 3]  # round 1 was not evaluated: fewer than asked
    assert mean["per_site"]["site-1"]["dice"] == pytest.approx(0.6)
    assert mean["per_site"]["site-2"]["dice"] == pytest.approx(0.3)  # its one scored round, not (0.3 + 0) / 2
    assert log.mean_of_last(1, 1) is None
    log.finish({"site-1": {"dice": 0.7}}, mean_of_last=mean, contributions={"site-1": 1.0})
    run = {**json.loads((tmp_path / "results.json").read_text()), "file": "r.json"}
    assert with_final([run], "mean_of_last")[0]["final"]["mean"] == pytest.approx(0.45)
    assert with_final([run], "mean_of_last")[0]["final"]["contributions"] == {"site-1": 1.0}  # kept
    short = {**run, "final": {**run["final"], "mean_of_last": log.mean_of_last(3, 3)}}
    with pytest.raises(ValueError, match="fewer rounds"):
        with_final([short], "mean_of_last")
    assert with_final([run], "last")[0]["final"]["mean"] == pytest.approx(0.7)
    plain = {**run, "final": {k: v for k, v in run["final"].items() if k != "mean_of_last"}}
    with pytest.raises(ValueError, match="average_last"):
        with_final([plain], "mean_of_last")
    with pytest.raises(ValueError, match="final"):
        with_final([run], "best")


def test_equal_worst_scores_name_the_same_worst_site_whatever_order_the_answers_arrived(tmp_path):
    from fairfl.results import ResultsLog

    named = []
    for order in (["site-10", "site-2", "site-1"], ["site-1", "site-2", "site-10"], ["site-2", "site-10", "site-1"]):
        log = ResultsLog(str(tmp_path / "results.json"), "fedavg", "segmentation", "dice", 0, order, {})
        record = log.add_round(0, 1.0, {s: {"dice": 0.5 if s != "site-1" else 0.9} for s in order})
        named.append(record["worst_site"])
    assert named == ["site-2", "site-2", "site-2"]  # site-2 and site-10 tie: the first in site order


# ---------------------------------------------------------------- spread across sites (fairness.summarize)


def test_spread_table_by_hand(tmp_path, runs_dir):
    table, stats = spread_table(load_runs(runs_dir))
    rows, header = table_rows(table)
    assert header == ["Method", "Worst", "P10", "Median", "P90", "Best", "Spread", "Gini", "seeds"]
    # Solo (60, 70, 80) sorted: p10 at position 0.2 = 62, p90 at 1.8 = 78; ordered-pair |differences| sum 80:
    # Gini = (80 / 9) / (2 x 70)
    assert rows["Solo"] == ["60.00", "62.00", "70.00", "78.00", "80.00", "20.00", f"{80 / 9 / 140:.3f}", "1"]
    assert rows["FedAvg"][4] == "**90.00**" and rows["FedAvg"][-2] == f"{80 / 9 / 160:.3f}"
    # Fed-LWR, mean ± sd over seeds (82, 85, 88) and (86, 87, 90): worst 82, 86; p10 82.6, 86.2; spread 6, 4
    ginis = [24 / 9 / 170, 16 / 9 / (2 * 263 / 3)]
    assert rows["Fed-LWR"] == [
        "**84.00 ± 2.83**",
        "**84.40 ± 2.55**",
        "**86.00 ± 1.41**",
        "**88.40 ± 1.41**",
        "89.00 ± 1.41",  # FedAvg's best site is better
        "**5.00 ± 1.41**",
        f"**{np.mean(ginis):.3f} ± {np.std(ginis, ddof=1):.3f}**",
        "2",
    ]
    assert stats["fedlwr"]["gini"][0] == pytest.approx(np.mean(ginis)) and stats["fedlwr"]["seeds"] == 2
    # a metric with a negative site value has no Gini: "–", the other columns as usual
    write_run(tmp_path / "neg" / "results.json", "fedprox", 0, [-0.1, 0.5, 0.6])
    table, stats = spread_table(load_runs([runs_dir, tmp_path / "neg"]))
    assert stats["fedprox"]["gini"] is None and table_rows(table)[0]["FedProx"][-2:] == ["–", "1"]
    assert table_rows(table)[0]["FedProx"][0] == "-10.00"
    assert spread_table([{**load_runs(runs_dir / "solo_s0")[0], "final": None}]) == ("", {})


@pytest.mark.parametrize("broken", [float("nan"), None, "0.8", True])  # None: a NaN as results.json writes it
def test_a_broken_score_in_the_spread_table_names_the_file_and_the_site(tmp_path, runs_dir, capsys, broken):
    bad = write_run(tmp_path / "bad" / "results.json", "fedavg", 3, [0.8, 0.5, 0.7])
    data = json.loads(bad.read_text())
    data["final"]["per_site"]["site-2"]["dice"] = broken
    bad.write_text(json.dumps(data))
    assert report_main([str(runs_dir), str(bad), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "site-2" in err


def test_results_json_records_the_spread_in_rounds_final_and_the_mean_of_the_last(tmp_path):
    from fairfl.fairness import summarize
    from fairfl.results import ResultsLog

    path = tmp_path / "results.json"
    log = ResultsLog(str(path), "fedavg", "segmentation", "dice", 0, ["site-10", "site-2", "site-1"], {})
    scores = [{"site-10": 0.9, "site-2": 0.5, "site-1": 0.5}, {"site-2": 0.0, "site-1": 0.0, "site-10": 0.0}]
    log.add_round(0, 1.0, {s: {"dice": v} for s, v in scores[0].items()})
    log.add_round(1, 1.0, {s: {"dice": v} for s, v in scores[1].items()})
    log.finish({s: {"dice": v} for s, v in scores[0].items()}, mean_of_last=log.mean_of_last(1, 2))
    data = json.loads(path.read_text())
    keys = {"mean", "std", "worst", "worst_site", "best", "best_site", "spread", "p10", "p50", "p90", "gini"}
    first, second, final = data["rounds"][0], data["rounds"][1], data["final"]
    assert keys <= set(first) and keys <= set(final) and keys <= set(final["mean_of_last"])
    assert {k: first[k] for k in keys} == summarize({"site-1": 0.5, "site-2": 0.5, "site-10": 0.9})
    assert (first["worst_site"], first["best_site"]) == ("site-1", "site-10")  # ties: the first in site order
    # ordered-pair |differences| sum 1.6 over 9 pairs, mean 1.9 / 3
    assert first["spread"] == pytest.approx(0.4) and first["gini"] == pytest.approx(1.6 / 9 / (2 * 1.9 / 3))
    assert "gini" in second and second["gini"] is None  # all zero: null in the file, never a crash
    assert final["mean_of_last"]["p50"] == pytest.approx(0.25) and final["mean_of_last"]["best_site"] == "site-10"


# ---------------------------------------------------------------- the global model and held-out sites


def personalised_run(path, seed, scores, held_out=(), method="ditto"):
    """A results.json written by the real ResultsLog: final per-site {site: (dice, global_dice or None)}; the
    held-out sites (the server's exclude_sites) are in config and scored without a global_ copy."""
    from fairfl.results import ResultsLog

    log = ResultsLog(
        str(path), method, "segmentation", "dice", seed, list(scores), {"exclude_sites": list(held_out)}, held_out
    )
    per_site = {
        s: {"dice": d, **({} if g is None else {"global_dice": g}), "personal_model": 1.0}
        for s, (d, g) in scores.items()
    }
    log.add_round(0, 1.0, per_site)
    log.finish(per_site)
    return path


def test_results_summarise_the_global_model_and_the_held_out_sites_apart_leaving_every_number_as_it_was(tmp_path):
    from fairfl.fairness import summarize

    scores = {"site-1": (0.8, 0.7), "site-2": (0.6, 0.65), "site-3": (0.5, None)}
    data = json.loads(personalised_run(tmp_path / "r.json", 0, scores, held_out=["site-3"]).read_text())
    final = data["final"]
    assert data["held_out_sites"] == ["site-3"] and data["config"]["exclude_sites"] == ["site-3"]
    # the main metric's summary over every site scored, as before; the parts apart, each naming its sites
    everyone = summarize({s: d for s, (d, _) in scores.items()})
    assert {k: final[k] for k in everyone} == everyone and "sites" not in final
    assert final["federation"] == {"sites": ["site-1", "site-2"], **summarize({"site-1": 0.8, "site-2": 0.6})}
    assert final["held_out"] == {"sites": ["site-3"], **summarize({"site-3": 0.5})}
    assert final["global_model"] == {"sites": ["site-1", "site-2"], **summarize({"site-1": 0.7, "site-2": 0.65})}
    assert data["rounds"][0]["global_model"]["worst_site"] == "site-2"
    # a run without held-out sites nor global scores records exactly what it recorded before
    plain = json.loads(personalised_run(tmp_path / "p.json", 0, {"site-1": (0.8, None)}, method="fedavg").read_text())
    assert plain["held_out_sites"] == [] and set(plain["final"]) == {"per_site", *everyone}
    # the mean of the last rounds averages the global scores too
    from fairfl.results import ResultsLog

    log = ResultsLog(str(tmp_path / "m.json"), "ditto", "segmentation", "dice", 0, ["site-1"], {})
    log.add_round(0, 1.0, {"site-1": {"dice": 0.5, "global_dice": 0.2}})
    log.add_round(1, 1.0, {"site-1": {"dice": 0.7, "global_dice": 0.4}})
    assert log.mean_of_last(1, 2)["global_model"]["mean"] == pytest.approx(0.3)


def test_report_shows_personal_against_global_and_the_held_out_sites_apart(tmp_path, capsys):
    runs = tmp_path / "runs"
    personalised_run(runs / "d0" / "results.json", 0, {"site-1": (0.8, 0.7), "site-2": (0.6, 0.5)})
    personalised_run(runs / "d1" / "results.json", 1, {"site-1": (0.9, 0.6), "site-2": (0.7, 0.6)})
    held = {"site-1": (0.8, 0.7), "site-2": (0.6, 0.4), "site-3": (0.3, None)}
    personalised_run(runs / "h" / "results.json", 0, held, held_out=["site-3"])
    write_run(runs / "fedavg" / "results.json", "fedavg", 0, [0.7, 0.7, 0.7])  # no global scores: not in it
    out = make_report(runs, tmp_path / "out")
    rows = [line.split(" | ") for line in out["tables"]["personal_global"].splitlines()[2:]]
    assert [r[:2] for r in rows] == [
        ["| Ditto", "personal model"],
        ["| Ditto", "global model"],
        ["| Ditto (without site-3)", "personal model"],
        ["| Ditto (without site-3)", "global model"],
    ]
    # per site and Avg./Std./Worst, mean ± sd over seeds; a held-out site is not in the federation's table
    assert rows[1][2:] == ["65.00 ± 7.07", "55.00 ± 7.07", "60.00 ± 0.00", "5.00 ± 7.07", "55.00 ± 7.07 |"]
    assert rows[3][2:] == ["70.00", "40.00", "55.00", "15.00", "40.00 |"]  # no site-3 column
    assert out["personal_global"]["ditto"]["personal"]["mean"] == pytest.approx((75.0, 7.0710678))
    held_rows = table_rows(out["tables"]["held_out"])[0]
    assert held_rows == {"Ditto (without site-3)": ["site-3", "70.00", "10.00", "60.00", "30.00", "0.00", "30.00"]}
    text = out["report"].read_text()
    assert "## Personal and global models" in text and "## Held-out sites" in text
    # hostile files: a global score that is not a number stops the report naming file and site; a missing one is
    # a note, that site left out of both rows' Avg.
    bad = personalised_run(tmp_path / "bad" / "results.json", 2, {"site-1": (0.8, 0.7), "site-2": (0.6, 0.5)})
    data = json.loads(bad.read_text())
    data["final"]["per_site"]["site-2"]["global_dice"] = None  # a NaN as the file writes it
    bad.write_text(json.dumps(data))
    assert report_main([str(runs), str(bad), "--out", str(tmp_path / "out2")]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "site-2" in err
    del data["final"]["per_site"]["site-2"]["global_dice"]
    bad.write_text(json.dumps(data))
    table, stats = personal_global_table(load_runs(bad))
    assert f"Note: {bad} has no global-model score for site-2" in table
    assert stats["ditto"]["personal"]["mean"] == (80.0, None) and stats["ditto"]["global"]["site-2"] is None


def test_cross_site_matrix_in_results_and_as_a_heatmap_even_from_a_hostile_file(tmp_path):
    from fairfl.results import ResultsLog

    path = personalised_run(tmp_path / "run" / "results.json", 0, {"site-1": (0.8, 0.7), "site-2": (0.6, 0.5)})
    log = ResultsLog(str(path), "ditto", "segmentation", "dice", 0, ["site-1", "site-2", "site-10"], {})
    log.data = json.loads(path.read_text())
    matrix = {"site-2": {"site-10": 0.2, "site-2": 0.6, "site-1": 0.5}, "site-1": {"site-1": 0.8, "site-2": 0.4}}
    record = log.cross_site(3, matrix, rejected={}, absent=["site-10"], failed={})
    data = json.loads(path.read_text())["cross_site"]
    assert data == record and record["models"] == ["site-1", "site-2"]
    assert record["sites"] == ["site-1", "site-2", "site-10"] and list(record["matrix"]["site-2"]) == record["sites"]
    assert record["own"] == {"site-1": 0.8, "site-2": 0.6} and record["absent"] == ["site-10"]
    assert record["on_others"] == {"site-1": 0.4, "site-2": pytest.approx(0.35)} and "rejected" not in record
    out = make_report(path, tmp_path / "out")
    assert tmp_path / "out" / "cross_site_ditto_seed0.png" in out["figures"]
    # a hostile file: cells that are not numbers are blank, a matrix that is not one is no figure; never a crash
    run = load_runs(path)[0]
    run["cross_site"]["matrix"]["site-1"]["site-2"] = "0.4"
    run["cross_site"]["matrix"]["site-2"]["site-1"] = None
    assert plot_cross_site(run, tmp_path / "hostile.png") == tmp_path / "hostile.png"
    for broken in ({"matrix": [1, 2]}, {"matrix": {"site-1": 0.5}}, "matrix", {"matrix": {}}):
        assert plot_cross_site({**run, "cross_site": broken}, tmp_path / "none.png") is None


def test_the_method_units_add_their_sections_and_figures_where_they_say():
    """The report names no method: FedISM+'s and FedCE's sections and FedCE's and Fed-LWR's figures come from their
    units' `report` modules, each section after the one it names."""
    assert [s.key for s in report_sections()] == [
        "spread",
        "quality_shift",
        "personal_global",
        "held_out",
        "performance_fairness",
        "contributions",
        "contribution_agreement",
    ]
    figures = {(type(part), part.kind) for part in method_parts() if not isinstance(part, Section)}
    assert figures == {(GroupFigure, "contributions"), (RunFigure, "layer_weights")}
    empty = lambda inputs: ("", {})  # noqa: E731
    added = [Section(key, key, str, empty, after="spread") for key in ("first", "second")]
    assert [s.key for s in ordered(SECTIONS, added)][:3] == ["spread", "first", "second"]
    with pytest.raises(ValueError, match="'nowhere'"):
        ordered(SECTIONS, [Section("lost", "Lost", str, empty, after="nowhere")])
