"""Bad inputs, table-driven: every one ends in a clear error naming the site (or setting) and the file (or
argument), and nothing outside the site's data and workspace is read, written or run.

Each case goes through the real code path: real files written in the real formats (nibabel, PIL) and read by
the site's executor (datalist, headers, the caching loader that decodes each file once), the real controller
and checkpoint code, and the real `fairfl` command line (`fairfl.cli.main`). Tiny images; no simulator here
(tests/integration/test_simulator_jobs.py::test_bad_data_fails_fast_naming_site_and_file runs bad data through one)."""

import gzip
import io
import json
import os
import struct
import tracemalloc
import zlib
from unittest import mock

import nibabel as nib
import numpy as np
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel
from PIL import Image

from fairfl import cli
from fairfl.data.datalist import SPLITS, write_datalist
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor
from fairfl.flare.site_task import SiteTask, check_meta
from fairfl.methods.fednpr.protocol import NPR

from helpers import REPO

SITE = "site-1"
SHAPE = (8, 8)


def save(path, array, mode=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".png") or path.name.endswith(".jpg"):
        Image.fromarray(array, mode).save(path) if mode is None else Image.fromarray(array).convert(mode).save(path)
    else:
        nib.save(nib.Nifti1Image(array, np.eye(4)), path)
    return path


def good_site(root, site=SITE, fmt="nii.gz"):
    """A valid tiny segmentation site (2 cases a split); returns the first training entry's file paths."""
    rng = np.random.default_rng(0)
    splits = {}
    for split in SPLITS:
        entries = []
        for i in range(2):
            name = f"{split}_{i}.{fmt}"
            image = rng.integers(0, 255, SHAPE).astype(np.uint8 if fmt == "png" else np.float32)
            mask = np.zeros(SHAPE, np.uint8)
            mask[2:5, 2:5] = 1
            save(root / site / "images" / name, image)
            save(root / site / "labels" / name, mask)
            entries.append({"image": f"{site}/images/{name}", "label": f"{site}/labels/{name}"})
        splits[split] = entries
    write_datalist(root / f"{site}.json", splits)
    first = splits["training"][0]
    return root / first["image"], root / first["label"]


def set_first(root, key, value, site=SITE):
    """Point the first training entry's `key` at `value` (a path string as a datalist holds it)."""
    path = root / f"{site}.json"
    datalist = json.loads(path.read_text())
    datalist["training"][0][key] = value
    path.write_text(json.dumps(datalist))


def site_task(meta: dict, site=SITE) -> SiteTask:
    """A server task of `meta` as the site reads it."""
    return SiteTask.of(site, FLModel(meta=meta))


def load_site(root, site=SITE, in_channels=1, num_classes=2, task="segmentation", max_samples=None):
    """What a site does with its data on its first tasks: read the datalist and dataset.json, then build (decode
    and cache) the loader of every split; with max_samples, the sampling loader (Fed-LWR's CKA), which decodes
    only while it is read: read once."""
    executor = FairflExecutor(data_root=str(root), image_size=16, batch_size=2)
    meta = {
        protocol.MODEL_SPEC: {"name": "unet", "in_channels": in_channels, "num_classes": num_classes},
        protocol.TASK: task,
    }
    for split in SPLITS:
        for _ in executor._loader(site_task(meta, site), split, train=False, seed=0, max_samples=max_samples):
            if max_samples is None:
                break
    return executor


# ------------------------------------------------------------------------------------------------- data files
def volume_image(root, image, mask):  # a 3-D volume where 2-D slices are expected (image and mask alike)
    save(image, np.zeros((*SHAPE, 3), np.float32))
    save(mask, np.zeros((*SHAPE, 3), np.uint8))
    return image


def truncated_nifti(root, image, mask):
    data = image.read_bytes()
    image.write_bytes(gzip.compress(gzip.decompress(data)[:400]))  # header intact, voxels cut off
    return image


def truncated_png(root, image, mask):
    png = image.with_suffix("").with_suffix(".png")
    save(png, np.random.default_rng(1).integers(0, 255, SHAPE, dtype=np.uint8))
    png.write_bytes(png.read_bytes()[:-30])
    set_first(root, "image", str(png.relative_to(root)))
    return png


def pixels(value):
    def make(root, image, mask):
        array = np.ones(SHAPE, np.float32)
        array[3, 4] = value
        save(image, array)
        return image

    return make


def overflowing_pixels(root, image, mask):  # finite, but the z-score's sums overflow float32
    array = np.full(SHAPE, 3e38, np.float32)
    array[3, 4] = 1.0
    save(image, array)
    return image


