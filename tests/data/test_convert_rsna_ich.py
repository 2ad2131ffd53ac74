"""Converter for the RSNA intracranial hemorrhage layout: PNG slices named by ID plus stage_2_train.csv."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_convert_isic import (  # shared helpers of the converter tests
    UNSAFE_SITE_NAMES,
    assert_refused,
    assert_unsafe_name_refused,
    rewrite,
    unsafe_name,
)

from fairfl.data.convert_rsna_ich import SUBTYPES, convert_rsna_ich
from fairfl.data.datalist import CORRUPTED_SPLIT, SPLITS, load_datalist
from fairfl.data.loaders import make_loader
from fairfl.errors import DataError

# positive subtypes of each slice: 54 with one subtype, 3 with two, 3 without hemorrhage
POSITIVE = [[0]] * 6 + [[1]] * 12 + [[2]] * 8 + [[3]] * 12 + [[4]] * 16 + [[1, 3], [2, 4], [0, 4]] + [[]] * 3
SLICES_PER_PATIENT = 3


def slice_id(k: int) -> str:
    return f"ID_{k:09x}"


def write_source(src, metadata: bool = True):
    folder = src / "stage_2_train"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = ["ID,Label"]
    for k, positive in enumerate(POSITIVE):
        pixels = rng.integers(0, 255, (16, 16), dtype=np.uint8)
        if k == 7:  # a 16-bit export (Hounsfield units plus offset)
            Image.fromarray(pixels.astype(np.uint16) * 200).save(folder / f"{slice_id(k)}.png")
        else:
            Image.fromarray(pixels).save(folder / f"{slice_id(k)}.png")
        for index, name in enumerate(SUBTYPES):
            rows.append(f"{slice_id(k)}_{name},{int(index in positive)}")
        rows.append(f"{slice_id(k)}_any,{int(bool(positive))}")
    rows.append(f"{slice_id(3)}_epidural,1")  # the real file repeats some rows
    for k in (900, 901):  # labelled, not converted to PNG
        rows += [f"{slice_id(k)}_{name},0" for name in (*SUBTYPES, "any")]
    (src / "stage_2_train.csv").write_text("\n".join(rows) + "\n")
    if metadata:
        lines = ["ID,PatientID,StudyInstanceUID"]
        patient = [k // SLICES_PER_PATIENT for k in range(len(POSITIVE))]
        lines += [f"{slice_id(k)},ID_p{p},ID_s{p}" for k, p in enumerate(patient)]
        (src / "stage_2_train_metadata.csv").write_text("\n".join(lines) + "\n")
    return src


@pytest.fixture
def source(tmp_path):
    return write_source(tmp_path / "rsna")


def name_of(entry) -> int:
    return int(entry["image"].rsplit("/", 1)[-1].split(".")[0][3:], 16)


def test_single_subtype_slices_split_by_patient(source, tmp_path):
    dst = tmp_path / "dst"
    summary = convert_rsna_ich(source, dst, num_sites=3)
    assert summary["excluded"] == {"several subtypes": 3, "no hemorrhage": 3, "labelled, no PNG": 2}
    description = json.loads((dst / "dataset.json").read_text())
    assert description["classes"] == list(SUBTYPES) and description["num_classes"] == 5
    assert description["in_channels"] == 1 and description["split"]["grouping"].startswith("by group")
    assert summary["split"] == description["split_used"] == "Dirichlet sites, fairfl's seeded split (seed 0)"
    where = {}
    for site in ("site-1", "site-2", "site-3"):
        for split, entries in load_datalist(dst, site, task="classification", num_classes=5).items():
            for entry in entries:
                k = name_of(entry)
                assert POSITIVE[k] == [entry["label"]]
                where.setdefault(k // SLICES_PER_PATIENT, set()).add(site if split != "testing" else "test")
    assert all(len(v) == 1 for v in where.values()), "a patient's slices in two sites or splits"
    placed = {
        name_of(e)
        for s in ("site-1", "site-2", "site-3")
        for entries in load_datalist(dst, s, task="classification", num_classes=5).values()
        for e in entries
    }
    assert placed == set(range(54))  # every single-subtype slice, once
    wide = dst / "test/clean" / f"{slice_id(7)}.png"
    wide = wide if wide.exists() else next(dst.glob(f"site-*/{slice_id(7)}.png"))
    assert wide.read_bytes() == (source / "stage_2_train" / f"{slice_id(7)}.png").read_bytes()  # copied as is
    batch = next(
        iter(
            make_loader(
                load_datalist(dst, "site-1", task="classification", num_classes=5)["training"],
                32,
                5,
                2,
                train=False,
                seed=0,
                in_channels=1,
                task="classification",
            )
        )
    )
    assert batch["image"].shape == (2, 1, 32, 32) and batch["label"].dtype == torch.int64


def test_none_class_subset_and_blurred_sites(source, tmp_path):
    dst = tmp_path / "dst"
    summary = convert_rsna_ich(
        source,
        dst,
        num_sites=2,
        include_none=True,
        max_images=40,
        image_size=24,
        corrupted_fraction=0.5,
        corruption="blur",
    )
    assert summary["excluded"]["not sampled (max_images)"] == 57 - 40
    description = json.loads((dst / "dataset.json").read_text())
    assert description["classes"][-1] == "none" and description["num_classes"] == 6
    assert description["corrupted_sites"] == ["site-2"] and description["corruption"]["kind"] == "blur"
    lists = load_datalist(dst, "site-2", task="classification", num_classes=6, splits=(*SPLITS, CORRUPTED_SPLIT))
    assert sum(len(lists[s]) for s in ("training", "validation")) + len(lists["testing"]) <= 40
    with Image.open(lists["training"][0]["image"]) as image:
        assert image.size == (24, 24)
    sharp = np.asarray(Image.open(lists["testing"][0]["image"]), float)
    blurred = np.asarray(Image.open(lists[CORRUPTED_SPLIT][0]["image"]), float)
    assert np.abs(np.diff(blurred, axis=1)).mean() < 0.8 * np.abs(np.diff(sharp, axis=1)).mean()


def test_without_metadata_slices_are_split_one_by_one(tmp_path):
    src = write_source(tmp_path / "rsna", metadata=False)
    convert_rsna_ich(src, tmp_path / "dst", num_sites=3)
    assert json.loads((tmp_path / "dst/dataset.json").read_text())["split"]["grouping"] == "by image"


CSV = "stage_2_train.csv"


@pytest.mark.parametrize(
    "damage, site, file, problem",
    [
        (lambda src: (src / CSV).unlink(), "-", CSV, "file not found"),
        (lambda src: rewrite(src / CSV, "ID,Label", "ID,Target"), "-", CSV, "missing column(s) Label"),
        (
            lambda src: rewrite(src / CSV, f"{slice_id(2)}_epidural,1", f"{slice_id(2)}_epidural,2"),
            "-",
            CSV,
            "label '2' is not 0 or 1",
        ),
        (
            lambda src: rewrite(src / CSV, f"{slice_id(2)}_epidural,1", f"{slice_id(2)}_extradural,1"),
            "-",
            CSV,
            "is not ID_<image id>_<subtype>",
        ),
        (
            lambda src: (src / CSV).write_text((src / CSV).read_text() + f"{slice_id(3)}_epidural,0\n"),
            "-",
            CSV,
            "repeated with a different label",
        ),
        (
            lambda src: rewrite(src / CSV, f"{slice_id(4)}_subdural,0\n", ""),
            "-",
            CSV,
            f"{slice_id(4)}: no row for subdural",
        ),
        (
            lambda src: rewrite(src / CSV, f"{slice_id(5)}_any,1", f"{slice_id(5)}_any,0"),
            "-",
            CSV,
            "'any' is 0 but the subtypes say 1",
        ),
        (
            lambda src: Image.new("L", (8, 8)).save(src / f"stage_2_train/{slice_id(999)}.png"),
            "-",
            f"{slice_id(999)}.png",
            "no rows for",
        ),
        (
            lambda src: (src / f"stage_2_train/{slice_id(20)}.png").write_bytes(b"\x89PNG\r\n\x1a\n"),
            "site-",
            f"{slice_id(20)}.png",
            "cannot read image",
        ),
        (
            lambda src: rewrite(src / "stage_2_train_metadata.csv", "PatientID,StudyInstanceUID", "Patient,Study"),
            "-",
            "stage_2_train_metadata.csv",
            "needs an image-ID column",
        ),
        (
            lambda src: rewrite(src / "stage_2_train_metadata.csv", f"{slice_id(10)},", "ID_other,"),
            "-",
            f"{slice_id(10)}.png",
            "no patient in the metadata",
        ),
    ],
)
def test_each_problem_names_site_and_file_and_writes_nothing(source, tmp_path, damage, site, file, problem):
    damage(source)
    assert_refused(lambda src, dst: convert_rsna_ich(src, dst, num_sites=3), source, tmp_path, site, file, problem)


def test_missing_folders_and_options(source, tmp_path):
    with pytest.raises(DataError, match="PNG folder not found"):
        convert_rsna_ich(tmp_path, tmp_path / "out")
    with pytest.raises(DataError, match="folder not found"):
        convert_rsna_ich(source, tmp_path / "out", images_dir="slices")
    (source / "stage_2_train").rename(source / "slices")
    (source / CSV).rename(source / "labels.csv")
    summary = convert_rsna_ich(source, tmp_path / "out", num_sites=2, images_dir="slices", labels_csv="labels.csv")
    assert set(summary["sites"]) == {"site-1", "site-2"}


def test_command_line_converts(source, tmp_path):
    from fairfl import cli

    dst = tmp_path / "cli"
    assert cli.main(["convert-rsna-ich", str(source), str(dst), "--num-sites", "3", "--include-none"]) == 0
    assert sorted(p.name for p in dst.glob("site-*.json")) == ["site-1.json", "site-2.json", "site-3.json"]
    assert len(json.loads((dst / "dataset.json").read_text())["classes"]) == 6


@pytest.mark.parametrize("name", UNSAFE_SITE_NAMES)
def test_an_output_site_name_outside_the_output_folder_is_refused_and_nothing_written(source, tmp_path, name):
    name = unsafe_name(name, tmp_path)
    convert = lambda src, dst: convert_rsna_ich(src, dst, num_sites=3, site_names={"site-3": name})  # noqa: E731
    assert_unsafe_name_refused(convert, source, tmp_path, name, "Dirichlet(1) share 3", source)
