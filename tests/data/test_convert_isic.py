"""Converter for the ISIC 2019 layout: image folder, one-hot ground-truth CSV, optional metadata."""

import json

import numpy as np
import pytest
from PIL import Image

from fairfl.data.classification_sites import SKIN_CLASSES
from fairfl.data.convert_isic import convert_isic
from fairfl.data.datalist import CORRUPTED_SPLIT, SPLITS, load_datalist
from fairfl.data.loaders import make_loader
from fairfl.errors import DataError

COLUMNS = (*SKIN_CLASSES, "UNK")
# class of each of 61 images: NV dominant, every class present; the last one (60) is UNK
LABELS = [1] * 24 + [0] * 10 + [2] * 8 + [3] * 4 + [4] * 6 + [5, 5, 6, 6, 7, 7, 7, 7] + [8]
SOURCES = ["BCN_nan", "HAM_vidir_modern", "HAM_rosendahl", "MSK4nan"]


def image_id(k: int) -> str:
    return f"ISIC_{k:07d}"


def lesion(k: int) -> str:
    """Two images per lesion for the first 20 images (the same class: k and k + 1 pair up below 24)."""
    return f"{SOURCES[k % 4].split('_')[0][:4]}_{(k // 2 if k < 20 else k):07d}"


def source_of(k: int) -> str:
    """Image k's source: lesions pair images k, k+1 (k even) below 20, and a pair's sources agree."""
    return SOURCES[(k - k % 2) % 4] if k < 20 else SOURCES[k % 4]


def write_source(src, metadata: bool = True, fl_metadata: bool = True, size=(24, 20)):
    images = src / "ISIC_2019_Training_Input"
    images.mkdir(parents=True)
    (images / "LICENSE.txt").write_text("CC-BY-NC")
    rng = np.random.default_rng(0)
    rows = ["image," + ",".join(COLUMNS)]
    for k, label in enumerate(LABELS):
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(images / f"{image_id(k)}.jpg")
        rows.append(image_id(k) + "," + ",".join("1.0" if c == label else "0.0" for c in range(len(COLUMNS))))
    (src / "ISIC_2019_Training_GroundTruth.csv").write_text("\n".join(rows) + "\n")
    sources = [source_of(k) for k in range(len(LABELS))]
    if metadata:
        lines = ["image,age_approx,anatom_site_general,lesion_id,sex"]
        lines += [
            f"{image_id(k)},50,back,{sources[k].split('_')[0][:4]}_{(k // 2 if k < 20 else k):07d},male"
            for k in range(len(LABELS))
        ]
        (src / "ISIC_2019_Training_Metadata.csv").write_text("\n".join(lines) + "\n")
    if fl_metadata:
        lines = ["image,age_approx,anatom_site_general,sex,dataset"]
        lines += [f"{image_id(k)},50,back,male,{sources[k] if k != 59 else ''}" for k in range(len(LABELS))]
        (src / "ISIC_2019_Training_Metadata_FL.csv").write_text("\n".join(lines) + "\n")
    return src


@pytest.fixture
def source(tmp_path):
    return write_source(tmp_path / "isic")


def entries_by_image(root, site):
    datalist = json.loads((root / f"{site}.json").read_text())
    return {
        split: {e["image"].rsplit("/", 1)[-1].split(".")[0]: e["label"] for e in datalist[split]} for split in datalist
    }


