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

Anatomy (`fairfl.data.render_fundus`) is drawn on a 2x finer grid and box-averaged to the native size, which gives
partial-area edges; a mask pixel is disc (or cup) where that structure covers at least half of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fairfl.data.builtin import (
    cache_name,
    check_test_scale,
    ensure_cached,
    extra_test_count,
    extra_test_rng,
    recorded_test_scale,
    site_progress,
)
from fairfl.data.datalist import SPLITS, split_cases, write_datalist
from fairfl.data.drawing import SUPERSAMPLE, box_mean
from fairfl.data.render_fundus import Eye, photograph

GENERATOR_VERSION = 1
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


def site_profile(site_index: int) -> SiteProfile:
    """Profile of the site at 0-based `site_index`; beyond six, the profiles repeat (new seeds)."""
    return PROFILES[site_index % len(PROFILES)]


def generate_site_images(profile: SiteProfile, native_size: int, rng: np.random.Generator, num_images: int):
    """Yield (image_id, RGB uint8 [S, S, 3], mask uint8 [S, S] 0/1/2, eye) per image, S = native_size."""
    from threadpoolctl import threadpool_limits

    for index in range(num_images):
        # One BLAS thread: the products here are tiny, and threads spinning on cores that other
        # FLARE clients are using made generation several times slower.
        with threadpool_limits(limits=1, user_api="blas"):
            eye = Eye(rng, profile)
            radiance, disc, cup, fov = eye.render(native_size * SUPERSAMPLE)
            image = photograph(_box_mean_rgb(radiance), box_mean(fov, SUPERSAMPLE), profile, rng)
        mask = (box_mean(disc.astype(np.float32), SUPERSAMPLE) >= 0.5).astype(np.uint8) + (
            box_mean(cup.astype(np.float32), SUPERSAMPLE) >= 0.5
        ).astype(np.uint8)
        yield f"img{index:03d}", image, mask, eye


def _box_mean_rgb(array: np.ndarray) -> np.ndarray:
    # channel by channel: box_mean over the channel axis adds in another order, which would change the images' bits
    return np.stack([box_mean(array[..., c], SUPERSAMPLE) for c in range(array.shape[-1])], axis=-1)


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

        def write(image_id, image, mask, site=site, entries=entries):
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
        site_progress(f"{site} of {num_sites}", {f"{s} images": n for s, n in sites[site]["images"].items()})
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
