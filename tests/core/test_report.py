"""`fairfl report` on synthetic results files: the runs found and loaded, the sites' tables (the papers' table,
its CSV, the regions, the spread across sites, personal against global models, the held-out sites) and the
summaries results.json records for them. The fairness and contribution tables are tested in test_report_fairness.py,
the figures and the document's parts in test_report_figures.py, the command in test_report_command.py."""

import csv
import json

import numpy as np
import pytest

from fairfl.report.command import main as report_main
from fairfl.report.document import make_report
from fairfl.report.global_model import personal_global_table
from fairfl.report.runs import find_results, load_runs, with_final
from fairfl.report.site_tables import paper_table, spread_table, write_csv

from report_runs import SITES, personalised_run, table_rows, write_fedce, write_run


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


def test_runs_with_other_free_riders_or_left_out_sites_are_separate_rows(tmp_path, runs_dir):
    write_fedce(runs_dir / "fedce_plain" / "results.json", 0, free_riders=())
    write_run(
        runs_dir / "without2" / "results.json", "fedavg", 0, [0.8, 0.88, 0.7], config={"exclude_sites": ["site-2"]}
    )
    rows, _ = table_rows(paper_table(load_runs(runs_dir)))
    assert list(rows) == ["Solo", "FedAvg", "FedAvg (without site-2)", "FedCE (Sum.)", "Fed-LWR"]


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


# ------------------------------------------------------------------------ the papers' best round (optimistic, apart)


def test_the_best_round_is_the_evaluated_round_of_highest_avg_shown_apart_from_the_last(tmp_path):
    """The paper-style figure reads each run's best evaluated round on test (highest Avg.; a round missing a site is
    no candidate), labelled optimistic, while the papers' table keeps the last round."""
    from fairfl.progress import shown_round
    from fairfl.report.best_round import best_round, best_round_table

    from report_runs import per_site

    better = {0: [0.60, 0.70, 0.50], 2: [0.90, 0.90, 0.90]}  # round 2 (shown 3) beats the last, round 3 (shown 4)
    earlier = write_run(
        tmp_path / "a" / "results.json",
        "fedlwr",
        0,
        [0.80, 0.85, 0.75],
        round_fields=lambda r: {"per_site": per_site(better[r])} if r in better else {},
    )
    partial = {2: {"site-1": {"dice": 0.99}, "site-2": {"dice": 0.99}}}  # site-3 not scored: no candidate
    write_run(
        tmp_path / "b" / "results.json",
        "fedavg",
        0,
        [0.70, 0.70, 0.70],
        round_fields=lambda r: {"per_site": partial[r]} if r in partial else {},
    )
    runs = load_runs([tmp_path])
    lwr = best_round(next(r for r in runs if r["method"] == "fedlwr"), "dice")
    assert lwr["best"] == pytest.approx((2, 90.0, 0.0)) and lwr["last"][:2] == pytest.approx((3, 80.0))
    avg = best_round(next(r for r in runs if r["method"] == "fedavg"), "dice")
    assert avg["best"][0] == avg["last"][0] == 3  # round 2's 99% missed a site; round 0 was lower
    table, stats = best_round_table(runs)
    rows, header = table_rows(table)
    assert header[:3] == ["Method", "seed", "best round"]
    assert rows["Fed-LWR"] == ["0", str(shown_round(2)), "90.00", "0.00", "4", "80.00", "4.08", "+10.00"]
    assert rows["FedAvg"][1:3] == ["4", "70.00"] and rows["FedAvg"][-1] == "+0.00"
    result = make_report([tmp_path], tmp_path / "report")
    text = result["report"].read_text()
    assert "## Best round on test (paper-style, optimistic)" in text and "**Optimistic" in text
    assert table_rows(result["table"])[0]["Fed-LWR"][3] == "**80.00**"  # the papers' table: the last round
    assert str(earlier) in text
    # a run evaluated once has no round to choose: no section
    single = [{**run, "rounds": [r for r in run["rounds"] if r["round"] == 3]} for run in runs]
    assert best_round_table(single) == ("", {})