def test_dirichlet_sites_shared_test_set_labels_and_lesions(source, tmp_path):
    dst = tmp_path / "dst"
    summary = convert_isic(source, dst, num_sites=4)
    sites = [f"site-{k}" for k in range(1, 5)]
    assert list(summary["sites"]) == sites and summary["excluded"]["UNK label"] == 1
    assert summary["split"] == "Dirichlet sites, fairfl's seeded split (seed 0)"
    description = json.loads((dst / "dataset.json").read_text())
    assert description["classes"] == list(SKIN_CLASSES) and description["num_classes"] == 8
    assert description["in_channels"] == 3 and description["split"]["method"] == "dirichlet"
    assert description["corruption"] is None and description["test"]["shared"]
    where = {}
    for site in sites:
        lists = load_datalist(dst, site, task="classification", num_classes=8)  # files exist, labels in range
        assert CORRUPTED_SPLIT not in json.loads((dst / f"{site}.json").read_text())
        for split, found in entries_by_image(dst, site).items():
            for name, label in found.items():
                assert label == LABELS[int(name.split("_")[1])]
                where.setdefault(name, set()).add(site if split != "testing" else "test")
        assert lists["testing"] == load_datalist(dst, "site-1", task="classification", num_classes=8)["testing"]
    assert len(where) == len(LABELS) - 1 and all(len(v) == 1 for v in where.values())  # UNK left out
    for k in range(0, 20, 2):  # both images of a lesion in one place
        assert where[image_id(k)] == where[image_id(k + 1)]
    copied = next((dst / "site-1").iterdir())
    assert copied.read_bytes() == (source / "ISIC_2019_Training_Input" / copied.name).read_bytes()
    batch = next(
        iter(
            make_loader(
                load_datalist(dst, "site-2", task="classification", num_classes=8)["training"],
                32,
                8,
                2,
                train=True,
                seed=0,
                in_channels=3,
                task="classification",
            )
        )
    )
    assert batch["image"].shape == (2, 3, 32, 32) and batch["label"].shape == (2,)


def test_source_sites_with_flare_names_and_their_own_test_sets(source, tmp_path):
    dst = tmp_path / "dst"
    summary = convert_isic(source, dst, sites="source", site_names="flare")
    assert json.loads((dst / "sites.json").read_text()) == {f"site-{k + 1}": s for k, s in enumerate(sorted(SOURCES))}
    assert summary["excluded"]["no source site"] == 1  # image 59 has no dataset
    description = json.loads((dst / "dataset.json").read_text())
    assert description["split"]["method"] == "source" and not description["test"]["shared"]
    tests = [set(entries_by_image(dst, f"site-{k}")["testing"]) for k in range(1, 5)]
    assert all(tests) and not set.intersection(*tests[:2])
    held = sum(len(entries_by_image(dst, f"site-{k}")[s]) for k in range(1, 5) for s in SPLITS)
    assert held == len(LABELS) - 2


# FLamby's centre of each of our sources (its README's order: BCN, HAM_vidir_molemax, HAM_vidir_modern, ...)
FLAMBY_CENTER = {"BCN_nan": 0, "HAM_vidir_modern": 2, "HAM_rosendahl": 3, "MSK4nan": 4}
FLAMBY_HEADER = "image," + ",".join(COLUMNS) + ",target,center,fold,fold2"


