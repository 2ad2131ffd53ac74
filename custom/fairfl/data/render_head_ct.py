"""Procedural head-CT-like slices of the built-in `ich` setting (`fairfl.data.synthetic_classification`),
imitating the RSNA intracranial hemorrhage data (grey CT slices in a brain window).

The five subtypes epidural, intraparenchymal, intraventricular, subarachnoid, subdural, one per slice, as FedISM+
(following Jiang et al.'s 25,000-slice selection) and FedNPR use them (slices with a single
hemorrhage type; no "none" class). An axial slice at a random level (skull base to vertex) holds
scalp, skull, grey and white matter, sulci, the interhemispheric fissure, lateral and third
ventricles and the basal cisterns, sized by age (atrophy); the hemorrhage is a biconvex lens against
the skull (epidural), a long crescent along it, acute, subacute (isodense) or chronic (dark)
(subdural), a blob with an oedema halo in the parenchyma (intraparenchymal), blood layering in the
ventricles (intraventricular) or blood filling sulci, fissures and cisterns (subarachnoid), with
varying size and conspicuity; window level and width, head position, size and scanner noise vary.
"""

from __future__ import annotations

import math

import numpy as np

from fairfl.data.classification_sites import ICH_CLASSES
from fairfl.data.drawing import blend, crop_grid, grow_line, line_weights, random_shape, sigmoid, smooth_field

