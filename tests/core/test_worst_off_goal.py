"""benchmarks/worst_off.py, the worst-off hospital's goal: an arm that lifts the worst site clearly meets it and one
equal to FedAvg does not; the intervals count the test splits when the runs recorded their patients' influences and
say "seeds only" when not; an arm that did not train and fewer than 3 seeds are not judged."""

import json
import os
import shutil
import sys

import numpy as np
import pytest

from fairfl.results import SCHEMA_VERSION
from fairfl.uncertainty import case_influence_record, cluster_se, mean_influence

from helpers import REPO

SITES = ("site-1", "site-2", "site-3", "site-4")
PATIENTS = np.repeat(np.arange(8), 3)  # 8 test patients of 3 slices per site


@pytest.fixture(scope="module")
def worst_off():
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        import worst_off
    finally:
        sys.path.pop(0)
    return worst_off


def write_run(folder, method, seed, images: dict, influences=True):
    """A results.json of per-image Dice `images` {site: [24]} and the results.csv rows pointing at it."""
    per_site, records = {}, {}
    for site, values in images.items():
        influence = mean_influence(values, PATIENTS)
        per_site[site] = {"dice": float(values.mean()), "dice_se": cluster_se(influence)}
        records[site] = {"dice": case_influence_record(influence)}
    final = {"per_site": per_site, **({"test_influence": records} if influences else {})}
    run = {
        "schema": SCHEMA_VERSION,
        "method": method,
        "task": "segmentation",
        "metric": "dice",
        "seed": seed,
        "sites": list(SITES),
        "rounds": [{"round": 0, "seconds": 1.0}],
        "final": final,
    }
    path = folder / "runs" / f"{method}-{seed}" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(run))
    return [f"{method},,{seed},{site},dice,{100 * v['dice']},{path}" for site, v in per_site.items()]


def benchmark(folder, arms: dict, seeds=(0, 1, 2), influences=True):
    """arms {method: per-site shift of the patients' Dice} on one shared set of test patients."""
    rng = np.random.default_rng(0)
    patients = {site: rng.uniform(0.5, 0.9, 8) for site in SITES}
    patients["site-4"] -= 0.25  # the worst-off site
    rows = ["method,variant,seed,site,metric,percent,file"]
    for method, shift in arms.items():
        for seed in seeds:
            images = {s: np.clip(np.repeat(patients[s] + shift[s], 3) + rng.normal(0, 0.01, 24), 0, 1) for s in SITES}
            rows += write_run(folder, method, seed, images, influences)
    (folder / "dice").mkdir()
    (folder / "dice" / "results.csv").write_text("\n".join(rows) + "\n")
    summary = {
        "dataset": "prostate",
        "sites": len(SITES),
        "metrics": ["dice"],
        "methods": list(arms),
        "round_seconds": {m: 2.0 if m == "lifted" else 1.0 for m in arms},
    }
    (folder / "summary.json").write_text(json.dumps(summary))


NONE = dict.fromkeys(SITES, 0.0)


def test_an_arm_that_lifts_the_worst_site_meets_the_goal_and_fedavgs_twin_does_not(tmp_path, worst_off):
    arms = {
        "fedavg": NONE,
        "solo": {**NONE, "site-4": -0.02},
        "lifted": {**NONE, "site-4": 0.12},  # the worst site 12 points up, the others unchanged
        "twin": NONE,  # FedAvg again
        "broken": dict.fromkeys(SITES, -0.5),
    }
    benchmark(tmp_path, arms, seeds=range(5))
    found = worst_off.goal(str(tmp_path))["arms"]
    lifted, twin = found["lifted"], found["twin"]
    assert lifted["worst_vs_fedavg"]["verdict"] == "met" and lifted["worst_vs_solo"]["verdict"] == "met"
    assert lifted["worst_vs_fedavg"]["noise"] == "seeds and test splits"
    assert lifted["mean"]["verdict"] == "met" and lifted["spread"]["verdict"] in ("met", "missed")
    assert lifted["sites_within_se"]["fedavg"]["verdict"] == "met" and lifted["cost"]["ratio"] == 2.0
    # FedAvg's twin: no worst-site gain; the same patients score both, so its split noise is nil, not large
    assert twin["worst_vs_fedavg"]["verdict"] == "missed"
    assert twin["worst_vs_fedavg"]["interval"]["split_se"] < 0.5  # independent errors would add to about 6
    assert found["broken"]["mean"]["verdict"] == "not judged"  # did not train
    table = worst_off.tables([{**worst_off.goal(str(tmp_path)), "folder": str(tmp_path)}])
    assert "| Twin |" not in table or "missed" in table


