"""Procedural images of the built-in classification settings (`fairfl.data.synthetic_classification`), each
imitating one of the papers' public datasets:

- `skin` (ISIC 2019-like, RGB dermoscopy): eight diagnoses MEL, NV, BCC, AK, BKL, DF, VASC, SCC. Each
  class is drawn with the dermoscopic structures clinicians read (the "ABCD" rule, the pattern analysis
  of Argenziano et al.): melanoma large, asymmetric, with an irregular border, several colours, an
  atypical broken network, peripheral dots and globules, a blue-white veil or regression; nevus smaller,
  symmetric, one brown hue, a regular network or regular globules; basal cell carcinoma pink and
  translucent with arborizing vessels and blue-grey ovoid nests; actinic keratosis an ill-defined red
  "strawberry" pseudo-network of pale follicular openings with white scale; benign keratosis sharply
  demarcated, waxy tan-brown with milia-like cysts, comedo-like openings and cerebriform fissures;
  dermatofibroma small with a central white scar-like patch in a delicate peripheral network; vascular
  lesions sharply bounded red-purple lacunae; squamous cell carcinoma pink-white with a central keratin
  mass, glomerular vessels and blood spots. Strengths and presence of each structure vary from lesion
  to lesion, and the ranges overlap (a dysplastic nevus shares some melanoma features, a pigmented
  BCC some melanoma colours, AK and SCC both scale and red dots), on skin of varying tone with hairs,
  dermoscope vignetting, gel bubbles, uneven lighting and colour balance.
- `ich` (RSNA intracranial hemorrhage-like, grey CT slices in a brain window): the five subtypes
  epidural, intraparenchymal, intraventricular, subarachnoid, subdural, one per slice, as FedISM+
  (following Jiang et al.'s 25,000-slice selection) and FedNPR use them (slices with a single
  hemorrhage type; no "none" class). An axial slice at a random level (skull base to vertex) holds
  scalp, skull, grey and white matter, sulci, the interhemispheric fissure, lateral and third
  ventricles and the basal cisterns, sized by age (atrophy); the hemorrhage is a biconvex lens against
  the skull (epidural), a long crescent along it, acute, subacute (isodense) or chronic (dark)
  (subdural), a blob with an oedema halo in the parenchyma (intraparenchymal), blood layering in the
  ventricles (intraventricular) or blood filling sulci, fissures and cisterns (subarachnoid), with
  varying size and conspicuity; window level and width, head position, size and scanner noise vary.

`render_image` draws one image on a grid `SUPERSAMPLE` times finer and box-averages it to the size the model sees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from scipy.special import expit, ndtri

from fairfl.data.classification_sites import ICH_CLASSES, SKIN_CLASSES
from fairfl.data.synthetic_fundus import _draw_segments, _smooth_field
from fairfl.data.synthetic_prostate import _box_mean

SUPERSAMPLE = 2


# ----------------------------------------------------------------------------------------------
# drawing helpers (lengths in crop units: the image spans [-1, 1], so one unit is half its width)


def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    axis = ((np.arange(n) - (n - 1) / 2) / (n / 2)).astype(np.float32)
    return axis[None, :], axis[:, None]


def _sigmoid(x) -> np.ndarray:
    return expit(np.asarray(x, np.float32))


def _blend(image: np.ndarray, weight, target) -> np.ndarray:
    """`image` moved towards `target` (a colour or a grey value) by `weight` (in [0, 1]), pixel by pixel."""
    weight = np.asarray(weight, np.float32)
    if image.ndim == 3:
        weight = weight[..., None]
    change = np.asarray(target, np.float32) - image
    change *= weight
    change += image
    return change


def _mix(a, b, t: float) -> np.ndarray:
    return (1 - t) * np.asarray(a, np.float32) + t * np.asarray(b, np.float32)


def _pick(rng: np.random.Generator, mask: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of up to `count` distinct random pixels where `mask` holds."""
    where = np.flatnonzero(mask)
    if not where.size or count <= 0:
        return np.zeros(0, int), np.zeros(0, int)
    chosen = rng.choice(where, size=min(int(count), where.size), replace=False)
    return np.divmod(chosen, mask.shape[1])


def _lattice(rng: np.random.Generator, mask: np.ndarray, spacing: float, jitter: float):
    """(rows, cols) of a jittered square lattice of `spacing` (units) where `mask` holds."""
    n = mask.shape[0]
    step = spacing * n / 2
    rows, cols = np.meshgrid(
        np.arange(rng.uniform(0, step), n, step), np.arange(rng.uniform(0, step), n, step), indexing="ij"
    )
    rows = np.clip(np.round(rows + rng.normal(0, jitter * step, rows.shape)), 0, n - 1).astype(int).ravel()
    cols = np.clip(np.round(cols + rng.normal(0, jitter * step, cols.shape)), 0, n - 1).astype(int).ravel()
    keep = mask[rows, cols]
    return rows[keep], cols[keep]


def _spots(n: int, rows: np.ndarray, cols: np.ndarray, radius: float) -> np.ndarray:
    """Round flat-topped spots of `radius` (units) at pixels (rows, cols): a weight map in [0, 1]."""
    spots = np.zeros((n, n), np.float32)
    if rows.size:
        np.add.at(spots, (rows, cols), 1.0)
        sigma = max(radius * n / 2 / 1.4, 0.6)
        spots = ndimage.gaussian_filter(spots, sigma) * (2 * np.pi * sigma * sigma)
    return np.clip(spots * 1.8, 0, 1)


def _dots(rng, colour: np.ndarray, mask: np.ndarray, count: int, radius: float, opacity: float, target) -> np.ndarray:
    """`colour` with up to `count` round spots of `radius` (units) at random pixels of `mask`, blended
    towards `target` with `opacity`."""
    rows, cols = _pick(rng, mask, count)
    return _blend(colour, _spots(colour.shape[0], rows, cols, radius) * opacity, target)