# grey values on the display scale 0-1 (brain window)

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
        X, Y = crop_grid(n)
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
        return sigmoid((1 - np.hypot((c * du + s * dv) / a, (c * dv - s * du) / b)) / edge)

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
            grow_line(
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
        image = np.where(outer > 0, SCALP, AIR).astype(np.float32) * sigmoid(outer / 0.004)
        bone = sigmoid((outer - self.scalp) / 0.004) * sigmoid(-self.depth / 0.004)
        diploe = np.exp(-(((outer - self.scalp - self.skull / 2) / (self.skull / 3)) ** 2))  # spongy middle layer
        image = blend(image, bone, BONE - 0.12 * diploe)
        brain = sigmoid(self.depth / 0.003)
        cortex = sigmoid((0.045 + 0.01 * smooth_field(rng, 12, n) - (self.depth - self.csf_gap)) / 0.012)
        tissue = WHITE_MATTER + (GREY_MATTER - WHITE_MATTER) * cortex + 0.012 * smooth_field(rng, 16, n)
        image = blend(image, brain, tissue)
        image = blend(image, brain * sigmoid((self.csf_gap - self.depth) / 0.003), CSF)  # CSF over the convexity
        masks = dict(brain=brain * sigmoid((self.depth - self.csf_gap) / 0.003))
        masks["sulci"] = self.sulci(rng.integers(22, 34))
        # the interhemispheric fissure (front and back), Sylvian fissures at the level of the basal ganglia
        fissure = []
        for end, stop in ((-np.pi / 2, -0.3 + 0.25 * level), (np.pi / 2, 0.35 - 0.25 * level)):
            u, v = self.at(end, 0.0)
            grow_line(
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
                grow_line(
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
            star = sigmoid((0.05 + 0.03 * np.cos(5 * np.arctan2(dv, du)) - np.hypot(du, dv)) / 0.008)
            ring = np.exp(-(((np.hypot(self.u - m, self.v - 0.06) - 0.11) / 0.015) ** 2)) * (self.v > 0.0)
            cisterns = np.maximum(star, ring * (0.7 + 0.5 * age)).clip(0, 1)
            ventricles = np.maximum(ventricles, self.ellipse(m, 0.33, 0.03, 0.02))  # fourth ventricle
        if 0.3 < level < 0.55:  # basal ganglia and thalami, a little brighter
            for side in (-1.0, 1.0):
                image = blend(image, self.ellipse(m + side * 0.16, 0.0, 0.07, 0.12, edge=0.3) * 0.5, GREY_MATTER)
        masks.update(ventricles=ventricles * brain, cisterns=cisterns * brain)
        return image, masks

    def finish(
        self, image: np.ndarray, masks: dict, sulcal_blood: list | None = None, blood_value: float = 0.8
    ) -> np.ndarray:
        """Draw CSF spaces (and blood in some sulci), then return the slice."""
        csf = (
            np.maximum.reduce(
                [
                    line_weights(masks["sulci"], self.n) * 0.7,
                    line_weights(masks["fissures"], self.n) * 0.7,
                    masks["ventricles"],
                    masks["cisterns"],
                ]
            )
            * masks["brain"]
        )
        image = blend(image, csf, CSF)
        if sulcal_blood:
            image = blend(image, line_weights(sulcal_blood, self.n) * masks["brain"], blood_value)
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
    lens = sigmoid((profile - head.depth) / 0.006) * sigmoid(head.depth / 0.003)
    value = rng.uniform(0.7, 0.9)
    if rng.random() < 0.2:  # swirl sign: unclotted blood, darker patches
        value = value * (1 - 0.2 * np.clip(smooth_field(rng, 8, head.n), 0, 1))
    return blend(image, lens, value)


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
        return blend(image, band * masks["brain"], value)
    profile = thickness * np.clip(1 - (_angle_offset(head.theta, theta0) / half) ** 2, 0, 1) ** 0.3
    crescent = sigmoid((profile - head.depth) / 0.005) * sigmoid(head.depth / 0.003)
    return blend(image, crescent, value)


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
    grid = crop_grid(head.n)
    blob = random_shape(rng, *grid, head.n, radius, 0.15, 0.12, 0.08, centre=(X, Y))
    oedema = sigmoid((1 + rng.uniform(0.2, 0.6) - blob.rho) / 0.1) * masks["brain"]
    image = blend(image, oedema * 0.7, WHITE_MATTER - 0.08)
    core = rng.uniform(0.72, 0.92) * (1 - 0.06 * smooth_field(rng, 10, head.n))
    return blend(image, blob.weight * masks["brain"], core)


def _intraventricular(rng, head: _Head):
    image, masks = head.render()
    image = head.finish(image, masks)
    ventricles, value = masks["ventricles"], rng.uniform(0.62, 0.88)
    if rng.random() < 0.3:  # a cast of one lateral ventricle
        side = float(rng.choice((-1, 1)))
        blood = ventricles * sigmoid(side * (head.u - head.shift) / 0.01)
    else:  # layering in the dependent (posterior) horns, one side or both
        sides = rng.choice(3)  # left, right, both
        where = np.where(sides == 2, 1.0, sigmoid((1 if sides else -1) * (head.u - head.shift) / 0.01))
        blood = ventricles * where * sigmoid((head.v - rng.uniform(0.1, 0.25)) / 0.01)
    return blend(image, blood, value)


def _subarachnoid(rng, head: _Head, pattern: int):
    image, masks = head.render()
    value = rng.uniform(0.6, 0.82)
    blood = []
    if pattern == 0:  # focal, over the convexity
        sector = (rng.uniform(-np.pi, np.pi), rng.uniform(0.3, 0.8))
        blood = head.sulci(rng.integers(4, 12), sector)
        gap = sigmoid((head.csf_gap + 0.006 - head.depth) / 0.003) * sigmoid(head.depth / 0.003)
        image = blend(image, gap * (np.abs(_angle_offset(head.theta, sector[0])) < sector[1]) * 0.8, value)
    elif pattern == 1:  # diffuse: many sulci and the fissures
        blood = head.sulci(rng.integers(10, 24)) + masks["fissures"]
        masks["fissures"] = []
    image = head.finish(image, masks, blood, value)
    if pattern == 2:  # basal: blood fills the cisterns (a bright star)
        image = blend(image, masks["cisterns"], value)
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
