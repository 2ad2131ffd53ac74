"""Convert DICOM series into NIfTI volumes for fairfl's 3-D path.

Hospitals hold DICOM; fairfl's loaders read NIfTI. Source (`src`): DICOM files at any depth, with or without a
`.dcm` suffix, any number of patients, studies and series. Every file's header is read first (pydicom,
`stop_before_pixels`) and the files are grouped by SeriesInstanceUID; each series becomes one volume.
Skipped and listed (not errors): files that are not DICOM (no `DICM` marker at byte 128, as pydicom reads it:
also the old ACR-NEMA files without a preamble), DICOMDIR indexes, objects that are no image (SEG,
RTSTRUCT, RT dose and plan, structured reports, presentation states: segmentations are not read) and images
without a patient position (radiographs, photographs, screen captures: no slice of a volume).

Refused, naming the file (nothing is written then): an unreadable or truncated file (a header without Rows and
Columns, pixels that do not decode), slices of one series that differ in shape, orientation or pixel spacing,
two slices at one position, uneven slice spacing (a missing slice: the gap and its positions are named), slices
off one line, a colour image, a multi-frame file (enhanced MR or CT: see below), a compressed transfer syntax
no installed codec decodes (the packages to install are named), and a series above the site's size limits
(FAIRFL_MAX_IMAGE_SIDE, FAIRFL_MAX_IMAGE_VOXELS; checked from the headers before any pixel is read). Every
header is checked before any pixel is read.

Reading: each slice's pixels, rescaled (RescaleSlope/Intercept: CT in Hounsfield units), and its RAS affine come
from MONAI's `PydicomReader`, one file at a time. Its own series reading is not used: it takes a folder (a
hospital export often holds several series in one), orders slices by InstanceNumber (not by position), drops
slices without one with only a warning, and takes the slice spacing from the z coordinate alone. Here slices are
ordered by their position along the slice normal (ImageOrientationPatient's row x column direction), whatever the
file names and InstanceNumbers, and the slice axis of the affine is the step between neighbouring
ImagePositionPatients (LPS, turned to RAS): exact for oblique series and for CT with a tilted gantry (a sheared
affine, not resampled). A single slice gets SpacingBetweenSlices (else SliceThickness, else 1 mm) along its
normal. Multi-frame files are refused: the reader stacks their frames without the per-frame positions
(PerFrameFunctionalGroupsSequence) and gives an identity affine; export such a series as classic single-frame
files (or convert it with dcm2niix).

Output (`dst` must not exist or be empty; written to a temporary sibling, renamed when complete):
`<dst>/<name>.nii.gz` per series, float32, axes (columns, rows, slices), the affine in RAS millimetres; the
name is `<PatientID>_s<SeriesNumber>_<Modality>` made safe (characters other than letters, digits, `_` and `-`
become `_`), with `_2`, `_3` ... where several series share it. `<dst>/series.json`: per series its file,
SeriesInstanceUID, modality, patient id, series description, shape, spacing (mm, along the volume's axes), number
of source files and whether RescaleSlope/Intercept were applied; and the source files skipped, by reason.

Privacy: a NIfTI file keeps the voxels and their geometry only (no names, dates, institutions or other DICOM
fields), but the file names and `series.json` keep each series' PatientID, so that datalists can group a
patient's series: pseudonymise the PatientIDs at the source if they identify a person. A segmentation label
volume does not come from here (DICOM SEG and RTSTRUCT are not read): export it from the annotation tool as
NIfTI on the same grid.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairfl.data.datalist import check_output_folder, staged_output
from fairfl.errors import DataError
from fairfl.names import safe_name
from fairfl.site_settings import MAX_IMAGE_SIDE_ENV, MAX_IMAGE_VOXELS_ENV, site_settings

IMAGE_STORAGE = "Image Storage"  # the name of every SOP class that holds an image ends so (CT, MR, PET, SC, ...)
DIRECTORY_STORAGE = "1.2.840.10008.1.3.10"  # Media Storage Directory Storage: a DICOMDIR
NOT_DICOM = "not DICOM (no DICM marker at byte 128)"
DICOMDIR = "DICOMDIR (an index of files; the files themselves are read)"
NO_POSITION = "an image without ImagePositionPatient (a radiograph, photograph or screen capture: no slice of a volume)"
ORIENTATION_TOLERANCE = 1e-3  # direction cosines
SPACING_TOLERANCE = (0.02, 0.01)  # relative, mm: more than DICOM's rounding of positions, far less than a missing slice
NAME_PART = re.compile(r"[^A-Za-z0-9_-]+")
# the header fields series.json and the output names keep, and nothing else
HEADER_FIELDS = dict(
    patient_id="PatientID", series_number="SeriesNumber", modality="Modality", description="SeriesDescription"
)


@dataclass(frozen=True)
class _Slice:
    """What one file's header says, checked."""

    path: Path
    rows: int
    columns: int
    position: np.ndarray  # ImagePositionPatient, LPS mm
    orientation: np.ndarray  # ImageOrientationPatient: row direction, column direction
    pixel_spacing: np.ndarray  # between rows, between columns (mm)
    thickness: float | None  # SpacingBetweenSlices, else SliceThickness
    samples: int
    transfer_syntax: str | None
    rescaled: bool
    patient_id: str
    series_number: str
    modality: str
    description: str


