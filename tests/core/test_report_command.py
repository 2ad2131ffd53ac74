"""`fairfl report` as a user runs it: the table printed and the report written, with a leave-one-out file, and a
results file with a broken score refused naming the file and the site."""

import json

import pytest

from fairfl.report.command import main as report_main

from report_runs import is_png, write_run


def test_command_line(runs_dir, capsys):
    assert report_main([str(runs_dir / "fedlwr_s0"), str(runs_dir / "fedavg_s0")]) == 0
    printed = capsys.readouterr().out
    assert "| Fed-LWR |" in printed and str(runs_dir / "fedlwr_s0" / "report" / "report.md") in printed
    assert report_main([str(runs_dir / "nowhere")]) == 1
    assert "nowhere" in capsys.readouterr().err


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


@pytest.mark.parametrize("broken", [float("nan"), None, "0.8", True])  # None: a NaN as results.json writes it
def test_a_broken_score_in_the_spread_table_names_the_file_and_the_site(tmp_path, runs_dir, capsys, broken):
    bad = write_run(tmp_path / "bad" / "results.json", "fedavg", 3, [0.8, 0.5, 0.7])
    data = json.loads(bad.read_text())
    data["final"]["per_site"]["site-2"]["dice"] = broken
    bad.write_text(json.dumps(data))
    assert report_main([str(runs_dir), str(bad), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "site-2" in err
