"""Converter for the multi-site fundus layouts: <site>/train|test/ROIs/image|mask/ and <site>/image(s)|mask(s)/."""

import json

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage
from test_convert_isic import UNSAFE_SITE_NAMES, assert_unsafe_name_refused, unsafe_name

from fairfl.data.convert_fundus import convert_fundus, mask_classes
from fairfl.data.datalist import SPLITS, load_datalist
from fairfl.data.loaders import make_loader
from fairfl.errors import DataError

SIZE = 48  # large enough that anti-aliased edges are a small share of a mask, as in real ones


def classes_of(index: int) -> np.ndarray:
    """Class map of image `index`: a disc (rim) with a cup inside, placed a little differently each time."""
    rows, cols = np.mgrid[:SIZE, :SIZE]
    r = np.hypot(rows - 23 - index % 3, cols - 24 + index % 2)
    return np.where(r < 6, 2, np.where(r < 12, 1, 0)).astype(np.uint8)


def grey_mask(classes: np.ndarray, antialias: bool = False, colour: bool = False) -> np.ndarray:
    """The public encoding: 255 background, 128 rim, 0 cup; optionally blurred edges and saved as RGB."""
    grey = np.array([255, 128, 0], np.uint8)[classes]
    if antialias:
        grey = np.round(ndimage.uniform_filter(grey.astype(np.float32), 2)).astype(np.uint8)
    return np.repeat(grey[..., None], 3, -1) if colour else grey


def write_pair(image_dir, mask_dir, stem, index, image_ext=".png", mask_ext=".png", **mask_style):
    image_dir.mkdir(parents=True, exist_ok=True)
    mask_dir.mkdir(parents=True, exist_ok=True)
    rgb = np.random.default_rng(index).integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(image_dir / f"{stem}{image_ext}")
    Image.fromarray(grey_mask(classes_of(index), **mask_style)).save(mask_dir / f"{stem}{mask_ext}")


def write_source(src):
    """Domain1: the DoFE release (train/test under ROIs/); Domain2: train/test without ROIs, JPEG
    images and anti-aliased RGB BMP masks; Domain3: images/ + masks/ directly, no given test set."""
    for k in range(4):
        write_pair(src / "Domain1/train/ROIs/image", src / "Domain1/train/ROIs/mask", f"gdrishtiGS_{k:03d}", k)
    for k in range(4, 6):
        write_pair(src / "Domain1/test/ROIs/image", src / "Domain1/test/ROIs/mask", f"gdrishtiGS_{k:03d}", k)
    for k in range(5):
        part = "Train" if k < 3 else "Test"
        write_pair(
            src / f"Domain2/{part}/Image",
            src / f"Domain2/{part}/Mask",
            f"n{k:04d}",
            k,
            image_ext=".jpg",
            mask_ext=".bmp",
            antialias=True,
            colour=True,
        )
    for k in range(8):
        write_pair(src / "Domain3/images", src / "Domain3/masks", f"V{k:04d}", k)
    return src


@pytest.fixture
def source(tmp_path):
    return write_source(tmp_path / "Fundus")


def read_label(path):
    return np.asarray(Image.open(path))