def _points_to_units(n: int, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (cols + 0.5) * 2 / n - 1, (rows + 0.5) * 2 / n - 1


def _grow(
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
            _grow(rng, segments, x, y, child, width * 0.7, max(steps // 2, 2), curl, branch, darkness, depth + 1, step)


def _lines(segments: list, n: int) -> np.ndarray:
    """Weight map in [0, 1] of line segments (x0, y0, x1, y1, width, darkness) with Gaussian profiles."""
    return np.clip(_draw_segments(segments, n) * 1.2, 0, 1) if segments else np.zeros((n, n), np.float32)


@dataclass
class _Shape:
    """A lesion or blob: soft inside weight, normalised radius (1 on the border), lesion-frame coordinates."""

    weight: np.ndarray
    rho: np.ndarray
    u: np.ndarray
    v: np.ndarray
    centre: tuple[float, float]
    radius: float


def _shape(
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
) -> _Shape:
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
    rho = rho * (1 + 0.6 * irregularity * _smooth_field(rng, 12, n))
    return _Shape(_sigmoid((1 - rho) / edge), rho, u, v, (cx, cy), radius)


def _lesion(rng, X, Y, n: int, colour: np.ndarray, hue, opacity, radius, asymmetry, irregularity, edge):
    """A lesion's outline (`_shape`) and its base colour `hue` laid on `colour` with `opacity`. Each
    number may be a (low, high) range, drawn uniformly. Returns (shape, colour)."""

    def draw(value):
        return rng.uniform(*value) if isinstance(value, tuple) else value

    shape = _shape(rng, X, Y, n, draw(radius), draw(asymmetry), draw(irregularity), draw(edge))
    return shape, _blend(colour, shape.weight * draw(opacity), hue)


def _network(rng, shape: _Shape, n: int, spacing: float, irregularity: float) -> np.ndarray:
    """Reticular pigment network (weight of its lines) of mesh `spacing`: the low set of a sum of three
    plane waves at 60 degrees (a honeycomb), warped, thickened, thinned and broken up by `irregularity`."""
    warp = irregularity * spacing * 0.6
    uu = shape.u + warp * _smooth_field(rng, 10, n)
    vv = shape.v + warp * _smooth_field(rng, 10, n)
    f = 2 * np.pi / spacing
    h = np.cos(f * uu) + np.cos(f * (0.5 * uu + 0.866 * vv)) + np.cos(f * (0.5 * uu - 0.866 * vv))
    lines = _sigmoid((-0.1 + 0.6 * irregularity * _smooth_field(rng, 8, n) - h) / 0.3)
    if irregularity > 0.3:  # atypical: broken off in places
        lines = lines * _sigmoid((_smooth_field(rng, 6, n) + 1.6 - 1.2 * irregularity) / 0.25)
    return lines


def _stripes(rng, shape: _Shape, n: int, spacing: float, warp: float) -> np.ndarray:
    """A sine wave of period `spacing` across the lesion in a random direction, its phase warped by a
    smooth field (`warp` radians per unit of the field): parallel lines, or with a large warp, ridges
    and furrows."""
    angle = rng.uniform(0, np.pi)
    phase = 2 * np.pi / spacing * (shape.u * math.cos(angle) + shape.v * math.sin(angle))
    return np.sin(phase + warp * _smooth_field(rng, 6 if warp > 2 else 4, n))


def _patches(rng, n: int, coverage: float, cells: int = 5) -> np.ndarray:
    """Random blotches covering roughly `coverage` of the image (weight in [0, 1])."""
    threshold = float(ndtri(1 - coverage))  # the fields are zero-mean, unit-sd and roughly normal
    return _sigmoid((_smooth_field(rng, cells, n) - threshold) / 0.25)


# ----------------------------------------------------------------------------------------------
# dermoscopy (the skin setting)

SKIN_LIGHT, SKIN_DARK = (0.94, 0.78, 0.69), (0.68, 0.49, 0.37)
ERYTHEMA = (0.86, 0.48, 0.45)
LIGHT_BROWN, DARK_BROWN, BLACK = (0.70, 0.50, 0.36), (0.40, 0.24, 0.15), (0.14, 0.10, 0.09)
TAN = (0.80, 0.63, 0.46)
BLUE_GREY, VEIL = (0.44, 0.50, 0.62), (0.62, 0.68, 0.80)
PINK, PEARL = (0.92, 0.64, 0.64), (0.95, 0.80, 0.78)
WHITE, KERATIN = (0.97, 0.95, 0.92), (0.94, 0.88, 0.70)
VESSEL, BLOOD = (0.72, 0.12, 0.15), (0.42, 0.08, 0.10)
LACUNA_RED, LACUNA_PURPLE, LACUNA_DARK = (0.78, 0.16, 0.22), (0.46, 0.16, 0.36), (0.16, 0.10, 0.22)


def _nevus(rng, X, Y, n, colour):
    atypia = rng.uniform(0, 0.5)  # dysplastic nevi share some melanoma features
    hue = _mix(LIGHT_BROWN, DARK_BROWN, rng.uniform(0.1, 0.8))
    if rng.random() < 0.12:  # blue nevus: homogeneous steel blue-grey
        hue = _mix(BLUE_GREY, DARK_BROWN, rng.uniform(0, 0.4))
    shape, colour = _lesion(
        rng,
        X,
        Y,
        n,
        colour,
        hue,
        opacity=(0.7, 0.95),
        radius=(0.22, 0.5),
        asymmetry=0.03 + 0.12 * atypia,
        irregularity=0.02 + 0.1 * atypia,
        edge=(0.03, 0.08),
    )
    w = shape.weight
    colour = _blend(colour, w * np.clip(1 - shape.rho, 0, 1) * rng.uniform(0, 0.5), DARK_BROWN)
    pattern = rng.choice(3, p=[0.5, 0.3, 0.2])  # reticular, globular, homogeneous
    if pattern == 0:
        net = _network(rng, shape, n, rng.uniform(0.11, 0.16), 0.1 + 0.6 * atypia)
        colour = _blend(colour, w * np.clip((1.1 - shape.rho) / 0.4, 0, 1) * net * rng.uniform(0.4, 0.7), DARK_BROWN)
    elif pattern == 1:
        rows, cols = _lattice(rng, shape.rho < 0.85, rng.uniform(0.1, 0.15), 0.1 + 0.4 * atypia)
        colour = _blend(colour, _spots(n, rows, cols, rng.uniform(0.025, 0.04)) * rng.uniform(0.6, 0.9), DARK_BROWN)
    if atypia > 0.3 and rng.random() < 0.5:  # an eccentric darker area
        colour = _blend(colour, w * _patches(rng, n, 0.2) * 0.6, DARK_BROWN)
    return colour, shape.weight


def _melanoma(rng, X, Y, n, colour):
    atypia = rng.uniform(0.25, 1.0)
    shape = _shape(
        rng, X, Y, n, rng.uniform(0.35, 0.8), 0.05 + 0.15 * atypia, 0.03 + 0.12 * atypia, rng.uniform(0.02, 0.1)
    )
    w = shape.weight
    if rng.random() < 0.1:  # amelanotic: pink, with dotted and irregular vessels (BCC and SCC look alike)
        colour = _blend(colour, w * rng.uniform(0.5, 0.8), PINK)
        colour = _dots(rng, colour, shape.rho < 0.9, rng.integers(8, 30), rng.uniform(0.012, 0.022), 0.8, VESSEL)
        colour = _blend(colour, _vessel_tree(rng, n, shape.rho < 0.9, 2, 0.025, 8, 0.6, 0.0) * 0.7, VESSEL)
        return colour, shape.weight
    colour = _blend(colour, w * rng.uniform(0.75, 0.95), _mix(LIGHT_BROWN, DARK_BROWN, rng.uniform(0.2, 0.8)))
    extra = (DARK_BROWN, BLACK, BLUE_GREY, ERYTHEMA, WHITE)  # colour variegation
    for index in rng.choice(len(extra), rng.binomial(4, 0.25 + 0.5 * atypia), replace=False):
        colour = _blend(colour, w * _patches(rng, n, rng.uniform(0.15, 0.4)) * rng.uniform(0.5, 0.9), extra[index])
    if rng.random() < 0.65:  # atypical network
        net = _network(rng, shape, n, rng.uniform(0.1, 0.18), 0.5 + 0.8 * atypia)
        colour = _blend(colour, w * net * rng.uniform(0.4, 0.8), _mix(DARK_BROWN, BLACK, rng.uniform()))
    if rng.random() < 0.6:  # irregular dots and globules, mostly at the periphery
        ring = (shape.rho > 0.5) & (shape.rho < 1.05)
        for radius in (rng.uniform(0.015, 0.025), rng.uniform(0.03, 0.05)):
            colour = _dots(
                rng, colour, ring, rng.integers(3, 16), radius, rng.uniform(0.6, 0.95), _mix(DARK_BROWN, BLACK, 0.6)
            )
    if rng.random() < 0.1 + 0.45 * atypia:  # blue-white veil
        colour = _blend(colour, w * _patches(rng, n, rng.uniform(0.15, 0.35)) * rng.uniform(0.5, 0.8), VEIL)
    if rng.random() < 0.3:  # regression: white scar-like areas with grey peppering
        regression = w * _patches(rng, n, rng.uniform(0.1, 0.25))
        colour = _blend(colour, regression * 0.7, WHITE)
        colour = _dots(rng, colour, regression > 0.5, rng.integers(5, 25), 0.012, 0.6, BLUE_GREY)
    if rng.random() < 0.3:  # streaks / pseudopods at the border
        rows, cols = _pick(rng, (shape.rho > 0.8) & (shape.rho < 0.95), rng.integers(4, 12))
        segments = []
        for x, y in zip(*_points_to_units(n, rows, cols)):
            heading = math.atan2(y - shape.centre[1], x - shape.centre[0])
            _grow(rng, segments, x, y, heading, rng.uniform(0.02, 0.035), rng.integers(3, 7), 0.1, 0.0)
        colour = _blend(colour, _lines(segments, n) * 0.85, DARK_BROWN)
    return colour, shape.weight


def _vessel_tree(
    rng, n: int, mask: np.ndarray, trees: int, width: float, steps: int, curl: float, branch: float
) -> np.ndarray:
    segments = []
    rows, cols = _pick(rng, mask, trees)
    for x, y in zip(*_points_to_units(n, rows, cols)):
        _grow(rng, segments, x, y, rng.uniform(0, 2 * np.pi), width, steps, curl, branch)
    return _lines(segments, n) * mask


def _basal_cell_carcinoma(rng, X, Y, n, colour):
    shape, colour = _lesion(
        rng,
        X,
        Y,
        n,
        colour,
        PEARL,
        opacity=(0.45, 0.75),
        radius=(0.25, 0.6),
        asymmetry=(0.05, 0.12),
        irregularity=(0.04, 0.12),
        edge=(0.04, 0.1),
    )
    inside = shape.rho < 0.95
    if rng.random() < 0.85:  # arborizing vessels: sharp, branching, red
        trees = _vessel_tree(
            rng, n, inside, rng.integers(1, 5), rng.uniform(0.03, 0.05), rng.integers(12, 28), 0.15, 0.09
        )
        colour = _blend(colour, trees * rng.uniform(0.7, 1.0), VESSEL)
    if rng.random() < 0.5:  # blue-grey ovoid nests and globules
        colour = _dots(
            rng, colour, shape.rho < 0.8, rng.integers(1, 7), rng.uniform(0.04, 0.09), rng.uniform(0.5, 0.85), BLUE_GREY
        )
    if rng.random() < 0.3:  # ulceration
        colour = _dots(rng, colour, shape.rho < 0.6, 1, rng.uniform(0.05, 0.12), 0.9, (0.45, 0.16, 0.12))
    if rng.random() < 0.3:  # shiny white lines
        segments = []
        rows, cols = _pick(rng, shape.rho < 0.8, rng.integers(2, 6))
        for x, y in zip(*_points_to_units(n, rows, cols)):
            _grow(rng, segments, x, y, rng.uniform(0, np.pi), 0.02, rng.integers(3, 6), 0.0, 0.0)
        colour = _blend(colour, _lines(segments, n) * 0.8, WHITE)
    if rng.random() < 0.2:  # pigmented BCC: a few brown dots
        colour = _dots(rng, colour, shape.rho < 0.9, rng.integers(3, 10), 0.02, 0.8, DARK_BROWN)
    return colour, shape.weight


def _actinic_keratosis(rng, X, Y, n, colour):
    shape, colour = _lesion(
        rng,
        X,
        Y,
        n,
        colour,
        ERYTHEMA,
        opacity=(0.35, 0.7),
        radius=(0.35, 0.75),
        asymmetry=(0.05, 0.15),
        irregularity=(0.05, 0.15),
        edge=(0.1, 0.25),
    )
    w = shape.weight
    if rng.random() < 0.6:  # strawberry pattern: red pseudo-network around pale follicular openings
        spacing = rng.uniform(0.09, 0.14)
        colour = _blend(colour, w * _network(rng, shape, n, spacing, 0.4) * rng.uniform(0.15, 0.45), VESSEL)
        rows, cols = _lattice(rng, shape.rho < 0.9, spacing, 0.2)
        colour = _blend(colour, _spots(n, rows, cols, rng.uniform(0.018, 0.03)) * rng.uniform(0.6, 0.9), KERATIN)
    if rng.random() < 0.6:  # surface scale
        scale = w * _patches(rng, n, rng.uniform(0.15, 0.4)) * np.clip(0.7 + 0.5 * _smooth_field(rng, 40, n), 0, 1)
        colour = _blend(colour, scale * rng.uniform(0.5, 0.9), WHITE)
    if rng.random() < 0.3:  # fine wavy vessels
        colour = _blend(
            colour, _vessel_tree(rng, n, shape.rho < 0.9, rng.integers(2, 5), 0.02, 10, 0.5, 0.0) * 0.8, VESSEL
        )
    if rng.random() < 0.3:  # dotted vessels
        colour = _dots(rng, colour, shape.rho < 0.9, rng.integers(5, 20), rng.uniform(0.012, 0.02), 0.8, VESSEL)
    if rng.random() < 0.2:  # pigmented AK
        colour = _blend(colour, w * _network(rng, shape, n, rng.uniform(0.1, 0.14), 0.3) * 0.5, LIGHT_BROWN)
    return colour, shape.weight


def _benign_keratosis(rng, X, Y, n, colour):
    hue = _mix(TAN, DARK_BROWN, rng.uniform(0, 0.7))  # waxy tan to brown
    shape, colour = _lesion(
        rng,
        X,
        Y,
        n,
        colour,
        hue,
        opacity=(0.8, 0.95),
        radius=(0.3, 0.7),
        asymmetry=(0.03, 0.1),
        irregularity=(0.04, 0.14),
        edge=(0.015, 0.04),
    )
    w = shape.weight
    inside = shape.rho < 0.9
    if rng.random() < 0.6:  # milia-like cysts
        colour = _dots(rng, colour, inside, rng.integers(3, 16), rng.uniform(0.015, 0.03), rng.uniform(0.6, 0.9), WHITE)
    if rng.random() < 0.6:  # comedo-like openings
        colour = _dots(
            rng,
            colour,
            inside,
            rng.integers(3, 16),
            rng.uniform(0.015, 0.035),
            rng.uniform(0.6, 0.9),
            _mix(DARK_BROWN, BLACK, 0.7),
        )
    if rng.random() < 0.5:  # fissures and ridges (cerebriform)
        wave = _stripes(rng, shape, n, rng.uniform(0.08, 0.14), 4.0)
        colour = _blend(colour, w * _sigmoid((0.3 - np.abs(wave)) / 0.1) * rng.uniform(0.4, 0.7), DARK_BROWN)
    if rng.random() < 0.2:  # solar lentigo: a fine reticular network (nevus-like)
        colour = _blend(colour, w * _network(rng, shape, n, rng.uniform(0.1, 0.15), 0.3) * 0.5, DARK_BROWN)
    if rng.random() < 0.15:  # lichen-planus-like keratosis: grey granular peppering (regression-like)
        colour = _dots(rng, colour, shape.rho < 0.9, rng.integers(15, 50), 0.012, 0.7, BLUE_GREY)
    if rng.random() < 0.2:  # fingerprint-like parallel lines (solar lentigo)
        wave = _stripes(rng, shape, n, rng.uniform(0.06, 0.09), 0.8)
        colour = _blend(colour, w * _sigmoid((wave - 0.5) / 0.15) * 0.5, DARK_BROWN)
    return colour, shape.weight


def _dermatofibroma(rng, X, Y, n, colour):
    hue = _mix(LIGHT_BROWN, PINK, rng.uniform(0, 0.6))
    shape, colour = _lesion(
        rng,
        X,
        Y,
        n,
        colour,
        hue,
        opacity=(0.4, 0.65),
        radius=(0.18, 0.4),
        asymmetry=(0.02, 0.05),
        irregularity=(0.02, 0.06),
        edge=(0.05, 0.1),
    )
    w = shape.weight
    if rng.random() < 0.85:  # delicate peripheral network
        ring = np.clip((shape.rho - 0.35) / 0.25, 0, 1)
        net = _network(rng, shape, n, rng.uniform(0.1, 0.14), 0.1)
        colour = _blend(colour, w * ring * net * rng.uniform(0.4, 0.7), _mix(LIGHT_BROWN, DARK_BROWN, 0.5))
    if rng.random() < 0.7:  # central white scar-like patch
        patch = _sigmoid((rng.uniform(0.3, 0.6) - shape.rho * (1 + 0.3 * _smooth_field(rng, 8, n))) / 0.06)
        colour = _blend(colour, patch * rng.uniform(0.3, 0.9), WHITE)
    return colour, shape.weight


def _vascular(rng, X, Y, n, colour):
    shape, colour = _lesion(
        rng,
        X,
        Y,
        n,
        colour,
        (0.88, 0.55, 0.58),
        opacity=(0.5, 0.8),
        radius=(0.15, 0.45),
        asymmetry=(0.03, 0.08),
        irregularity=(0.03, 0.1),
        edge=(0.02, 0.045),
    )
    t = rng.uniform()  # red, purple, or dark (thrombosed)
    lacuna = _mix(LACUNA_RED, LACUNA_PURPLE, 2 * t) if t < 0.5 else _mix(LACUNA_PURPLE, LACUNA_DARK, 2 * t - 1)
    rows, cols = _pick(rng, shape.rho < 0.75, rng.integers(3, 15))
    lacunae = _spots(n, rows, cols, shape.radius * rng.uniform(0.18, 0.35)) * shape.weight
    return _blend(colour, lacunae * rng.uniform(0.75, 0.95), lacuna), shape.weight


def _squamous_cell_carcinoma(rng, X, Y, n, colour):
    shape, colour = _lesion(
        rng,
        X,
        Y,
        n,
        colour,
        PINK,
        opacity=(0.5, 0.8),
        radius=(0.28, 0.6),
        asymmetry=(0.05, 0.15),
        irregularity=(0.06, 0.16),
        edge=(0.04, 0.1),
    )
    if rng.random() < 0.8:  # central keratin mass, rough
        mass = _sigmoid((rng.uniform(0.3, 0.7) - shape.rho * (1 + 0.3 * _smooth_field(rng, 8, n))) / 0.08)
        rough = np.clip(0.75 + 0.35 * _smooth_field(rng, 40, n), 0, 1)
        colour = _blend(colour, mass * rough * rng.uniform(0.6, 0.95), KERATIN)
    if rng.random() < 0.75:  # glomerular / dotted vessels, clustered
        colour = _dots(
            rng,
            colour,
            (shape.rho > 0.35) & (shape.rho < 1.0),
            rng.integers(10, 40),
            rng.uniform(0.012, 0.022),
            rng.uniform(0.7, 0.95),
            VESSEL,
        )
    if rng.random() < 0.4:  # blood spots
        colour = _dots(rng, colour, shape.rho < 0.8, rng.integers(1, 5), rng.uniform(0.03, 0.06), 0.9, BLOOD)
    if rng.random() < 0.3:  # keratin-filled follicular openings (AK-like)
        rows, cols = _lattice(rng, shape.rho < 0.9, rng.uniform(0.09, 0.14), 0.3)
        colour = _blend(colour, _spots(n, rows, cols, rng.uniform(0.018, 0.03)) * 0.7, KERATIN)
    if rng.random() < 0.3:  # hairpin vessels
        colour = _blend(
            colour, _vessel_tree(rng, n, shape.rho < 0.9, rng.integers(2, 6), 0.02, 6, 0.7, 0.0) * 0.8, VESSEL
        )
    return colour, shape.weight


SKIN_LESIONS = dict(
    MEL=_melanoma,
    NV=_nevus,
    BCC=_basal_cell_carcinoma,
    AK=_actinic_keratosis,
    BKL=_benign_keratosis,
    DF=_dermatofibroma,
    VASC=_vascular,
    SCC=_squamous_cell_carcinoma,
)


def render_skin(label: int, rng: np.random.Generator, n: int) -> np.ndarray:
    """A dermoscopy-like RGB image [n, n, 3] (0-1) of a lesion of class `label` (SKIN_CLASSES order)."""
    X, Y = _grid(n)
    tone = rng.beta(1.5, 4.0)
    skin = _mix(SKIN_LIGHT, SKIN_DARK, tone) * rng.normal(1, 0.025, 3).astype(np.float32)
    colour = skin * (1 + 0.05 * _smooth_field(rng, 5, n) + 0.015 * _smooth_field(rng, 40, n))[..., None]
    colour = _blend(colour, 0.3 * np.clip(_smooth_field(rng, 4, n), 0, None) * rng.uniform(0, 1), ERYTHEMA)
    background = colour
    colour, lesion = SKIN_LESIONS[SKIN_CLASSES[label]](rng, X, Y, n, colour)
    # conspicuity: how clearly the inner structures show (lesion depth, pressure, gel, focus); at low
    # conspicuity a lesion tends towards a plain blotch of its mean colour, keeping its outline
    mean = (colour * lesion[..., None]).sum((0, 1)) / max(float(lesion.sum()), 1.0)
    plain = _blend(background, lesion, mean)
    colour = plain + rng.uniform(0.3, 1.0) * (colour - plain)
    # hairs
    if rng.random() < 0.45:
        segments = []
        for _ in range(rng.integers(1, 9)):
            _grow(
                rng,
                segments,
                rng.uniform(-1.1, 1.1),
                rng.uniform(-1.1, 1.1),
                rng.uniform(0, 2 * np.pi),
                rng.uniform(0.02, 0.035),
                rng.integers(30, 90),
                0.03,
                0.0,
            )
        colour = _blend(colour, _lines(segments, n) * rng.uniform(0.7, 1.0), _mix(DARK_BROWN, BLACK, rng.uniform()))
    # gel bubbles: bright rims
    if rng.random() < 0.15:
        for _ in range(rng.integers(1, 4)):
            bx, by, br = rng.uniform(-0.9, 0.9), rng.uniform(-0.9, 0.9), rng.uniform(0.05, 0.15)
            rim = np.exp(-(((np.hypot(X - bx, Y - by) - br) / 0.012) ** 2))
            colour = _blend(colour, rim * 0.8, WHITE)
    # lighting: a gradient and vignetting, then the dermoscope's dark circular field stop in some images
    light = 1 + 0.08 * rng.normal() * X + 0.08 * rng.normal() * Y - rng.uniform(0, 0.15) * (X * X + Y * Y)
    colour = colour * light[..., None] * rng.normal(1, 0.04, 3).astype(np.float32)
    colour = ndimage.gaussian_filter(colour, (*(2 * [rng.uniform(0, 0.8) * SUPERSAMPLE]), 0))  # focus
    if rng.random() < 0.3:
        stop = _sigmoid((np.hypot(X - rng.normal(0, 0.05), Y - rng.normal(0, 0.05)) - rng.uniform(0.95, 1.3)) / 0.02)
        colour = _blend(colour, stop, (0.05, 0.04, 0.04))
    return colour


# ----------------------------------------------------------------------------------------------
# head CT in a brain window (the ich setting); grey values on the display scale 0-1

AIR, CSF, WHITE_MATTER, GREY_MATTER, SCALP, BONE = 0.0, 0.14, 0.41, 0.51, 0.44, 1.0


class _Head:
    """An axial head CT slice: anatomy in a head frame (u right, v posterior), drawn on an n x n grid."""

    def __init__(self, rng: np.random.Generator, n: int, level: float):
        self.rng, self.n, self.level = rng, n, level
        self.age = rng.uniform(0, 1)  # atrophy: wider sulci and ventricles
        size = rng.uniform(0.86, 0.96) * (1 - 0.5 * max(0.0, level - 0.7))  # smaller towards the vertex
        self.a, self.b = size * rng.uniform(0.74, 0.82), min(size * rng.uniform(0.95, 1.03), 0.97)
        self.cx, self.cy = float(rng.normal(0, 0.03)), float(rng.normal(0, 0.03))
        self.angle = float(rng.normal(0, 0.06))
        self.scalp, self.skull = rng.uniform(0.025, 0.045), rng.uniform(0.035, 0.06)
        self.csf_gap = 0.004 + 0.02 * self.age
        X, Y = _grid(n)
        c, s = math.cos(self.angle), math.sin(self.angle)
        self.u = c * (X - self.cx) + s * (Y - self.cy)
        self.v = c * (Y - self.cy) - s * (X - self.cx)
        self.theta = np.arctan2(self.v, self.u)
        self.depth = self.inner_radius(self.theta) - np.hypot(self.u, self.v)  # below the inner table
        self.shift = 0.0  # midline shift (mass effect), set by a hemorrhage before the midline is drawn

    def outer_radius(self, theta):
        """Radius of the scalp surface at angle theta: an egg-shaped ellipse, wider at the back."""
        return (1 / np.sqrt((np.cos(theta) / self.a) ** 2 + (np.sin(theta) / self.b) ** 2)) * (1 + 0.03 * np.sin(theta))

    def inner_radius(self, theta):
        return self.outer_radius(theta) - self.scalp - self.skull * (1 + 0.25 * np.sin(theta) ** 2)

    def to_image(self, u: float, v: float) -> tuple[float, float]:
        c, s = math.cos(self.angle), math.sin(self.angle)
        return self.cx + c * u - s * v, self.cy + s * u + c * v

    def at(self, theta: float, depth: float) -> tuple[float, float]:
        """Head-frame point at angle theta, `depth` below the inner table."""
        r = float(self.inner_radius(theta)) - depth
        return r * math.cos(theta), r * math.sin(theta)

    def ellipse(self, cu: float, cv: float, a: float, b: float, angle: float = 0.0, edge: float = 0.1) -> np.ndarray:
        c, s = math.cos(angle), math.sin(angle)
        du, dv = self.u - cu, self.v - cv
        return _sigmoid((1 - np.hypot((c * du + s * dv) / a, (c * dv - s * du) / b)) / edge)

    def sulci(self, count: int, sector: tuple[float, float] | None = None) -> list[tuple]:
        """Sulci as segments (image coordinates): from the brain surface inwards, wiggling; only in the
        angular `sector` (centre, half-width) if given."""
        rng, segments = self.rng, []
        width = (0.012 + 0.012 * self.age) * rng.uniform(0.85, 1.15)
        for _ in range(count):
            theta = rng.uniform(-np.pi, np.pi) if sector is None else sector[0] + rng.uniform(-1, 1) * sector[1]
            u, v = self.at(theta, self.csf_gap)
            x, y = self.to_image(u, v)
            inward = math.atan2(y - self.cy, x - self.cx) + np.pi
            _grow(
                rng,
                segments,
                x,
                y,
                inward + rng.normal(0, 0.3),
                width,
                int(rng.uniform(0.05, 0.13) * (1 + 0.5 * self.age) / 0.015),
                0.35,
                0.08,
                step=0.015,
            )
        return segments

    def render(self) -> tuple[np.ndarray, dict]:
        """The slice without hemorrhage, and the masks a hemorrhage needs (brain, ventricles, cisterns)."""
        rng, n, level, age = self.rng, self.n, self.level, self.age
        outer = self.outer_radius(self.theta) - np.hypot(self.u, self.v)  # depth below the scalp surface
        image = np.where(outer > 0, SCALP, AIR).astype(np.float32) * _sigmoid(outer / 0.004)
        bone = _sigmoid((outer - self.scalp) / 0.004) * _sigmoid(-self.depth / 0.004)
        diploe = np.exp(-(((outer - self.scalp - self.skull / 2) / (self.skull / 3)) ** 2))  # spongy middle layer
        image = _blend(image, bone, BONE - 0.12 * diploe)
        brain = _sigmoid(self.depth / 0.003)
        cortex = _sigmoid((0.045 + 0.01 * _smooth_field(rng, 12, n) - (self.depth - self.csf_gap)) / 0.012)
        tissue = WHITE_MATTER + (GREY_MATTER - WHITE_MATTER) * cortex + 0.012 * _smooth_field(rng, 16, n)
        image = _blend(image, brain, tissue)
        image = _blend(image, brain * _sigmoid((self.csf_gap - self.depth) / 0.003), CSF)  # CSF over the convexity
        masks = dict(brain=brain * _sigmoid((self.depth - self.csf_gap) / 0.003))
        masks["sulci"] = self.sulci(rng.integers(22, 34))
        # the interhemispheric fissure (front and back), Sylvian fissures at the level of the basal ganglia
        fissure = []
        for end, stop in ((-np.pi / 2, -0.3 + 0.25 * level), (np.pi / 2, 0.35 - 0.25 * level)):
            u, v = self.at(end, 0.0)
            _grow(
                rng,
                fissure,
                *self.to_image(self.shift, v),
                (1 if end < 0 else -1) * np.pi / 2 + self.angle,
                0.02 + 0.01 * age,
                max(int(abs(v - stop) / 0.02), 1),
                0.02,
                0.0,
            )
        if 0.25 < level < 0.55:
            for side in (0.0, np.pi):
                theta = side + (0.3 if side else -0.3) + rng.normal(0, 0.1)
                u, v = self.at(theta, self.csf_gap)
                x, y = self.to_image(u, v)
                _grow(
                    rng,
                    fissure,
                    x,
                    y,
                    math.atan2(y - self.cy, x - self.cx) + np.pi,
                    0.025 + 0.015 * age,
                    int(rng.uniform(0.18, 0.28) / 0.02),
                    0.15,
                    0.1,
                )
        masks["fissures"] = fissure
        # ventricles, third ventricle, basal cisterns: CSF, centred on the (possibly shifted) midline
        m = self.shift
        ventricles = np.zeros((n, n), np.float32)
        if 0.3 < level < 0.75:
            width = (0.6 + 0.9 * age) * math.exp(-(((level - 0.5) / 0.17) ** 2)) * rng.uniform(0.8, 1.2)
            for side in (-1.0, 1.0):
                horns = [
                    self.ellipse(m + side * 0.07, -0.17, 0.035 * width + 0.008, 0.11, side * 0.35),
                    self.ellipse(m + side * 0.1, 0.06, 0.04 * width + 0.008, 0.13, -side * 0.15),
                    self.ellipse(m + side * 0.13, 0.24, 0.035 * width + 0.006, 0.08, -side * 0.4),
                ]
                ventricles = np.maximum(ventricles, np.maximum.reduce(horns))
        if 0.25 < level < 0.45:
            ventricles = np.maximum(ventricles, self.ellipse(m, 0.0, 0.012 * (1 + age), 0.07))
        cisterns = np.zeros((n, n), np.float32)
        if level < 0.32:
            du, dv = self.u - m, self.v + 0.08
            star = _sigmoid((0.05 + 0.03 * np.cos(5 * np.arctan2(dv, du)) - np.hypot(du, dv)) / 0.008)
            ring = np.exp(-(((np.hypot(self.u - m, self.v - 0.06) - 0.11) / 0.015) ** 2)) * (self.v > 0.0)
            cisterns = np.maximum(star, ring * (0.7 + 0.5 * age)).clip(0, 1)
            ventricles = np.maximum(ventricles, self.ellipse(m, 0.33, 0.03, 0.02))  # fourth ventricle
        if 0.3 < level < 0.55:  # basal ganglia and thalami, a little brighter
            for side in (-1.0, 1.0):
                image = _blend(image, self.ellipse(m + side * 0.16, 0.0, 0.07, 0.12, edge=0.3) * 0.5, GREY_MATTER)
        masks.update(ventricles=ventricles * brain, cisterns=cisterns * brain)
        return image, masks

    def finish(
        self, image: np.ndarray, masks: dict, sulcal_blood: list | None = None, blood_value: float = 0.8
    ) -> np.ndarray:
        """Draw CSF spaces (and blood in some sulci), then return the slice."""
        csf = (
            np.maximum.reduce(
                [
                    _lines(masks["sulci"], self.n) * 0.7,
                    _lines(masks["fissures"], self.n) * 0.7,
                    masks["ventricles"],
                    masks["cisterns"],
                ]
            )
            * masks["brain"]
        )
        image = _blend(image, csf, CSF)
        if sulcal_blood:
            image = _blend(image, _lines(sulcal_blood, self.n) * masks["brain"], blood_value)
        return image


def _angle_offset(theta: np.ndarray, centre: float) -> np.ndarray:
    return np.angle(np.exp(1j * (theta - centre)))


def _lateral_angle(rng) -> float:
    return float(rng.choice((0.0, np.pi)) + rng.normal(0, 0.6))


def _epidural(rng, head: _Head):
    theta0, half = _lateral_angle(rng), rng.uniform(0.3, 0.6)
    thickness = rng.uniform(0.04, 0.13)
    head.shift = -0.35 * thickness * math.copysign(1, math.cos(theta0))
    image, masks = head.render()
    image = head.finish(image, masks)
    profile = thickness * np.sqrt(np.clip(1 - (_angle_offset(head.theta, theta0) / half) ** 2, 0, 1))
    lens = _sigmoid((profile - head.depth) / 0.006) * _sigmoid(head.depth / 0.003)
    value = rng.uniform(0.7, 0.9)
    if rng.random() < 0.2:  # swirl sign: unclotted blood, darker patches
        value = value * (1 - 0.2 * np.clip(_smooth_field(rng, 8, head.n), 0, 1))
    return _blend(image, lens, value)


def _subdural(rng, head: _Head):
    kind = rng.choice(3, p=[0.6, 0.22, 0.18])  # acute, subacute (isodense), chronic (hypodense)
    value = (rng.uniform(0.7, 0.9), rng.uniform(0.52, 0.62), rng.uniform(0.2, 0.3))[kind]
    thickness = rng.uniform(0.015, 0.07)
    theta0, half = _lateral_angle(rng), rng.uniform(0.6, 1.5)
    head.shift = -0.3 * thickness * math.copysign(1, math.cos(theta0))
    image, masks = head.render()
    image = head.finish(image, masks)
    if rng.random() < 0.1:  # along the falx
        band = head.ellipse(
            head.shift, rng.uniform(-0.3, 0.3), thickness / 2 + 0.01, rng.uniform(0.15, 0.35), edge=0.15
        )
        return _blend(image, band * masks["brain"], value)
    profile = thickness * np.clip(1 - (_angle_offset(head.theta, theta0) / half) ** 2, 0, 1) ** 0.3
    crescent = _sigmoid((profile - head.depth) / 0.005) * _sigmoid(head.depth / 0.003)
    return _blend(image, crescent, value)


def _intraparenchymal(rng, head: _Head):
    radius = rng.uniform(0.03, 0.13)
    head.shift = -0.3 * max(radius - 0.06, 0)
    image, masks = head.render()
    image = head.finish(image, masks)
    if rng.random() < 0.5:  # deep (basal ganglia, thalamus)
        centre = (head.shift + float(rng.choice((-1, 1))) * rng.uniform(0.08, 0.22), rng.uniform(-0.12, 0.15))
    else:  # lobar
        centre = head.at(rng.uniform(-np.pi, np.pi), rng.uniform(0.1, 0.3) + radius * 0.5)
    X, Y = head.to_image(*centre)
    grid = _grid(head.n)
    blob = _shape(rng, *grid, head.n, radius, 0.15, 0.12, 0.08, centre=(X, Y))
    oedema = _sigmoid((1 + rng.uniform(0.2, 0.6) - blob.rho) / 0.1) * masks["brain"]
    image = _blend(image, oedema * 0.7, WHITE_MATTER - 0.08)
    core = rng.uniform(0.72, 0.92) * (1 - 0.06 * _smooth_field(rng, 10, head.n))
    return _blend(image, blob.weight * masks["brain"], core)


def _intraventricular(rng, head: _Head):
    image, masks = head.render()
    image = head.finish(image, masks)
    ventricles, value = masks["ventricles"], rng.uniform(0.62, 0.88)
    if rng.random() < 0.3:  # a cast of one lateral ventricle
        side = float(rng.choice((-1, 1)))
        blood = ventricles * _sigmoid(side * (head.u - head.shift) / 0.01)
    else:  # layering in the dependent (posterior) horns, one side or both
        sides = rng.choice(3)  # left, right, both
        where = np.where(sides == 2, 1.0, _sigmoid((1 if sides else -1) * (head.u - head.shift) / 0.01))
        blood = ventricles * where * _sigmoid((head.v - rng.uniform(0.1, 0.25)) / 0.01)
    return _blend(image, blood, value)


def _subarachnoid(rng, head: _Head, pattern: int):
    image, masks = head.render()
    value = rng.uniform(0.6, 0.82)
    blood = []
    if pattern == 0:  # focal, over the convexity
        sector = (rng.uniform(-np.pi, np.pi), rng.uniform(0.3, 0.8))
        blood = head.sulci(rng.integers(4, 12), sector)
        gap = _sigmoid((head.csf_gap + 0.006 - head.depth) / 0.003) * _sigmoid(head.depth / 0.003)
        image = _blend(image, gap * (np.abs(_angle_offset(head.theta, sector[0])) < sector[1]) * 0.8, value)
    elif pattern == 1:  # diffuse: many sulci and the fissures
        blood = head.sulci(rng.integers(10, 24)) + masks["fissures"]
        masks["fissures"] = []
    image = head.finish(image, masks, blood, value)
    if pattern == 2:  # basal: blood fills the cisterns (a bright star)
        image = _blend(image, masks["cisterns"], value)
    return image


def render_ct(label: int, rng: np.random.Generator, n: int) -> np.ndarray:
    """A head-CT-like grey slice [n, n] (0-1, brain window) with a hemorrhage of class `label`."""
    name = ICH_CLASSES[label]
    pattern = int(rng.choice(3, p=[0.4, 0.3, 0.3])) if name == "subarachnoid" else -1
    if name == "intraventricular":
        level = rng.uniform(0.35, 0.65)
    elif pattern == 2:
        level = rng.uniform(0.15, 0.31)
    else:
        level = rng.uniform(0.15, 0.9)
    head = _Head(rng, n, level)
    if name == "subarachnoid":
        image = _subarachnoid(rng, head, pattern)
    else:
        image = dict(
            epidural=_epidural,
            intraparenchymal=_intraparenchymal,
            intraventricular=_intraventricular,
            subdural=_subdural,
        )[name](rng, head)
    # window level and width vary by site and scan
    return (image - 0.45) * rng.uniform(0.85, 1.2) + 0.45 + rng.uniform(-0.05, 0.05)


# ----------------------------------------------------------------------------------------------
# one image at the size the model sees


def render_image(setting: str, label: int, image_size: int, rng: np.random.Generator) -> np.ndarray:
    """One synthetic image as uint8: RGB [S, S, 3] (skin) or grey [S, S] (ich), S = image_size."""
    n = image_size * SUPERSAMPLE
    if setting == "skin":
        fine = render_skin(label, rng, n)
        image = fine.reshape(image_size, SUPERSAMPLE, image_size, SUPERSAMPLE, 3).mean(axis=(1, 3))
        noise = 0.008
    else:
        image = _box_mean(render_ct(label, rng, n), SUPERSAMPLE)
        noise = rng.uniform(0.01, 0.03)  # CT quantum noise, at the pixel size the model sees
    image = image + rng.normal(0, noise, image.shape).astype(np.float32)
    return np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)
