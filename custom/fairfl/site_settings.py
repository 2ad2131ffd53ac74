"""A site's own settings, read from the site's environment, never from the job or the server's task.

The job is written by its submitter, the task by the server; neither may widen what a site reads (absolute
paths), make a site a free rider or let a model of any size be built there. Each site sets these for its own
client process (in the simulator all sites share one environment; in production each site sets its own):

    FAIRFL_DATA_ROOT               the site's data root (then the job's `data_root` is ignored)
    FAIRFL_ALLOW_ABSOLUTE_PATHS    1: datalists may name files outside the data root (default 0)
    FAIRFL_FREE_RIDERS             site-4[,site-5]: the sites named are free riders (a test switch, FedCE Fig. 4)
    FAIRFL_FREE_RIDER_SOURCE       the site whose first training image free riders repeat (default site-1)
    FAIRFL_MAX_MODEL_PARAMETERS    the largest network the server may ask this site to build (default 200M)
    FAIRFL_MAX_IMAGE_SIDE          the longest axis an image file of the site's data may declare (default 8192)
    FAIRFL_MAX_IMAGE_VOXELS        the most voxels an image file may declare, all axes together (default 512x512x1024)
    FAIRFL_SHARE_OWN_MODEL         1: send the site's own or personal model when the server asks for it (cross-site
                                   evaluation); 0: decline; unset: 1 in NVFlare's simulator only
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fairfl.errors import DataError
from fairfl.names import safe_name

DATA_ROOT_ENV = "FAIRFL_DATA_ROOT"
ALLOW_ABSOLUTE_PATHS_ENV = "FAIRFL_ALLOW_ABSOLUTE_PATHS"
FREE_RIDERS_ENV = "FAIRFL_FREE_RIDERS"
FREE_RIDER_SOURCE_ENV = "FAIRFL_FREE_RIDER_SOURCE"
MAX_MODEL_PARAMETERS_ENV = "FAIRFL_MAX_MODEL_PARAMETERS"
MAX_MODEL_PARAMETERS = 200_000_000  # 0.8 GB of float32 weights: far above every network the jobs use
MAX_IMAGE_SIDE_ENV = "FAIRFL_MAX_IMAGE_SIDE"
# Originals the converters copy as they are (dermoscopy and fundus photographs, several thousand pixels a side) pass;
# 8192^2 RGB decodes to 0.8 GB of float32. A 1.7 MB gzip NIfTI can declare 20000^2: 1.6 GB a channel.
MAX_IMAGE_SIDE = 8192
MAX_IMAGE_VOXELS_ENV = "FAIRFL_MAX_IMAGE_VOXELS"
MAX_IMAGE_VOXELS = 512 * 512 * 1024  # a whole CT volume (512x512x1000 fits); binds where a site raises the side cap
SHARE_OWN_MODEL_ENV = "FAIRFL_SHARE_OWN_MODEL"
# executor arguments of older jobs that are now site settings: where each went
MOVED_ARGUMENTS = {
    "allow_absolute_paths": ALLOW_ABSOLUTE_PATHS_ENV,
    "free_riders": FREE_RIDERS_ENV,
    "free_rider_source": FREE_RIDER_SOURCE_ENV,
}
SWITCH_VALUES = {"": False, "0": False, "false": False, "no": False, "1": True, "true": True, "yes": True}


@dataclass(frozen=True)
class SiteSettings:
    data_root: str  # "" = the job's data_root, or the built-in data
    allow_absolute_paths: bool
    free_rider: bool  # this site is one
    free_rider_source: str
    max_model_parameters: int
    max_image_side: int
    max_image_voxels: int
    share_own_model: bool | None  # None: unset (the site shares only in NVFlare's simulator)


def site_settings(site: str, environ=None) -> SiteSettings:
    """This site's settings from `environ` (default os.environ); a malformed value is a DataError naming the
    site and the variable."""
    env = os.environ if environ is None else environ

    def refuse(name, problem):
        return DataError(site, f"environment variable {name}", f"{env.get(name)!r}: {problem}")

    def switch(name):
        value = env.get(name, "").strip().lower()
        if value not in SWITCH_VALUES:
            raise refuse(name, "expected 1 or 0")
        return SWITCH_VALUES[value]

    def positive_int(name, default):
        value = env.get(name) or str(default)
        if not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise refuse(name, "expected a positive whole number")
        return int(value)

    try:
        riders = [safe_name(s.strip(), "site name") for s in env.get(FREE_RIDERS_ENV, "").split(",") if s.strip()]
    except ValueError as err:
        raise refuse(FREE_RIDERS_ENV, f"expected comma-separated site names: {err}") from err
    try:
        source = safe_name(env.get(FREE_RIDER_SOURCE_ENV) or "site-1", "site name")
    except ValueError as err:
        raise refuse(FREE_RIDER_SOURCE_ENV, str(err)) from err
    if source in riders:
        raise refuse(FREE_RIDERS_ENV, f"the free riders' source {source} cannot be a free rider itself")
    return SiteSettings(
        data_root=env.get(DATA_ROOT_ENV, ""),
        allow_absolute_paths=switch(ALLOW_ABSOLUTE_PATHS_ENV),
        free_rider=site in riders,
        free_rider_source=source,
        max_model_parameters=positive_int(MAX_MODEL_PARAMETERS_ENV, MAX_MODEL_PARAMETERS),
        max_image_side=positive_int(MAX_IMAGE_SIDE_ENV, MAX_IMAGE_SIDE),
        max_image_voxels=positive_int(MAX_IMAGE_VOXELS_ENV, MAX_IMAGE_VOXELS),
        share_own_model=switch(SHARE_OWN_MODEL_ENV) if env.get(SHARE_OWN_MODEL_ENV, "").strip() else None,
    )
