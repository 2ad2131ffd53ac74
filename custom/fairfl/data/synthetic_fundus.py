"""Built-in synthetic multi-site retinal fundus: optic-disc-centred RGB crops with disc and cup masks.

Each image is a region of interest around the optic disc, as in the public multi-site fundus data
(Drishti-GS, RIM-ONE r3, REFUGE train and validation, and similar sources; FedCE uses six): an
orange-red fundus with choroidal texture, a bright yellowish, slightly irregular optic disc holding
a paler cup, a branching vessel tree that emerges from the cup, kinks over the cup rim and thins
towards the periphery, sometimes a pale peripapillary atrophy crescent, and, where the crop reaches
it, the dark edge of the camera's circular field of view. Cup-to-disc ratios follow a healthy or a
glaucomatous distribution, and the share of glaucomatous eyes is a property of each site.

Sites imitate how the real sources differ: camera colour balance and channel cross-talk, tone curve,
exposure, veiling glare (contrast), vignetting and uneven illumination, optical blur, sensor noise,
JPEG-like loss of chroma and fine detail, field angle and crop scale (disc size in pixels), native
image size, population (pigmentation, cup-to-disc ratio) and number of images. `site-5` is the
minority site, imitating a source unlike the others (FedCE's client 5, on which FedAvg loses about
40 Dice points): a wide-field, low-cost camera with a dark, greenish cast, haze, strong blur and
compression, and a much smaller disc in the crop.

Anatomy is drawn on a 2x finer grid and box-averaged to the native size, which gives partial-area
edges; a mask pixel is disc (or cup) where that structure covers at least half of it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy import ndimage

from fairfl.data.builtin import (
    cache_name,
    check_test_scale,
    ensure_cached,
    extra_test_count,
    extra_test_rng,
    recorded_test_scale,
)
from fairfl.data.datalist import SPLITS, split_cases, write_datalist
from fairfl.data.synthetic_prostate import _box_mean, _unit

GENERATOR_VERSION = 1
SUPERSAMPLE = 2
SPLIT_FRACTIONS = (0.5, 0.25, 0.25)  # by image, as in the FedCE paper
LABELS = {"0": "background", "1": "optic disc rim", "2": "optic cup"}
REGIONS = {"disc": [1, 2], "cup": [2]}  # Dice per region is over the union of its classes


@dataclass(frozen=True)
class SiteProfile:
    """How one source's camera, protocol and population look. Lengths are in crop units (the crop's
    half-width is 1), so a profile gives the same picture at every `image_size`."""

    imitates: str  # the public source this profile is modelled on
    camera: str
    images: int  # at size_scale 1
    size_factor: float  # native crop size / image_size (the loader resizes back to image_size)
    field_of_view_deg: float  # camera field angle: with the disc size, places the field-of-view edge
    disc_eccentricity_deg: float  # distance of the disc from the centre of the field (image centring)
    disc_radius: float  # mean disc radius in crop units (crop scale: ROI size relative to the disc)
    disc_radius_sd: float  # sd of the log disc radius (eye size, myopia, crop jitter)
    glaucoma_fraction: float  # share of glaucomatous eyes, whose cups are larger and taller
    pigment: float  # mean fundus pigmentation, 0 light (orange) to 1 dark (brown)
    exposure: float  # flash energy / sensor gain: overall brightness
    colour_gain: tuple[float, float, float]  # RGB white balance of the sensor
    colour_mix: float  # cross-talk between colour channels (0 none, 1 grey): desaturates
    gamma: float  # tone curve: encoded = linear ** gamma (sRGB-like ~0.45; larger is darker, harsher)
    contrast: float  # 1 nominal; < 1 adds veiling glare (media opacity, stray light)
    vignetting: float  # relative brightness lost at the field-of-view edge
    illumination: float  # sd of the log of a smooth uneven-illumination field
    blur: float  # optical / defocus blur, Gaussian sigma in crop units
    noise: float  # sensor noise sd on the 0-1 linear scale
    compression: float  # 0 lossless; > 0 JPEG-like: chroma smoothed and fine luma detail cored


# Modelled on the public sources (Drishti-GS: Aravind Eye Hospital, 30-degree disc-centred photos,
# mostly glaucomatous; RIM-ONE r3: stereo Nidek camera, tight crops, JPEG, darker red; REFUGE:
# Zeiss Visucam 500 (training) and Canon CR-2 (validation), 45-degree macula-centred screening
# photos, 10% glaucoma) plus a MESSIDOR-like Topcon source and the shifted minority. Counts keep
# roughly the real ordering (101, 159, 400, 400 images) at a size CPU training can afford. The
# values are plausible, not measured: they imitate the kind and size of differences between
# sources, and none was tuned to favour a method.
PROFILES = (
    SiteProfile(
        imitates="Drishti-GS",
        camera="30-degree mydriatic camera, disc-centred, PNG",
        images=40,
        size_factor=1.5,
        field_of_view_deg=30.0,
        disc_eccentricity_deg=3.0,
        disc_radius=0.42,
        disc_radius_sd=0.08,
        glaucoma_fraction=0.7,
        pigment=0.55,
        exposure=1.05,
        colour_gain=(1.0, 1.0, 0.85),
        colour_mix=0.05,
        gamma=0.5,
        contrast=1.0,
        vignetting=0.25,
        illumination=0.08,
        blur=0.006,
        noise=0.01,
        compression=0.0,
    ),
    SiteProfile(
        imitates="RIM-ONE r3",
        camera="Nidek AFC-210 stereo, Canon EOS 5D back, JPEG",
        images=50,
        size_factor=1.25,
        field_of_view_deg=30.0,
        disc_eccentricity_deg=1.0,
        disc_radius=0.52,
        disc_radius_sd=0.08,
        glaucoma_fraction=0.45,
        pigment=0.3,
        exposure=0.8,
        colour_gain=(1.05, 0.8, 0.7),
        colour_mix=0.0,
        gamma=0.6,
        contrast=0.95,
        vignetting=0.3,
        illumination=0.15,
        blur=0.012,
        noise=0.015,
        compression=0.35,
    ),
    SiteProfile(
        imitates="REFUGE training (Zeiss)",
        camera="Zeiss Visucam 500, 45 degrees, JPEG",
        images=80,
        size_factor=2.0,
        field_of_view_deg=45.0,
        disc_eccentricity_deg=8.0,
        disc_radius=0.3,
        disc_radius_sd=0.1,
        glaucoma_fraction=0.1,
        pigment=0.45,
        exposure=0.8,
        colour_gain=(0.95, 0.9, 0.75),
        colour_mix=0.05,
        gamma=0.55,
        contrast=0.95,
        vignetting=0.35,
        illumination=0.2,
        blur=0.008,
        noise=0.012,
        compression=0.2,
    ),
    SiteProfile(
        imitates="REFUGE validation (Canon)",
        camera="Canon CR-2, 45 degrees, JPEG",
        images=80,
        size_factor=1.75,
        field_of_view_deg=45.0,
        disc_eccentricity_deg=8.0,
        disc_radius=0.26,
        disc_radius_sd=0.1,
        glaucoma_fraction=0.1,
        pigment=0.45,
        exposure=1.1,
        colour_gain=(1.1, 0.95, 0.8),
        colour_mix=0.0,
        gamma=0.45,
        contrast=1.0,
        vignetting=0.2,
        illumination=0.1,
        blur=0.005,
        noise=0.008,
        compression=0.15,
    ),
    SiteProfile(
        imitates="shifted minority source (FedCE client 5)",
        camera="low-cost wide-field non-mydriatic camera, strong JPEG",
        images=30,
        size_factor=1.0,
        field_of_view_deg=50.0,
        disc_eccentricity_deg=12.0,
        disc_radius=0.16,
        disc_radius_sd=0.12,
        glaucoma_fraction=0.3,
        pigment=0.6,
        exposure=0.7,
        colour_gain=(0.55, 1.0, 0.6),
        colour_mix=0.3,
        gamma=0.7,
        contrast=0.7,
        vignetting=0.55,
        illumination=0.3,
        blur=0.025,
        noise=0.03,
        compression=0.6,
    ),
    SiteProfile(
        imitates="MESSIDOR (RIGA)",
        camera="Topcon TRC NW6 non-mydriatic, 45 degrees",
        images=60,
        size_factor=1.5,
        field_of_view_deg=45.0,
        disc_eccentricity_deg=8.0,
        disc_radius=0.32,
        disc_radius_sd=0.1,
        glaucoma_fraction=0.15,
        pigment=0.4,
        exposure=0.95,
        colour_gain=(1.0, 0.92, 0.8),
        colour_mix=0.1,
        gamma=0.5,
        contrast=0.9,
        vignetting=0.3,
        illumination=0.15,
        blur=0.008,
        noise=0.01,
        compression=0.1,
    ),
)

# Vertical cup-to-disc ratio (mean, sd, clip range): normal discs mostly 0.2-0.6, glaucomatous
# ones 0.6-0.9 (the cup widens mostly vertically, thinning the superior and inferior rim).
HEALTHY_VCDR = (0.4, 0.09, (0.15, 0.62))
GLAUCOMA_VCDR = (0.7, 0.08, (0.5, 0.88))

# Linear reflectance of the structures (RGB, before exposure and camera).
LIGHT_FUNDUS = np.array([0.8, 0.34, 0.12], np.float32)  # choroid seen through a thin RPE: orange-red
DARK_FUNDUS = np.array([0.48, 0.2, 0.08], np.float32)  # heavily pigmented: darker, browner
RIM = np.array([0.92, 0.52, 0.3], np.float32)  # neuroretinal rim: pink-orange
CUP = np.array([1.0, 0.9, 0.7], np.float32)  # pale, nearly white cup
ATROPHY = np.array([0.9, 0.68, 0.48], np.float32)  # peripapillary atrophy: sclera showing through
VESSEL_ABSORPTION = np.array([0.3, 1.2, 1.0], np.float32)  # blood absorbs green and blue, not red
DISC_DEGREES = 3.1  # disc radius in degrees of visual angle (diameter about 1.8 mm)


def site_profile(site_index: int) -> SiteProfile:
    """Profile of the site at 0-based `site_index`; beyond six, the profiles repeat (new seeds)."""
    return PROFILES[site_index % len(PROFILES)]


# ----------------------------------------------------------------------------------------------
# one eye: random anatomy, then the camera


class _Eye:
    """Random optic nerve head of one eye in crop units (x right, y down, crop half-width 1).

    `temporal` is the image direction (+1 or -1 along x) towards the fovea: a right eye's disc is
    nasal, so the fovea lies to its left."""

    def __init__(self, rng: np.random.Generator, profile: SiteProfile):
        self.rng, self.profile = rng, profile

        # Python floats, not numpy scalars: a float64 scalar would turn every float32 grid into float64.
        def uniform(low, high):
            return float(rng.uniform(low, high))

        def normal(mean, sd):
            return float(rng.normal(mean, sd))

        self.temporal = float(rng.choice([-1.0, 1.0]))
        radius = profile.disc_radius * math.exp(normal(0, profile.disc_radius_sd))
        self.disc = dict(
            x=normal(0, 0.05),
            y=normal(0, 0.05),  # ROI crops are centred by a detector, not exactly
            a=radius * uniform(0.88, 0.98),
            b=radius * uniform(1.0, 1.1),  # discs are vertically oval
            angle=normal(0, 0.12),
            harmonics=[(k, normal(0, 0.025), uniform(0, 2 * np.pi)) for k in (2, 3, 4, 5)],
        )
        self.glaucoma = bool(rng.random() < profile.glaucoma_fraction)
        mean, sd, (low, high) = GLAUCOMA_VCDR if self.glaucoma else HEALTHY_VCDR
        vcdr = min(max(normal(mean, sd), low), high)
        # glaucomatous cups grow mostly vertically
        hcdr = min(max(vcdr * (uniform(0.75, 0.95) if self.glaucoma else uniform(0.88, 1.08)), 0.12), 0.85)
        # Cups sit slightly temporal in the disc; the offset keeps the cup inside the rim.
        shift = self.temporal * uniform(0.0, 0.6) * max(0.0, 0.9 - max(hcdr, vcdr))
        self.cup = dict(
            u=shift,
            v=normal(0, 0.03),
            a=hcdr,
            b=vcdr,
            harmonics=[(k, normal(0, 0.04), uniform(0, 2 * np.pi)) for k in (2, 3)],
        )
        self.vcdr, self.hcdr = vcdr, hcdr
        self.pigment = min(max(normal(profile.pigment, 0.12), 0.0), 1.0)
        self.atrophy = uniform(0.1, 0.35) if rng.random() < (0.6 if self.glaucoma else 0.25) else 0.0
        self.scleral_ring = uniform(0.0, 0.12)
        self.margin = uniform(0.04, 0.14)  # disc margin blur (sharp temporally in some eyes, blurred in others)
        # The field of view: its radius and centre follow from the disc's angular size.
        per_degree = self.disc["a"] / DISC_DEGREES
        self.fov_radius = 0.5 * profile.field_of_view_deg * per_degree
        eccentricity = profile.disc_eccentricity_deg * per_degree * uniform(0.8, 1.2)
        self.fov_centre = (
            self.disc["x"] + self.temporal * eccentricity,
            self.disc["y"] + normal(0, 0.3) * eccentricity,
        )

    def disc_coordinates(self, X, Y):
        """(u, v): coordinates in which the disc ellipse is the unit circle."""
        d = self.disc
        dx, dy = X - d["x"], Y - d["y"]
        c, s = math.cos(d["angle"]), math.sin(d["angle"])
        return (c * dx + s * dy) / d["a"], (c * dy - s * dx) / d["b"]

    def radii(self, X, Y):
        """Normalised radii of the (irregular) disc and cup at (X, Y): < 1 inside."""
        u, v = self.disc_coordinates(X, Y)
        theta = np.arctan2(v, u)
        disc = np.hypot(u, v) / (1 + sum(amp * np.cos(k * theta + ph) for k, amp, ph in self.disc["harmonics"]))
        cu, cv = (u - self.cup["u"]) / self.cup["a"], (v - self.cup["v"]) / self.cup["b"]
        phi = np.arctan2(cv, cu)
        cup = np.hypot(cu, cv) / (1 + sum(amp * np.cos(k * phi + ph) for k, amp, ph in self.cup["harmonics"]))
        return disc, cup

    # -- vessels --------------------------------------------------------------------------------

    def vessels(self) -> list[tuple]:
        """Vessel segments (x0, y0, x1, y1, width, darkness) in crop units.

        Four arcades of an artery and a vein each leave the cup vertically, kink where they cross the
        cup rim (the sign of cup depth clinicians read), then the temporal ones arch round the macula
        and the nasal ones fan out; branches split off with thinner children; a few small vessels
        start at the disc edge."""
        rng, d, segments = self.rng, self.disc, []
        nasal = -self.temporal
        start = (d["x"] + (self.cup["u"] + 0.3 * self.cup["a"] * nasal) * d["a"], d["y"])
        vein_width = 0.15 * d["a"] * rng.uniform(0.85, 1.15)  # major vein ~1/7 of the disc diameter
        for vertical in (-1.0, 1.0):  # superior, inferior
            for side, spread in ((self.temporal, 0.15), (nasal, 0.4)):
                for width, darkness in ((vein_width, 1.0), (0.75 * vein_width, 0.6)):  # vein, artery
                    heading = np.arctan2(vertical, side * (spread + rng.normal(0, 0.1)))
                    # arcades end up running horizontally temporal (round the macula) or fanning nasally
                    target = np.arctan2(vertical * (0.35 if side == self.temporal else 1.0), side)
                    self._walk(
                        segments, start, heading, target, width, darkness * rng.uniform(0.85, 1.1), depth=0, in_cup=True
                    )
        for _ in range(rng.integers(3, 7)):
            angle = rng.uniform(0, 2 * np.pi)
            edge = (d["x"] + 0.95 * d["a"] * np.cos(angle), d["y"] + 0.95 * d["b"] * np.sin(angle))
            self._walk(segments, edge, angle + rng.normal(0, 0.3), angle, 0.4 * vein_width, 0.6, depth=2)
        return segments

    def _walk(self, segments, point, heading, target, width, darkness, depth, in_cup=False, step=0.03, max_steps=160):
        """Trace one vessel from `point`, appending its segments (and its branches') to `segments`."""
        rng = self.rng
        x, y = point
        wander, branch = rng.normal(0, 0.07, max_steps), rng.random(max_steps)  # drawn at once: fast
        for k in range(max_steps):
            if width < 0.006 or abs(x) > 1.25 or abs(y) > 1.25:
                return
            nx, ny = x + step * math.cos(heading), y + step * math.sin(heading)
            contrast = 1.0
            if in_cup:
                if self.radii(np.array(nx), np.array(ny))[1] >= 1:  # over the cup rim: dips out of sight, turns
                    in_cup, contrast = False, 0.4
                    heading += math.copysign(rng.uniform(0.3, 0.8), math.sin(target - heading))
                    nx, ny = x + step * math.cos(heading), y + step * math.sin(heading)
                else:
                    contrast = 0.7  # deep in the pale cup
            segments.append((x, y, nx, ny, width, darkness * contrast))
            x, y = nx, ny
            heading += 0.06 * math.sin(target - heading) + wander[k]  # curve towards the target, wander a little
            width *= 0.995
            if not in_cup and depth < 2 and branch[k] < 0.05:
                child = heading + rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.2)
                self._walk(segments, (x, y), child, child, width * rng.uniform(0.45, 0.7), darkness, depth + 1)
                width *= 0.9

    # -- rendering ------------------------------------------------------------------------------

    def render(self, n: int):
        """Linear RGB radiance [n, n, 3], disc and cup masks [n, n] and field-of-view weight [n, n]
        on the fine grid (n pixels across the crop)."""
        rng, profile = self.rng, self.profile
        axis = ((np.arange(n) - (n - 1) / 2) / (n / 2)).astype(np.float32)
        X, Y = axis[None, :], axis[:, None]
        disc_r, cup_r = self.radii(X, Y)
        disc, cup = disc_r < 1, (cup_r < 1) & (disc_r < 1)

        # Background: orange-red fundus, browner with pigment, mottled by choroidal texture.
        base = (1 - self.pigment) * LIGHT_FUNDUS + self.pigment * DARK_FUNDUS
        texture = 0.06 * _smooth_field(rng, 10, n) + 0.03 * _smooth_field(rng, 32, n)
        colour = base[None, None, :] * (1 + texture[..., None])

        # Peripapillary atrophy: a pale, mottled crescent outside the temporal disc margin.
        if self.atrophy:
            u, v = self.disc_coordinates(X, Y)
            toward = np.clip(np.cos(np.arctan2(v, u * self.temporal)), 0, 1) ** 2  # 1 on the temporal side
            crescent = (disc_r >= 1) & (disc_r < 1 + self.atrophy * toward)
            weight = crescent * (0.6 + 0.4 * np.clip(_smooth_field(rng, 16, n), -1, 1))
            colour = colour + weight[..., None] * (ATROPHY - colour)

        # Disc: rim colour with a slightly soft margin, a pale scleral ring, and cup pallor that
        # fades in a little inside the true cup edge (the cup is judged as much by vessels as by colour).
        rim_weight = np.clip((1 - disc_r) / self.margin + 0.5, 0, 1)
        colour = colour + rim_weight[..., None] * (RIM - colour)
        ring = self.scleral_ring * np.exp(-(((disc_r - 1) / 0.05) ** 2))
        colour = colour + ring[..., None] * (1 - colour)
        pallor = np.clip((1.05 - cup_r) / 0.45, 0, 1) * rim_weight
        colour = colour + pallor[..., None] * (CUP - colour)
        colour = colour * (1 + 0.04 * _smooth_field(rng, 24, n))[..., None]

        # Vessels: Beer-Lambert attenuation along each segment's Gaussian cross-section.
        density = _draw_segments(self.vessels(), n)
        colour = colour * np.exp(-1.4 * density[..., None] * VESSEL_ABSORPTION)

        # Illumination: vignetting towards the field-of-view edge, a smooth uneven field, and the
        # field-of-view stop itself (black outside, a soft edge a few fine pixels wide).
        fx, fy = self.fov_centre
        distance = np.hypot(X - fx, Y - fy) / self.fov_radius
        light = (1 - profile.vignetting * np.clip(distance, 0, 1) ** 2) * np.exp(
            profile.illumination * _smooth_field(rng, 3, n)
        )
        fov = np.clip((1 - distance) * self.fov_radius * n / 3, 0, 1)
        radiance = colour * (light * fov)[..., None]
        return radiance.astype(np.float32), disc, cup, fov.astype(np.float32)