def datalist_link_out(root, image, mask):  # <root>/<site>.json itself a link to a datalist outside the root
    outside = root.parent / "elsewhere" / f"{SITE}.json"
    outside.parent.mkdir()
    (root / f"{SITE}.json").rename(outside)
    (root / f"{SITE}.json").symlink_to(outside)
    return root / f"{SITE}.json"


def escaping(kind):
    def make(root, image, mask):
        outside = root.parent / "outside" / "secret.nii.gz"
        save(outside, np.ones(SHAPE, np.float32))
        if kind == "link":
            link = root / SITE / "images" / "innocent.nii.gz"
            link.symlink_to(outside)
            set_first(root, "image", f"{SITE}/images/innocent.nii.gz")
        else:
            set_first(root, "image", "../outside/secret.nii.gz" if kind == "dotdot" else str(outside))
        return outside if kind != "link" else root / SITE / "images" / "innocent.nii.gz"

    return make


def png_mode(mode, key="image"):
    def make(root, image, mask):
        path = (image if key == "image" else mask).with_suffix("").with_suffix(".png")
        array = np.zeros(SHAPE, np.uint8)
        array[2:5, 2:5] = 1
        save(path, array, mode)
        set_first(root, key, str(path.relative_to(root)))
        return path

    return make


def cmyk_jpeg(root, image, mask):
    path = image.with_suffix("").with_suffix(".jpg")
    save(path, np.full(SHAPE, 100, np.uint8), "CMYK")
    set_first(root, "image", str(path.relative_to(root)))
    return path


def rewrite(name, content):
    def make(root, image, mask):
        target = {"image": image, "mask": mask}.get(name, root / name)
        target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
        return target

    return make


def text_as_nifti(root, image, mask):
    image.write_text("this is not an image")
    return image


def truncated_mask(root, image, mask):
    mask.write_bytes(mask.read_bytes()[:60])
    return mask


def directory_as_image(root, image, mask):
    folder = root / SITE / "images" / "a_folder.nii.gz"
    folder.mkdir()
    set_first(root, "image", f"{SITE}/images/a_folder.nii.gz")
    return folder


def nan_mask(root, image, mask):
    array = np.zeros(SHAPE, np.float32)
    array[0, 0] = np.nan
    save(mask, array)
    return mask


def datalist_value(value):
    def make(root, image, mask):
        (root / f"{SITE}.json").write_text(json.dumps(value))
        return root / f"{SITE}.json"

    return make


def entry_path(value):
    def make(root, image, mask):
        set_first(root, "image", value)
        return root / f"{SITE}.json"

    return make