def test_both_layouts_given_test_sets_and_seeded_splits(source, tmp_path):
    dst = tmp_path / "dst"
    summary = convert_fundus(source, dst)
    sites = summary["sites"]
    assert set(sites) == {"Domain1", "Domain2", "Domain3"}
    assert json.loads((dst / "sites.json").read_text()) == {s: s for s in sites}
    description = json.loads((dst / "dataset.json").read_text())
    assert description["labels"] == {"0": "background", "1": "optic disc rim", "2": "optic cup"}
    assert description["regions"] == {"disc": [1, 2], "cup": [2]}
    assert (
        summary["split"]
        == description["split_used"]
        == (
            "testing: the release's test/ folder at Domain1, Domain2; "
            "the rest: fairfl's seeded split by image (0.5/0.25/0.25, seed 0)"
        )
    )

    # Given test sets are kept; the training folder is split into training and validation.
    assert sites["Domain1"]["test_set"] == "given"
    assert sites["Domain1"]["images"]["testing"] == ["gdrishtiGS_004", "gdrishtiGS_005"]
    assert sorted(sites["Domain1"]["images"]["training"] + sites["Domain1"]["images"]["validation"]) == [
        f"gdrishtiGS_{k:03d}" for k in range(4)
    ]
    assert len(sites["Domain1"]["images"]["validation"]) == 1  # 4 * 0.25 / 0.75, rounded
    assert sites["Domain2"]["test_set"] == "given" and sites["Domain2"]["images"]["testing"] == ["n0003", "n0004"]
    # No test folder: a seeded 0.5/0.25/0.25 split of all images.
    assert sites["Domain3"]["test_set"] == "split"
    assert {s: len(sites["Domain3"]["images"][s]) for s in SPLITS} == {"training": 4, "validation": 2, "testing": 2}

    for site in sites:
        datalist = load_datalist(dst, site, num_classes=3)  # files exist, sizes match, labels in 0..2
        assert sum(len(v) for v in datalist.values()) == sum(len(v) for v in sites[site]["images"].values())
    batch = next(
        iter(
            make_loader(
                load_datalist(dst, "Domain2", num_classes=3)["training"], 32, 3, 2, train=True, seed=0, in_channels=3
            )
        )
    )
    assert batch["image"].shape == (2, 3, 32, 32) and set(batch["label"].unique().tolist()) <= {0, 1, 2}


def test_masks_are_re_encoded_and_images_copied(source, tmp_path):
    convert_fundus(source, tmp_path / "dst")
    dst = tmp_path / "dst"
    # exact grey masks map exactly
    assert np.array_equal(read_label(dst / "Domain1/labels/gdrishtiGS_005.png"), classes_of(5))
    assert (dst / "Domain1/images/gdrishtiGS_005.png").read_bytes() == (
        source / "Domain1/test/ROIs/image/gdrishtiGS_005.png"
    ).read_bytes()
    # anti-aliased RGB masks: nearest level, so only edge pixels may move, by one class at most
    label, expected = read_label(dst / "Domain2/labels/n0001.png"), classes_of(1)
    assert label.dtype == np.uint8 and set(np.unique(label)) == {0, 1, 2}
    assert (label != expected).mean() < 0.1 and np.abs(label.astype(int) - expected).max() == 1
    assert (dst / "Domain2/images/n0001.jpg").read_bytes() == (source / "Domain2/Train/Image/n0001.jpg").read_bytes()


def test_mask_rule_nearest_level():
    classes, off = mask_classes(np.array([[255, 200, 191, 128, 64, 63, 0]], np.uint8))
    assert classes.tolist() == [[0, 0, 1, 1, 1, 2, 2]] and off == pytest.approx(4 / 7)  # all but 255, 128, 0: > 48 off
    classes, off = mask_classes(np.array([[[255, 255, 255], [128, 120, 136], [0, 200, 0]]], np.uint8))
    assert classes.tolist()[0][:2] == [0, 1] and off == pytest.approx(1 / 3)  # channels disagree


def test_non_rgb_images_become_rgb_png(tmp_path):
    src = tmp_path / "src"
    for k in range(3):
        write_pair(src / "A/image", src / "A/mask", f"a{k}", k)
    Image.fromarray(np.full((SIZE, SIZE, 4), 90, np.uint8)).save(src / "A/image/a1.png")  # RGBA
    convert_fundus(src, tmp_path / "dst")
    with Image.open(tmp_path / "dst/A/images/a1.png") as image:
        assert image.mode == "RGB"


def test_site_names_and_deterministic_split(source, tmp_path):
    a = convert_fundus(source, tmp_path / "a", site_names="flare")
    b = convert_fundus(source, tmp_path / "b", site_names="flare")
    assert a == b
    assert json.loads((tmp_path / "a" / "sites.json").read_text()) == {
        "site-1": "Domain1",
        "site-2": "Domain2",
        "site-3": "Domain3",
    }
    assert (tmp_path / "a" / "site-3.json").read_text() == (tmp_path / "b" / "site-3.json").read_text()
    assert load_datalist(tmp_path / "a", "site-2", num_classes=3)
    mapped = convert_fundus(source, tmp_path / "m", site_names={"Domain1": "drishti"})
    assert set(mapped["sites"]) == {"drishti", "Domain2", "Domain3"}
    splits = [
        convert_fundus(source, tmp_path / f"s{seed}", seed=seed)["sites"]["Domain3"]["images"] for seed in range(5)
    ]
    assert any(s != splits[0] for s in splits)  # the seed moves images between splits


