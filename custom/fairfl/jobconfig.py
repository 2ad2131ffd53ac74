"""Write a copy of a job folder with some component arguments changed (the originals stay untouched).

Used by `fairfl run --set key=value`, the benchmarks (seeds, rounds) and the tests (tiny settings)."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

from fairfl.site_settings import MOVED_ARGUMENTS
from fairfl.tracking import with_mlflow

JOBS = Path(__file__).resolve().parents[2] / "jobs"  # the job folders of a fairfl checkout (fairfl make-jobs)
# how a run waits for its sites: they change when a round ends, never its numbers
WAITING_ARGUMENTS = ("task_timeout", "straggler_timeout", "task_check_period")
SERVER_CONFIG = os.path.join("app", "config", "config_fed_server.json")
CLIENT_CONFIG = os.path.join("app", "config", "config_fed_client.json")
JSON_KINDS = (
    (bool, "true/false"),
    ((int, float), "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "an object"),
)


def component_arguments(cls: type) -> dict:
    """{argument: default} of the constructors of `cls` and its fairfl bases (not NVFlare's): base arguments first,
    each with the most derived class's default; tuples as JSON lists."""
    defaults = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("fairfl.") and "__init__" in vars(klass):
            for name, parameter in inspect.signature(vars(klass)["__init__"]).parameters.items():
                if parameter.default is not inspect.Parameter.empty:
                    defaults[name] = (
                        list(parameter.default) if isinstance(parameter.default, tuple) else parameter.default
                    )
    return defaults


def _fairfl_components(config: dict):
    """The fairfl components of a config: server workflows and client executors."""
    for workflow in config.get("workflows", []):
        if workflow.get("path", "").startswith("fairfl."):
            yield workflow
    for executor in config.get("executors", []):
        if executor.get("executor", {}).get("path", "").startswith("fairfl."):
            yield executor["executor"]


def job_arguments(job: str) -> dict:
    """{argument: value} of every fairfl component of `job` (server and client configs; the client's win on a
    name both have)."""
    arguments = {}
    for name in (SERVER_CONFIG, CLIENT_CONFIG):
        with open(os.path.join(job, name)) as f:
            for component in _fairfl_components(json.load(f)):
                arguments.update(component.get("args", {}))
    return arguments


def _kind(value) -> str | None:
    return next((name for types, name in JSON_KINDS if isinstance(value, types)), None)


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
    src: str, dst: str, args: dict | None = None, client_config: dict | None = None, mlflow: bool | str = False
) -> str:
    """Copy job `src` to `dst`, setting each argument in `args` on every fairfl component that has it.

    An argument no component has, or a value of another JSON kind than the job's (a string for a number), is a
    ValueError naming it, and nothing is written (a typo must not silently run the defaults). `dst` may exist
    only as an empty folder or an earlier job copy (`is_job_copy`), which is replaced; anything else is refused,
    never deleted. client_config: top-level keys to set in the client config (e.g. task_result_filters). mlflow:
    add NVFlare's MLflow receiver to the server (fairfl.tracking.with_mlflow: True, or a tracking URI)."""
    if os.path.lexists(dst) and not (
        os.path.isdir(dst) and not os.path.islink(dst) and (not os.listdir(dst) or is_job_copy(dst))
    ):
        raise ValueError(f"{dst} exists and is not a job copy written by fairfl: refusing to replace it")
    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".job-", dir=parent)  # filled and checked first; dst is replaced last
    try:
        copy = os.path.join(staging, "job")
        shutil.copytree(src, copy)
        _set_arguments(src, copy, args or {}, client_config or {}, mlflow)
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.replace(copy, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dst


def _set_arguments(src: str, job: str, args: dict, client_config: dict, mlflow: bool | str) -> None:
    configs = {}
    for name in (SERVER_CONFIG, CLIENT_CONFIG):
        with open(os.path.join(job, name)) as f:
            configs[name] = json.load(f)
    set_arguments(configs, args, src)
    configs[CLIENT_CONFIG].update(client_config)
    configs[SERVER_CONFIG] = with_mlflow(configs[SERVER_CONFIG], mlflow)
    for name, config in configs.items():
        with open(os.path.join(job, name), "w") as f:
            json.dump(config, f, indent=2)


def set_arguments(configs: dict, args: dict, job: str) -> dict:
    """Set each argument in `args` on every fairfl component of `configs` ({config path: config dict}, changed in
    place and returned) that has it. An argument no component has, or a value of another JSON kind than the job's
    (a string for a number), is a ValueError naming it and `job`."""
    unused = set(args)
    for config in configs.values():
        for component in _fairfl_components(config):
            for key, value in args.items():
                if key in component.get("args", {}):
                    default = component["args"][key]
                    if None not in (default, value) and _kind(default) != _kind(value):
                        raise ValueError(
                            f"{key}={json.dumps(value)}: job {job} expects {_kind(default)} "
                            f"(it has {json.dumps(default)})"
                        )
                    component["args"][key] = value
                    unused.discard(key)
    if unused:
        moved = "".join(
            f"; {key} is the site's own setting {MOVED_ARGUMENTS[key]} (its environment)"
            for key in sorted(unused)
            if key in MOVED_ARGUMENTS
        )
        raise ValueError(f"job {job} has no argument(s) {sorted(unused)}{moved}")
    return configs


def parse_assignments(items: list[str]) -> dict:
    """['num_rounds=50', 'cka_clip=[0.0001,0.99]'] -> {'num_rounds': 50, 'cka_clip': [0.0001, 0.99]} (JSON values;
    anything that is not JSON stays a string)."""
    result = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {item!r}")
        try:
            result[key] = json.loads(value)
        except json.JSONDecodeError:
            result[key] = value
    return result
