"""`fairfl report` on synthetic results files: the table's numbers, the files found, the figures written."""

import csv
import json

import numpy as np
import pytest

from fairfl import report

SITES = ["site-1", "site-2", "site-3"]
LAYERS = ["model.0.conv.unit0.conv", "model.0.residual", "model.1.submodule.0.conv.unit0.conv",
          "model.1.submodule.1.submodule.0.conv.unit0.conv", "model.2.1.conv.unit0.conv"]
FINAL = {  # (method, seed): final Dice per site
    ("solo", 0): [0.70, 0.80, 0.60],      # Avg. 70.00, Std. 8.16 (population; the sample sd would be 10.00)
    ("fedavg", 0): [0.80, 0.90, 0.70],    # Avg. 80.00, Std. 8.16
    ("fedlwr", 0): [0.85, 0.88, 0.82],    # Avg. 85.00, Std. sqrt(6) = 2.449
    ("fedlwr", 1): [0.87, 0.90, 0.86],    # Avg. 87.67, Std. 1.700
}


def per_site(values):
    return {s: {"dice": v} for s, v in zip(SITES, values)}


def write_run(path, method, seed, final, schema=1, layer_weights=False, finished=True):
    """A results.json like fairfl.results.ResultsLog writes: 4 rounds, evaluated at 0, 2 and 3, then `final`."""
    rounds = []
    for r in range(4):
        record = {"round": r, "seconds": 10.0, "train": {s: {"train_loss": 0.5 - 0.1 * r} for s in SITES}}
        if r != 1:
            record["per_site"] = per_site([v - 0.05 * (3 - r) for v in final])
        if layer_weights:
            w = [1 / 3 + 0.02 * r, 1 / 3, 1 / 3 - 0.02 * r]
            record["layer_weights"] = {layer: dict(zip(SITES, np.roll(w, i).tolist())) for i, layer in enumerate(LAYERS)}
        if r == 2:
            record["rejected"] = {"site-3": "NaN in model.0.conv.weight"}
        rounds.append(record)
    data = {"schema": schema, "method": method, "task": "segmentation", "metric": "dice", "seed": seed,
            "sites": SITES, "config": {}, "started": "2026-11-22T13:00:00", "rounds": rounds,
            "final": {"per_site": per_site(final)} if finished else None}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def runs_dir(tmp_path):
    """Simulator-shaped workspaces, one per run, plus a Fed-LWR run that never finished."""
    for (method, seed), final in FINAL.items():
        write_run(tmp_path / "runs" / f"{method}_s{seed}" / "server" / "simulate_job" / "results.json",
                  method, seed, final, layer_weights=method == "fedlwr")
    write_run(tmp_path / "runs" / "fedlwr_s2" / "server" / "simulate_job" / "results.json", "fedlwr", 2, [0.5, 0.6, 0.7],
              finished=False)
    return tmp_path / "runs"


def table_rows(table):
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("|")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[2:]}, [c.strip() for c in rows[0]]


def test_find_results(tmp_path, runs_dir):
    ws = runs_dir / "fedavg_s0"
    results = ws / "server" / "simulate_job" / "results.json"
    assert report.find_results(results) == [results]
    assert report.find_results(ws) == [results]
    assert report.find_results(results.parent) == [results]
    found = report.find_results(runs_dir)
    assert len(found) == 5 and found == sorted(found)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        report.find_results(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="missing"):
        report.find_results(tmp_path / "missing")


def test_load_runs_checks_schema_and_deduplicates(tmp_path, runs_dir):
    bad = write_run(tmp_path / "old" / "results.json", "fedavg", 0, [0.5] * 3, schema=0)
    with pytest.raises(ValueError, match=f"{bad}.*schema 0"):
        report.load_runs([bad])
    broken = tmp_path / "broken" / "results.json"
    broken.parent.mkdir()
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=str(broken)):
        report.load_runs(broken)
    ws = runs_dir / "solo_s0"
    runs = report.load_runs([ws, ws / "server" / "simulate_job" / "results.json"])
    assert len(runs) == 1 and runs[0]["method"] == "solo" and runs[0]["file"].endswith("results.json")


