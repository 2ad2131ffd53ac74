"""One image of the built-in fundus data (`fairfl.data.synthetic_fundus` describes its anatomy and sites): the optic
nerve head of a random eye drawn as linear radiance on a fine grid (`Eye`), and the crop as the site's camera (a
`SiteProfile`) records it (`photograph`)."""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage

from fairfl.data.drawing import crop_grid, draw_segments, smooth_field

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


# ----------------------------------------------------------------------------------------------
# one eye: random anatomy, then the camera


class Eye:
    """Random optic nerve head of one eye in crop units (x right, y down, crop half-width 1).

    `temporal` is the image direction (+1 or -1 along x) towards the fovea: a right eye's disc is
    nasal, so the fovea lies to its left."""

    def __init__(self, rng: np.random.Generator, profile):
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
        X, Y = crop_grid(n)
        disc_r, cup_r = self.radii(X, Y)
        disc, cup = disc_r < 1, (cup_r < 1) & (disc_r < 1)

        # Background: orange-red fundus, browner with pigment, mottled by choroidal texture.
        base = (1 - self.pigment) * LIGHT_FUNDUS + self.pigment * DARK_FUNDUS
        texture = 0.06 * smooth_field(rng, 10, n) + 0.03 * smooth_field(rng, 32, n)
        colour = base[None, None, :] * (1 + texture[..., None])

        # Peripapillary atrophy: a pale, mottled crescent outside the temporal disc margin.
        if self.atrophy:
            u, v = self.disc_coordinates(X, Y)
            toward = np.clip(np.cos(np.arctan2(v, u * self.temporal)), 0, 1) ** 2  # 1 on the temporal side
            crescent = (disc_r >= 1) & (disc_r < 1 + self.atrophy * toward)
            weight = crescent * (0.6 + 0.4 * np.clip(smooth_field(rng, 16, n), -1, 1))
            colour = colour + weight[..., None] * (ATROPHY - colour)

        # Disc: rim colour with a slightly soft margin, a pale scleral ring, and cup pallor that
        # fades in a little inside the true cup edge (the cup is judged as much by vessels as by colour).
        rim_weight = np.clip((1 - disc_r) / self.margin + 0.5, 0, 1)
        colour = colour + rim_weight[..., None] * (RIM - colour)
        ring = self.scleral_ring * np.exp(-(((disc_r - 1) / 0.05) ** 2))
        colour = colour + ring[..., None] * (1 - colour)
        pallor = np.clip((1.05 - cup_r) / 0.45, 0, 1) * rim_weight
        colour = colour + pallor[..., None] * (CUP - colour)
        colour = colour * (1 + 0.04 * smooth_field(rng, 24, n))[..., None]

        # Vessels: Beer-Lambert attenuation along each segment's Gaussian cross-section.
        density = draw_segments(self.vessels(), n)
        colour = colour * np.exp(-1.4 * density[..., None] * VESSEL_ABSORPTION)

        # Illumination: vignetting towards the field-of-view edge, a smooth uneven field, and the
        # field-of-view stop itself (black outside, a soft edge a few fine pixels wide).
        fx, fy = self.fov_centre
        distance = np.hypot(X - fx, Y - fy) / self.fov_radius
        light = (1 - profile.vignetting * np.clip(distance, 0, 1) ** 2) * np.exp(
            profile.illumination * smooth_field(rng, 3, n)
        )
        fov = np.clip((1 - distance) * self.fov_radius * n / 3, 0, 1)
        radiance = colour * (light * fov)[..., None]
        return radiance.astype(np.float32), disc, cup, fov.astype(np.float32)


def photograph(radiance: np.ndarray, fov: np.ndarray, profile, rng: np.random.Generator) -> np.ndarray:
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
