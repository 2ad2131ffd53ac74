"""Drawing primitives the synthetic image generators share (prostate MRI, fundus photographs, dermoscopy, head CT).

Lengths are in crop units: the image spans [-1, 1], so one unit is half its width. Every generator draws on a grid
`SUPERSAMPLE` times finer than its output and box-averages it (`box_mean`), which gives partial-volume edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import ndimage
from scipy.special import expit

SUPERSAMPLE = 2


# ----------------------------------------------------------------------------------------------
# grids and random fields


def crop_grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(X, Y): the pixel centres of an n x n grid in crop units, as a row and a column (float32)."""
    axis = ((np.arange(n) - (n - 1) / 2) / (n / 2)).astype(np.float32)
    return axis[None, :], axis[:, None]


def box_mean(array: np.ndarray, factor: int) -> np.ndarray:
    """`array` [n, n, ...] averaged over `factor` x `factor` blocks: [n / factor, n / factor, ...]."""
    n = array.shape[0] // factor
    return array.reshape(n, factor, n, factor, *array.shape[2:]).mean(axis=(1, 3))


def standardise(field: np.ndarray) -> np.ndarray:
    """`field` shifted and scaled to zero mean and unit sd."""
    return (field - field.mean()) / (field.std() + 1e-8)


def smooth_field(rng: np.random.Generator, cells: int, n: int) -> np.ndarray:
    """Zero-mean, unit-sd random field [n, n] smooth on the scale of n / cells pixels: a cells x cells
    grid of white noise, cubic-interpolated (one matrix product per axis, much faster than zoom)."""
    interpolate, transposed = _cubic_upsampling(cells, n)
    return standardise(interpolate @ rng.standard_normal((cells, cells)).astype(np.float32) @ transposed)


