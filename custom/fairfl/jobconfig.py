"""Write a copy of a job folder with some component arguments changed (the originals stay untouched).

Used by `--set key=value` (`fairfl run`, `fairfl export-job`, `fairfl poc submit`, `fairfl submit`), the benchmarks
(seeds, rounds) and the tests (tiny settings)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from fairfl.arguments import check_all, declared, defaults, moved_settings
from fairfl.files import parse_json, read_json
from fairfl.tracking import with_mlflow

JOBS = Path(__file__).resolve().parents[2] / "jobs"  # the job folders of a fairfl checkout (fairfl make-jobs)
# how a run waits for its sites: they change when a round ends, never its numbers
WAITING_ARGUMENTS = ("task_timeout", "straggler_timeout", "task_check_period")
SERVER_CONFIG = os.path.join("app", "config", "config_fed_server.json")
CLIENT_CONFIG = os.path.join("app", "config", "config_fed_client.json")


def component_arguments(component) -> dict:
    """{argument: default} of a fairfl component (its class or class path), as fairfl.arguments declares them: a
    class's bases' arguments first, each with the class's own default; tuples as JSON lists."""
    return defaults(component)


def _fairfl_components(config: dict):
    """The fairfl components of a config: server workflows and client executors (entries of another shape are
    NVFlare's to refuse)."""
    workflows, executors = (config.get(key) for key in ("workflows", "executors"))
    entries = [w for w in workflows if isinstance(w, dict)] if isinstance(workflows, list) else []
    entries += [e.get("executor") for e in executors if isinstance(e, dict)] if isinstance(executors, list) else []
    for entry in entries:
        if isinstance(entry, dict) and str(entry.get("path", "")).startswith("fairfl."):
            yield entry


def job_arguments(job: str) -> dict:
    """{argument: value} of every fairfl component of `job` (server and client configs; the client's win on a
    name both have)."""
    arguments = {}
    for config in read_configs(job).values():
        for component in _fairfl_components(config):
            arguments.update(component.get("args", {}))
    return arguments


def config_problem(config: dict) -> str | None:
    """Why a job config (a JSON object) has not the shape NVFlare and fairfl read, or None: its component lists must
    be lists of objects and a fairfl component's `args` an object (a job folder is untrusted input)."""
    for key in ("workflows", "executors", "components", "task_result_filters", "task_data_filters"):
        value = config.get(key, [])
        if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
            return f"{key} must be a list of objects"
    for component in _fairfl_components(config):
        if not isinstance(component.get("args", {}), dict):
            return f"the args of {component.get('path')} must be an object"
    return None


def is_job_copy(folder: str) -> bool:
    """Whether `folder` looks like a job folder (meta.json and app/config with both configs, nothing else at the
    top): what customize_job writes, so the only kind of folder it replaces."""
    try:
        top = set(os.listdir(folder))
    except OSError:
        return False
    return (
        top <= {"meta.json", "app"}
        and "meta.json" in top
        and all(os.path.isfile(os.path.join(folder, name)) for name in (SERVER_CONFIG, CLIENT_CONFIG))
    )


