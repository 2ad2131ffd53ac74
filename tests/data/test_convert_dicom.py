"""DICOM series to NIfTI volumes (`fairfl convert-dicom`) on the real DICOM files pydicom's wheel ships
(pydicom/data/test_files: no download): values against pydicom's own pixels, the affine against the headers'
geometry, the order of the files, and hostile inputs."""

import gzip
import json
import random
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file

from fairfl import cli
from fairfl.data.convert_dicom import DICOMDIR, NO_POSITION, NOT_DICOM, convert_dicom
from fairfl.errors import DataError
from fairfl.site_settings import MAX_IMAGE_VOXELS_ENV

FILES = Path(get_testdata_file("CT_small.dcm", download=False)).parent
CT5N = FILES / "dicomdirtests/98892001/CT5N"  # 5 axial CT slices 2.5 mm apart, file names and InstanceNumbers top down
CT2 = FILES / "dicomdirtests/77654033/CT2"  # 4 slices at z -99.48, 103.02, 104.27, 105.52: 202.5 mm missing
CT2N = FILES / "dicomdirtests/98892001/CT2N"  # 2 slices, one sagittal and one coronal, one series
MR1 = FILES / "dicomdirtests/98892003/MR1"  # 3 sagittal localizer slices, each its own series, one name
LPS_TO_RAS = np.array([-1.0, -1.0, 1.0])


def copy_series(folder: Path, to: Path) -> Path:
    to.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        shutil.copyfile(f, to / f.name)
    return to


def pixels(path: Path) -> np.ndarray:
    """pydicom's pixels of one file, rescaled as the DICOM standard says (CT: Hounsfield units)."""
    ds = pydicom.dcmread(path)
    return ds.pixel_array * float(ds.get("RescaleSlope", 1)) + float(ds.get("RescaleIntercept", 0))


def ras(point) -> np.ndarray:
    return np.asarray(point, dtype=float) * LPS_TO_RAS


def world(affine: np.ndarray, voxel) -> np.ndarray:
    return (affine @ [*voxel, 1])[:3]


