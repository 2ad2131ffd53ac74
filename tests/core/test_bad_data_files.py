"""Bad data at a site, table-driven: data files, datalists and dataset.json, images declaring a huge size in their
header, data that does not fit the task. Every one ends in a clear error naming the site and the file, and nothing
outside the site's data root is read or written.

Each case goes through the real code path: real files written in the real formats (nibabel, PIL) and read by the
site's executor (datalist, headers, the caching loader that decodes each file once). Tiny images; no simulator here
(tests/integration/test_simulator_hostile_sites.py::test_bad_data_fails_fast_naming_site_and_file runs bad data
through one). The other input surfaces: test_bad_configuration.py (job arguments, a site's own settings, the server's
tasks) and test_bad_command_line.py."""

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
from PIL import Image

from fairfl.data.datalist import SPLITS, write_datalist
from fairfl.errors import DataError
from fairfl.flare import protocol
from fairfl.flare.executor import FairflExecutor

from site_data import SHAPE, SITE, good_site, load_site, save, set_first, site_task


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
    batch = next(iter(executor._loaders[("training", False, None, None, False)]))
    assert batch["image"].shape == (2, 1, 16, 16) and torch.isfinite(batch["image"]).all()
    assert executor._datalist["training"][0]["image"] == str(image)  # resolved: swapping the link later is moot
    escaping("absolute")(root, image, None)
    monkeypatch.setenv("FAIRFL_ALLOW_ABSOLUTE_PATHS", "1")  # the site's own choice
    load_site(root)