def convert_dicom(src: str | Path, dst: str | Path) -> dict:
    """Write one NIfTI volume per DICOM series found under `src` and `<dst>/series.json` (module docstring).

    Args:
        src: folder of DICOM files, any depth.
        dst: output folder; must not exist or be empty.

    Returns:
        what `<dst>/series.json` holds: `{"series": {name: {...}}, "skipped": {reason: [files]}, ...}`.

    Raises:
        DataError naming the file for every problem found (nothing is written then).
    """
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise DataError("-", src, "source folder not found")
    check_output_folder(dst)
    own = site_settings("-")
    series, skipped = _find_series(src)
    if not series:
        counts = ", ".join(f"{len(files)} {reason}" for reason, files in skipped.items()) or "no files"
        raise DataError("-", src, f"no DICOM image series found ({counts})")
    plans = {uid: _plan(slices, own.max_image_side, own.max_image_voxels) for uid, slices in sorted(series.items())}
    names = _series_names({uid: plan[0][0] for uid, plan in plans.items()})

    import nibabel as nib

    entries = {}
    with staged_output(dst) as staging:
        for uid, name in names.items():
            slices, step = plans[uid]
            volume, affine = _read_volume(slices, step)
            image = nib.Nifti1Image(volume, affine)
            image.header.set_xyzt_units("mm")
            image.set_sform(affine, code="scanner")
            image.set_qform(affine, code="scanner")
            nib.save(image, staging / f"{name}.nii.gz")
            entries[name] = dict(
                file=f"{name}.nii.gz",
                series_instance_uid=uid,
                modality=slices[0].modality,
                patient_id=slices[0].patient_id,
                series_description=slices[0].description,
                shape=list(volume.shape),
                spacing=[round(float(s), 6) for s in nib.affines.voxel_sizes(affine)],
                source_files=len(slices),
                rescaled=any(s.rescaled for s in slices),
            )
        description = dict(
            converter="fairfl.data.convert_dicom",
            source=str(src.resolve()),
            privacy="the .nii.gz files keep voxels and geometry only (no DICOM names, dates or other fields); "
            "their names and this file keep each series' PatientID",
            series=entries,
            skipped_files=sum(len(files) for files in skipped.values()),
            skipped=skipped,
        )
        (staging / "series.json").write_text(json.dumps(description, indent=1) + "\n")
    return description


def _find_series(src: Path) -> tuple[dict[str, list[_Slice]], dict[str, list[str]]]:
    """{SeriesInstanceUID: its slices} and {reason: files skipped (relative to src)}, from the headers only."""
    from pydicom import dcmread
    from pydicom.errors import InvalidDicomError

    series: dict[str, list[_Slice]] = {}
    skipped: dict[str, list[str]] = {}
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        try:
            header = dcmread(path, stop_before_pixels=True)
        except InvalidDicomError:
            reason = NOT_DICOM
        except Exception as err:  # a DICM marker, then something pydicom cannot parse
            raise DataError("-", path, f"cannot read its DICOM header: {err} (a truncated or corrupt file?)") from err
        else:
            reason = _skip_reason(path, header)
        if reason:
            skipped.setdefault(reason, []).append(path.relative_to(src).as_posix())
            continue
        image = _slice(path, header)
        uid = str(header.get("SeriesInstanceUID") or "")
        if not uid:
            raise DataError("-", path, "an image without SeriesInstanceUID: its series cannot be told")
        series.setdefault(uid, []).append(image)
    return series, skipped


def _skip_reason(path: Path, header) -> str | None:
    """Why a readable DICOM file is no slice to convert, or None when it is one."""
    sop_class = header.get("SOPClassUID") or header.file_meta.get("MediaStorageSOPClassUID")
    if path.name.upper() == "DICOMDIR" or sop_class == DIRECTORY_STORAGE:
        return DICOMDIR
    if sop_class is None:
        return None  # judged by its image header (a truncated file keeps its meta header's SOP class)
    if not sop_class.name.endswith(IMAGE_STORAGE):
        return f"not an image ({sop_class.name}, not read)"
    if "Rows" not in header or "Columns" not in header:
        return None  # refused in _slice: a truncated header
    geometry = ("ImagePositionPatient", "ImageOrientationPatient", "PerFrameFunctionalGroupsSequence")
    if not any(key in header for key in geometry):
        return NO_POSITION
    return None


