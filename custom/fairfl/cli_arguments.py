"""What several of fairfl's command lines share: argparse value types and the --gpu and --mlflow options.

argparse reports a value a type refuses as "argument --x: ..." with exit code 2. Nothing here imports the commands
(fairfl.cli, the report, the benchmark, deploy, the recipe), which all import it; the modules a type needs are
imported when a value is checked."""

from __future__ import annotations

import argparse
import os


def at_least(low: int, at_most: int | None = None):
    """An argparse type: an integer >= low (and <= at_most)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if at_most is not None and value > at_most:
            raise argparse.ArgumentTypeError(f"must be at most {at_most}, got {value}")
        return value

    return parse


def number_in(low: float, high: float, low_open: bool = False):
    """An argparse type: a finite number in [low, high] ((low, high] with low_open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (low < value if low_open else low <= value) or not value <= high:
            raise argparse.ArgumentTypeError(f"must be in {'(' if low_open else '['}{low:g}, {high:g}], got {text}")
        return value

    return parse


def gpu_list(text: str) -> str:
    """An argparse type: the simulator's -gpu value (fairfl.simulate.gpu_groups), passed on as it is."""
    from fairfl.simulate import gpu_groups

    try:
        gpu_groups(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def gpu_problem(gpu: str | None, n_clients: int) -> str | None:
    """Why --gpu cannot run `n_clients` sites (the simulator wants at least one site per GPU group), or None."""
    from fairfl.simulate import gpu_groups

    groups = len(gpu_groups(gpu)) if gpu is not None else 0
    if groups > n_clients:
        return f"argument --gpu: {groups} GPU groups need at least as many sites (-n {n_clients})"
    return None


def site_names(text: str) -> list:
    """An argparse type: comma-separated site names (fairfl.names)."""
    from fairfl.names import safe_name

    try:
        return [safe_name(name, "site name") for name in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def existing_folder(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"no such folder: {text}")
    return text


def existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return os.path.abspath(text)


def job_folder(text: str) -> str:
    from fairfl.jobconfig import CLIENT_CONFIG, SERVER_CONFIG

    missing = [name for name in (SERVER_CONFIG, CLIENT_CONFIG) if not os.path.isfile(os.path.join(text, name))]
    if missing:
        raise argparse.ArgumentTypeError(f"{text} is not a job folder (no {', '.join(missing)})")
    return text


def add_mlflow_argument(parser) -> None:
    parser.add_argument(
        "--mlflow",
        nargs="?",
        const=True,
        default=False,
        metavar="TRACKING_URI",
        help="also send every site's accepted metrics to MLflow (NVFlare's MLflowReceiver on the server): to a "
        "SQLite store mlflow.db beside results.json, or to TRACKING_URI: http(s) to a host in FAIRFL_MLFLOW_HOSTS "
        "(default this machine only), file: or sqlite: in a folder of FAIRFL_MLFLOW_PATHS (needs pip install "
        "'fairfl[tracking]')",
    )


def add_gpu_argument(parser) -> None:
    parser.add_argument(
        "--gpu",
        type=gpu_list,
        metavar="IDS",
        help="the simulator's GPUs: 0 (all sites on GPU 0), 0,1 or [0,1],[2,3] (the sites split over the GPU "
        "groups, one process per group at a time); the sites use their GPU when the job's device is auto or cuda",
    )