@lru_cache(maxsize=64)
def _cubic_upsampling(cells: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """[n, cells] matrix of cubic-spline upsampling weights (zoom is linear and separable), and its
    transpose stored contiguously (a strided operand makes the product several times slower)."""
    matrix = ndimage.zoom(np.eye(cells, dtype=np.float32), (n / cells, 1), order=3, mode="nearest", grid_mode=True)
    return matrix, np.ascontiguousarray(matrix.T)


# ----------------------------------------------------------------------------------------------
# blending


def sigmoid(x) -> np.ndarray:
    """The logistic function, in float32."""
    return expit(np.asarray(x, np.float32))


def blend(image: np.ndarray, weight, target) -> np.ndarray:
    """`image` moved towards `target` (a colour or a grey value) by `weight` (in [0, 1]), pixel by pixel."""
    weight = np.asarray(weight, np.float32)
    if image.ndim == 3:
        weight = weight[..., None]
    change = np.asarray(target, np.float32) - image
    change *= weight
    change += image
    return change


# ----------------------------------------------------------------------------------------------
# lines: vessels, hairs, sulci


def grow_line(
    rng,
    segments: list,
    x: float,
    y: float,
    heading: float,
    width: float,
    steps: int,
    curl: float,
    branch: float,
    darkness: float = 1.0,
    depth: int = 0,
    step: float = 0.02,
) -> None:
    """A wandering line from (x, y) (a vessel, a hair, a sulcus) as segments, branching with probability
    `branch` per step into thinner children (three generations at most)."""
    for _ in range(steps):
        nx, ny = x + step * math.cos(heading), y + step * math.sin(heading)
        segments.append((x, y, nx, ny, width, darkness))
        x, y = nx, ny
        heading += float(rng.normal(0, curl))
        width *= 0.985
        if depth < 3 and rng.random() < branch:
            child = heading + float(rng.choice((-1.0, 1.0)) * rng.uniform(0.5, 1.2))
            grow_line(
                rng, segments, x, y, child, width * 0.7, max(steps // 2, 2), curl, branch, darkness, depth + 1, step
            )


def draw_segments(segments: list[tuple], n: int) -> np.ndarray:
    """Density [n, n] of line segments (x0, y0, x1, y1, width, darkness), e.g. vessels: darkness *
    exp(-4 ln2 (distance / width)^2) around the nearest point of the nearest centreline (width is the full width
    at half maximum).

    Centrelines are sampled every half fine pixel and rasterised; one Euclidean distance transform
    then finds each pixel's nearest sample, so the cost does not grow with the number of vessels.
    Where centrelines cross, the wider vessel's sample wins the pixel."""
    density = np.zeros((n, n), np.float32)
    if not segments:
        return density
    seg = np.asarray(sorted(segments, key=lambda s: s[4]), dtype=np.float64)  # thin first, wide wins
    pixel = 2.0 / n
    counts = np.maximum(np.ceil(np.hypot(seg[:, 2] - seg[:, 0], seg[:, 3] - seg[:, 1]) / (0.5 * pixel)), 1).astype(int)
    owner = np.repeat(np.arange(len(seg)), counts)
    t = (np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)) / np.repeat(counts, counts)
    px = seg[owner, 0] + t * (seg[owner, 2] - seg[owner, 0])
    py = seg[owner, 1] + t * (seg[owner, 3] - seg[owner, 1])
    col, row = np.round((px + 1) / pixel - 0.5).astype(int), np.round((py + 1) / pixel - 0.5).astype(int)
    inside = (col >= 0) & (col < n) & (row >= 0) & (row < n)
    sample = np.full((n, n), -1)
    sample[row[inside], col[inside]] = np.flatnonzero(inside)
    if (sample < 0).all():
        return density
    _, (near_row, near_col) = ndimage.distance_transform_edt(sample < 0, return_indices=True)
    nearest = sample[near_row, near_col]
    axis = (np.arange(n) - (n - 1) / 2) / (n / 2)
    d2 = (axis[None, :] - px[nearest]) ** 2 + (axis[:, None] - py[nearest]) ** 2
    width, darkness = seg[owner[nearest], 4], seg[owner[nearest], 5]
    return (darkness * np.exp(-2.77 * d2 / (width * width))).astype(np.float32)


def line_weights(segments: list, n: int) -> np.ndarray:
    """Weight map in [0, 1] of line segments (x0, y0, x1, y1, width, darkness) with Gaussian profiles."""
    return np.clip(draw_segments(segments, n) * 1.2, 0, 1) if segments else np.zeros((n, n), np.float32)


# ----------------------------------------------------------------------------------------------
# closed outlines: lesions and blobs


@dataclass
class Shape:
    """A lesion or blob: soft inside weight, normalised radius (1 on the border), lesion-frame coordinates."""

    weight: np.ndarray
    rho: np.ndarray
    u: np.ndarray
    v: np.ndarray
    centre: tuple[float, float]
    radius: float


def random_shape(
    rng,
    X,
    Y,
    n: int,
    radius: float,
    asymmetry: float,
    irregularity: float,
    edge: float,
    centre_sd: float = 0.06,
    centre: tuple[float, float] | None = None,
) -> Shape:
    """A closed outline: an ellipse whose radius carries low harmonics (asymmetry), higher ones and a
    fine random wiggle (border irregularity); `edge` is the width of the soft border (relative)."""
    cx, cy = centre if centre is not None else (float(rng.normal(0, centre_sd)), float(rng.normal(0, centre_sd)))
    angle = rng.uniform(0, np.pi)
    c, s = math.cos(angle), math.sin(angle)
    u = c * (X - cx) + s * (Y - cy)
    v = (c * (Y - cy) - s * (X - cx)) / rng.uniform(0.72, 1.0)
    theta = np.arctan2(v, u)
    outline = np.ones_like(theta)
    for k in range(1, 12):
        amplitude = (asymmetry if k <= 3 else irregularity) / k
        outline = outline + amplitude * float(rng.normal()) * np.cos(k * theta + rng.uniform(0, 2 * np.pi))
    rho = np.hypot(u, v) / (radius * np.maximum(outline, 0.35))
    rho = rho * (1 + 0.6 * irregularity * smooth_field(rng, 12, n))
    return Shape(sigmoid((1 - rho) / edge), rho, u, v, (cx, cy), radius)