def test_without_influences_it_says_seeds_only_and_two_seeds_judge_nothing(tmp_path, worst_off):
    benchmark(tmp_path, {"fedavg": NONE, "lifted": {**NONE, "site-4": 0.12}}, seeds=(0, 1), influences=False)
    lifted = worst_off.goal(str(tmp_path))["arms"]["lifted"]
    assert lifted["worst_vs_fedavg"]["noise"] == "seeds only"
    assert lifted["worst_vs_fedavg"]["verdict"] == "not judged" and "worst_vs_solo" not in lifted


def test_a_task_whose_runs_are_gone_keeps_its_committed_goal_and_one_never_judged_is_refused(
    tmp_path, worst_off, monkeypatch, capsys
):
    rerun, kept, never = tmp_path / "rerun", tmp_path / "kept", tmp_path / "never"
    for folder, shift in ((rerun, 0.12), (kept, 0.20), (never, 0.12)):
        folder.mkdir()
        benchmark(folder, {"fedavg": NONE, "lifted": {**NONE, "site-4": shift}})
    monkeypatch.setattr(sys, "argv", ["worst_off.py", str(kept)])
    worst_off.main()  # judged while its runs are here: writes its goal.json
    committed = json.loads((kept / "goal.json").read_text())
    shutil.rmtree(kept / "runs")  # a fresh clone: the runs are not committed
    table = tmp_path / "GOAL.md"
    monkeypatch.setattr(sys, "argv", ["worst_off.py", str(rerun), str(kept), "--table", str(table)])
    worst_off.main()
    assert json.loads((kept / "goal.json").read_text()) == committed  # not rewritten
    assert "keeping its" in capsys.readouterr().err
    text = table.read_text()
    rerun_goal = json.loads((rerun / "goal.json").read_text())
    cells = [g["arms"]["lifted"]["worst_vs_fedavg"]["text"] for g in (rerun_goal, committed)]
    assert cells[0] != cells[1] and all(c in text for c in cells)  # both sections, each its own runs' figures
    assert text.count(worst_off.KEPT_NOTE) == 1  # the kept section says so
    with open(kept / "dice" / "results.csv", "a") as f:  # a run added since it was judged: its goal.json is stale
        f.write("lifted,,3,site-1,dice,50.0,/elsewhere/runs/lifted-3/results.json\n")
    monkeypatch.setattr(sys, "argv", ["worst_off.py", str(kept)])
    with pytest.raises(SystemExit, match="was not judged from the runs"):
        worst_off.main()
    shutil.rmtree(never / "runs")
    monkeypatch.setattr(sys, "argv", ["worst_off.py", str(never)])
    with pytest.raises(SystemExit, match="no goal.json was kept"):
        worst_off.main()


