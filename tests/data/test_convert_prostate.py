"""Converter for the multi-site prostate layout <src>/<site>/Image|Mask/<case>.nii.gz."""

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from test_convert_isic import UNSAFE_SITE_NAMES, assert_unsafe_name_refused, unsafe_name

from fairfl.data.convert_prostate import convert_prostate
from fairfl.data.datalist import SPLITS, load_datalist
from fairfl.data.loaders import make_loader
from fairfl.errors import DataError

SHAPE = (16, 16, 10)
# Per source site: how its masks are named and stored (the public releases differ).
SITES = {"BIDMC": ("", 1, ".nii.gz"), "HK": ("_segmentation", 255, ".nii.gz"), "UCL": ("_Segmentation", 1, ".nii")}
AFFINE = np.array([[0.5, 0, 0, -4.0], [0, 0.6, 0, 2.0], [0, 0, 3.0, 10.0], [0, 0, 0, 1]])


def organ_range(case: int) -> range:
    """Slices (along axis 2) that show the organ in case `case`: 4 or 5 slices, position varies."""
    return range(2 + case % 3, 6 + case % 3 + case % 2)


def write_source(src, sites=SITES, cases=4):
    rng = np.random.default_rng(0)
    for site, (suffix, value, ext) in sites.items():
        for case in range(cases):
            image = rng.normal(300, 50, SHAPE).astype(np.int16)
            mask = np.zeros(SHAPE, np.uint8)
            mask[5:11, 4:12, organ_range(case).start : organ_range(case).stop] = value
            for folder, name, array in (
                ("Image", f"Case{case:02d}{ext}", image),
                ("Mask", f"Case{case:02d}{suffix}{ext}", mask),
            ):
                (src / site / folder).mkdir(parents=True, exist_ok=True)
                nib.save(nib.Nifti1Image(array, AFFINE), src / site / folder / name)
    return src


@pytest.fixture
def source(tmp_path):
    return write_source(tmp_path / "src")


def slices_by_case(datalist):
    counts = {}
    for split in SPLITS:
        for entry in datalist[split]:
            counts.setdefault((split, entry["case"]), []).append(entry)
    return counts


def test_default_keeps_organ_slices_plus_two_and_splits_by_case(source, tmp_path):
    dst = tmp_path / "dst"
    summary = convert_prostate(source, dst)
    assert set(summary["sites"]) == set(SITES)
    assert json.loads((dst / "sites.json").read_text()) == {s: s for s in SITES}
    for site in SITES:
        datalist = load_datalist(dst, site)  # checks files, shapes and binary labels
        by_case = slices_by_case(datalist)
        cases_per_split = {s: {c for sp, c in by_case if sp == s} for s in SPLITS}
        assert [len(cases_per_split[s]) for s in SPLITS] == [2, 1, 1]
        assert len({c for _, c in by_case}) == 4  # every case in exactly one split: no leakage
        for (_, case), entries in by_case.items():
            organ = organ_range(int(case[-2:]))
            expected = range(max(organ.start - 2, 0), min(organ.stop + 2, SHAPE[2]))
            assert [int(e["image"].split("_s")[-1][:3]) for e in entries] == list(expected)
        assert summary["sites"][site]["slices"] == {
            s: sum(len(v) for (sp, _), v in by_case.items() if sp == s) for s in SPLITS
        }
        for entry in datalist["training"]:  # masks binarised, including the 0/255 site
            assert set(np.unique(np.asanyarray(nib.load(entry["label"]).dataobj))) <= {0, 1}
    batch = next(iter(make_loader(load_datalist(dst, "HK")["training"], 32, 2, 4, train=True, seed=0)))
    assert batch["image"].shape == (4, 1, 32, 32) and set(batch["label"].unique().tolist()) <= {0, 1}


def test_slice_keeps_its_place_in_the_world(source, tmp_path):
    convert_prostate(source, tmp_path / "dst", keep_empty_slices=True)
    sliced = nib.load(tmp_path / "dst" / "UCL" / "images" / "Case01_s007.nii.gz")
    volume = nib.load(source / "UCL" / "Image" / "Case01.nii")
    assert sliced.shape == SHAPE[:2]
    assert np.array_equal(sliced.get_fdata(), volume.get_fdata()[:, :, 7])
    assert np.allclose(sliced.affine @ [3, 4, 0, 1], volume.affine @ [3, 4, 7, 1])