def _smooth_field(rng: np.random.Generator, cells: int, n: int) -> np.ndarray:
    """Zero-mean, unit-sd random field [n, n] smooth on the scale of n / cells pixels: a cells x cells
    grid of white noise, cubic-interpolated (one matrix product per axis, much faster than zoom)."""
    interpolate, transposed = _cubic_upsampling(cells, n)
    return _unit(interpolate @ rng.standard_normal((cells, cells)).astype(np.float32) @ transposed)


@lru_cache(maxsize=64)
def _cubic_upsampling(cells: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """[n, cells] matrix of cubic-spline upsampling weights (zoom is linear and separable), and its
    transpose stored contiguously (a strided operand makes the product several times slower)."""
    matrix = ndimage.zoom(np.eye(cells, dtype=np.float32), (n / cells, 1), order=3, mode="nearest", grid_mode=True)
    return matrix, np.ascontiguousarray(matrix.T)


def _draw_segments(segments: list[tuple], n: int) -> np.ndarray:
    """Vessel density [n, n]: darkness * exp(-4 ln2 (distance / width)^2) around the nearest point of
    the nearest centreline (width is the full width at half maximum).

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


def _camera(radiance: np.ndarray, fov: np.ndarray, profile: SiteProfile, rng: np.random.Generator) -> np.ndarray:
    """The crop as this site's camera records it: uint8 RGB at the native size."""
    size = radiance.shape[0]
    # Optics: veiling glare inside the field of view (low contrast), then blur.
    mean = (radiance * fov[..., None]).sum((0, 1)) / max(fov.sum(), 1.0)
    radiance = radiance + (1 - profile.contrast) * fov[..., None] * (mean - radiance)
    sigma = profile.blur * size / 2 * rng.uniform(0.8, 1.25)
    radiance = ndimage.gaussian_filter(radiance, (sigma, sigma, 0))
    # Sensor: exposure and white balance (with per-photo jitter), cross-talk, noise, saturation.
    gain = profile.exposure * rng.uniform(0.85, 1.15) * np.asarray(profile.colour_gain) * rng.normal(1, 0.03, 3)
    signal = radiance * gain.astype(np.float32)
    mix = profile.colour_mix
    signal = (1 - mix) * signal + mix * signal.mean(-1, keepdims=True)
    signal = signal + rng.normal(0, profile.noise, signal.shape).astype(np.float32)
    encoded = np.clip(signal, 0, 1) ** profile.gamma
    if profile.compression:
        encoded = _lossy(encoded, profile.compression, size)
    return np.round(np.clip(encoded, 0, 1) * 255).astype(np.uint8)


def _lossy(rgb: np.ndarray, strength: float, size: int) -> np.ndarray:
    """JPEG-like loss without 8x8 blocks (they would be far too coarse at these sizes): chroma is
    smoothed (subsampling) and small fine luma detail is cored away (small AC coefficients quantised
    to zero), which removes texture and noise but keeps edges."""
    matrix = np.array([[0.299, 0.587, 0.114], [-0.1687, -0.3313, 0.5], [0.5, -0.4187, -0.0813]], np.float32)
    ycc = rgb @ matrix.T
    sigma = strength * size / 64
    ycc[..., 1:] = ndimage.gaussian_filter(ycc[..., 1:], (sigma, sigma, 0))
    low = ndimage.gaussian_filter(ycc[..., 0], 0.7)
    detail = ycc[..., 0] - low
    ycc[..., 0] = low + np.sign(detail) * np.maximum(np.abs(detail) - 0.02 * strength, 0)
    return ycc @ np.linalg.inv(matrix).T


def generate_site_images(profile: SiteProfile, native_size: int, rng: np.random.Generator, num_images: int):
    """Yield (image_id, RGB uint8 [S, S, 3], mask uint8 [S, S] 0/1/2, eye) per image, S = native_size."""
    from threadpoolctl import threadpool_limits

    for index in range(num_images):
        # One BLAS thread: the products here are tiny, and threads spinning on cores that other
        # FLARE clients are using made generation several times slower.
        with threadpool_limits(limits=1, user_api="blas"):
            eye = _Eye(rng, profile)
            radiance, disc, cup, fov = eye.render(native_size * SUPERSAMPLE)
            image = _camera(_box_mean_rgb(radiance), _box_mean(fov, SUPERSAMPLE), profile, rng)
        mask = (_box_mean(disc.astype(np.float32), SUPERSAMPLE) >= 0.5).astype(np.uint8) + (
            _box_mean(cup.astype(np.float32), SUPERSAMPLE) >= 0.5
        ).astype(np.uint8)
        yield f"img{index:03d}", image, mask, eye


def _box_mean_rgb(array: np.ndarray) -> np.ndarray:
    return np.stack([_box_mean(array[..., c], SUPERSAMPLE) for c in range(array.shape[-1])], axis=-1)


# ----------------------------------------------------------------------------------------------
# writing a dataset, and the cache the jobs use


def generate_fundus_sites(
    root: str | Path,
    num_sites: int = 6,
    image_size: int = 64,
    seed: int = 0,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Write `num_sites` synthetic fundus sites as PNG plus one datalist per site; return `root`.

    Layout: `<root>/site-K/images/<id>.png` (RGB, native size round(image_size * size_factor)),
    `.../labels/<id>.png` (uint8: 0 background, 1 disc rim, 2 cup), `<root>/site-K.json`
    (training/validation/testing 0.5/0.25/0.25 by image, paths relative to `root`) and
    `<root>/dataset.json` (labels, regions, generator version, parameters, profiles, counts).
    Deterministic: site K draws from `numpy.random.default_rng([seed, K - 1])`. With `test_scale` s > 1 each
    site's testing split also holds round(n_test * (s - 1)) more images `extra-img<k>` of its profile, drawn from
    `fairfl.data.builtin.extra_test_rng(seed, K - 1)`: everything else is as at s = 1.
    """
    if image_size < 32:
        raise ValueError(f"image_size must be at least 32 (the cup needs the pixels), got {image_size}")
    test_scale = check_test_scale(test_scale)
    from PIL import Image

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    sites = {}
    for index in range(num_sites):
        site, profile = f"site-{index + 1}", site_profile(index)
        rng = np.random.default_rng([seed, index])
        native = round(image_size * profile.size_factor)
        num_images = max(len(SPLITS), round(profile.images * size_scale))
        entries, disc_fraction, vcdr, glaucoma = {}, [], [], 0

        def write(image_id, image, mask):
            paths = {"image": f"{site}/images/{image_id}.png", "label": f"{site}/labels/{image_id}.png"}
            for key, array in (("image", image), ("label", mask)):
                (root / paths[key]).parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(array).save(root / paths[key])
            entries[image_id] = paths

        for image_id, image, mask, eye in generate_site_images(profile, native, rng, num_images):
            write(image_id, image, mask)
            disc_fraction.append(float((mask >= 1).mean()))
            vcdr.append(eye.vcdr)
            glaucoma += eye.glaucoma
        split = split_cases(list(entries), SPLIT_FRACTIONS, seed=[seed, index])
        extra = extra_test_count(len(split["testing"]), test_scale)
        for image_id, image, mask, _ in generate_site_images(profile, native, extra_test_rng(seed, index), extra):
            write(f"extra-{image_id}", image, mask)
            split["testing"].append(f"extra-{image_id}")
        write_datalist(root / f"{site}.json", {s: [entries[i] for i in split[s]] for s in SPLITS})
        sites[site] = dict(
            profile=asdict(profile),
            family_seed=[seed, index],
            native_size=native,
            images={s: len(split[s]) for s in SPLITS},
            glaucomatous=glaucoma,
            mean_disc_fraction=round(float(np.mean(disc_fraction)), 4),
            mean_vertical_cdr=round(float(np.mean(vcdr)), 3),
        )
    description = dict(
        name="fairfl synthetic multi-site retinal fundus (optic disc and cup)",
        generator=f"fairfl.data.synthetic_fundus v{GENERATOR_VERSION}",
        parameters=dict(
            num_sites=num_sites,
            image_size=image_size,
            seed=seed,
            size_scale=size_scale,
            **recorded_test_scale(test_scale),
        ),
        labels=LABELS,
        regions=REGIONS,
        note=(
            "Synthetic optic-disc-centred RGB crops, sites modelled on the sources of the multi-site fundus "
            "data (Drishti-GS, RIM-ONE r3, REFUGE Zeiss and Canon, MESSIDOR) plus a strongly shifted minority "
            "(site-5). Lengths in profiles are in crop units (half-width 1); see SiteProfile in "
            "fairfl/data/synthetic_fundus.py for every field. Images are stored at each site's native size "
            "(round(image_size * size_factor)); loaders resize them. Splits are by image."
        ),
        sites=sites,
    )
    (root / "dataset.json").write_text(json.dumps(description, indent=1) + "\n")
    return root


def builtin_fundus_name(
    image_size: int = 64, seed: int = 0, num_sites: int = 6, size_scale: float = 1.0, test_scale: float = 1.0
) -> str:
    """Cache folder name: changes whenever the generator or its parameters do."""
    return cache_name("fundus", GENERATOR_VERSION, image_size, seed, num_sites, size_scale, test_scale)


def ensure_builtin_fundus(
    image_size: int = 64,
    seed: int = 0,
    num_sites: int = 6,
    cache_dir: str | Path | None = None,
    size_scale: float = 1.0,
    test_scale: float = 1.0,
) -> Path:
    """Path of the cached built-in fundus dataset (`generate_fundus_sites` output), generating it on
    first use (`fairfl.data.builtin.ensure_cached`: one generator at a time, never half-written)."""
    name = builtin_fundus_name(image_size, seed, num_sites, size_scale, test_scale)
    return ensure_cached(
        name,
        lambda folder: generate_fundus_sites(
            folder, num_sites=num_sites, image_size=image_size, seed=seed, size_scale=size_scale, test_scale=test_scale
        ),
        cache_dir,
    )