def test_the_interleaved_cost_judges_an_arm_on_its_own_dataset_by_the_larger_of_wall_and_cpu(tmp_path, worst_off):
    benchmark(tmp_path, {"fedavg": NONE, "lifted": {**NONE, "site-4": 0.12}, "twin": NONE})
    # the benchmark's own rounds: lifted 2.0x (missed only at > 2); the alternated runs say otherwise
    interleaved = {
        "lifted": {"dataset": "prostate", "ratio": 1.4, "cpu_ratio": 2.3},  # CPU over the goal: missed
        "twin": {"dataset": "fundus", "ratio": 1.0, "cpu_ratio": 1.0},  # another dataset: not used here
    }
    elsewhere = {"lifted": {"dataset": "fundus", "ratio": 9.0, "cpu_ratio": 9.0}}  # a second file, another dataset
    arms = worst_off.goal(str(tmp_path), [elsewhere, interleaved])["arms"]
    assert arms["lifted"]["cost"] == {"ratio": 1.4, "cpu_ratio": 2.3, "source": "interleaved", "verdict": "missed"}
    assert arms["twin"]["cost"]["source"] == "one after another" and arms["twin"]["cost"]["ratio"] == 1.0
    interleaved["lifted"]["cpu_ratio"] = 1.9
    arms = worst_off.goal(str(tmp_path), [elsewhere, interleaved])["arms"]
    assert arms["lifted"]["cost"]["verdict"] == "met"
    interleaved["lifted"]["cpu_ratio"] = None  # wall time alone, on a shared machine, judges nothing
    assert worst_off.goal(str(tmp_path), [elsewhere, interleaved])["arms"]["lifted"]["cost"]["verdict"] == "not judged"
    interleaved["lifted"]["cpu_ratio"] = 1.9
    judged = {**worst_off.goal(str(tmp_path), [elsewhere, interleaved]), "folder": "f"}
    table = worst_off.tables([judged], ["cost/summary.json", "c2.json"])
    assert "1.40, CPU 1.90: met (interleaved)" in table and "--cost cost/summary.json --cost c2.json" in table


def test_two_cost_files_measuring_an_arm_on_the_same_dataset_are_refused(tmp_path, worst_off):
    row = {"dataset": "prostate", "ratio": 1.4, "cpu_ratio": 1.5}
    files = []
    for name, table in (("a.json", {"lifted": row}), ("b.json", {"lifted": {**row, "dataset": "fundus"}})):
        (tmp_path / name).write_text(json.dumps({"methods": table}))
        files.append(str(tmp_path / name))
    assert [t["lifted"]["dataset"] for t in worst_off.cost_tables(files)] == ["prostate", "fundus"]
    (tmp_path / "c.json").write_text(json.dumps({"methods": {"lifted": row}}))
    with pytest.raises(SystemExit, match="lifted on prostate: its round cost is in both .*a.json and .*c.json"):
        worst_off.cost_tables([*files, str(tmp_path / "c.json")])
    (tmp_path / "d.json").write_text(json.dumps({"methods": {"lifted": {**row, "sites": 20}}}))  # other sites: both
    assert len(worst_off.cost_tables([files[0], str(tmp_path / "d.json")])) == 2
    for name, text in (("gone.json", None), ("bad.json", "{"), ("plain.json", "{}"), ("list.json", '{"methods": [1]}')):
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(SystemExit, match=f"--cost .*{name}: "):
            worst_off.cost_tables([str(tmp_path / name)])


def test_a_cost_row_judges_only_a_benchmark_with_as_many_sites(tmp_path, worst_off):
    benchmark(tmp_path, {"fedavg": NONE, "lifted": {**NONE, "site-4": 0.12}})
    sites = json.loads((tmp_path / "summary.json").read_text())["sites"]
    for measured_sites, source in ((sites, "interleaved"), (None, "interleaved"), (sites + 14, "one after another")):
        row = {"dataset": "prostate", "ratio": 1.4, "cpu_ratio": 1.5, "sites": measured_sites}
        cost = worst_off.goal(str(tmp_path), [{"lifted": row}])["arms"]["lifted"]["cost"]
        assert cost["source"] == source, measured_sites


def test_a_benchmark_folder_moved_elsewhere_is_judged_from_its_own_runs(tmp_path, worst_off):
    """results.csv names each run's file by the absolute path it was written at; a fresh clone has the committed run
    records under the folder's runs/ at another path."""
    written = tmp_path / "written"
    written.mkdir()
    benchmark(written, {"fedavg": NONE, "lifted": {**NONE, "site-4": 0.12}})
    before = worst_off.goal(str(written))
    clone = tmp_path / "clone" / "worst_off"
    shutil.move(str(written), str(clone))
    assert worst_off.goal(str(clone)) == before
    shutil.rmtree(clone / "runs" / "lifted-1")  # one record missing: refused, not judged without it
    with pytest.raises(worst_off.RunsNotHere, match="lifted-1"):
        worst_off.goal(str(clone))