@pytest.mark.parametrize(
    "keep, per_case", [(True, lambda r: SHAPE[2]), (False, len), (0, len), (1, lambda r: len(r) + 2 - (r.start == 0))]
)
def test_keep_empty_slices_options(source, tmp_path, keep, per_case):
    summary = convert_prostate(source, tmp_path / "dst", keep_empty_slices=keep)
    total = sum(summary["sites"]["BIDMC"]["slices"].values())
    assert total == sum(per_case(organ_range(case)) for case in range(4))


def test_axis_option(source, tmp_path):
    summary = convert_prostate(source, tmp_path / "dst", axis=0, keep_empty_slices=False)
    assert sum(summary["sites"]["HK"]["slices"].values()) == 4 * 6  # organ spans rows 5..10 in every case
    assert load_datalist(tmp_path / "dst", "HK")


def test_flare_names_and_deterministic_split(source, tmp_path):
    a = convert_prostate(source, tmp_path / "a", site_names="flare", seed=0)
    b = convert_prostate(source, tmp_path / "b", site_names="flare", seed=0)
    assert json.loads((tmp_path / "a" / "sites.json").read_text()) == {
        "site-1": "BIDMC",
        "site-2": "HK",
        "site-3": "UCL",
    }
    assert a == b
    assert (tmp_path / "a" / "site-2.json").read_text() == (tmp_path / "b" / "site-2.json").read_text()
    seeds = [convert_prostate(source, tmp_path / f"s{seed}", seed=seed)["sites"]["BIDMC"]["cases"] for seed in range(6)]
    assert any(s != seeds[0] for s in seeds)  # the seed does move cases between splits


def test_missing_mask_names_site_and_image(source, tmp_path):
    (source / "HK" / "Mask" / "Case02_segmentation.nii.gz").unlink()
    with pytest.raises(DataError) as info:
        convert_prostate(source, tmp_path / "dst")
    assert "HK" in str(info.value) and "Case02.nii.gz" in str(info.value)


def test_shape_mismatch_names_site_and_mask(source, tmp_path):
    nib.save(
        nib.Nifti1Image(np.zeros((16, 15, 10), np.uint8), AFFINE), source / "UCL" / "Mask" / "Case03_Segmentation.nii"
    )
    with pytest.raises(DataError) as info:
        convert_prostate(source, tmp_path / "dst")
    assert "UCL" in str(info.value) and "Case03_Segmentation.nii" in str(info.value)


def test_too_few_cases_and_empty_mask(tmp_path):
    src = write_source(tmp_path / "few", sites={"RUNMC": ("", 1, ".nii.gz")}, cases=2)
    with pytest.raises(DataError, match="RUNMC.*at least 3"):
        convert_prostate(src, tmp_path / "dst")
    src = write_source(tmp_path / "empty", sites={"BMC": ("", 1, ".nii.gz")}, cases=3)
    nib.save(nib.Nifti1Image(np.zeros(SHAPE, np.uint8), AFFINE), src / "BMC" / "Mask" / "Case01.nii.gz")
    with pytest.raises(DataError) as info:
        convert_prostate(src, tmp_path / "dst")
    assert "BMC" in str(info.value) and "Case01.nii.gz" in str(info.value)


# NVFlare's prostate example (research/prostate/data_preparation): dataset[_2D]/<site>/Image|Mask/..., and
# datalist[_2D]/client_<site>.json with paths relative to the dataset folder, client_All.json every client merged.
NVFLARE_SPLIT = {"training": [0, 1], "validation": [2], "testing": [3]}


def write_nvflare_3d(root, sites=("I2CVB", "MSD")):
    """NVFlare's 3-D layout: NIfTI volumes (masks 0/1) and one datalist per client, split by case."""
    write_source(root / "dataset", sites={s: ("", 1, ".nii.gz") for s in sites})
    merged = {split: [] for split in NVFLARE_SPLIT}
    for site in sites:
        datalist = {
            split: [
                {"image": f"{site}/Image/Case{c:02d}.nii.gz", "label": f"{site}/Mask/Case{c:02d}.nii.gz"} for c in cases
            ]
            for split, cases in NVFLARE_SPLIT.items()
        }
        write_json(root / "datalist" / f"client_{site}.json", datalist)
        for split in merged:
            merged[split] += datalist[split]
    write_json(root / "datalist" / "client_All.json", merged)
    return root / "dataset", root / "datalist"


