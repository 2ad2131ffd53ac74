"""pytest's fixtures and hooks for the whole suite; the plain helpers the tests import are in helpers.py."""

import os

import pytest

from helpers import make_job

# Fixtures that start one federation or run for several tests: pytest-xdist keeps each one's tests on one worker
# (--dist loadgroup), so it is set up once, not once per worker.
SHARED_RUNS = ("tiny_fedavg_run", "federation")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """The process-starting tests first, in file order, then the rest. With several workers each takes the next
    test when it is free, so the short unit tests fill in at the end instead of one long run finishing last."""
    for item in items:
        shared = [name for name in SHARED_RUNS if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
            if getattr(config.option, "loadgroup", False):  # a pytest-xdist worker under --dist loadgroup
                join_group(item, shared[0])
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order within each part


def join_group(item, group):
    """Tell pytest-xdist's scheduler that `item` belongs to `group`. pytest-xdist (3.8) reads a test's group from an
    "@group" suffix of its node id, which it writes to item._nodeid; from pytest 9.2 on, pytest keeps the id in
    item._id and that write is lost, so every test of a group went to whichever worker was free and each of those
    workers set the shared run up again (pytest-xdist issue 1386). Where pytest keeps the id there, the suffix is
    written there; an older pytest takes pytest-xdist's own. A pytest that keeps it elsewhere again stops the
    session instead of silently setting each shared run up on every worker."""
    if not hasattr(item, "_id"):
        return  # pytest before 9.2: pytest-xdist's own suffix takes effect
    grouped = f"{item.nodeid}@{group}"
    item._id = type(item._id).parse(grouped)
    if item.nodeid != grouped:
        raise pytest.UsageError(f"cannot put {item.nodeid} in pytest-xdist group {group}: see tests/conftest.py")


def session_folder(tmp_path_factory):
    """The folder of this test session that all its pytest-xdist workers share: under xdist each worker's base is
    <session base>/popen-gwN, and the session base is common to all of them."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One built-in data cache for the whole session (shared by all pytest-xdist workers: the generation is safe
    with concurrent processes), unless CI set one."""
    path = os.environ.get("FAIRFL_CACHE_DIR")
    if not path:
        path = str(session_folder(tmp_path_factory) / "fairfl_cache")
        os.makedirs(path, exist_ok=True)
    os.environ["FAIRFL_CACHE_DIR"] = path
    return path


@pytest.fixture(scope="session")
def made_once(tmp_path_factory):
    """made_once(name, generate): the folder that generate(folder) filled, made once for the whole session however
    many pytest-xdist workers ask (one generates, the others wait for it and read the same folder, as the built-in
    data cache does: fairfl.data.builtin.ensure_cached). For a module's data that its tests only read: a module's
    tests spread over the workers, and a module-scoped fixture alone would generate it once on each of them."""
    from fairfl.data.builtin import ensure_cached

    root = session_folder(tmp_path_factory) / "made_once"
    return lambda name, generate: ensure_cached(name, generate, root)


@pytest.fixture(scope="session")
def tiny_fedavg_run(tmp_path_factory, cache_dir):
    """jobs/fedavg, tiny, through `nvflare simulator` with 2 sites (each site is a process start, most of a tiny
    run's time; no check needs a third): one run that several tests check (its results; the recipe API's run of the
    same job against it; a run with a third site failing every round against it)."""
    from fairfl.progress import round_printer
    from fairfl.simulate import NVFLARE_SIMULATOR, run_simulator

    root = tmp_path_factory.mktemp("tiny_fedavg")
    job = make_job("fedavg", str(root / "job"))
    printed = []  # the lines `fairfl run` prints while it runs, one per round
    run = run_simulator(
        job,
        str(root / "ws"),
        n_clients=2,
        threads=2,
        timeout=600,
        via=NVFLARE_SIMULATOR,
        on_round=round_printer(write=lambda line, flush: printed.append(line)),
    )
    run.progress_lines = printed
    return run