DATA_CASES = {
    "3-D volume where 2-D slices are expected": volume_image,
    "truncated NIfTI": truncated_nifti,
    "truncated PNG": truncated_png,
    "NaN pixels": pixels(np.nan),
    "+Inf pixels": pixels(np.inf),
    "-Inf pixels": pixels(-np.inf),
    "pixels near float32's largest value (3e38: NaN after normalisation)": overflowing_pixels,
    "datalist file is a link out of the data root": datalist_link_out,
    "'../' path out of the data root": escaping("dotdot"),
    "absolute path out of the data root": escaping("absolute"),
    "symlink out of the data root": escaping("link"),
    "palette (P) image": png_mode("P"),
    "CMYK JPEG image": cmyk_jpeg,
    "RGB mask": png_mode("RGB", key="label"),
    "grey + alpha mask": png_mode("LA", key="label"),
    "empty image file": rewrite("image", b""),
    "text file named .nii.gz": text_as_nifti,
    "truncated mask": truncated_mask,
    "folder where an image is expected": directory_as_image,
    "NaN in a mask": nan_mask,
    "datalist is a JSON list": datalist_value([]),
    "datalist entry is a string": datalist_value({s: ["image.nii.gz"] for s in SPLITS}),
    "image path is a number": entry_path(7),
    "image path holds a NUL byte": entry_path("site-1/images/a\u0000.nii.gz"),
    "malformed dataset.json": rewrite("dataset.json", '{"regions": {"disc": [1, 2]'),
    "dataset.json is a list": rewrite("dataset.json", "[1, 2]"),
    "dataset.json regions out of class range": rewrite("dataset.json", '{"regions": {"disc": [1, 7]}}'),
    "dataset.json corrupted_sites not names": rewrite("dataset.json", '{"corrupted_sites": "site-1"}'),
    # nested deeper than Python's JSON parser recurses: a RecursionError, not a ValueError, before
    "datalist nested 100000 deep": rewrite(f"{SITE}.json", "[" * 100_000 + "]" * 100_000),
    "dataset.json nested 100000 deep": rewrite("dataset.json", '{"regions": ' + "[" * 100_000 + "]" * 100_000 + "}"),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_file_is_a_data_error_naming_site_and_file(tmp_path, case):
    root = tmp_path / "data"
    image, mask = good_site(root)
    bad_file = DATA_CASES[case](root, image, mask)
    with pytest.raises(DataError) as info:
        load_site(root)
    message = str(info.value)
    assert info.value.site == SITE and SITE in message
    assert os.path.basename(bad_file) in message, message
    assert "outside" not in [p.name for p in root.iterdir()]  # nothing written into the data root either


# -------------------------------------------------------------------- images declaring a huge size in their header
def nifti_declaring(path, shape):
    """A valid gzip NIfTI of zeros (uint8) whose header declares `shape`, written a chunk at a time: 20000 x 20000 is
    1.7 MB on disk and 400 MB once read."""
    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(np.uint8)
    header["vox_offset"] = 352
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(header.binaryblock + bytes(4))
        chunk, left = bytes(2**24), int(np.prod(shape))
        while left:
            out.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
    return path


def png_declaring(path, width, height):
    """A valid grey PNG of zeros, compressed a row at a time (never whole in memory here)."""

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor, row = zlib.compressobj(1), bytes(width + 1)  # each row: filter byte 0, then its pixels
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


def jpeg_declaring(path, width, height):
    """A tiny JPEG whose frame header (SOF0) is rewritten to declare width x height."""
    encoded = io.BytesIO()
    Image.fromarray(np.zeros(SHAPE, np.uint8)).save(encoded, "JPEG")
    data = bytearray(encoded.getvalue())
    frame = data.index(b"\xff\xc0")  # marker, length (2), precision (1), height (2), width (2)
    data[frame + 5 : frame + 9] = struct.pack(">HH", height, width)
    path.write_bytes(bytes(data))
    return path


def huge_nifti_pair(root):  # the pair is valid: before the cap, its mask was read whole (400 MB) and accepted
    good_site(root)
    image = nifti_declaring(root / SITE / "images" / "huge.nii.gz", (20000, 20000))
    (root / SITE / "labels").mkdir(exist_ok=True)
    (root / SITE / "labels" / "huge.nii.gz").write_bytes(image.read_bytes())
    set_first(root, "image", f"{SITE}/images/huge.nii.gz")
    set_first(root, "label", f"{SITE}/labels/huge.nii.gz")
    return image, "segmentation"


def huge_png_pair(root):  # 9000 x 9000: below PIL's own decompression-bomb limits, which never warned
    good_site(root)
    image = png_declaring(root / SITE / "images" / "huge.png", 9000, 9000)
    (root / SITE / "labels" / "huge.png").write_bytes(image.read_bytes())
    set_first(root, "image", f"{SITE}/images/huge.png")
    set_first(root, "label", f"{SITE}/labels/huge.png")
    return image, "segmentation"


def huge_jpeg(root):  # classification: only the header was read before training decoded it
    root.mkdir(parents=True, exist_ok=True)
    path = jpeg_declaring(root / "huge.jpg", 9000, 9000)
    write_datalist(root / f"{SITE}.json", {s: [{"image": "huge.jpg", "label": 1}] for s in SPLITS})
    return path, "classification"


HUGE_IMAGES = [huge_nifti_pair, huge_png_pair, huge_jpeg]


@pytest.mark.parametrize("make_files", HUGE_IMAGES)
def test_an_image_declaring_a_huge_size_is_refused_from_its_header_before_any_pixel_is_read(tmp_path, make_files):
    root = tmp_path / "data"
    bad_file, task = make_files(root)
    meta = {protocol.MODEL_SPEC: {"name": "cnn", "in_channels": 1, "num_classes": 2}, protocol.TASK: task}
    executor = FairflExecutor(data_root=str(root))
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as info:
            executor._load_datalist(site_task(meta))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert info.value.site == SITE and bad_file.name in message
    assert "declares 9000 x 9000" in message or "declares 20000 x 20000" in message
    assert "FAIRFL_MAX_IMAGE_SIDE" in message and "8192 per axis" in message, message
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB traced: the image was decoded"  # 81 to 400 MB if it were


def test_the_sites_own_image_limits_are_its_environments(tmp_path, monkeypatch):
    """FAIRFL_MAX_IMAGE_SIDE and FAIRFL_MAX_IMAGE_VOXELS move the caps both ways, site by site: the 8 x 8 slices pass
    at 8 and 64, fail at 7 and 63; a 9000 x 9000 image passes where a site raises the side (and PIL decodes it)."""
    root = tmp_path / "data"
    image, _ = good_site(root)
    for variables, refused in (
        ({"FAIRFL_MAX_IMAGE_SIDE": "8", "FAIRFL_MAX_IMAGE_VOXELS": "64"}, None),
        ({"FAIRFL_MAX_IMAGE_SIDE": "7"}, "limit of 7 per axis"),
        ({"FAIRFL_MAX_IMAGE_VOXELS": "63"}, "and 63 voxels"),
    ):
        with mock.patch.dict(os.environ, variables):
            if refused is None:
                load_site(root)
                continue
            with pytest.raises(DataError, match=refused) as info:
                load_site(root)
            assert info.value.site == SITE and image.name in str(info.value)
    huge_jpeg(root)
    monkeypatch.setenv("FAIRFL_MAX_IMAGE_SIDE", "9000")
    meta = {protocol.MODEL_SPEC: {"name": "cnn", "in_channels": 1, "num_classes": 2}, protocol.TASK: "classification"}
    datalist = FairflExecutor(data_root=str(root))._load_datalist(site_task(meta))
    assert datalist["training"][0]["image"].endswith("huge.jpg")


def rgb_image_for_two_channels(root):
    image, _ = good_site(root, fmt="png")
    save(image, np.zeros((*SHAPE, 3), np.uint8))
    return image, dict(in_channels=2)


def unsafe_site_name(root):
    good_site(root)
    return root / f"{SITE}.json", dict(site="../" + SITE)


def classification_volume(root):
    path = save(root / "a.nii.gz", np.zeros((*SHAPE, 4), np.float32))
    write_datalist(root / f"{SITE}.json", {s: [{"image": "a.nii.gz", "label": 1}] for s in SPLITS})
    return path, dict(task="classification", num_classes=3)


def classification_nan(root):
    path = save(root / "a.nii.gz", np.full(SHAPE, np.nan, np.float32))
    write_datalist(root / f"{SITE}.json", {s: [{"image": "a.nii.gz", "label": 1}] for s in SPLITS})
    return path, dict(task="classification", num_classes=3)


def classification_truncated_png(root):
    path = save(root / "a.png", np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-40])
    write_datalist(root / f"{SITE}.json", {s: [{"image": "a.png", "label": 0}] for s in SPLITS})
    return path, dict(task="classification", num_classes=3, in_channels=3)