def write_json(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4))


def test_nvflare_3d_datalists_keep_their_sites_and_split(tmp_path):
    src, lists = write_nvflare_3d(tmp_path / "nvflare")
    dst = tmp_path / "dst"
    summary = convert_prostate(src, dst, nvflare_datalists=lists)
    assert set(summary["sites"]) == {"I2CVB", "MSD"}  # client_All.json (every client merged) is no site
    assert summary["split"] == f"NVFlare's prostate datalists ({lists}), kept as they are"
    assert json.loads((dst / "dataset.json").read_text())["split_used"] == summary["split"]
    assert json.loads((dst / "sites.json").read_text()) == {"I2CVB": "client_I2CVB.json", "MSD": "client_MSD.json"}
    for site in ("I2CVB", "MSD"):
        datalist = load_datalist(dst, site)  # 2-D slices inside the data root, binary masks
        for split, cases in NVFLARE_SPLIT.items():
            assert {e["case"] for e in datalist[split]} == {f"Case{c:02d}" for c in cases}
            assert summary["sites"][site]["slices"][split] == len(datalist[split])
            organ = [organ_range(c) for c in cases]
            assert len(datalist[split]) == sum(min(r.stop + 2, SHAPE[2]) - max(r.start - 2, 0) for r in organ)


def test_nvflare_2d_png_datalists_from_the_command_line(tmp_path, capsys):
    """NVFlare's 2-D example: PNG slices <site>/Image/<case>/<k>.png with 0/255 PNG masks, datalist_2D/."""
    from PIL import Image

    from fairfl import cli

    src, lists = tmp_path / "dataset_2D", tmp_path / "datalist_2D"
    rng = np.random.default_rng(1)
    datalist = {split: [] for split in SPLITS}
    for split, cases in NVFLARE_SPLIT.items():
        for case in cases:
            for k in (4, 5):
                mask = np.zeros((12, 10), np.uint8)
                mask[3:8, 2 : 4 + case] = 255
                for folder, array in (("Image", rng.integers(0, 255, (12, 10), dtype=np.uint8)), ("Mask", mask)):
                    (src / "BIDMC" / folder / f"Case{case:02d}").mkdir(parents=True, exist_ok=True)
                    Image.fromarray(array).save(src / "BIDMC" / folder / f"Case{case:02d}" / f"{k}.png")
                paths = {
                    key: f"BIDMC/{folder}/Case{case:02d}/{k}.png"
                    for key, folder in (("image", "Image"), ("label", "Mask"))
                }
                datalist[split].append(paths)
    write_json(lists / "client_BIDMC.json", datalist)
    dst = tmp_path / "dst"
    assert cli.main(["convert-prostate", str(src), str(dst), "--nvflare-datalists", str(lists), "--rename-sites"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["split"].startswith("NVFlare's prostate datalists") and list(printed["sites"]) == ["site-1"]
    converted = load_datalist(dst, "site-1")
    assert [len(converted[s]) for s in SPLITS] == [4, 2, 2]
    first = converted["training"][0]
    assert first["case"] == "Case00" and first["image"].endswith("site-1/images/Case00_4.png")
    assert Path(first["image"]).read_bytes() == (src / "BIDMC/Image/Case00/4.png").read_bytes()  # copied as is
    assert np.array_equal(
        np.asarray(Image.open(first["label"])), np.asarray(Image.open(src / "BIDMC/Mask/Case00/4.png")) // 255
    )
    batch = next(iter(make_loader(converted["training"], 16, 2, 4, train=True, seed=0)))
    assert batch["image"].shape == (4, 1, 16, 16) and set(batch["label"].unique().tolist()) == {0, 1}


def edit_datalist(lists, site, change):
    path = lists / f"client_{site}.json"
    datalist = json.loads(path.read_text())
    change(datalist)
    write_json(path, datalist)


def entry(split, index, key, value):
    def change(datalist):
        datalist[split][index][key] = value

    return change


@pytest.mark.parametrize(
    "damage, site, file, problem",
    [
        (
            lambda src, lists: (
                nib.save(nib.Nifti1Image(np.zeros(SHAPE, np.int16), AFFINE), src.parent / "outside.nii.gz"),
                edit_datalist(lists, "MSD", entry("training", 0, "image", "../outside.nii.gz")),
            ),
            "MSD",
            "outside.nii.gz",
            "leads outside the data root",
        ),
        (
            lambda src, lists: (  # absolute: fine inside the data root, refused outside it
                edit_datalist(lists, "MSD", entry("training", 0, "image", str(src / "MSD/Image/Case00.nii.gz"))),
                edit_datalist(lists, "MSD", entry("testing", 0, "label", str(src.parent / "Case03.nii.gz"))),
                (src / "MSD/Mask/Case03.nii.gz").rename(src.parent / "Case03.nii.gz"),
            ),
            "MSD",
            "Case03.nii.gz",
            "give as SRC the folder its paths are relative to",
        ),
        (
            lambda src, lists: (src / "I2CVB/Image/Case02.nii.gz").unlink(),
            "I2CVB",
            "Case02.nii.gz",
            "image file not found (entry validation[0] of client_I2CVB.json)",
        ),
        (
            lambda src, lists: edit_datalist(lists, "MSD", lambda d: d.update(testing=[])),
            "MSD",
            "client_MSD.json",
            "split 'testing' is missing or empty",
        ),
        (
            lambda src, lists: [p.unlink() for p in lists.glob("client_[IM]*.json")],
            "-",
            "datalist",
            "no client_<site>.json datalists",
        ),
        (lambda src, lists: (lists / "client_MSD.json").write_text("{"), "MSD", "client_MSD.json", "not valid JSON"),
        (
            lambda src, lists: edit_datalist(lists, "MSD", lambda d: d["testing"].append(d["training"][0])),
            "MSD",
            "Case00.nii.gz",
            "listed twice: client_MSD.json training[0] and client_MSD.json testing[1]",
        ),
        (
            lambda src, lists: edit_datalist(
                lists, "I2CVB", lambda d: d["training"].append("I2CVB/Image/Case00.nii.gz")
            ),
            "I2CVB",
            "client_I2CVB.json",
            "entry training[2] must be an object",
        ),
        (
            lambda src, lists: (lists / "client_MSD.json").rename(lists / "client_M SD.json"),
            "M SD",
            "client_M SD.json",
            "not a safe name",
        ),
        (
            lambda src, lists: nib.save(
                nib.Nifti1Image(np.zeros(SHAPE, np.uint8), AFFINE), src / "MSD/Mask/Case03.nii.gz"
            ),
            "MSD",
            "Case03.nii.gz",
            "mask is empty",
        ),
    ],
)
def test_each_nvflare_problem_names_site_and_file_and_writes_nothing(tmp_path, damage, site, file, problem):
    src, lists = write_nvflare_3d(tmp_path / "nvflare")
    damage(src, lists)
    with pytest.raises(DataError) as info:
        convert_prostate(src, tmp_path / "dst", nvflare_datalists=lists)
    for part in (f"[{site}]", file, problem):
        assert part in str(info.value), (part, str(info.value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvflare"]  # no output, no temporary folder


@pytest.mark.parametrize("name", UNSAFE_SITE_NAMES)
@pytest.mark.parametrize("layout", ["folders", "nvflare datalists"])
def test_an_output_site_name_outside_the_output_folder_is_refused_and_nothing_written(tmp_path, name, layout):
    name = unsafe_name(name, tmp_path)
    if layout == "folders":
        source = write_source(tmp_path / "src", sites={"HK": SITES["HK"]})
        convert = lambda src, dst: convert_prostate(src, dst, site_names={"HK": name})  # noqa: E731
        assert_unsafe_name_refused(convert, source, tmp_path, name, "HK", source)
    else:  # NVFlare's datalists: their client names, renamed
        src, lists = write_nvflare_3d(tmp_path / "nvflare", sites=("MSD",))
        convert = lambda _, dst: convert_prostate(src, dst, nvflare_datalists=lists, site_names={"MSD": name})  # noqa: E731
        assert_unsafe_name_refused(convert, tmp_path / "nvflare", tmp_path, name, "MSD", lists)
