import os

import pytest

from fairfl.jobconfig import customize_job

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = os.path.join(REPO, "jobs")

# Small enough for CI on 2 cores, large enough that training really runs.
TINY_SERVER = {"num_rounds": 2, "eval_every": 1, "model_channels": [8, 16, 32], "model_strides": [2, 2]}
TINY_CLIENT = {"image_size": 32, "synthetic_size_scale": 0.5, "cka_max_samples": 16}


def make_job(name: str, dst: str, server: dict = None, client: dict = None, client_extra: dict = None) -> str:
    """jobs/<name> copied to dst with tiny settings (plus any overrides); the repo's job stays untouched."""
    args = {**TINY_SERVER, **TINY_CLIENT, **(server or {}), **(client or {})}
    return customize_job(os.path.join(JOBS, name), dst, args, client_config=client_extra)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One built-in data cache for the whole session, unless CI set one."""
    path = os.environ.get("FAIRFL_CACHE_DIR") or str(tmp_path_factory.mktemp("fairfl_cache"))
    os.environ["FAIRFL_CACHE_DIR"] = path
    return path