def _slice(path: Path, header) -> _Slice:
    """One file's geometry, checked: a DataError naming the file for what is missing or malformed."""
    if "Rows" not in header or "Columns" not in header:
        raise DataError("-", path, "no Rows and Columns in its header (a truncated file?)")
    frames = int(header.get("NumberOfFrames") or 1)
    if frames > 1:
        raise DataError(
            "-",
            path,
            f"a multi-frame image ({frames} frames): MONAI's PydicomReader stacks its frames without their positions "
            "(PerFrameFunctionalGroupsSequence), so it is not converted; export the series as single-frame files "
            "(or convert it with dcm2niix)",
        )
    try:
        position = np.array([float(v) for v in header.ImagePositionPatient])
        orientation = np.array([float(v) for v in header.ImageOrientationPatient])
        pixel_spacing = np.array([float(v) for v in header.PixelSpacing])
        thickness = header.get("SpacingBetweenSlices") or header.get("SliceThickness")
        thickness = float(thickness) if thickness else None
    except (AttributeError, TypeError, ValueError) as err:
        raise DataError(
            "-", path, f"no usable ImagePositionPatient, ImageOrientationPatient and PixelSpacing ({err})"
        ) from err
    if position.shape != (3,) or orientation.shape != (6,) or pixel_spacing.shape != (2,):
        raise DataError("-", path, "ImagePositionPatient, ImageOrientationPatient or PixelSpacing has a wrong length")
    if not (np.isfinite([*position, *orientation, *pixel_spacing]).all() and (pixel_spacing > 0).all()):
        raise DataError("-", path, "non-finite position or orientation, or a pixel spacing not above 0")
    ts = header.file_meta.get("TransferSyntaxUID")
    return _Slice(
        path=path,
        rows=int(header.Rows),
        columns=int(header.Columns),
        position=position,
        orientation=orientation,
        pixel_spacing=pixel_spacing,
        thickness=thickness if thickness and thickness > 0 else None,
        samples=int(header.get("SamplesPerPixel") or 1),
        transfer_syntax=str(ts) if ts else None,
        rescaled="RescaleSlope" in header or "RescaleIntercept" in header,
        **{key: str(header.get(tag) or "") for key, tag in HEADER_FIELDS.items()},
    )


def _plan(slices: list[_Slice], max_side: int, max_voxels: int) -> tuple[list[_Slice], np.ndarray]:
    """A series' slices in order along their normal and the step from one to the next (LPS mm), from the headers
    only: every refusal of the module docstring but an undecodable pixel is made here, before any pixel is read."""
    first = slices[0]
    for s in slices:
        if s.samples != 1:
            raise DataError("-", s.path, f"a colour image ({s.samples} samples per pixel): not a greyscale slice")
        if (s.rows, s.columns) != (first.rows, first.columns):
            raise DataError(
                "-",
                s.path,
                f"{s.rows} x {s.columns} pixels, but {first.path.name} of the same series has "
                f"{first.rows} x {first.columns}: slices of one series differ in shape",
            )
        if not np.allclose(s.orientation, first.orientation, atol=ORIENTATION_TOLERANCE):
            raise DataError(
                "-",
                s.path,
                f"orientation {_numbers(s.orientation)}, but {first.path.name} of the same series has "
                f"{_numbers(first.orientation)}: slices of one series differ in orientation (a localizer?)",
            )
        if not np.allclose(s.pixel_spacing, first.pixel_spacing, rtol=1e-3):
            raise DataError(
                "-",
                s.path,
                f"pixel spacing {_numbers(s.pixel_spacing)}, but {first.path.name} of the same series has "
                f"{_numbers(first.pixel_spacing)}",
            )
        _check_decodable(s)
    shape = (first.columns, first.rows, len(slices))
    if max(shape) > max_side or int(np.prod(shape)) > max_voxels:
        raise DataError(
            "-",
            first.path,
            f"its series declares {' x '.join(map(str, shape))} voxels ({int(np.prod(shape)):,}): above this site's "
            f"limit of {max_side} per axis and {max_voxels:,} voxels ({MAX_IMAGE_SIDE_ENV}, {MAX_IMAGE_VOXELS_ENV}); "
            "not read",
        )
    normal = np.cross(first.orientation[:3], first.orientation[3:])
    if len(slices) == 1:
        return slices, normal * (first.thickness or 1.0)
    ordered = sorted(slices, key=lambda s: (float(s.position @ normal), str(s.path)))
    along = np.array([s.position @ normal for s in ordered])
    gaps = np.diff(along)
    if gaps.min() <= SPACING_TOLERANCE[1]:
        k = int(gaps.argmin())
        raise DataError(
            "-",
            ordered[k + 1].path,
            f"at the position of {ordered[k].path.name} ({along[k]:g} mm along the slice normal): two slices of one "
            "series at one place (two acquisitions under one SeriesInstanceUID?)",
        )
    smallest, k = gaps.min(), int(gaps.argmax())
    if gaps[k] - smallest > max(SPACING_TOLERANCE[0] * smallest, SPACING_TOLERANCE[1]):
        raise DataError(
            "-",
            ordered[k + 1].path,
            f"uneven slice spacing: a gap of {gaps[k]:g} mm between the slices at {along[k]:g} mm "
            f"({ordered[k].path.name}) and {along[k + 1]:g} mm ({ordered[k + 1].path.name}) along the slice normal, "
            f"{smallest:g} mm elsewhere: a missing slice?",
        )
    step = (ordered[-1].position - ordered[0].position) / (len(ordered) - 1)
    for k, s in enumerate(ordered):
        off = np.linalg.norm(s.position - (ordered[0].position + k * step))
        if off > max(SPACING_TOLERANCE[0] * np.linalg.norm(step), SPACING_TOLERANCE[1]):
            raise DataError(
                "-", s.path, f"{off:.4g} mm off the line through its series' other slice positions: not one volume"
            )
    return ordered, step