def save(array, path):
    Image.fromarray(np.asarray(array, np.uint8)).save(path)


@pytest.mark.parametrize(
    "damage, site, file, problem",
    [
        (
            lambda src: (src / "Domain1/train/ROIs/mask/gdrishtiGS_002.png").unlink(),
            "Domain1",
            "gdrishtiGS_002.png",
            "no mask for this image",
        ),
        (lambda src: (src / "Domain3/images/V0004.png").unlink(), "Domain3", "V0004.png", "mask without an image"),
        (
            lambda src: (src / "Domain3/images/V0002.png").write_bytes(b"not a png"),
            "Domain3",
            "V0002.png",
            "cannot read image",
        ),
        (
            lambda src: save(
                np.random.default_rng(0).integers(0, 255, (SIZE, SIZE)),
                src / "Domain1/test/ROIs/mask/gdrishtiGS_004.png",
            ),
            "Domain1",
            "gdrishtiGS_004.png",
            "far from the grey levels",
        ),
        (
            lambda src: save(classes_of(1), src / "Domain3/masks/V0001.png"),  # already class indices
            "Domain3",
            "V0001.png",
            "no background",
        ),
        (
            lambda src: save(
                np.where(classes_of(2) > 0, 255, 0), src / "Domain3/masks/V0002.png"
            ),  # binary, black background
            "Domain3",
            "V0002.png",
            "no disc rim",
        ),
        (
            lambda src: save(
                np.array([0, 128, 255])[classes_of(2)], src / "Domain3/masks/V0002.png"
            ),  # cup <-> background
            "Domain3",
            "V0002.png",
            "cup (0) pixels reach the image border",
        ),
        (
            lambda src: save(np.full((SIZE, SIZE + 2), 255), src / "Domain2/Test/Mask/n0003.bmp"),
            "Domain2",
            "n0003.bmp",
            "does not match image n0003.jpg",
        ),
    ],
)
def test_each_problem_names_site_and_file_and_writes_nothing(source, tmp_path, damage, site, file, problem):
    damage(source)
    with pytest.raises(DataError) as info:
        convert_fundus(source, tmp_path / "dst")
    for part in (f"[{site}]", file, problem):
        assert part in str(info.value), (part, str(info.value))
    assert list(tmp_path.iterdir()) == [source]  # no output, no temporary folder left behind


def make_folders(*folders):
    for folder in folders:
        folder.mkdir(parents=True)


def test_empty_and_too_small_sites(tmp_path):
    src = tmp_path / "src"
    make_folders(src / "Empty/image", src / "Empty/mask")
    with pytest.raises(DataError, match=r"\[Empty\].*0 image"):
        convert_fundus(src, tmp_path / "dst")
    src = tmp_path / "src2"
    for k in range(2):
        write_pair(src / "Small/train/image", src / "Small/train/mask", f"s{k}", k)
    make_folders(src / "Small/test/image", src / "Small/test/mask")
    with pytest.raises(DataError, match=r"\[Small\].*2 training and 0 test"):
        convert_fundus(src, tmp_path / "dst")
    (src / "Small/test/mask").rmdir()
    with pytest.raises(DataError, match=r"\[Small\].*test.*no image/ and mask/"):
        convert_fundus(src, tmp_path / "dst")


def test_refuses_a_non_empty_output_and_a_source_without_sites(source, tmp_path):
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "keep.txt").write_text("user data")
    with pytest.raises(DataError, match="not empty"):
        convert_fundus(source, tmp_path / "dst")
    assert (tmp_path / "dst" / "keep.txt").read_text() == "user data"
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match="no site folders"):
        convert_fundus(tmp_path / "nothing", tmp_path / "out")
    (tmp_path / "empty_dst").mkdir()  # an existing empty folder is fine
    assert convert_fundus(source, tmp_path / "empty_dst")["sites"]


@pytest.mark.parametrize("name", UNSAFE_SITE_NAMES)
def test_an_output_site_name_outside_the_output_folder_is_refused_and_nothing_written(source, tmp_path, name):
    name = unsafe_name(name, tmp_path)
    convert = lambda src, dst: convert_fundus(src, dst, site_names={"Domain2": name})  # noqa: E731
    assert_unsafe_name_refused(convert, source, tmp_path, name, "Domain2", source)