def truncated_in_sampled_validation(root):
    good_site(root)
    path = root / SITE / "images" / "validation_1.nii.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:400]))
    return path, dict(max_samples=8)


SITE_CASES = {
    "truncated NIfTI in a sampled validation split (Fed-LWR's CKA loader)": truncated_in_sampled_validation,
    "RGB image for a 2-channel network": rgb_image_for_two_channels,
    "site name with '../' (its datalist file name)": unsafe_site_name,
    "classification: a 3-D volume": classification_volume,
    "classification: NaN pixels": classification_nan,
    "classification: truncated RGB PNG": classification_truncated_png,
}


@pytest.mark.parametrize("case", list(SITE_CASES))
def test_bad_data_for_the_task_is_a_data_error_naming_site_and_file(tmp_path, case):
    root = tmp_path / "data"
    bad_file, options = SITE_CASES[case](root)
    site = options.pop("site", SITE)
    with pytest.raises(DataError) as info:
        load_site(root, site=site, **options)
    assert site in str(info.value) and os.path.basename(bad_file) in str(info.value), str(info.value)


def test_grey_alpha_image_is_read_as_grey_and_a_link_inside_the_root_is_fine(tmp_path, monkeypatch):
    """Not bad input: a grey + alpha PNG (alpha dropped, as for RGBA) and a link that stays in the data root (the
    loader gets the file it links to, checked); the site's FAIRFL_ALLOW_ABSOLUTE_PATHS=1 lets it read files
    outside the root on purpose."""
    root = tmp_path / "data"
    image, _ = good_site(root, fmt="png")
    save(image, np.random.default_rng(2).integers(0, 255, SHAPE, dtype=np.uint8), "LA")
    (root / "alias.png").symlink_to(image)
    set_first(root, "image", "alias.png")
    executor = load_site(root)
    batch = next(iter(executor._loaders[("training", False, None, None)]))
    assert batch["image"].shape == (2, 1, 16, 16) and torch.isfinite(batch["image"]).all()
    assert executor._datalist["training"][0]["image"] == str(image)  # resolved: swapping the link later is moot
    escaping("absolute")(root, image, None)
    monkeypatch.setenv("FAIRFL_ALLOW_ABSOLUTE_PATHS", "1")  # the site's own choice
    load_site(root)


# --------------------------------------------------------------------------- configuration and server tasks
def model_spec_check(spec):
    """The network of a server task, checked as a site checks it before anything is built."""

    def attempt(tmp_path):
        check_meta(SITE, {protocol.MODEL_SPEC: spec})

    return attempt


def executor_task(meta_changes):
    """A site asked for built-in data by a server task with hostile meta."""

    def attempt(tmp_path):
        meta = {
            protocol.MODEL_SPEC: {"name": "unet", "in_channels": 1, "num_classes": 2},
            protocol.DATASET: "prostate",
            protocol.NUM_SITES: 2,
            protocol.DATA_SEED: 0,
            **meta_changes,
        }
        FairflExecutor(image_size=16)._load_datalist(site_task(meta))

    return attempt


