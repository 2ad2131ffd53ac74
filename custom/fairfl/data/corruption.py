"""Image-quality corruptions of the FedISM / FedISM+ setting: Gaussian noise and motion blur.

The papers build their quality shift with two corruptions of Hendrycks and Dietterich's benchmark
(ImageNet-C, ICLR 2019), applied with the same severity to the training images of the corrupted
clients and to a copy of the test set; the reference code (FFL4MIA, `data/*/add_noise.ipynb`) uses
Gaussian noise of severity 3 (sigma 0.18 on the 0-1 scale) on 224 x 224 images.

- Gaussian noise: `clip(x + N(0, sigma^2), 0, 1)` on the 0-1 intensity scale, independently per pixel
  and channel; sigma per severity 1-5 is `NOISE_SIGMA`. Noise is applied at the resolution the model
  sees (the papers' 224 pixels; here usually 64): per-pixel sigma, not rescaled with the image size.
- Motion blur: ImageMagick's `-motion-blur radius x sigma + angle`, which ImageNet-C calls: a one-sided
  line kernel of `2 * ceil(radius) + 1` taps at 0, 1, 2... pixels along the angle, weighted
  `exp(-i^2 / (2 sigma^2))`, angle drawn uniformly in [-45, 45] degrees per image. (radius, sigma) per
  severity is `MOTION_BLUR`, in pixels of a 224-pixel image; both are scaled to the image's size, so a
  64-pixel image is blurred as the 224-pixel one would be before being shrunk.

Every function takes and returns uint8 or uint16 arrays [H, W] or [H, W, C] (other integer or float
inputs are read on a 0-1 scale: integers by their type's maximum, floats as they are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

CORRUPTIONS = ("noise", "blur")
NOISE_SIGMA = (0.08, 0.12, 0.18, 0.26, 0.38)  # severity 1..5, 0-1 intensity scale (ImageNet-C)
MOTION_BLUR = ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15))  # severity 1..5: (radius, sigma), 224-px pixels
REFERENCE_SIZE = 224  # the image size the severities are defined at
BLUR_ANGLES = (-45.0, 45.0)  # degrees; drawn uniformly per image


@dataclass(frozen=True)
class Corruption:
    """One corruption at one severity (1-5), applied image by image with a caller's random generator."""

    kind: str  # "noise" or "blur"
    severity: int = 3

    def __post_init__(self):
        if self.kind not in CORRUPTIONS:
            raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {self.kind!r}")
        if not 1 <= self.severity <= len(NOISE_SIGMA):
            raise ValueError(f"severity must be 1 to {len(NOISE_SIGMA)}, got {self.severity}")

    def parameters(self, image_size: int) -> dict:
        """What is applied to an image of `image_size` pixels, for the dataset description."""
        if self.kind == "noise":
            return {
                "kind": "noise",
                "severity": self.severity,
                "sigma": NOISE_SIGMA[self.severity - 1],
                "scale": "0-1 intensity, per pixel and channel",
            }
        radius, sigma = blur_size(self.severity, image_size)
        return {
            "kind": "blur",
            "severity": self.severity,
            "radius_px": round(radius, 3),
            "sigma_px": round(sigma, 3),
            "angle_deg": list(BLUR_ANGLES),
            "reference": f"ImageMagick motion blur (radius, sigma) {MOTION_BLUR[self.severity - 1]} "
            f"at {REFERENCE_SIZE} px, scaled to {image_size} px",
        }

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "noise":
            return gaussian_noise(image, NOISE_SIGMA[self.severity - 1], rng)
        radius, sigma = blur_size(self.severity, max(image.shape[:2]))
        return motion_blur(image, radius, sigma, float(rng.uniform(*BLUR_ANGLES)))


def blur_size(severity: int, image_size: int) -> tuple[float, float]:
    """(radius, sigma) in pixels of an `image_size` image for a motion-blur severity."""
    radius, sigma = MOTION_BLUR[severity - 1]
    scale = image_size / REFERENCE_SIZE
    return radius * scale, sigma * scale


def gaussian_noise(image: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Additive Gaussian noise of standard deviation `sigma` on the 0-1 scale, clipped to the range."""
    unit, restore = _to_unit(image)
    return restore(unit + rng.normal(0.0, sigma, unit.shape).astype(np.float32))


def motion_blur(image: np.ndarray, radius: float, sigma: float, angle: float) -> np.ndarray:
    """ImageMagick-style motion blur: each pixel averages the pixels 0..2*ceil(radius) steps along `angle`
    (degrees from the +column axis towards +row), Gaussian-weighted by `sigma` (in steps)."""
    kernel = motion_kernel(radius, sigma, angle)
    unit, restore = _to_unit(image)
    if unit.ndim == 2:
        return restore(ndimage.correlate(unit, kernel, mode="nearest"))
    return restore(
        np.stack([ndimage.correlate(unit[..., c], kernel, mode="nearest") for c in range(unit.shape[-1])], axis=-1)
    )


def motion_kernel(radius: float, sigma: float, angle: float) -> np.ndarray:
    """The normalised correlation kernel [2L+1, 2L+1] of `motion_blur`: taps at i = 0..2*ceil(radius)
    pixels from the centre along `angle`, bilinearly splatted, weights exp(-i^2 / (2 sigma^2))."""
    width = 2 * math.ceil(radius) + 1
    size = width  # the kernel reaches width - 1 pixels either way from its centre
    kernel = np.zeros((2 * size - 1, 2 * size - 1), np.float64)
    dx, dy = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    centre = size - 1
    for i in range(width):
        weight = math.exp(-(i * i) / (2.0 * max(sigma, 1e-6) ** 2))
        x, y = centre + i * dx, centre + i * dy
        x0, y0 = math.floor(x), math.floor(y)
        fx, fy = x - x0, y - y0
        for (row, col), share in (
            ((y0, x0), (1 - fx) * (1 - fy)),
            ((y0, x0 + 1), fx * (1 - fy)),
            ((y0 + 1, x0), (1 - fx) * fy),
            ((y0 + 1, x0 + 1), fx * fy),
        ):
            if share > 0:
                kernel[row, col] += weight * share
    return (kernel / kernel.sum()).astype(np.float32)


def _to_unit(image: np.ndarray):
    """(float32 image on the 0-1 scale, function mapping a 0-1 float image back to the input's type)."""
    image = np.asarray(image)
    if np.issubdtype(image.dtype, np.integer):
        top = float(np.iinfo(image.dtype).max)
        dtype = image.dtype
        return image.astype(np.float32) / top, lambda x: np.round(np.clip(x, 0, 1) * top).astype(dtype)
    return image.astype(np.float32), lambda x: np.clip(x, 0, 1).astype(image.dtype)