def test_paper_table_numbers(runs_dir):
    table = report.paper_table(report.load_runs([runs_dir]))
    rows, header = table_rows(table)
    assert header == ["Method", *SITES, "Avg.", "Std.", "Seeds"]
    assert list(rows) == ["Solo", "FedAvg", "Fed-LWR"]
    assert rows["Solo"] == ["70.00", "80.00", "60.00", "70.00", "8.16", "1"]  # population std, not 10.00
    assert rows["FedAvg"] == ["80.00", "90.00", "70.00", "80.00", "8.16", "1"]
    stds = [np.std([85, 88, 82]), np.std([87, 90, 86])]
    assert rows["Fed-LWR"] == ["86.00 ± 1.41", "89.00 ± 1.41", "84.00 ± 2.83",
                               f"**{np.mean([85, 87.6667]):.2f} ± {np.std([85, 87.6667], ddof=1):.2f}**",
                               f"**{np.mean(stds):.2f} ± {np.std(stds, ddof=1):.2f}**", "2"]
    assert rows["Fed-LWR"][3] == "**86.33 ± 1.89**" and rows["Fed-LWR"][4] == "**2.07 ± 0.53**"
    assert "fedlwr_s2" in table and "no final evaluation" in table  # the unfinished run is named, not counted


def test_single_runs_have_no_seed_column_and_bold_the_best(runs_dir):
    runs = [r for r in report.load_runs(runs_dir) if r["seed"] == 0]
    rows, header = table_rows(report.paper_table(runs))
    assert header[-1] == "Std." and "Seeds" not in header
    assert rows["Fed-LWR"][-2:] == ["**85.00**", "**2.45**"] and rows["FedAvg"][-2:] == ["80.00", "8.16"]


def test_csv(tmp_path, runs_dir):
    path = report.write_csv(report.load_runs(runs_dir), tmp_path / "results.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * (len(SITES) + 3)  # 4 finished runs x (sites + mean, std, worst)
    solo = {r["site"]: float(r["percent"]) for r in rows if r["method"] == "solo"}
    assert solo == pytest.approx({"site-1": 70, "site-2": 80, "site-3": 60, "mean": 70, "std": 8.165, "worst": 60},
                                 abs=1e-3)


def test_short_layer_names_are_unique():
    labels = report._short_names(LAYERS)
    assert labels == ["0.conv.unit0.conv", "0.residual", "1.s.0.conv.unit0.conv", "1.s.1.s.0.conv.unit0.conv",
                      "2.1.conv.unit0.conv"]
    assert report._short_names(["a.sequence.x", "a.submodule.x"]) == ["sequence.x", "submodule.x"]  # no clash


def is_png(path, min_bytes=10_000):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > min_bytes


def test_make_report(tmp_path, runs_dir):
    out = tmp_path / "report"
    result = report.make_report([runs_dir], out)
    names = sorted(f.name for f in result["figures"])
    assert names == ["convergence.png", "layer_weights_fedlwr_seed0.png", "layer_weights_fedlwr_seed1.png",
                     "per_site.png"]
    assert all(is_png(f) for f in result["figures"])
    text = result["report"].read_text()
    assert result["table"] in text and (out / "results.csv").exists()
    assert all(f"]({name})" in text for name in names)
    assert text.count("1 rejected site update(s)") == 5 and "40.0 s" in text and "not finished" in text


def test_layer_weights_skipped_without_them(tmp_path, runs_dir):
    run = report.load_runs(runs_dir / "fedavg_s0")[0]
    assert report.plot_layer_weights(run, tmp_path / "lw.png") is None and not (tmp_path / "lw.png").exists()


def test_command_line(runs_dir, capsys):
    assert report.main([str(runs_dir / "fedlwr_s0"), str(runs_dir / "fedavg_s0")]) == 0
    printed = capsys.readouterr().out
    assert "| Fed-LWR |" in printed and str(runs_dir / "fedlwr_s0" / "report" / "report.md") in printed
    assert report.main([str(runs_dir / "nowhere")]) == 1
    assert "nowhere" in capsys.readouterr().err
