"""Procedural dermoscopy-like images of the built-in `skin` setting (`fairfl.data.synthetic_classification`),
imitating ISIC 2019 (RGB dermoscopy): eight diagnoses MEL, NV, BCC, AK, BKL, DF, VASC, SCC.

Each class is drawn with the dermoscopic structures clinicians read (the "ABCD" rule, the pattern analysis
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
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage
from scipy.special import ndtri

from fairfl.data.classification_sites import SKIN_CLASSES
from fairfl.data.drawing import (
    SUPERSAMPLE,
    Shape,
    blend,
    crop_grid,
    grow_line,
    line_weights,
    random_shape,
    sigmoid,
    smooth_field,
)

# ----------------------------------------------------------------------------------------------
# drawing helpers of dermoscopic structures


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
    return blend(colour, _spots(colour.shape[0], rows, cols, radius) * opacity, target)


def _points_to_units(n: int, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (cols + 0.5) * 2 / n - 1, (rows + 0.5) * 2 / n - 1


def _lesion(rng, X, Y, n: int, colour: np.ndarray, hue, opacity, radius, asymmetry, irregularity, edge):
    """A lesion's outline (`random_shape`) and its base colour `hue` laid on `colour` with `opacity`. Each
    number may be a (low, high) range, drawn uniformly. Returns (shape, colour)."""

    def draw(value):
        return rng.uniform(*value) if isinstance(value, tuple) else value

    shape = random_shape(rng, X, Y, n, draw(radius), draw(asymmetry), draw(irregularity), draw(edge))
    return shape, blend(colour, shape.weight * draw(opacity), hue)


def _network(rng, shape: Shape, n: int, spacing: float, irregularity: float) -> np.ndarray:
    """Reticular pigment network (weight of its lines) of mesh `spacing`: the low set of a sum of three
    plane waves at 60 degrees (a honeycomb), warped, thickened, thinned and broken up by `irregularity`."""
    warp = irregularity * spacing * 0.6
    uu = shape.u + warp * smooth_field(rng, 10, n)
    vv = shape.v + warp * smooth_field(rng, 10, n)
    f = 2 * np.pi / spacing
    h = np.cos(f * uu) + np.cos(f * (0.5 * uu + 0.866 * vv)) + np.cos(f * (0.5 * uu - 0.866 * vv))
    lines = sigmoid((-0.1 + 0.6 * irregularity * smooth_field(rng, 8, n) - h) / 0.3)
    if irregularity > 0.3:  # atypical: broken off in places
        lines = lines * sigmoid((smooth_field(rng, 6, n) + 1.6 - 1.2 * irregularity) / 0.25)
    return lines


def _stripes(rng, shape: Shape, n: int, spacing: float, warp: float) -> np.ndarray:
    """A sine wave of period `spacing` across the lesion in a random direction, its phase warped by a
    smooth field (`warp` radians per unit of the field): parallel lines, or with a large warp, ridges
    and furrows."""
    angle = rng.uniform(0, np.pi)
    phase = 2 * np.pi / spacing * (shape.u * math.cos(angle) + shape.v * math.sin(angle))
    return np.sin(phase + warp * smooth_field(rng, 6 if warp > 2 else 4, n))


def _patches(rng, n: int, coverage: float, cells: int = 5) -> np.ndarray:
    """Random blotches covering roughly `coverage` of the image (weight in [0, 1])."""
    threshold = float(ndtri(1 - coverage))  # the fields are zero-mean, unit-sd and roughly normal
    return sigmoid((smooth_field(rng, cells, n) - threshold) / 0.25)


# ----------------------------------------------------------------------------------------------
# the eight diagnoses

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
    colour = blend(colour, w * np.clip(1 - shape.rho, 0, 1) * rng.uniform(0, 0.5), DARK_BROWN)
    pattern = rng.choice(3, p=[0.5, 0.3, 0.2])  # reticular, globular, homogeneous
    if pattern == 0:
        net = _network(rng, shape, n, rng.uniform(0.11, 0.16), 0.1 + 0.6 * atypia)
        colour = blend(colour, w * np.clip((1.1 - shape.rho) / 0.4, 0, 1) * net * rng.uniform(0.4, 0.7), DARK_BROWN)
    elif pattern == 1:
        rows, cols = _lattice(rng, shape.rho < 0.85, rng.uniform(0.1, 0.15), 0.1 + 0.4 * atypia)
        colour = blend(colour, _spots(n, rows, cols, rng.uniform(0.025, 0.04)) * rng.uniform(0.6, 0.9), DARK_BROWN)
    if atypia > 0.3 and rng.random() < 0.5:  # an eccentric darker area
        colour = blend(colour, w * _patches(rng, n, 0.2) * 0.6, DARK_BROWN)
    return colour, shape.weight


def _melanoma(rng, X, Y, n, colour):
    atypia = rng.uniform(0.25, 1.0)
    shape = random_shape(
        rng, X, Y, n, rng.uniform(0.35, 0.8), 0.05 + 0.15 * atypia, 0.03 + 0.12 * atypia, rng.uniform(0.02, 0.1)
    )
    w = shape.weight
    if rng.random() < 0.1:  # amelanotic: pink, with dotted and irregular vessels (BCC and SCC look alike)
        colour = blend(colour, w * rng.uniform(0.5, 0.8), PINK)
        colour = _dots(rng, colour, shape.rho < 0.9, rng.integers(8, 30), rng.uniform(0.012, 0.022), 0.8, VESSEL)
        colour = blend(colour, _vessel_tree(rng, n, shape.rho < 0.9, 2, 0.025, 8, 0.6, 0.0) * 0.7, VESSEL)
        return colour, shape.weight
    colour = blend(colour, w * rng.uniform(0.75, 0.95), _mix(LIGHT_BROWN, DARK_BROWN, rng.uniform(0.2, 0.8)))
    extra = (DARK_BROWN, BLACK, BLUE_GREY, ERYTHEMA, WHITE)  # colour variegation
    for index in rng.choice(len(extra), rng.binomial(4, 0.25 + 0.5 * atypia), replace=False):
        colour = blend(colour, w * _patches(rng, n, rng.uniform(0.15, 0.4)) * rng.uniform(0.5, 0.9), extra[index])
    if rng.random() < 0.65:  # atypical network
        net = _network(rng, shape, n, rng.uniform(0.1, 0.18), 0.5 + 0.8 * atypia)
        colour = blend(colour, w * net * rng.uniform(0.4, 0.8), _mix(DARK_BROWN, BLACK, rng.uniform()))
    if rng.random() < 0.6:  # irregular dots and globules, mostly at the periphery
        ring = (shape.rho > 0.5) & (shape.rho < 1.05)
        for radius in (rng.uniform(0.015, 0.025), rng.uniform(0.03, 0.05)):
            colour = _dots(
                rng, colour, ring, rng.integers(3, 16), radius, rng.uniform(0.6, 0.95), _mix(DARK_BROWN, BLACK, 0.6)
            )
    if rng.random() < 0.1 + 0.45 * atypia:  # blue-white veil
        colour = blend(colour, w * _patches(rng, n, rng.uniform(0.15, 0.35)) * rng.uniform(0.5, 0.8), VEIL)
    if rng.random() < 0.3:  # regression: white scar-like areas with grey peppering
        regression = w * _patches(rng, n, rng.uniform(0.1, 0.25))
        colour = blend(colour, regression * 0.7, WHITE)
        colour = _dots(rng, colour, regression > 0.5, rng.integers(5, 25), 0.012, 0.6, BLUE_GREY)
    if rng.random() < 0.3:  # streaks / pseudopods at the border
        rows, cols = _pick(rng, (shape.rho > 0.8) & (shape.rho < 0.95), rng.integers(4, 12))
        segments = []
        for x, y in zip(*_points_to_units(n, rows, cols), strict=True):
            heading = math.atan2(y - shape.centre[1], x - shape.centre[0])
            grow_line(rng, segments, x, y, heading, rng.uniform(0.02, 0.035), rng.integers(3, 7), 0.1, 0.0)
        colour = blend(colour, line_weights(segments, n) * 0.85, DARK_BROWN)
    return colour, shape.weight


def _vessel_tree(
    rng, n: int, mask: np.ndarray, trees: int, width: float, steps: int, curl: float, branch: float
) -> np.ndarray:
    segments = []
    rows, cols = _pick(rng, mask, trees)
    for x, y in zip(*_points_to_units(n, rows, cols), strict=True):
        grow_line(rng, segments, x, y, rng.uniform(0, 2 * np.pi), width, steps, curl, branch)
    return line_weights(segments, n) * mask


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
        colour = blend(colour, trees * rng.uniform(0.7, 1.0), VESSEL)
    if rng.random() < 0.5:  # blue-grey ovoid nests and globules
        colour = _dots(
            rng, colour, shape.rho < 0.8, rng.integers(1, 7), rng.uniform(0.04, 0.09), rng.uniform(0.5, 0.85), BLUE_GREY
        )
    if rng.random() < 0.3:  # ulceration
        colour = _dots(rng, colour, shape.rho < 0.6, 1, rng.uniform(0.05, 0.12), 0.9, (0.45, 0.16, 0.12))
    if rng.random() < 0.3:  # shiny white lines
        segments = []
        rows, cols = _pick(rng, shape.rho < 0.8, rng.integers(2, 6))
        for x, y in zip(*_points_to_units(n, rows, cols), strict=True):
            grow_line(rng, segments, x, y, rng.uniform(0, np.pi), 0.02, rng.integers(3, 6), 0.0, 0.0)
        colour = blend(colour, line_weights(segments, n) * 0.8, WHITE)
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
        colour = blend(colour, w * _network(rng, shape, n, spacing, 0.4) * rng.uniform(0.15, 0.45), VESSEL)
        rows, cols = _lattice(rng, shape.rho < 0.9, spacing, 0.2)
        colour = blend(colour, _spots(n, rows, cols, rng.uniform(0.018, 0.03)) * rng.uniform(0.6, 0.9), KERATIN)
    if rng.random() < 0.6:  # surface scale
        scale = w * _patches(rng, n, rng.uniform(0.15, 0.4)) * np.clip(0.7 + 0.5 * smooth_field(rng, 40, n), 0, 1)
        colour = blend(colour, scale * rng.uniform(0.5, 0.9), WHITE)
    if rng.random() < 0.3:  # fine wavy vessels
        colour = blend(
            colour, _vessel_tree(rng, n, shape.rho < 0.9, rng.integers(2, 5), 0.02, 10, 0.5, 0.0) * 0.8, VESSEL
        )
    if rng.random() < 0.3:  # dotted vessels
        colour = _dots(rng, colour, shape.rho < 0.9, rng.integers(5, 20), rng.uniform(0.012, 0.02), 0.8, VESSEL)
    if rng.random() < 0.2:  # pigmented AK
        colour = blend(colour, w * _network(rng, shape, n, rng.uniform(0.1, 0.14), 0.3) * 0.5, LIGHT_BROWN)
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
        colour = blend(colour, w * sigmoid((0.3 - np.abs(wave)) / 0.1) * rng.uniform(0.4, 0.7), DARK_BROWN)
    if rng.random() < 0.2:  # solar lentigo: a fine reticular network (nevus-like)
        colour = blend(colour, w * _network(rng, shape, n, rng.uniform(0.1, 0.15), 0.3) * 0.5, DARK_BROWN)
    if rng.random() < 0.15:  # lichen-planus-like keratosis: grey granular peppering (regression-like)
        colour = _dots(rng, colour, shape.rho < 0.9, rng.integers(15, 50), 0.012, 0.7, BLUE_GREY)
    if rng.random() < 0.2:  # fingerprint-like parallel lines (solar lentigo)
        wave = _stripes(rng, shape, n, rng.uniform(0.06, 0.09), 0.8)
        colour = blend(colour, w * sigmoid((wave - 0.5) / 0.15) * 0.5, DARK_BROWN)
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
        colour = blend(colour, w * ring * net * rng.uniform(0.4, 0.7), _mix(LIGHT_BROWN, DARK_BROWN, 0.5))
    if rng.random() < 0.7:  # central white scar-like patch
        patch = sigmoid((rng.uniform(0.3, 0.6) - shape.rho * (1 + 0.3 * smooth_field(rng, 8, n))) / 0.06)
        colour = blend(colour, patch * rng.uniform(0.3, 0.9), WHITE)
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
    return blend(colour, lacunae * rng.uniform(0.75, 0.95), lacuna), shape.weight


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
        mass = sigmoid((rng.uniform(0.3, 0.7) - shape.rho * (1 + 0.3 * smooth_field(rng, 8, n))) / 0.08)
        rough = np.clip(0.75 + 0.35 * smooth_field(rng, 40, n), 0, 1)
        colour = blend(colour, mass * rough * rng.uniform(0.6, 0.95), KERATIN)
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
        colour = blend(colour, _spots(n, rows, cols, rng.uniform(0.018, 0.03)) * 0.7, KERATIN)
    if rng.random() < 0.3:  # hairpin vessels
        colour = blend(
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
    X, Y = crop_grid(n)
    tone = rng.beta(1.5, 4.0)
    skin = _mix(SKIN_LIGHT, SKIN_DARK, tone) * rng.normal(1, 0.025, 3).astype(np.float32)
    colour = skin * (1 + 0.05 * smooth_field(rng, 5, n) + 0.015 * smooth_field(rng, 40, n))[..., None]
    colour = blend(colour, 0.3 * np.clip(smooth_field(rng, 4, n), 0, None) * rng.uniform(0, 1), ERYTHEMA)
    background = colour
    colour, lesion = SKIN_LESIONS[SKIN_CLASSES[label]](rng, X, Y, n, colour)
    # conspicuity: how clearly the inner structures show (lesion depth, pressure, gel, focus); at low
    # conspicuity a lesion tends towards a plain blotch of its mean colour, keeping its outline
    mean = (colour * lesion[..., None]).sum((0, 1)) / max(float(lesion.sum()), 1.0)
    plain = blend(background, lesion, mean)
    colour = plain + rng.uniform(0.3, 1.0) * (colour - plain)
    # hairs
    if rng.random() < 0.45:
        segments = []
        for _ in range(rng.integers(1, 9)):
            grow_line(
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
        colour = blend(
            colour, line_weights(segments, n) * rng.uniform(0.7, 1.0), _mix(DARK_BROWN, BLACK, rng.uniform())
        )
    # gel bubbles: bright rims
    if rng.random() < 0.15:
        for _ in range(rng.integers(1, 4)):
            bx, by, br = rng.uniform(-0.9, 0.9), rng.uniform(-0.9, 0.9), rng.uniform(0.05, 0.15)
            rim = np.exp(-(((np.hypot(X - bx, Y - by) - br) / 0.012) ** 2))
            colour = blend(colour, rim * 0.8, WHITE)
    # lighting: a gradient and vignetting, then the dermoscope's dark circular field stop in some images
    light = 1 + 0.08 * rng.normal() * X + 0.08 * rng.normal() * Y - rng.uniform(0, 0.15) * (X * X + Y * Y)
    colour = colour * light[..., None] * rng.normal(1, 0.04, 3).astype(np.float32)
    colour = ndimage.gaussian_filter(colour, (*(2 * [rng.uniform(0, 0.8) * SUPERSAMPLE]), 0))  # focus
    if rng.random() < 0.3:
        stop = sigmoid((np.hypot(X - rng.normal(0, 0.05), Y - rng.normal(0, 0.05)) - rng.uniform(0.95, 1.3)) / 0.02)
        colour = blend(colour, stop, (0.05, 0.04, 0.04))
    return colour
