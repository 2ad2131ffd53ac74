"""Write a copy of a job folder with some component arguments changed (the originals stay untouched).

Used by `fairfl run --set key=value`, the benchmarks (seeds, rounds) and the tests (tiny settings)."""

from __future__ import annotations

import json
import os
import shutil

SERVER_CONFIG = os.path.join("app", "config", "config_fed_server.json")
CLIENT_CONFIG = os.path.join("app", "config", "config_fed_client.json")


def _fairfl_components(config: dict):
    """The fairfl components of a config: server workflows and client executors."""
    for workflow in config.get("workflows", []):
        if workflow.get("path", "").startswith("fairfl."):
            yield workflow
    for executor in config.get("executors", []):
        if executor.get("executor", {}).get("path", "").startswith("fairfl."):
            yield executor["executor"]


def customize_job(src: str, dst: str, args: dict | None = None, client_config: dict | None = None) -> str:
    """Copy job `src` to `dst`, setting each argument in `args` on every fairfl component that has it.

    An argument no component has is an error (a typo must not silently run the defaults).
    client_config: top-level keys to set in the client config (e.g. task_result_filters)."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    unused = set(args or {})
    for name in (SERVER_CONFIG, CLIENT_CONFIG):
        path = os.path.join(dst, name)
        with open(path) as f:
            config = json.load(f)
        for component in _fairfl_components(config):
            for key, value in (args or {}).items():
                if key in component.get("args", {}):
                    component["args"][key] = value
                    unused.discard(key)
        if name == CLIENT_CONFIG:
            config.update(client_config or {})
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
    if unused:
        shutil.rmtree(dst)
        raise ValueError(f"job {src} has no argument(s) {sorted(unused)}")
    return dst


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