def assert_refused(src: Path, dst: Path, *words: str) -> str:
    """The conversion is refused with every one of `words` in the message, and nothing is left behind."""
    with pytest.raises(DataError) as caught:
        convert_dicom(src, dst)
    for word in words:
        assert word in str(caught.value)
    assert not dst.exists() and not [p for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.")]
    return str(caught.value)


@pytest.fixture
def source(tmp_path):
    """A hospital-like export: a CT series two folders down, single CT and MR slices, and what is not converted
    (a text file, a DICOMDIR, a radiograph without position, a structured report, an RT dose)."""
    src = tmp_path / "export"
    copy_series(CT5N, src / "study1" / "series5")
    for name in ("CT_small.dcm", "MR_small.dcm", "test-SR.dcm", "rtdose.dcm"):
        shutil.copyfile(FILES / name, src / name)
    shutil.copyfile(FILES / "dicomdirtests/DICOMDIR", src / "DICOMDIR")
    shutil.copyfile(FILES / "dicomdirtests/77654033/CR1/6154", src / "cr_6154")
    (src / "notes.txt").write_text("not DICOM")
    return src


def test_volumes_equal_pydicoms_pixels_on_the_headers_geometry(source, tmp_path):
    dst = tmp_path / "out"
    summary = convert_dicom(source, dst)
    on_disk = json.loads((dst / "series.json").read_text())
    assert on_disk == summary
    assert sorted(p.name for p in dst.iterdir()) == [
        "1CT1_s1_CT.nii.gz",
        "4MR1_s1_MR.nii.gz",
        "98890234_s5_CT.nii.gz",
        "series.json",
    ]
    series = summary["series"]["98890234_s5_CT"]
    assert series["modality"] == "CT" and series["patient_id"] == "98890234" and series["source_files"] == 5
    assert series["series_description"] == "SmartScore - Gated 0.5 sec"
    assert series["shape"] == [16, 16, 5] and series["spacing"] == [0.488281, 0.488281, 2.5]

    image = nib.load(dst / "98890234_s5_CT.nii.gz")
    volume, affine = np.asanyarray(image.dataobj), image.affine
    assert volume.dtype == np.float32 and volume.shape == (16, 16, 5)
    files = sorted(CT5N.iterdir(), key=lambda f: float(pydicom.dcmread(f).ImagePositionPatient[2]))
    for k, f in enumerate(files):  # axes (columns, rows, slices), slices from foot to head, values in HU
        np.testing.assert_array_equal(volume[:, :, k], pixels(f).T.astype(np.float32))
    assert volume.min() < -500  # air in Hounsfield units: the intercept -1024 was applied
    first, last = (pydicom.dcmread(f) for f in (files[0], files[-1]))
    dr, dc = (float(v) for v in first.PixelSpacing)
    np.testing.assert_allclose(nib.affines.voxel_sizes(affine), [dc, dr, 2.5], rtol=1e-6)
    row, col = np.array(first.ImageOrientationPatient[:3], float), np.array(first.ImageOrientationPatient[3:], float)
    np.testing.assert_allclose(world(affine, (0, 0, 0)), ras(first.ImagePositionPatient), atol=1e-4)
    far = np.array(last.ImagePositionPatient, float) + 15 * dc * row + 15 * dr * col
    np.testing.assert_allclose(world(affine, (15, 15, 4)), ras(far), atol=1e-4)
    assert nib.aff2axcodes(affine) == ("L", "P", "S")  # DICOM's LPS axes, written in RAS coordinates
    assert image.header["sform_code"] == image.header["qform_code"] == 1  # scanner coordinates

    ct = np.asanyarray(nib.load(dst / "1CT1_s1_CT.nii.gz").dataobj)
    np.testing.assert_array_equal(ct[:, :, 0], pixels(FILES / "CT_small.dcm").T.astype(np.float32))
    assert summary["series"]["1CT1_s1_CT"]["spacing"][2] == 5.0  # one slice: its SliceThickness
    mr = np.asanyarray(nib.load(dst / "4MR1_s1_MR.nii.gz").dataobj)
    np.testing.assert_array_equal(mr[:, :, 0], pydicom.dcmread(FILES / "MR_small.dcm").pixel_array.T)

    assert summary["skipped"][NOT_DICOM] == ["notes.txt"] and summary["skipped"][DICOMDIR] == ["DICOMDIR"]
    assert summary["skipped"][NO_POSITION] == ["cr_6154"]
    assert summary["skipped"]["not an image (Comprehensive SR Storage, not read)"] == ["test-SR.dcm"]
    assert summary["skipped"]["not an image (RT Dose Storage, not read)"] == ["rtdose.dcm"]
    assert summary["skipped_files"] == 5


def test_nifti_keeps_no_dicom_header_beyond_geometry(source, tmp_path):
    dst = tmp_path / "out"
    convert_dicom(source, dst)
    for name, f in (("1CT1_s1_CT", FILES / "CT_small.dcm"), ("98890234_s5_CT", next(CT5N.iterdir()))):
        raw = gzip.decompress((dst / f"{name}.nii.gz").read_bytes())
        ds = pydicom.dcmread(f)
        for value in (ds.PatientName.family_name, ds.StudyDate, ds.get("InstitutionName"), ds.SeriesInstanceUID):
            if value:
                assert str(value).encode() not in raw
        header = nib.load(dst / f"{name}.nii.gz").header
        assert header["descrip"] == header["aux_file"] == header["db_name"] == b""
        assert header.extensions == []


def test_sagittal_slices_and_series_sharing_a_name(tmp_path):
    """Three one-slice series of one patient with one SeriesNumber: `_2`, `_3` by SeriesInstanceUID."""
    src = copy_series(MR1, tmp_path / "src")
    summary = convert_dicom(src, tmp_path / "out")
    by_uid = sorted(summary["series"].values(), key=lambda s: s["series_instance_uid"])
    assert [s["file"] for s in by_uid] == [
        "98890234_s1_MR.nii.gz",
        "98890234_s1_MR_2.nii.gz",
        "98890234_s1_MR_3.nii.gz",
    ]
    for f in MR1.iterdir():
        ds = pydicom.dcmread(f)
        name = next(s["file"] for s in by_uid if s["series_instance_uid"] == ds.SeriesInstanceUID)
        image = nib.load(tmp_path / "out" / name)
        np.testing.assert_array_equal(np.asanyarray(image.dataobj)[:, :, 0], ds.pixel_array.T)
        row, col = np.array(ds.ImageOrientationPatient[:3], float), np.array(ds.ImageOrientationPatient[3:], float)
        dr, dc = (float(v) for v in ds.PixelSpacing)
        np.testing.assert_allclose(world(image.affine, (0, 0, 0)), ras(ds.ImagePositionPatient), atol=1e-4)
        np.testing.assert_allclose(image.affine[:3, 0], ras(row * dc), atol=1e-6)
        np.testing.assert_allclose(image.affine[:3, 1], ras(col * dr), atol=1e-6)
        np.testing.assert_allclose(image.affine[:3, 2], ras(np.cross(row, col) * float(ds.SliceThickness)), atol=1e-6)


def test_same_output_whatever_the_files_order_names_and_instance_numbers(tmp_path):
    reference = convert_dicom(copy_series(CT5N, tmp_path / "a"), tmp_path / "out_a")
    files = sorted(CT5N.iterdir())
    numbers = list(range(1, len(files) + 1))
    random.Random(3).shuffle(numbers)
    for k, (f, number) in enumerate(zip(files, numbers, strict=True)):
        ds = pydicom.dcmread(f)
        ds.InstanceNumber = number  # MONAI's own series reader would order by these
        folder = tmp_path / "b" / f"part{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        ds.save_as(folder / f"IMG{number:04d}.dcm")
    shuffled = convert_dicom(tmp_path / "b", tmp_path / "out_b")
    assert shuffled["series"] == reference["series"]
    a, b = (nib.load(tmp_path / out / "98890234_s5_CT.nii.gz") for out in ("out_a", "out_b"))
    np.testing.assert_array_equal(np.asanyarray(a.dataobj), np.asanyarray(b.dataobj))
    np.testing.assert_array_equal(a.affine, b.affine)


@pytest.mark.parametrize("name", ["MR_small_implicit.dcm", "MR_small_bigendian.dcm", "MR_small_RLE.dcm"])
def test_transfer_syntaxes_pydicom_decodes_give_the_same_volume(tmp_path, name):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(FILES / name, src / name)
    convert_dicom(src, tmp_path / "out")
    volume = np.asanyarray(nib.load(tmp_path / "out" / "4MR1_s1_MR.nii.gz").dataobj)
    np.testing.assert_array_equal(volume[:, :, 0], pydicom.dcmread(FILES / "MR_small.dcm").pixel_array.T)


def test_missing_slice_is_refused_naming_the_gap(tmp_path):
    src = copy_series(CT5N, tmp_path / "src")
    (src / "2693").unlink()  # z 3.7625, the middle slice
    assert_refused(src, tmp_path / "out", "uneven slice spacing", "gap of 5 mm", "1.2625 mm (3023)", "6.2625 mm (2392)")


def test_real_series_with_a_gap_and_mixed_orientations_are_refused(tmp_path):
    assert_refused(copy_series(CT2, tmp_path / "ct2"), tmp_path / "out", "gap of 202.5 mm", "-99.48 mm (17106)")
    assert_refused(copy_series(CT2N, tmp_path / "ct2n"), tmp_path / "out", "differ in orientation", "6924", "6293")


@pytest.mark.parametrize(
    "change, words",
    [
        ({"ImagePositionPatient": [-72.2, -143.0, 6.2625]}, ["two slices of one series at one place", "2392"]),
        ({"ImagePositionPatient": [-67.2, -143.0, 3.7625]}, ["5 mm off the line", "2693"]),
        ({"PixelSpacing": [0.5, 0.5]}, ["pixel spacing [0.5, 0.5]", "2693"]),
    ],
)
def test_slices_that_make_no_volume_are_refused(tmp_path, change, words):
    src = copy_series(CT5N, tmp_path / "src")
    ds = pydicom.dcmread(src / "2693")  # the middle slice, z 3.7625
    for key, value in change.items():
        setattr(ds, key, value)
    ds.save_as(src / "2693")
    assert_refused(src, tmp_path / "out", *words)


@pytest.mark.parametrize(
    "fraction, words",
    [(0.5, ["no Rows and Columns", "truncated"]), (0.95, ["cannot read its pixels", "truncated"])],
)
def test_truncated_copy_is_refused(tmp_path, fraction, words):
    src = copy_series(CT5N, tmp_path / "src")
    data = (CT5N / "3023").read_bytes()
    (src / "3023").write_bytes(data[: int(len(data) * fraction)])
    assert "3023" in assert_refused(src, tmp_path / "out", *words)


def test_real_truncated_file_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(FILES / "MR_truncated.dcm", src / "MR_truncated.dcm")
    assert_refused(src, tmp_path / "out", "MR_truncated.dcm", "cannot read its pixels")


def test_slice_of_another_shape_is_refused(tmp_path):
    src = copy_series(CT5N, tmp_path / "src")
    ds = pydicom.dcmread(src / "2693")
    ds.PixelData = ds.pixel_array[:8, :12].copy().tobytes()
    ds.Rows, ds.Columns = 8, 12
    ds.save_as(src / "2693")
    assert_refused(src, tmp_path / "out", "2693", "8 x 12 pixels", "16 x 16", "differ in shape")


def test_multi_frame_file_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    ds = pydicom.dcmread(FILES / "MR_small.dcm")
    ds.PixelData = ds.PixelData * 2
    ds.NumberOfFrames = 2
    ds.save_as(src / "enhanced.dcm")
    assert_refused(src, tmp_path / "out", "enhanced.dcm", "multi-frame", "PydicomReader")


def test_codec_not_installed_is_refused_naming_the_package(tmp_path):
    from pydicom.pixels import get_decoder
    from pydicom.uid import JPEGLSLossless

    if get_decoder(JPEGLSLossless).is_available:
        pytest.skip("a JPEG-LS codec is installed here")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(FILES / "MR_small_jpeg_ls_lossless.dcm", src / "mr.dcm")
    assert_refused(src, tmp_path / "out", "mr.dcm", "JPEG-LS Lossless", "install", "pylibjpeg")


def test_series_above_the_sites_size_limit_is_refused_before_pixels(tmp_path, monkeypatch):
    import fairfl.data.convert_dicom as module

    monkeypatch.setenv(MAX_IMAGE_VOXELS_ENV, "1000")  # 16 x 16 x 5 = 1280
    monkeypatch.setattr(module, "_read_volume", lambda *a: pytest.fail("pixels read"))
    assert_refused(copy_series(CT5N, tmp_path / "src"), tmp_path / "out", "16 x 16 x 5", MAX_IMAGE_VOXELS_ENV)


def test_nothing_to_convert_and_a_non_empty_output_are_refused(source, tmp_path):
    empty = tmp_path / "text_only"
    empty.mkdir()
    (empty / "a.txt").write_text("x")
    assert_refused(empty, tmp_path / "out", "no DICOM image series", f"1 {NOT_DICOM}")
    dst = tmp_path / "used"
    dst.mkdir()
    (dst / "keep.txt").write_text("precious")
    with pytest.raises(DataError, match="not empty"):
        convert_dicom(source, dst)
    assert [p.name for p in dst.iterdir()] == ["keep.txt"] and (dst / "keep.txt").read_text() == "precious"


def test_command_line(source, tmp_path, capsys):
    dst = tmp_path / "out"
    assert cli.main(["convert-dicom", str(source), str(dst)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((dst / "series.json").read_text())
    assert cli.main(["convert-dicom", str(source), str(dst)]) == 1
    assert "not empty" in capsys.readouterr().err
    (source / "study1" / "series5" / "2693").unlink()
    assert cli.main(["convert-dicom", str(source), str(tmp_path / "other")]) == 1
    assert "uneven slice spacing" in capsys.readouterr().err and not (tmp_path / "other").exists()
