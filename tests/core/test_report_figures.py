"""The report's figures and parts: the document make_report writes with its figures, a figure left out where its
runs lack the numbers, the cross-site heatmap even from a hostile file, and the sections and figures the method
units add."""

import json

import pytest

from fairfl.methods.fedce.report import plot_contributions
from fairfl.methods.fedlwr import report as fedlwr_report
from fairfl.methods.fedlwr.report import layer_labels, plot_layer_weights, short_names, unet_layer_name
from fairfl.progress import progress_line
from fairfl.report.document import SECTIONS, make_report, report_sections
from fairfl.report.figures import convergence_points, plot_cross_site
from fairfl.report.parts import RESERVED_KEYS, GroupFigure, RunFigure, Section, method_parts, ordered
from fairfl.report.runs import load_runs

from report_runs import FINAL, LAYERS, is_png, personalised_run, write_run


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


def test_monai_unet_layers_are_named_by_level_and_part_in_the_heatmap_and_kept_whole_in_results(tmp_path, monkeypatch):
    levels = ["enc1 conv1", "enc1 residual", "enc2 conv1", "enc3 conv1", "dec1 conv1"]
    assert [unet_layer_name(n) for n in LAYERS] == levels
    unet = {
        "model.1.submodule.1.submodule.1.submodule.conv.unit1.adn.A": "bottom act2",
        "model.1.submodule.1.submodule.2.0.conv": "dec3 up-conv",
        "model.1.submodule.2.0.adn.A": "dec2 up-conv act",
        "model.1.submodule.2.1.conv.unit0.adn.A": "dec2 act1",
        "model.0.conv.unit1.conv": "enc1 conv2",
    }
    assert {name: unet_layer_name(name) for name in unet} == unet
    for other in ("convInit.conv", "model.0.weight", "model.0.conv.unitx.conv", "model.3.conv"):
        assert unet_layer_name(other) is None, other
    assert layer_labels(["convInit.conv", "model.0.residual"]) == short_names(["convInit.conv", "model.0.residual"])
    # the heatmap's axis names the levels; results.json keeps the module paths
    shown = []
    monkeypatch.setattr(fedlwr_report, "name_ticks", lambda set_ticks, names, **style: shown.append(list(names)))
    path = write_run(tmp_path / "r.json", "fedlwr", 0, FINAL[("fedlwr", 0)], layer_weights=True)
    assert plot_layer_weights(load_runs([path])[0], tmp_path / "lw.png")
    assert shown[-1] == levels
    assert list(json.loads(path.read_text())["rounds"][0]["layer_weights"]) == LAYERS


def test_the_console_and_the_report_figures_count_rounds_alike_from_1(tmp_path):
    path = write_run(tmp_path / "r.json", "fedavg", 0, FINAL[("fedavg", 0)], config={"num_rounds": 4})
    results = json.loads(path.read_text())  # results.json counts from 0: rounds 0..3, evaluated 0, 2, 3
    lines = [progress_line(r, results, 40.0) for r in results["rounds"] if r.get("per_site")]
    evaluated = [int(line.split()[1].split("/")[0]) for line in lines]  # "round 3/4 | ..."
    assert evaluated == [1, 3, 4] and lines[-1].startswith("round 4/4 |")
    assert list(convergence_points(load_runs([path]), "dice")["fedavg"]) == evaluated  # the figure's x values


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


def test_plot_contributions_skips_runs_without_them(tmp_path, runs_dir):
    runs = load_runs(runs_dir / "fedavg_s0")
    assert plot_contributions(runs, tmp_path / "c.png", "x") is None and not (tmp_path / "c.png").exists()


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
    units' `report` modules, each section after the one it names. A unit added since may add its own parts: the
    shipped ones keep their order and kinds among them."""
    shipped = [
        "spread",
        "quality_shift",
        "personal_global",
        "held_out",
        "performance_fairness",
        "contributions",
        "contribution_agreement",
    ]
    assert [s.key for s in report_sections() if s.key in shipped] == shipped
    figures = {(type(part), part.kind) for part in method_parts() if not isinstance(part, Section)}
    assert {(GroupFigure, "contributions"), (RunFigure, "layer_weights")} <= figures
    empty = lambda inputs: ("", {})  # noqa: E731
    added = [Section(key, key, str, empty, after="spread") for key in ("first", "second")]
    assert [s.key for s in ordered(SECTIONS, added)][:3] == ["spread", "first", "second"]
    with pytest.raises(ValueError, match="'nowhere'"):
        ordered(SECTIONS, [Section("lost", "Lost", str, empty, after="nowhere")])
    for key in ("spread", "table"):  # a section already there, or a result make_report returns itself
        with pytest.raises(ValueError, match=f"section '{key}'"):
            ordered(SECTIONS, [Section(key, key, str, empty, after="spread")])


def test_the_keys_a_section_may_not_take_are_those_make_report_returns_for_itself(runs_dir, tmp_path):
    result = make_report([runs_dir], tmp_path / "report")
    assert set(result) - {section.key for section in report_sections()} == set(RESERVED_KEYS)