def flamby_fold(k: int) -> str:
    """Every third lesion pair (or image, from 20 on) in the test fold: each centre gets test images."""
    return "test" if (k // 2 if k < 20 else k) % 3 == 0 else "train"


def write_flamby_split(path, leave_out=(58,)):
    """FLamby's train_test_split for images 0-59 (60 is UNK) but `leave_out`, in its column layout."""
    rows = [FLAMBY_HEADER]
    for k, label in enumerate(LABELS[:60]):
        if k not in leave_out:
            one_hot = ",".join("1.0" if c == label else "0.0" for c in range(len(COLUMNS)))
            center = FLAMBY_CENTER[source_of(k)]
            rows.append(f"{image_id(k)},{one_hot},{label},{center},{flamby_fold(k)},{flamby_fold(k)}_{center}")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_flamby_split_gives_its_centres_as_sites_and_its_test_fold_as_test_sets(source, tmp_path):
    write_flamby_split(source / "train_test_split")  # found in SRC under FLamby's file name
    dst = tmp_path / "dst"
    summary = convert_isic(source, dst, sites="source", site_names="flare", seed=4)
    assert json.loads((dst / "sites.json").read_text()) == {
        "site-1": "center0_BCN",
        "site-2": "center2_HAM_vidir_modern",
        "site-3": "center3_HAM_rosendahl",
        "site-4": "center4_MSK",
    }
    assert summary["split"].startswith("FLamby's Fed-ISIC2019 split") and "train_test_split" in summary["split"]
    assert summary["excluded"]["not in FLamby's split"] == 1  # image 58; 59 (no dataset) is in FLamby's split
    description = json.loads((dst / "dataset.json").read_text())
    assert description["split_used"] == summary["split"] and description["split"]["test_fraction"] is None
    fixed = description["fixed_split"]
    assert fixed["name"] == "FLamby Fed-ISIC2019 train_test_split" and fixed["file"].endswith("train_test_split")
    assert fixed["centers"] == {
        "center0_BCN": 0,
        "center2_HAM_vidir_modern": 2,
        "center3_HAM_rosendahl": 3,
        "center4_MSK": 4,
    }
    for site, src_name in json.loads((dst / "sites.json").read_text()).items():
        center = int(src_name[len("center")])
        mine = [k for k in range(60) if k != 58 and FLAMBY_CENTER[source_of(k)] == center]
        lists = entries_by_image(dst, site)
        assert set(lists["testing"]) == {image_id(k) for k in mine if flamby_fold(k) == "test"}
        assert set(lists["training"]) | set(lists["validation"]) == {
            image_id(k) for k in mine if flamby_fold(k) == "train"
        }
        assert lists["validation"] and not set(lists["training"]) & set(lists["validation"])
        for k in range(0, 20, 2):  # a lesion's two images stay in one of training and validation
            assert (image_id(k) in lists["training"]) == (image_id(k + 1) in lists["training"])
        load_datalist(dst, site, task="classification", num_classes=8)
    again = convert_isic(source, tmp_path / "again", sites="source", site_names="flare", seed=4)
    assert again["sites"] == summary["sites"]  # the validation draw is seeded


def test_without_flamby_split_the_source_sites_say_the_split_is_fairfls(source, tmp_path):
    summary = convert_isic(source, tmp_path / "dst", sites="source")
    assert "not FLamby's" in summary["split"] and "--flamby-split" in summary["split"]
    assert "fixed_split" not in json.loads((tmp_path / "dst" / "dataset.json").read_text())
    with pytest.raises(ValueError, match="sites='source'"):
        convert_isic(source, tmp_path / "d2", flamby_split=write_flamby_split(tmp_path / "split.csv"))


SPLIT = "train_test_split"


def edit_split(src, old, new):
    path = write_flamby_split(src / SPLIT)
    path.write_text(path.read_text().replace(old, new))


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda src: edit_split(src, "ISIC_0000007,", "ISIC_9999999,"), "line 9 (ISIC_9999999): no such image"),
        (lambda src: edit_split(src, "ISIC_0000007,", "ISIC_0000003,"), "line 9 (ISIC_0000003): image listed twice"),
        (
            lambda src: edit_split(src, ",train,train_0", ",valid,train_0"),
            "line 6 (ISIC_0000004): fold 'valid' is not 'train' or 'test'",
        ),
        (lambda src: edit_split(src, "1,0,train,train_0", "1,6,train,train_0"), "center '6' is not one of"),
        (
            lambda src: edit_split(src, ",1,0,train,train_0", ",0,0,train,train_0"),
            "line 6 (ISIC_0000004): target 0, but ISIC_2019_Training_GroundTruth.csv says 1 (NV)",
        ),
        (lambda src: edit_split(src, ",test,test_4", ",train,train_4"), "centre 4 (MSK) has no image in the test fold"),
        (lambda src: (src / SPLIT).write_text(FLAMBY_HEADER + "\n"), "no rows"),
    ],
)
def test_each_flamby_split_problem_names_the_file_and_line(source, tmp_path, damage, problem):
    damage(source)
    convert = lambda src, dst: convert_isic(src, dst, sites="source")  # noqa: E731
    assert_refused(convert, source, tmp_path, "-", SPLIT, problem)