def customize_job(
    src: str,
    dst: str,
    args: dict | None = None,
    client_config: dict | None = None,
    mlflow: bool | str = False,
    leave_out: tuple = (),
) -> str:
    """Copy job `src` to `dst`, setting each argument in `args` on every fairfl component that has it.

    An argument no component has, or a value of another JSON kind than the job's (a string for a number), is a
    ValueError naming it, and nothing is written (a typo must not silently run the defaults). `dst` may exist
    only as an empty folder or an earlier job copy (`is_job_copy`), which is replaced; anything else is refused,
    never deleted. client_config: top-level keys to set in the client config (e.g. task_result_filters). mlflow:
    add NVFlare's MLflow receiver to the server (fairfl.tracking.with_mlflow: True, or a tracking URI). leave_out:
    names of files or folders not copied (`fairfl export-job`: the BYOC marker folders)."""
    if os.path.lexists(dst) and not (
        os.path.isdir(dst) and not os.path.islink(dst) and (not os.listdir(dst) or is_job_copy(dst))
    ):
        raise ValueError(f"{dst} exists and is not a job copy written by fairfl: refusing to replace it")
    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".job-", dir=parent)  # filled and checked first; dst is replaced last
    try:
        copy = os.path.join(staging, "job")
        shutil.copytree(src, copy, ignore=shutil.ignore_patterns(*leave_out))
        _set_arguments(src, copy, args or {}, client_config or {}, mlflow)
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.replace(copy, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dst


def _set_arguments(src: str, job: str, args: dict, client_config: dict, mlflow: bool | str) -> None:
    configs = set_arguments(read_configs(job), args, src)
    configs[CLIENT_CONFIG].update(client_config)
    configs[SERVER_CONFIG] = with_mlflow(configs[SERVER_CONFIG], mlflow)
    for name, config in configs.items():
        with open(os.path.join(job, name), "w") as f:
            json.dump(config, f, indent=2)


def set_arguments(configs: dict, args: dict, job: str) -> dict:
    """Set each argument in `args` on every fairfl component of `configs` ({config path: config dict}, changed in
    place and returned) that takes it, then check every argument of every fairfl component (`check_components`). An
    argument no component takes, or a value its component does not take (a string for a number, 0 rounds, NaN), is
    a ValueError naming it, the component and `job`."""
    unused = set(args)
    for config in configs.values():
        for component in _fairfl_components(config):
            for key in args.keys() & _declared_names(component, job):
                component.setdefault("args", {})[key] = args[key]
                unused.discard(key)
    if unused:
        raise ValueError(f"job {job} has no argument(s) {sorted(unused)}{moved_settings(sorted(unused))}")
    check_components(configs, job)
    return configs


def _declared_names(component: dict, job: str) -> set:
    try:
        return set(declared(component.get("path")))
    except ValueError as e:
        raise ValueError(f"job {job}: {e}") from None


def check_components(configs: dict, job: str) -> None:
    """Every argument of every fairfl component of `configs` (fairfl.arguments.check_all): else a ValueError naming
    `job`, the component and each bad argument. What `fairfl run`, the recipe and `fairfl poc submit` check before
    anything starts."""
    for config in configs.values():
        for component in _fairfl_components(config):
            try:
                check_all(component.get("path"), component.get("args", {}))
            except (TypeError, ValueError) as e:
                raise ValueError(f"job {job}: {e}") from None


def read_configs(job: str) -> dict:
    """{config path: config dict} of the server and client configs of the job folder `job`; ValueError naming a file
    that is missing or not a JSON object."""
    configs = {}
    for name in (SERVER_CONFIG, CLIENT_CONFIG):
        path = os.path.join(job, name)
        try:
            configs[name] = read_json(path)
        except ValueError as e:
            raise ValueError(f"job {job}: {name}: {e}") from None
        if not isinstance(configs[name], dict):
            raise ValueError(f"job {job}: {name} is not a JSON object")
        problem = config_problem(configs[name])
        if problem:
            raise ValueError(f"job {job}: {name}: {problem}")
    return configs


def check_job(job: str, args: dict | None = None) -> None:
    """Whether the job folder `job`, with `args` set as `fairfl run --set` sets them, runs with arguments its
    components take (`set_arguments`): else a ValueError naming the job, the component and the argument. Nothing is
    written."""
    set_arguments(read_configs(job), args or {}, job)


def add_set_argument(parser) -> None:
    """The repeatable `--set KEY=VALUE` of every command that changes a job's arguments (read by checked_overrides)."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a job argument (JSON value), e.g. --set num_rounds=50; repeatable",
    )


def checked_overrides(job: str, assignments: list[str]) -> dict:
    """The arguments `--set` assigns (parse_assignments), once the job folder `job` checks with them set (check_job):
    else a ValueError naming --set, or the job, the component and the argument. Nothing is written."""
    try:
        overrides = parse_assignments(assignments)
    except ValueError as e:
        raise ValueError(f"argument --set: {e}") from None
    overrides = {**declared_by_data(overrides.get("data_root")), **overrides}
    check_job(job, overrides)
    return overrides


# what a data root's dataset.json declares that the server must know to build the network (the round's arguments)
DECLARED_ROUND_ARGUMENTS = ("task", "num_classes", "in_channels", "spatial_dims")


def declared_by_data(data_root) -> dict:
    """The round arguments the dataset.json of `data_root` declares (task, num_classes, in_channels, spatial_dims):
    the server has no data, so what the data says of itself travels in the job; `--set` wins over it, and each site
    refuses a job its own dataset.json contradicts. {} without a data root or its dataset.json; a malformed one is a
    ValueError naming it."""
    from fairfl.data.datalist import declared_task

    if not isinstance(data_root, str) or not data_root:
        return {}
    path = os.path.join(os.path.expanduser(data_root), "dataset.json")
    if not os.path.isfile(path):
        return {}
    info = read_json(path)
    if not isinstance(info, dict):
        raise ValueError(f"{path}: not a JSON object")
    declared = declared_task(info)
    return {key: declared[key] for key in DECLARED_ROUND_ARGUMENTS if key in declared}


def parse_assignments(items: list[str]) -> dict:
    """['num_rounds=50', 'cka_clip=[0.0001,0.99]'] -> {'num_rounds': 50, 'cka_clip': [0.0001, 0.99]} (JSON values;
    anything that is not JSON stays a string)."""
    result = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {item!r}")
        try:
            result[key] = parse_json(value)
        except ValueError:
            result[key] = value
    return result