def state_dir_of(run_name):
    def attempt(tmp_path):
        protocol.run_state_dir(str(tmp_path), SITE, run_name)

    return attempt


def controller_with(**args):
    def attempt(tmp_path):
        from fairfl.methods.fedavg.controller import FedAvgController

        FedAvgController(**args)

    return attempt


def executor_with(**args):
    def attempt(tmp_path):
        FairflExecutor(**args)

    return attempt


def site_environment(**variables):
    """A site whose own environment holds a malformed setting, asked for its data."""

    def attempt(tmp_path):
        with mock.patch.dict(os.environ, variables):
            executor_task({})(tmp_path)

    return attempt


def server_task_check(meta_changes, **variables):
    """What a site checks of every server task before it builds or loops over anything (FairflExecutor.execute)."""

    def attempt(tmp_path):
        meta = {protocol.MODEL_SPEC: {"name": "cnn", "in_channels": 1, "num_classes": 2}, **meta_changes}
        with mock.patch.dict(os.environ, variables):
            check_meta(SITE, meta)

    return attempt


def model_spec(**spec):
    return server_task_check({protocol.MODEL_SPEC: spec})


def npr_settings(**changes):
    settings = {"k": 4, "weight": 1.0, "epsilon": 0.05, "iterations": 50, "temperature": 1.0, "logits": "layernorm"}
    return server_task_check({NPR: {**settings, **changes}})