def test_command_line_flamby_split_is_used_and_said(source, tmp_path, capsys):
    from fairfl import cli

    split = write_flamby_split(tmp_path / "FLamby_train_test_split.csv", leave_out=())
    args = ["convert-isic", str(source), str(tmp_path / "out"), "--sites", "source", "--rename-sites"]
    assert cli.main([*args, "--flamby-split", str(split)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["split"] == f"FLamby's Fed-ISIC2019 split ({split}): its centres as sites, its test fold as testing"
    assert printed["excluded"]["not in FLamby's split"] == 0 and len(printed["sites"]) == 4
    with pytest.raises(SystemExit):
        cli.main([*args[:2], str(tmp_path / "other"), "--flamby-split", str(tmp_path / "nowhere.csv")])
    assert "no such file" in capsys.readouterr().err


def test_a_given_flamby_split_needs_its_columns(source, tmp_path):
    path = write_flamby_split(tmp_path / "elsewhere.csv")
    rewrite(path, ",fold,", ",partition,")
    with pytest.raises(DataError, match="elsewhere.csv: missing column.s. fold"):
        convert_isic(source, tmp_path / "dst", sites="source", flamby_split=path)


def test_lesion_id_prefix_is_the_source_without_fl_metadata(tmp_path):
    src = write_source(tmp_path / "isic", fl_metadata=False)
    summary = convert_isic(src, tmp_path / "dst", sites="source")
    assert set(summary["sites"]) == {"BCN", "HAM", "MSK4"}


def test_resized_png_and_corrupted_sites(source, tmp_path):
    dst = tmp_path / "dst"
    convert_isic(source, dst, num_sites=4, image_size=32, corrupted_fraction=0.5, seed=3)
    description = json.loads((dst / "dataset.json").read_text())
    assert description["corrupted_sites"] == ["site-3", "site-4"] and description["corruption"]["sigma"] == 0.18
    lists = load_datalist(dst, "site-1", task="classification", num_classes=8, splits=(*SPLITS, CORRUPTED_SPLIT))
    with Image.open(lists["testing"][0]["image"]) as image:
        assert image.size == (32, 32) and image.mode == "RGB" and image.format == "PNG"
    clean = np.asarray(Image.open(lists["testing"][0]["image"]), float)
    noisy = np.asarray(Image.open(lists[CORRUPTED_SPLIT][0]["image"]), float)
    assert 20 < np.abs(clean - noisy).mean() < 80
    with pytest.raises(ValueError, match="need image_size"):
        convert_isic(source, tmp_path / "other", corrupted_fraction=0.2)


def test_deterministic_split(source, tmp_path):
    convert_isic(source, tmp_path / "a", num_sites=4, seed=1)
    convert_isic(source, tmp_path / "b", num_sites=4, seed=1)
    convert_isic(source, tmp_path / "c", num_sites=4, seed=2)
    read = {name: [entries_by_image(tmp_path / name, f"site-{k}") for k in range(1, 5)] for name in "abc"}
    assert read["a"] == read["b"] and read["a"] != read["c"]


def rewrite(path, old, new):
    path.write_text(path.read_text().replace(old, new, 1))


GT = "ISIC_2019_Training_GroundTruth.csv"


@pytest.mark.parametrize(
    "damage, site, file, problem",
    [
        (lambda src: (src / GT).unlink(), "-", GT, "file not found"),
        (lambda src: rewrite(src / GT, "image,MEL", "name,MEL"), "-", GT, "missing column(s) image"),
        (
            lambda src: rewrite(src / GT, "ISIC_0000003,0.0,1.0", "ISIC_0000003,1.0,1.0"),
            "-",
            GT,
            "line 5 (ISIC_0000003): exactly one of",
        ),
        (lambda src: rewrite(src / GT, "ISIC_0000003,0.0,1.0", "ISIC_0000003,0.0,yes"), "-", GT, "must be 0 or 1"),
        (lambda src: rewrite(src / GT, "ISIC_0000004,", "ISIC_0000003,"), "-", GT, "ISIC_0000003 listed twice"),
        (
            lambda src: (src / "ISIC_2019_Training_Input/ISIC_0000007.jpg").unlink(),
            "-",
            "ISIC_0000007.jpg",
            "listed in ISIC_2019_Training_GroundTruth.csv but not found",
        ),
        (
            lambda src: Image.new("RGB", (8, 8)).save(src / "ISIC_2019_Training_Input/ISIC_9999999.jpg"),
            "-",
            "ISIC_9999999.jpg",
            "image without a row",
        ),
        (
            lambda src: (src / "ISIC_2019_Training_Input/ISIC_0000030.jpg").write_bytes(
                (src / "ISIC_2019_Training_Input/ISIC_0000030.jpg").read_bytes()[:200]
            ),
            "site-",
            "ISIC_0000030.jpg",
            "cannot read image",
        ),
        (
            lambda src: rewrite(src / "ISIC_2019_Training_Metadata.csv", "image,", "img,"),
            "-",
            "ISIC_2019_Training_Metadata.csv",
            "missing column(s) image",
        ),
    ],
)
def test_each_problem_names_site_and_file_and_writes_nothing(source, tmp_path, damage, site, file, problem):
    damage(source)
    assert_refused(lambda src, dst: convert_isic(src, dst, num_sites=4), source, tmp_path, site, file, problem)


def assert_refused(convert, source, tmp_path, site, file, problem):
    """`convert(source, dst)` raises a DataError naming the site, the file and the problem, and leaves no
    output and no temporary folder behind (`source` is the only thing in `tmp_path`)."""
    with pytest.raises(DataError) as info:
        convert(source, tmp_path / "dst")
    for part in (f"[{site}", file, problem):
        assert part in str(info.value), (part, str(info.value))
    assert list(tmp_path.iterdir()) == [source]


# output site names that would leave the output folder; "/absolute" stands for a folder of tmp_path (`unsafe_name`)
UNSAFE_SITE_NAMES = ["..", ".", "a/b", "/absolute", ""]


def unsafe_name(name, tmp_path) -> str:
    """`name`, "/absolute" as an absolute path into tmp_path, where `assert_refused` sees anything written."""
    return str(tmp_path / "elsewhere") if name == "/absolute" else name


def assert_unsafe_name_refused(convert, source, tmp_path, name, site, file):
    """`convert(source, dst)` with an unsafe output site name `name` (from source site `site`) is refused naming
    both and `file`, and writes nothing anywhere (`assert_refused`)."""
    assert_refused(convert, source, tmp_path, site, str(file), f"output site name {name!r} is not a safe name")


@pytest.mark.parametrize("name", UNSAFE_SITE_NAMES)
def test_an_output_site_name_outside_the_output_folder_is_refused_and_nothing_written(source, tmp_path, name):
    name = unsafe_name(name, tmp_path)
    convert = lambda src, dst: convert_isic(src, dst, num_sites=4, site_names={"site-2": name})  # noqa: E731
    assert_unsafe_name_refused(convert, source, tmp_path, name, "Dirichlet(1) share 2", source)
    convert = lambda src, dst: convert_isic(src, dst, sites="source", site_names={"HAM_rosendahl": name})  # noqa: E731
    assert_unsafe_name_refused(convert, source, tmp_path, name, "HAM_rosendahl", source)


@pytest.mark.parametrize("name", ["..", "."])
def test_a_source_site_named_dot_dot_in_the_metadata_is_refused_by_the_command_and_nothing_written(
    source, tmp_path, capsys, name
):
    """`fairfl convert-isic --sites source` wrote images into the output folder's parent for a source `..` (into the
    output folder's own parent for `.`); the metadata's `dataset` column names the sources."""
    from fairfl import cli

    metadata = source / "ISIC_2019_Training_Metadata_FL.csv"
    metadata.write_text(metadata.read_text().replace(",BCN_nan", f",{name}"))
    before = sorted(p for p in tmp_path.rglob("*"))
    assert cli.main(["convert-isic", str(source), str(tmp_path / "out" / "dst"), "--sites", "source"]) == 1
    err = capsys.readouterr().err
    assert f"[{name}] {source}: output site name {name!r} is not a safe name" in err and "Traceback" not in err
    assert sorted(p for p in tmp_path.rglob("*")) == before  # not even the output folder's parent
    assert cli.main(["convert-isic", str(source), str(tmp_path / "ok"), "--sites", "source", "--rename-sites"]) == 0


def test_refusals(source, tmp_path):
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("user data")
    with pytest.raises(DataError, match="not empty"):
        convert_isic(source, tmp_path / "dst")
    with pytest.raises(DataError, match="source folder not found"):
        convert_isic(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(DataError, match="image folder not found"):
        convert_isic(tmp_path / "dst", tmp_path / "out")
    with pytest.raises(DataError, match="cannot split 60 images"):
        convert_isic(source, tmp_path / "out", num_sites=30)
    bare = write_source(tmp_path / "bare", metadata=False, fl_metadata=False)
    with pytest.raises(DataError, match="no source sites"):
        convert_isic(bare, tmp_path / "out", sites="source")
    assert not (tmp_path / "out").exists()


def test_command_line_converts_with_options_and_reports_bad_data(source, tmp_path, capsys):
    from fairfl import cli

    dst = tmp_path / "cli"
    assert (
        cli.main(
            [
                "convert-isic",
                str(source),
                str(dst),
                "--num-sites",
                "4",
                "--image-size",
                "32",
                "--corrupted-fraction",
                "0.5",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    assert json.loads((dst / "dataset.json").read_text())["corrupted_sites"] == ["site-3", "site-4"]
    assert cli.main(["convert-isic", str(source), str(dst)]) == 1  # not empty any more
    assert "not empty" in capsys.readouterr().err
