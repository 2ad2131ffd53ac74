"""One case of the built-in prostate data (`fairfl.data.synthetic_prostate` describes its anatomy and sites): a
random male pelvis in millimetres, its axial slices drawn on a grid `SUPERSAMPLE` times finer than the output, and each
slice as the site's scanner (a `SiteProfile`) records it."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from fairfl.data.drawing import SUPERSAMPLE, box_mean, standardise

# Nominal T2w signal of each tissue (fast spin echo; fat and fluid bright, muscle and cortical
# bone dark) and how heterogeneous it looks (relative amplitude of the fine texture).
TISSUES = {
    "air": (0.0, 0.0),
    "fat": (0.85, 0.06),
    "muscle": (0.2, 0.14),
    "fascia": (0.45, 0.1),
    "cortex": (0.04, 0.2),
    "marrow": (0.55, 0.18),
    "fibrous": (0.15, 0.1),
    "urine": (1.0, 0.03),
    "wall": (0.22, 0.12),
    "mucus": (0.6, 0.15),
    "gas": (0.02, 0.0),
    "vein": (0.8, 0.1),
    "flow_void": (0.05, 0.1),
    "seminal": (0.9, 0.1),
    "pz": (0.8, 0.14),
    "tz": (0.38, 0.2),
    "stroma": (0.16, 0.12),
    "capsule": (0.2, 0.1),
    "urethra": (0.5, 0.1),
    "lesion": (0.3, 0.1),
}
TISSUE_INDEX = {name: i for i, name in enumerate(TISSUES)}
# Above the base the bladder grows with z up to this (1 at the base: 38 x 23 mm semi-axes; 1.6: 54 x 33 mm, a
# moderately full bladder) and then keeps its size, so a volume's upper slices hold a bladder, not the whole pelvis.
BLADDER_GROWTH = 1.6


# ----------------------------------------------------------------------------------------------
# geometry helpers


def _radius(X, Y, cx, cy, a, b, angle=0.0, power=2.0):
    """Normalised (super)ellipse radius around (cx, cy): < 1 inside, 1 on the boundary."""
    dx, dy = X - cx, Y - cy
    if angle:
        c, s = np.cos(angle), np.sin(angle)
        dx, dy = c * dx + s * dy, c * dy - s * dx
    u, v = np.abs(dx) / a, np.abs(dy) / b
    if power == 2.0:
        return np.sqrt(u * u + v * v)
    return (u**power + v**power) ** (1.0 / power)


def _upsample(coarse: np.ndarray, size: int) -> np.ndarray:
    """Cubic upsampling of a small square grid to size x size: a smooth random field."""
    return ndimage.zoom(coarse, size / coarse.shape[0], order=3, mode="nearest", grid_mode=True).astype(np.float32)


def _gland_extent(z: float) -> float:
    """Gland size at height z relative to mid-gland: ellipsoid-like, wider at the base than the apex."""
    return (1 - min(z * z, 0.96)) ** 0.35 * (1 + 0.12 * z)


# ----------------------------------------------------------------------------------------------
# one case: random anatomy, rendered slice by slice


class ProstateCase:
    """Random anatomy of one patient in millimetres, and its slices on a grid 2x finer than the output.

    x runs to the patient's left (image right), y posterior (image down); the pelvis is roughly
    centred in the field of view, shifted by the patient's position.
    """

    def __init__(self, rng: np.random.Generator, profile, image_size: int):
        self.rng, self.profile, self.image_size = rng, profile, image_size
        fov = profile.fov_mm * rng.uniform(0.95, 1.05)
        self.spacing = fov / image_size
        n = image_size * SUPERSAMPLE
        self.fine_spacing = fov / n
        grid = ((np.arange(n) - (n - 1) / 2) * self.fine_spacing).astype(np.float32)

        erc = profile.endorectal_coil > 0
        scale = max(0.7, rng.normal(profile.organ_scale, profile.organ_scale_sd))
        self.organ_scale = scale  # the gland's length along z follows its width (fairfl.data.synthetic_prostate3d)
        self.gland = dict(
            a=rng.uniform(24, 30) * scale,
            b=rng.uniform(17, 21) * scale * (0.85 if erc else 1.0),  # the balloon flattens the gland
            x=rng.normal(0, 2.5),
            y=rng.normal(-4, 2.5),
            power=rng.uniform(2.0, 2.6),
            harmonics=[(k, rng.normal(0, 0.03), rng.uniform(0, 2 * np.pi)) for k in (2, 3, 4, 5)],
            posterior_flat=rng.uniform(0.15, 0.35) + (0.25 if erc else 0.0),
            tz=rng.uniform(0.55, 0.85),  # transition-zone share: larger with benign hyperplasia
            nodules=[
                (
                    rng.uniform(-0.6, 0.6),
                    rng.uniform(-0.5, 0.5),
                    rng.uniform(0.15, 0.35),
                    rng.uniform(0.15, 0.3),
                    rng.uniform(0, np.pi),
                    rng.uniform(0.6, 1.6),
                )
                for _ in range(rng.integers(4, 9))
            ],
            lesion=(rng.uniform(-0.6, 0.6), rng.uniform(0.12, 0.3)) if rng.random() < 0.3 else None,
        )
        self.body = dict(
            a=rng.uniform(135, 165),
            b=rng.uniform(86, 100),
            y=rng.uniform(14, 24),
            fat=rng.uniform(10, 28),
            power=rng.uniform(2.2, 2.8),
        )
        self.rectum = dict(
            a=rng.uniform(17, 23),
            b=rng.uniform(9, 12),
            lumen=str(rng.choice(["gas", "mucus", "collapsed"])),
            balloon=rng.uniform(17, 21) if erc else 0.0,
        )
        self.pelvis = dict(
            width=rng.uniform(0.92, 1.08),
            femur_x=rng.uniform(88, 96),
            femur_r=rng.uniform(21, 25),
            pubis_y=rng.uniform(-48, -40),
        )
        # Thin fat planes between muscles: arcs of random ellipses.
        self.planes = [
            (
                rng.uniform(-130, 130),
                rng.uniform(-70, 130),
                rng.uniform(30, 80),
                rng.uniform(20, 60),
                rng.uniform(0, np.pi),
            )
            for _ in range(rng.integers(4, 9))
        ]
        self.veins = rng.uniform([-1.4, -1.5], [1.4, -0.6], size=(int(rng.integers(5, 10)), 2))
        self.tissue_gain = rng.normal(1.0, 0.04, size=len(TISSUES)).clip(0.85, 1.15)
        self.scanner_gain = profile.intensity_scale * rng.uniform(0.85, 1.15)  # per-scan scaling
        # Anatomical variability: a smooth displacement field (patient shape) plus a finer, weaker
        # one so that no boundary is a perfect ellipse; the same for every slice of the case.
        self.shift = rng.normal(0, 4, size=2)  # patient position: anatomy coordinate = grid + shift
        warp = [
            rng.uniform(2, 5) * standardise(_upsample(rng.standard_normal((5, 5)), n))
            + 0.8 * standardise(_upsample(rng.standard_normal((16, 16)), n))
            for _ in range(2)
        ]
        self.X = grid[None, :] + np.float32(self.shift[0]) + warp[0]
        self.Y = grid[:, None] + np.float32(self.shift[1]) + warp[1]
        self.margin = float(max(np.abs(warp[0]).max(), np.abs(warp[1]).max())) + 2 * self.fine_spacing
        self.septa = standardise(_upsample(rng.standard_normal((10, 10)), n))  # fibrous septa in pelvic fat
        self.tubules = standardise(_upsample(rng.standard_normal((40, 40)), n))  # seminal vesicle convolutions
        # The receive coil's smooth sensitivity field is a property of the set-up: one per case.
        self.coil_field = np.exp(profile.bias_field * standardise(_upsample(rng.standard_normal((3, 3)), image_size)))

    def window(self, x: float, y: float, reach: float) -> tuple[slice, slice]:
        """Fine-grid index window holding every anatomy point within `reach` mm of (x, y)."""
        n, reach = self.X.shape[0], reach + self.margin

        def span(centre):
            low = int(np.floor((centre - reach) / self.fine_spacing + (n - 1) / 2))
            return slice(max(low, 0), max(min(low + int(np.ceil(2 * reach / self.fine_spacing)) + 2, n), 0))

        return span(y - self.shift[1]), span(x - self.shift[0])

    def radius(self, x, y, a, b, angle=0.0, power=2.0) -> np.ndarray:
        """`_radius` on the fine grid, computed only near the shape (infinite elsewhere): most
        structures are small, and this is where generation spends its time."""
        win = self.window(x, y, 1.5 * max(a, b))
        r = np.full(self.X.shape, np.inf, dtype=np.float32)
        r[win] = _radius(self.X[win], self.Y[win], x, y, a, b, angle, power)
        return r

    def render(self, z: float):
        """The axial slice at height z, in units of the gland's half-length: -1 apex, 1 base.

        The 2-D cases stay inside the gland (|z| < 1); a volume (`fairfl.data.synthetic_prostate3d`) also has slices
        below the apex and above the base, where the gland is absent, the femoral heads keep their size and the
        bladder stops growing. Returns the fine-grid tissue-index map, the gland mask, a per-pixel signal gain for
        hyperplastic nodules, and the endorectal coil's (x, y) in mm from the image centre
        (None without one).
        """
        X, Y, radius = self.X, self.Y, self.radius
        tissue = np.full(X.shape, TISSUE_INDEX["air"], dtype=np.int8)

        def paint(mask, name, where=(slice(None), slice(None))):
            tissue[where][mask] = TISSUE_INDEX[name]

        def ring(r, width_mm, size_mm):
            return np.abs(r - 1) < width_mm / size_mm

        def bone(x, y, a, b, angle=0.0, cortex=2.0):
            r = radius(x, y, a, b, angle)
            paint(r < 1, "cortex")
            paint(r < 1 - cortex / min(a, b), "marrow")

        # Body: subcutaneous fat over a muscle layer (gluteal, thigh and abdominal wall muscles).
        body, pelvis = self.body, self.pelvis
        w = pelvis["width"]
        paint(_radius(X, Y, 0, body["y"], body["a"], body["b"], power=body["power"]) < 1, "fat")
        muscle = (
            _radius(X, Y, 0, body["y"], body["a"] - body["fat"], body["b"] - 0.8 * body["fat"], power=body["power"]) < 1
        )
        paint(muscle, "muscle")
        back = body["y"] + body["b"]
        paint((np.abs(X) < 1.0 + 0.05 * (Y - back + 40).clip(0)) & (back - 40 < Y), "air")  # gluteal cleft

        # Pelvic floor fat (ischioanal fossae, retropubic space): narrow at the pubic arch,
        # widening backwards; fibrous septa run through it.
        widen = 1 + 0.35 * ((Y - 10) / 60).clip(-1, 1)
        cavity = _radius(X / widen, Y, 0, 12, 44 * w, 62, power=2.3) < 1
        paint(cavity, "fat")
        paint(cavity & (np.abs(self.septa) < 0.03), "fibrous")
        for plane in self.planes:
            paint(ring(radius(*plane), 0.6, min(plane[2], plane[3])) & muscle & ~cavity, "fascia")

        # Thigh muscles and femoral vessels in front of the hips; bones (pubic bodies beside the
        # symphysis, ischium, femoral heads largest at the base); obturator internus bulging from
        # the side wall and gluteus maximus closing the ischioanal fossa from behind.
        for side in (-1, 1):
            paint(radius(side * 44 * w, -52, 18, 11, side * 0.5) < 1, "muscle")
            paint(radius(side * 64 * w, -66, 4.5, 4.5) < 1, "flow_void")
            paint(radius(side * 54 * w, -68, 5.5, 4.5) < 1, "vein")
            bone(side * 17, pelvis["pubis_y"], 16, 9, side * 0.5)
            bone(side * 70 * w, 6, 11, 28, side * 0.12)
            femur_r = pelvis["femur_r"] * (0.75 + 0.25 * min(max(z, -1.0), 1.0))
            bone(side * pelvis["femur_x"] * w, -4, femur_r, femur_r, cortex=2.5)
            paint(radius(side * 47 * w, 4, 11, 32, side * 0.12) < 1, "muscle")
            paint(radius(side * 62 * w, 78, 32, 42, -side * 0.5) < 1, "muscle")
        paint(radius(0, pelvis["pubis_y"], 2.0, 9.0) < 1, "fibrous")

        gland, rectum = self.gland, self.rectum
        extent = _gland_extent(z)
        a, b = gland["a"] * extent, gland["b"] * extent
        gx, gy = gland["x"], gland["y"] - 3 * z

        # Periprostatic venous plexus (slow flow: bright) in the retropubic fat.
        for vx, vy in self.veins:
            paint(radius(gx + vx * a, gy + vy * b, 2.0, 1.4, vx) < 1, "vein")

        # Bladder above the base, seminal vesicles behind it: only in the basal slices.
        if z > 0.55:
            grow = min((z - 0.55) / 0.45, BLADDER_GROWTH)
            r = radius(gx, gy - 0.7 * b, 12 + 26 * grow, 7 + 16 * grow)
            paint(r < 1, "wall")
            paint(r < 1 - 2.5 / (7 + 16 * grow), "urine")
        vesicles = min(1.0, (z - 0.35) / 0.4) if z > 0.35 else 0.0
        if vesicles:
            for side in (-1, 1):
                r = radius(gx + side * 18, gy + b + 3 * vesicles, 9 + 9 * vesicles, 3 + 3 * vesicles, side * 0.3)
                paint(r < 1, "wall")
                paint((r < 0.8) & (np.abs(self.tubules) > 0.3), "seminal")

        # Rectum behind the gland (behind the vesicles at the base) inside the levator ani sling.
        # An endorectal coil sits in an air-filled balloon that stretches the rectum, pressed
        # against its anterior wall (towards the gland).
        ra, rb = (rectum["balloon"],) * 2 if rectum["balloon"] else (rectum["a"], rectum["b"])
        ry = gy + b + rb + 1.5 + 8 * vesicles
        sling = radius(gx, (gy + ry) / 2, a + 10, (ry + rb - gy) / 2 + 8)
        paint(ring(sling, 1.2, a + 10) & (gy - 0.2 * b < Y), "muscle")
        r = radius(gx, ry, ra + 2.5, rb + 2.5)
        lumen = r < 1 - 2.4 / (rb + 2.5)
        paint(r < 1, "wall")  # muscularis: dark
        paint(r < 1 - 1.6 / (rb + 2.5), "mucus")  # submucosa and mucosa: brighter
        if rectum["balloon"]:
            paint(lumen, "gas")
            paint(radius(gx, ry - 0.45 * rb, 7, 2.5) < 1, "cortex")  # the coil itself
        elif rectum["lumen"] == "collapsed":
            paint(lumen, "wall")
            paint(radius(gx, ry, 0.7 * ra, 1.2) < 1, "mucus")
        else:
            paint(lumen, rectum["lumen"])
        if z > -0.2:  # coccyx behind the rectum in the upper slices
            bone(gx, ry + rb + 38, 8, 5, cortex=1.5)
        for side in (-1, 1):  # neurovascular bundles at the gland's posterolateral corners
            paint(radius(gx + side * 0.9 * a, gy + 0.7 * b, 2.8, 2.8) < 1, "vein")
            paint(radius(gx + side * 0.9 * a, gy + 0.7 * b, 1.1, 1.1) < 1, "flow_void")

        # The prostate, computed in a window around it: an irregular superellipse, flatter
        # posteriorly, with capsule, peripheral and transition zones, stroma, urethra. Below the apex and above
        # the base (only a volume's slices go there) the slice misses it.
        organ = np.zeros(X.shape, dtype=bool)
        nodule_gain = np.ones(X.shape, dtype=np.float32)
        if abs(z) < 1:
            win = self.window(gx, gy, 1.6 * max(a, b))
            u, v = (X[win] - gx) / a, (Y[win] - gy) / b
            v = np.where(v > 0, v * (1 + gland["posterior_flat"]), v)
            theta = np.arctan2(v, u)
            wobble = 1 + sum(amp * np.cos(k * theta + phase) for k, amp, phase in gland["harmonics"])
            r = (np.abs(u) ** gland["power"] + np.abs(v) ** gland["power"]) ** (1 / gland["power"]) / wobble
            if rectum["balloon"]:  # the balloon indents the gland
                r[_radius(X[win], Y[win], gx, ry, ra + 4, rb + 4) < 1] = 2.0
            organ[win] = r < 1
            paint(r < 1, "capsule", win)
            inside = r < 1 - 1.2 / b
            paint(inside, "pz", win)
            # Transition zone: anterior-central, small at the apex, large at the base (hyperplasia).
            tz_size = gland["tz"] * (0.45 + 0.55 * (z + 1) / 2)
            tu, tv = u / tz_size, (v + 0.3) / (0.95 * tz_size)
            tz_r = np.sqrt(tu * tu + tv * tv)
            tz = (tz_r < 1) & inside
            paint(tz, "capsule", win)  # the surgical pseudo-capsule between the zones
            paint(tz & (tz_r < 1 - 1.0 / (b * tz_size)), "tz", win)
            for nu, nv, na, nb, angle, gain in gland["nodules"]:
                nodule_gain[win][tz & (_radius(tu, tv, nu, nv, na, nb, angle) < 1)] = gain
            paint((r < 1) & (v < -0.75) & (np.abs(u) < 0.55), "stroma", win)  # anterior fibromuscular stroma
            paint(_radius(u, v, 0, -0.2, 0.08, 0.11) < 1, "urethra", win)
            if gland["lesion"] is not None:
                lu, lr = gland["lesion"]
                paint((_radius(u, v, lu, 0.6, lr, 0.7 * lr) < 1) & inside & ~tz, "lesion", win)
        coil = (gx - self.shift[0], ry - 0.45 * rb - self.shift[1]) if rectum["balloon"] else None
        return tissue, organ, nodule_gain, coil

    def acquire(
        self, tissue: np.ndarray, nodule_gain: np.ndarray, coil: tuple[float, float] | None, coil_z: float = 0.0
    ) -> np.ndarray:
        """The slice as this site's scanner records it: float32, image_size squared. `coil_z`: how far (mm) the slice
        lies beyond the endorectal coil's ends along z (a volume's slices below or above it; 0 for the 2-D cases):
        the near-coil gain falls off with the distance in three dimensions."""
        profile, rng, size = self.profile, self.rng, self.image_size
        values = np.array([v for v, _ in TISSUES.values()], dtype=np.float32) * self.tissue_gain
        texture = np.array([t for _, t in TISSUES.values()], dtype=np.float32)
        fine = standardise(ndimage.gaussian_filter(rng.standard_normal(tissue.shape, dtype=np.float32), 1.0))
        coarse = standardise(ndimage.gaussian_filter(rng.standard_normal(tissue.shape, dtype=np.float32), 4.0))
        signal = values[tissue] * nodule_gain * (1 + texture[tissue] * (0.7 * fine + 0.5 * coarse))
        # Box-averaging the fine grid gives partial-volume edges; a small blur stands for the
        # point-spread function every scanner has.
        signal = ndimage.gaussian_filter(box_mean(signal.clip(0), SUPERSAMPLE), 0.5)

        # Protocol contrast: gamma on the tissue signal, then contrast about the body's mean.
        signal = signal**profile.gamma
        body = box_mean((tissue != TISSUE_INDEX["air"]).astype(np.float32), SUPERSAMPLE) > 0.5
        mean = signal[body].mean()
        signal = np.where(body, mean + profile.contrast * (signal - mean), signal).clip(0)

        # Receive-coil field; an endorectal coil adds a steep near-field gain that falls off over
        # a few centimetres from the balloon.
        field = self.coil_field
        if coil is not None:
            axis = (np.arange(size) - (size - 1) / 2) * self.spacing
            distance = np.hypot(axis[None, :] - coil[0], axis[:, None] - coil[1])
            if coil_z:
                distance = np.hypot(distance, coil_z)
            field = field * (1 + profile.endorectal_coil * np.exp(-distance / 22.0))
        signal = signal * field / np.median(field[body])

        # Coarser acquisition matrix, Rician noise at that resolution, interpolated to the output grid.
        acquired = max(8, round(size / profile.resolution))
        if acquired < size:
            blurred = ndimage.gaussian_filter(signal, 0.45 * profile.resolution)
            signal = ndimage.zoom(blurred, acquired / size, order=1, grid_mode=True, mode="nearest")
        sigma = profile.noise * signal[signal > 0.1 * signal.max()].mean()
        signal = np.hypot(signal + rng.normal(0, sigma, signal.shape), rng.normal(0, sigma, signal.shape))
        if acquired < size:
            signal = ndimage.zoom(signal, size / acquired, order=1, grid_mode=True, mode="nearest")
        return (signal * self.scanner_gain).astype(np.float32)