# case -> (attempt, what the error must name)
CONFIG_CASES = {
    "server run_name '../../etc'": (controller_with(run_name="../../etc"), "run_name"),
    "server run_name absolute": (controller_with(run_name="/tmp/x"), "run_name"),
    "server run_name with a slash": (controller_with(run_name="a/b"), "run_name"),
    "server task run_name '..' on a site": (state_dir_of(".."), "run_name"),
    "server task run_name absolute on a site": (state_dir_of("/etc"), "run_name"),
    "server task run_name not a string": (state_dir_of(["x"]), "run_name"),
    "server task data_seed a path": (executor_task({protocol.DATA_SEED: "0/../../../x"}), "data_seed"),
    "server task num_sites huge": (executor_task({protocol.NUM_SITES: 10**9}), "num_sites"),
    "server task num_sites 0": (executor_task({protocol.NUM_SITES: 0}), "num_sites"),
    "server task dataset a path": (executor_task({protocol.DATASET: "../../x"}), "../../x"),
    "server task dataset a list": (executor_task({protocol.DATASET: ["x"]}), "dataset"),
    "server task model name a list": (model_spec_check({"name": ["unet"]}), "name ['unet']"),
    **{
        f"server task test_scale {bad!r}": (executor_task({protocol.TEST_SCALE: bad}), "test_scale")
        for bad in (1e9, -1, "3", float("nan"), True, None)
    },
    "server test_scale 0.5": (controller_with(test_scale=0.5), "test_scale"),
    # the site's own settings (its environment), never the job's: a job setting one fails at load
    "job sets allow_absolute_paths": (executor_with(allow_absolute_paths=True), "allow_absolute_paths"),
    "job sets free_riders": (executor_with(free_riders=["site-1"]), "free_riders"),
    "job sets free_rider_source": (executor_with(free_rider_source="site-2"), "free_rider_source"),
    "site's free rider named '../site-2'": (
        site_environment(FAIRFL_FREE_RIDERS="site-3,../site-2"),
        "FAIRFL_FREE_RIDERS",
    ),
    "site's free rider source a path": (
        site_environment(FAIRFL_FREE_RIDERS="site-2", FAIRFL_FREE_RIDER_SOURCE="/etc/passwd"),
        "FAIRFL_FREE_RIDER_SOURCE",
    ),
    "site's free rider source is a free rider": (site_environment(FAIRFL_FREE_RIDERS="site-1"), "FAIRFL_FREE_RIDERS"),
    "site's absolute-path switch neither 1 nor 0": (
        site_environment(FAIRFL_ALLOW_ABSOLUTE_PATHS="maybe"),
        "FAIRFL_ALLOW_ABSOLUTE_PATHS",
    ),
    "site's parameter limit negative": (
        site_environment(FAIRFL_MAX_MODEL_PARAMETERS="-5"),
        "FAIRFL_MAX_MODEL_PARAMETERS",
    ),
    **{
        f"site's {what}": (site_environment(**{variable: value}), variable)
        for what, variable, value in (
            ("image side limit 0", "FAIRFL_MAX_IMAGE_SIDE", "0"),
            ("voxel limit in words", "FAIRFL_MAX_IMAGE_VOXELS", "lots"),
            ("voxel limit a superscript digit", "FAIRFL_MAX_IMAGE_VOXELS", "2²"),
            ("model-sharing switch neither 1 nor 0", "FAIRFL_SHARE_OWN_MODEL", "maybe"),
        )
    },
    # the server's model spec and FedNPR settings: bounded before anything is built (144 GiB, 242 GiB otherwise)
    "model spec: CNN of 65536 channels": (model_spec(name="cnn", channels=[65536, 65536]), "channels"),
    "model spec: a billion classes": (model_spec(name="resnet18", num_classes=10**9), "num_classes"),
    "model spec: 1.4 billion parameters within every range": (
        model_spec(name="cnn", channels=[4096] * 10),
        "parameters",
    ),
    "model spec: above the site's own parameter limit": (
        server_task_check({}, FAIRFL_MAX_MODEL_PARAMETERS="1000"),
        "limit of 1,000",
    ),
    "model spec: unknown network": (model_spec(name="../evil"), "../evil"),
    "model spec: unknown key": (model_spec(name="cnn", pretrained=True), "pretrained"),
    "model spec: in_channels a string": (model_spec(name="cnn", in_channels="1"), "in_channels"),
    "model spec: num_classes true": (model_spec(name="cnn", num_classes=True), "num_classes"),
    "model spec: U-Net strides not matching channels": (model_spec(channels=[8, 16, 32], strides=[2]), "strides"),
    "model spec: not an object": (server_task_check({protocol.MODEL_SPEC: "unet"}), protocol.MODEL_SPEC),
    "FedNPR: k 10^9 sub-clusters": (npr_settings(k=10**9), "k 1000000000"),
    "FedNPR: k a string": (npr_settings(k="4"), "k '4'"),
    "FedNPR: 10^12 Sinkhorn iterations": (npr_settings(iterations=10**12), "iterations"),
    "FedNPR: epsilon 0": (npr_settings(epsilon=0), "epsilon"),
    "FedNPR: epsilon NaN": (npr_settings(epsilon=float("nan")), "epsilon"),
    "FedNPR: temperature infinite": (npr_settings(temperature=float("inf")), "temperature"),
    "FedNPR: temperature negative": (npr_settings(temperature=-1.0), "temperature"),
    "FedNPR: weight 1e300": (npr_settings(weight=1e300), "weight"),
    "FedNPR: unknown logits form": (npr_settings(logits="evil"), "logits"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_configuration_or_server_task_is_refused_by_name(tmp_path, case, monkeypatch):
    monkeypatch.delenv(protocol.STATE_ROOT_ENV, raising=False)
    monkeypatch.delenv("FAIRFL_DATA_ROOT", raising=False)
    attempt, named = CONFIG_CASES[case]
    with pytest.raises((ValueError, TypeError)) as info:  # DataError is a ValueError; TypeError: a job's argument
        attempt(tmp_path)
    assert named in str(info.value), str(info.value)
    if isinstance(info.value, DataError):
        assert info.value.site == SITE


def test_the_server_task_cannot_make_a_site_a_free_rider(tmp_path, monkeypatch):
    """The free-rider switch lives in the site's own environment; a task asking for it is ignored."""
    root = tmp_path / "data"
    good_site(root)
    good_site(root, site="site-2")
    meta = {protocol.MODEL_SPEC: {"name": "unet", "in_channels": 1, "num_classes": 2}, "free_riders": {SITE: "site-2"}}
    own = FairflExecutor(data_root=str(root))._load_datalist(site_task(meta))
    assert len({e["image"] for e in own["training"]}) == 2 and SITE in own["training"][0]["image"]
    monkeypatch.setenv("FAIRFL_FREE_RIDERS", f"site-9,{SITE}")
    monkeypatch.setenv("FAIRFL_FREE_RIDER_SOURCE", "site-2")
    rider = FairflExecutor(data_root=str(root))._load_datalist(site_task(meta))
    assert len({e["image"] for e in rider["training"]}) == 1 and "site-2" in rider["training"][0]["image"]


def test_the_sites_data_root_wins_over_the_jobs(tmp_path, monkeypatch):
    """A production site sets FAIRFL_DATA_ROOT: the data_root a job names is then never read."""
    good_site(tmp_path / "site_data")
    job_root = tmp_path / "job_data"  # what a careless or hostile job points at
    good_site(job_root)
    monkeypatch.setenv("FAIRFL_DATA_ROOT", str(tmp_path / "site_data"))
    meta = {protocol.MODEL_SPEC: {"name": "unet", "in_channels": 1, "num_classes": 2}}
    datalist = FairflExecutor(data_root=str(job_root))._load_datalist(site_task(meta))
    assert all(e["image"].startswith(str(tmp_path / "site_data")) for s in SPLITS for e in datalist[s])


class Payload:
    """Unpickling this runs code: it writes a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_or_local_model_holding_a_pickled_object_is_refused_and_never_run(tmp_path):
    from fairfl.methods.fedavg.controller import FedAvgController

    marker = tmp_path / "code_ran"
    controller = FedAvgController(run_name="trial")
    path = tmp_path / "checkpoint.pt"
    torch.save({"round": 0, "config": controller.config(), "payload": Payload(str(marker))}, path)
    with pytest.raises(ValueError, match="cannot be loaded safely") as info:
        controller._load_checkpoint(str(path))
    assert str(path) in str(info.value) and "trial" in str(info.value)
    local = tmp_path / protocol.LOCAL_MODEL_FILE
    torch.save({"weight": Payload(str(marker))}, local)
    with pytest.raises(ValueError, match="not a readable file of tensors") as info:
        spec = {"name": "unet", "in_channels": 1, "num_classes": 2}
        FairflExecutor()._own_model(site_task({protocol.MODEL_SPEC: spec}, "site-1"), str(tmp_path), 1)
    assert str(local) in str(info.value)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------- command line
def non_empty(path):
    path.mkdir(parents=True, exist_ok=True)
    (path / "keep.txt").write_text("precious")
    return path


def beside_a_user_folder(workspace):
    """A workspace whose job-copy folder (`fairfl run --set` writes <workspace>_job) holds a user's file."""
    non_empty(workspace.parent / f"{workspace.name}_job")
    return str(workspace)


# case -> (arguments given tmp_path, the text the error must show); exit code 2 (argparse) or 1 (refused)
CLI_CASES = {
    "prepare-data --num-sites 0": (lambda t: ["prepare-data", "--num-sites", "0"], "--num-sites"),
    "prepare-data --num-sites -3": (lambda t: ["prepare-data", "--num-sites", "-3"], "--num-sites"),
    "prepare-data --size-scale -1": (lambda t: ["prepare-data", "--size-scale", "-1"], "--size-scale"),
    "prepare-data --size-scale 0": (lambda t: ["prepare-data", "--size-scale", "0"], "--size-scale"),
    "prepare-data --size-scale nan": (lambda t: ["prepare-data", "--size-scale", "nan"], "--size-scale"),
    "prepare-data --image-size 4": (lambda t: ["prepare-data", "--image-size", "4"], "--image-size"),
    "prepare-data --seed -1": (lambda t: ["prepare-data", "--seed", "-1"], "--seed"),
    "prepare-data images too small for the anatomy": (
        lambda t: ["prepare-data", "--out", str(t / "o"), "--image-size", "16"],
        "image_size must be at least 32",
    ),
    "prepare-data one site of a ten-site split": (
        lambda t: ["prepare-data", "--dataset", "ich_imbalanced", "--out", str(t / "o"), "--num-sites", "1"],
        "num_sites >= 2",
    ),
    "prepare-data --num-sites two": (lambda t: ["prepare-data", "--num-sites", "two"], "--num-sites"),
    "prepare-data --test-scale 0.5": (lambda t: ["prepare-data", "--test-scale", "0.5"], "--test-scale"),
    "prepare-data --test-scale nan": (lambda t: ["prepare-data", "--test-scale", "nan"], "--test-scale"),
    "prepare-data --out a non-empty folder": (
        lambda t: ["prepare-data", "--out", str(non_empty(t / "out"))],
        "out is not empty",
    ),
    "run a missing job": (lambda t: ["run", str(t / "nojob"), "-w", str(t / "w")], "nojob"),
    "run -n 0": (lambda t: ["run", "jobs/fedavg", "-n", "0", "-w", str(t / "w")], "--n-clients"),
    "run -t 0": (lambda t: ["run", "jobs/fedavg", "-t", "0", "-w", str(t / "w")], "--threads"),
    "run into a non-empty workspace": (
        lambda t: ["run", "jobs/fedavg", "-w", str(non_empty(t / "ws"))],
        "ws is not empty",
    ),
    "run --set into a non-empty <workspace>_job": (
        lambda t: ["run", "jobs/fedavg", "-w", beside_a_user_folder(t / "ws"), "--set", "num_rounds=1"],
        "ws_job is not empty",
    ),
    "run --force --set into a <workspace>_job that is no job copy": (
        lambda t: ["run", "jobs/fedavg", "--force", "-w", beside_a_user_folder(t / "ws"), "--set", "num_rounds=1"],
        "does not look like a job copy",
    ),
    "run --set an argument the job does not have": (
        lambda t: ["run", "jobs/fedavg", "-w", str(t / "ws"), "--set", "nosuchkey=1"],
        "nosuchkey",
    ),
    "run --set a string for a number": (
        lambda t: ["run", "jobs/fedavg", "-w", str(t / "ws"), "--set", "num_rounds=abc"],
        "num_rounds",
    ),
    "run --set free_riders (the sites' own setting)": (
        lambda t: ["run", "jobs/fedce", "-w", str(t / "ws"), "--set", 'free_riders=["site-4"]'],
        "FAIRFL_FREE_RIDERS",
    ),
    "run --set without '='": (lambda t: ["run", "jobs/fedavg", "-w", str(t / "ws"), "--set", "num_rounds"], "--set"),
    "run --free-riders '../site-2'": (
        lambda t: ["run", "jobs/fedavg", "-w", str(t / "ws"), "--free-riders", "site-3,../site-2"],
        "site name '../site-2'",
    ),
    "run --force into a folder that is no workspace": (
        lambda t: ["run", "jobs/fedavg", "--force", "-w", str(non_empty(t / "home"))],
        "does not look like",
    ),
    "convert-prostate from a missing folder": (lambda t: ["convert-prostate", str(t / "nosrc"), str(t / "d")], "nosrc"),
    "convert-prostate into a non-empty folder": (
        lambda t: ["convert-prostate", str(non_empty(t / "src")), str(non_empty(t / "dst"))],
        "dst is not empty",
    ),
    "convert-fundus into a non-empty folder": (
        lambda t: ["convert-fundus", str(non_empty(t / "src")), str(non_empty(t / "dst"))],
        "dst is not empty",
    ),
    "convert-isic --alpha 0": (
        lambda t: ["convert-isic", str(non_empty(t / "s")), str(t / "d"), "--alpha", "0"],
        "--alpha",
    ),
    "convert-isic --corrupted-fraction 1.5": (
        lambda t: ["convert-isic", str(non_empty(t / "s")), str(t / "d"), "--corrupted-fraction", "1.5"],
        "--corrupted-fraction",
    ),
    "convert-isic --severity 9": (
        lambda t: ["convert-isic", str(non_empty(t / "s")), str(t / "d"), "--severity", "9"],
        "--severity",
    ),
    "convert-rsna-ich --max-images 0": (
        lambda t: ["convert-rsna-ich", str(non_empty(t / "s")), str(t / "d"), "--max-images", "0"],
        "--max-images",
    ),
    "convert-rsna-ich --num-sites 0": (
        lambda t: ["convert-rsna-ich", str(non_empty(t / "s")), str(t / "d"), "--num-sites", "0"],
        "--num-sites",
    ),
    "leave-one-out -n 0": (lambda t: ["leave-one-out", "jobs/fedavg", "-n", "0", "-o", str(t / "o")], "--n-clients"),
    "benchmark --rounds 0": (lambda t: ["benchmark", "prostate", "--rounds", "0", "--out", str(t / "b")], "--rounds"),
    "benchmark --sites 1": (lambda t: ["benchmark", "prostate", "--sites", "1", "--out", str(t / "b")], "--sites"),
    "benchmark --seeds -1": (lambda t: ["benchmark", "prostate", "--seeds", "-1", "--out", str(t / "b")], "--seeds"),
    "export-job --gpus -1": (lambda t: ["export-job", "jobs/fedavg", str(t / "e"), "--gpus", "-1"], "--gpus"),
    "export-job of a folder that is no job": (
        lambda t: ["export-job", str(non_empty(t / "j")), str(t / "e")],
        "not a job folder",
    ),
    "report --out a non-empty folder": (
        lambda t: ["report", str(t / "results.json"), "--out", str(non_empty(t / "r"))],
        "r is not empty",
    ),
    "poc prepare --port -5": (lambda t: ["poc", "prepare", "--port", "-5"], "--port"),
    "poc prepare --port 65536": (lambda t: ["poc", "prepare", "--port", "65536"], "--port"),
    "poc prepare -n 0": (lambda t: ["poc", "prepare", "-n", "0"], "--n-sites"),
    "dashboard --port 70000": (lambda t: ["dashboard", "--root", str(t / "d"), "--port", "70000"], "--port"),
    "dashboard --port 0": (lambda t: ["dashboard", "--root", str(t / "d"), "--port", "0"], "--port"),
    "dashboard --root a folder that is no dashboard's": (
        lambda t: ["dashboard", "--admin", "a@b.org", "--root", str(non_empty(t / "thesis"))],
        "holds no dashboard database",
    ),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_command_line_is_refused_naming_the_argument_and_nothing_is_lost(tmp_path, case, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # jobs/ as in the README
    make_args, named = CLI_CASES[case]
    args = make_args(tmp_path)
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    try:
        code = cli.main(args)
    except SystemExit as e:  # argparse: usage and "argument --x: ..." on stderr
        code = e.code
    assert code in (1, 2)
    assert named in capsys.readouterr().err
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing lost or written