def _check_decodable(s: _Slice) -> None:
    """A DataError naming the packages to install when pydicom cannot decode this file's transfer syntax here."""
    if s.transfer_syntax is None:
        return  # pydicom guesses it while reading; what it cannot read is refused then
    from pydicom.pixels import get_decoder
    from pydicom.uid import UID

    uid = UID(s.transfer_syntax)
    try:
        decoder = get_decoder(uid)
    except NotImplementedError as err:
        raise DataError("-", s.path, f"transfer syntax {uid.name} ({uid}): pydicom cannot decode it") from err
    if not decoder.is_available:
        raise DataError(
            "-",
            s.path,
            f"compressed ({uid.name}) and no installed codec decodes it: install one of "
            + "; ".join(decoder.missing_dependencies)
            + " (pip install, into the environment fairfl runs in)",
        )


def _read_volume(slices: list[_Slice], step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The slices' pixels stacked along the last axis (float32, rescaled) and the volume's RAS affine: MONAI's
    affine of the first slice with its third column set to the step between slices."""
    from monai.data import PydicomReader

    reader = PydicomReader()  # LPS -> RAS, axes swapped to (columns, rows) as MONAI's other readers give them
    volume = np.empty((slices[0].columns, slices[0].rows, len(slices)), dtype=np.float32)
    for k, s in enumerate(slices):
        try:
            plane, meta = reader.get_data(reader.read(str(s.path)))
        except Exception as err:  # truncated pixel data, a codec's failure
            raise DataError("-", s.path, f"cannot read its pixels: {err} (a truncated or corrupt file?)") from err
        if plane.shape != volume.shape[:2]:
            raise DataError("-", s.path, f"pixels of shape {plane.shape}, its header says {s.rows} x {s.columns}")
        volume[:, :, k] = plane
        if k == 0:
            affine = np.array(meta["affine"], dtype=np.float64)
    affine[:3, 2] = step * [-1, -1, 1]  # LPS -> RAS
    return volume, affine


def _series_names(first: dict[str, _Slice]) -> dict[str, str]:
    """{SeriesInstanceUID: output name}: `<PatientID>_s<SeriesNumber>_<Modality>` made safe, `_2`, `_3` ... added
    in SeriesInstanceUID order where several series share one (so the names do not depend on the files' order)."""
    bases = {}
    for uid, s in first.items():
        number = _name_part(s.series_number)
        parts = (_name_part(s.patient_id) or "patient", f"s{number}" if number else "", _name_part(s.modality) or "OT")
        bases[uid] = "_".join(p for p in parts if p)
    names: dict[str, str] = {}
    for uid in sorted(bases, key=lambda u: (bases[u], u)):
        name, k = bases[uid], 1
        while name in names.values():
            k += 1
            name = f"{bases[uid]}_{k}"
        names[uid] = safe_name(name, "series name")
    return names


def _name_part(value: str) -> str:
    return NAME_PART.sub("_", value.strip()).strip("_-")[:40]


def _numbers(values: np.ndarray) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"
