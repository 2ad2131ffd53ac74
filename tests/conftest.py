"""pytest's fixtures and hooks for the whole suite; the plain helpers the tests import are in helpers.py."""

import os

import pytest

from helpers import make_job

# Fixtures that start one federation or run for several tests: pytest-xdist keeps each one's tests on one worker
# (--dist loadgroup), so it is set up once, not once per worker.
SHARED_RUNS = ("tiny_fedavg_run", "federation")


def pytest_collection_modifyitems(config, items):
    """The process-starting tests first, in file order, then the rest. With several workers each takes the next
    test when it is free, so the short unit tests fill in at the end instead of one long run finishing last."""
    for item in items:
        shared = [name for name in SHARED_RUNS if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order within each part


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One built-in data cache for the whole session (shared by all pytest-xdist workers: the generation is safe
    with concurrent processes), unless CI set one."""
    path = os.environ.get("FAIRFL_CACHE_DIR")
    if not path:
        base = tmp_path_factory.getbasetemp()
        # under xdist each worker's base is <session base>/popen-gwN; the session base is common to all of them
        root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        path = str(root / "fairfl_cache")
        os.makedirs(path, exist_ok=True)
    os.environ["FAIRFL_CACHE_DIR"] = path
    return path


@pytest.fixture(scope="session")
def tiny_fedavg_run(tmp_path_factory, cache_dir):
    """jobs/fedavg, tiny, through `nvflare simulator` with 3 sites: one run that several tests check (its results;
    the recipe API's run of the same job against it)."""
    from fairfl.progress import round_printer
    from fairfl.simulate import NVFLARE_SIMULATOR, run_simulator

    root = tmp_path_factory.mktemp("tiny_fedavg")
    job = make_job("fedavg", str(root / "job"))
    printed = []  # the lines `fairfl run` prints while it runs, one per round
    run = run_simulator(
        job,
        str(root / "ws"),
        n_clients=3,
        threads=3,
        timeout=600,
        via=NVFLARE_SIMULATOR,
        on_round=round_printer(write=lambda line, flush: printed.append(line)),
    )
    run.progress_lines = printed
    return run
