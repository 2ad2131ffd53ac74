"""`fairfl check-data` (fairfl.data.check): every problem of every site, each naming its site and file, found by the
sites' own checks on tiny datalists; the exit code says clean (0), problems (1) or a bad command line (2)."""

import json
import re

import nibabel as nib
import numpy as np
import pytest
from PIL import Image
from test_datalist import make_site  # a valid tiny segmentation site

from fairfl import cli
from fairfl.data.check import check_data, data_settings

SITES = ("site-1", "site-2", "site-3", "site-4")


def set_entry(root, site, split, index, **values):
    path = root / f"{site}.json"
    datalist = json.loads(path.read_text())
    datalist[split][index].update(values)
    path.write_text(json.dumps(datalist))


def broken_root(root):
    """site-1 clean; site-2 a missing file and a mask value out of range; site-3 a path out of the root and an image
    whose header declares 20000 x 20000; site-4 a datalist that is not JSON. Returns {site: the files at fault}."""
    for site in SITES:
        make_site(root, site, per_split=2, shape=(8, 8), fmt="png")
    set_entry(root, "site-2", "training", 1, image="site-2/images/gone.png")
    Image.fromarray(np.full((8, 8), 5, np.uint8)).save(root / "site-2" / "labels" / "validation_0.png")
    (root.parent / "outside.png").write_bytes((root / "site-3" / "images" / "testing_0.png").read_bytes())
    set_entry(root, "site-3", "testing", 0, image="../outside.png")
    header = nib.Nifti1Header()  # the header only: the data it declares (400 MB) is never written, nor read
    header.set_data_shape((20000, 20000))
    header["vox_offset"] = 352
    (root / "site-3" / "images" / "huge.nii").write_bytes(header.binaryblock + bytes(4))
    set_entry(root, "site-3", "training", 0, image="site-3/images/huge.nii")
    (root / "site-4.json").write_text('{"training": [')
    return {
        "site-1": set(),
        "site-2": {"gone.png", "validation_0.png"},
        "site-3": {"outside.png", "huge.nii"},
        "site-4": {"site-4.json"},
    }


def found(root):
    """{site: {(file name, problem with the entry's index left out)}} as check_data reports them."""
    shared, checks = check_data(root, list(SITES), data_settings(root))
    assert not shared
    return {
        check.site: {
            (problem.path.rsplit("/", 1)[-1], re.sub(r"\[\d+\]", "[i]", problem.problem)) for problem in check.problems
        }
        for check in checks
    }


def test_a_clean_root_passes(tmp_path, capsys):
    for site in SITES[:2]:
        make_site(tmp_path, site, per_split=2, shape=(8, 8), fmt="png")
    assert cli.main(["check-data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "site-1: training 2, validation 2, testing 2: OK" in out and "all 2 site(s) OK" in out


def test_every_problem_of_every_site_is_reported_naming_its_site_and_file(tmp_path, capsys):
    root = tmp_path / "data"
    expected = broken_root(root)
    problems = found(root)
    assert {site: {name for name, _ in problems[site]} for site in SITES} == expected
    assert any("outside [0, 1]" in problem for _, problem in problems["site-2"])
    assert any("leads outside the data root" in problem for _, problem in problems["site-3"])
    assert any("declares 20000 x 20000" in problem for _, problem in problems["site-3"])
    assert cli.main(["check-data", str(root)]) == 1
    out = capsys.readouterr().out
    for site, names in expected.items():
        for name in names:  # one line per problem: "[site] path: problem"
            assert re.search(rf"^\[{site}\] \S*{re.escape(name)}: ", out, re.M), (site, name, out)
    assert "site-1: training 2, validation 2, testing 2: OK" in out
    assert "site-2: training 1, validation 1, testing 2 passed: 2 problems" in out
    assert "site-4: no entries passed: 1 problem" in out and "5 problem(s) in 3 of 4 site(s)" in out


def test_the_order_of_the_entries_does_not_change_the_problems(tmp_path):
    root = tmp_path / "data"
    broken_root(root)
    before = found(root)
    for site in SITES[:3]:
        path = root / f"{site}.json"
        datalist = json.loads(path.read_text())
        path.write_text(json.dumps({split: entries[::-1] for split, entries in datalist.items()}))
    assert found(root) == before


def test_decode_finds_what_only_decoding_shows(tmp_path, capsys):
    make_site(tmp_path, "site-1", per_split=2, shape=(8, 8), fmt="png")
    image = tmp_path / "site-1" / "images" / "testing_1.png"
    image.write_bytes(image.read_bytes()[:60])  # the header is whole, the pixels cut off
    assert cli.main(["check-data", str(tmp_path)]) == 0
    assert cli.main(["check-data", str(tmp_path), "--decode"]) == 1
    assert re.search(r"^\[site-1\] \S*testing_1.png: cannot decode the image file", capsys.readouterr().out, re.M)


def test_the_classes_and_channels_default_to_dataset_json_then_the_task_s(tmp_path):
    assert (data_settings(tmp_path).num_classes, data_settings(tmp_path).in_channels) == (2, 1)  # prostate's
    (tmp_path / "dataset.json").write_text(json.dumps({"task": "classification", "classes": list("abcde")}))
    settings = data_settings(tmp_path)
    assert (settings.task, settings.num_classes, settings.in_channels) == ("classification", 5, 3)  # skin's channels
    assert data_settings(tmp_path, num_classes=7, in_channels=1).num_classes == 7  # given wins


def test_a_bad_command_line_exits_2_saying_why(tmp_path, capsys):
    assert cli.main(["check-data", str(tmp_path)]) == 2  # no datalists
    assert "no datalists in" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["check-data", str(tmp_path / "missing")])
    assert info.value.code == 2 and "no such folder" in capsys.readouterr().err
