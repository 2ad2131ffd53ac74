"""Complete provisioned startup kits with what `project.yml` cannot express, and lock their secrets away.

Writes only into each kit's `local/` folder (never `startup/`):
- `local/resources.json`: the provisioned settings (resource manager with the site's GPUs, storage, ...)
  with our component classes added to the class allow-list, each by its exact path
  (`fairfl.flare.components.ALLOW_LIST`), so our installed package runs in jobs without BYOC and nothing else
  of it can be named by a job;
- `local/authorization.json`: only the project admin may submit jobs, nobody has the BYOC right and nobody
  outside a hospital may run shell commands (cat, ls, ...) on its site.
A site's own `resources.json` is completed in place (its settings kept, our classes added); a file whose
completion would change a setting the site made, or an edited `authorization.json`, is refused unless `force`.

Secrets become owner-only first, even when the rest is refused, and never through a symbolic link: `startup/`
folders (they hold the private keys) 0700, `*.key` 0600, and the provisioning `state/` folder beside the kits
(root CA private key and every participant's key) 0700/0600.

Nothing is changed through a symbolic link: a linked `state/`, or a linked `local/` or file in it that would be read
or written, is refused naming the link (a link could lead the permissions and policies anywhere, e.g. to another
kit's or the user's own files). With `force` a link is followed only where it leads inside the folder that holds
it (the kit for `local/`, the provisioning folder for `state/`); a link leading outside is refused even then. Links
inside `state/` and `startup/` are left alone, never followed.

Plain NVFlare 2.9 kits carry no `signature.json` (mutual TLS is the trust anchor); HE and confidential
computing kits sign `local/` too, and editing it would break their start, so those are refused.

The container option is a provisioning builder instead (`ContainerBuilder`, named by
`provisioning/project_docker.yml`): it writes each server and site kit's `startup/docker.sh` while the kit is made,
so it is in `startup/` before anything could sign it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST
from nvflare.lighter.constants import PropKey
from nvflare.lighter.spec import Builder
from nvflare.lighter.utils import sh_replace, write

from fairfl.files import write_json_atomic
from fairfl.tracking import UNCHECKED_RECEIVERS

OWN_PACKAGE = "fairfl."
RESOURCES, AUTHORIZATION_FILE = "resources.json", "authorization.json"  # in a kit's local/

# Per-role rights, NVFlare's authorization.json format. "any" for the project admin would include BYOC,
# so its rights are spelled out. Shell commands (cat, grep, ls, ... in the site's kit folder: its logs, with data
# file names, and configuration) stay with each hospital's own org admin and lead: running jobs needs none.
AUTHORIZATION = {
    "format_version": "1.0",
    "permissions": {
        "project_admin": {
            "submit_job": "any",
            "clone_job": "any",
            "manage_job": "any",
            "download_job": "any",
            "view": "any",
            "operate": "any",
            "shell_commands": "none",
            "byoc": "none",
            "server-predeployed-flwr": "none",
        },
        "org_admin": {
            "submit_job": "none",
            "clone_job": "none",
            "manage_job": "none",
            "download_job": "none",
            "view": "any",
            "operate": "o:site",
            "shell_commands": "o:site",
            "byoc": "none",
            "server-predeployed-flwr": "none",
        },
        "lead": {
            "submit_job": "none",
            "clone_job": "none",
            "manage_job": "none",
            "download_job": "none",
            "view": "any",
            "operate": "o:site",
            "shell_commands": "o:site",
            "byoc": "none",
            "server-predeployed-flwr": "none",
        },
        "member": {"view": "any"},
    },
}


def kit_kind(kit: str) -> str | None:
    """'server', 'client' or 'admin' for a startup kit folder, None for anything else."""
    for kind, name in (("server", "fed_server.json"), ("client", "fed_client.json"), ("admin", "fed_admin.json")):
        if os.path.isfile(os.path.join(kit, "startup", name)):
            return kind
    return None


def find_kits(root: str) -> dict:
    """{kit folder: kind} of every startup kit directly under `root` (a provisioned `prod_NN` folder)."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root} is not a folder of startup kits")
    kits = {}
    for name in sorted(os.listdir(root)):
        kind = kit_kind(os.path.join(root, name))
        if kind:
            kits[os.path.join(root, name)] = kind
    return kits


def allow_listed(resources: dict) -> dict:
    """`resources` (a resources.json dict) with our component classes on its class allow-list, enforced.

    NVFlare 2.9 admits a path equal to an entry or starting with the entry plus '.' (an entry ending in '.'
    is a package prefix), then imports everything before the path's last '.' as a module: so an exact class
    entry admits that class only. Any other entry reaching into our package (`fairfl.`, from earlier versions,
    or `fairfl.flare.`) is removed: it would let a job call any function of the package; so are NVFlare's MLflow
    and W&B receivers (`UNCHECKED_RECEIVERS`: a job could name any destination). The list in the file replaces
    NVFlare's default, so the other defaults stay in it."""
    from fairfl.flare.components import ALLOW_LIST

    listed = resources.get("class_allow_list") or list(DEFAULT_CLASS_ALLOW_LIST)
    if not isinstance(listed, list) or not all(isinstance(entry, str) for entry in listed):
        raise ValueError(f"class_allow_list must be a list of dotted paths, got {listed!r}")
    if "*" in listed:
        raise ValueError("class_allow_list is '*' (every class allowed); refusing to narrow it silently")
    # NVFlare's MLflow and W&B receivers would send every site's metrics wherever a job says: fairfl's checked
    # receiver replaces the first (fairfl.flare.mlflow_receiver)
    kept = [entry for entry in listed if not entry.startswith(OWN_PACKAGE) and entry not in UNCHECKED_RECEIVERS]
    return {
        **resources,
        "class_list_enforcement_mode": "enforce",
        "class_allow_list": list(dict.fromkeys([*kept, *ALLOW_LIST])),
    }


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (ValueError, RecursionError):
        return None  # not JSON: differs from anything we write


def _unlinked(path: str, top: str, force: bool) -> str:
    """`path` (below the folder `top`) to read, write or lock: itself when no part of it below `top` is a symbolic
    link; with `force`, where the links lead if that stays inside `top`; else a ValueError naming the link."""
    current = top
    for part in Path(os.path.relpath(path, top)).parts:
        current = os.path.join(current, part)
        if not os.path.islink(current):
            continue
        resolved, target = Path(path).resolve(), Path(current).resolve()
        if not force:
            raise ValueError(
                f"{current} is a symbolic link (to {target}): nothing is changed through a link; replace it with the "
                f"folder or file itself (--force follows a link only where it stays inside {top})"
            )
        if not resolved.is_relative_to(Path(top).resolve()):
            raise ValueError(
                f"{current} is a symbolic link to {target}, outside {top}: nothing is changed through it, "
                f"even with --force"
            )
        return str(resolved)
    return path


def _kit_files(kit: str, kind: str, storage: str | None, force: bool = False) -> dict:
    """{path: content} this kit's local/ should hold; the paths have no symbolic link in them (`_unlinked`)."""
    local = _unlinked(os.path.join(kit, "local"), kit, force)
    current, authorization, default = (
        _unlinked(os.path.join(kit, "local", name), kit, force)
        for name in (RESOURCES, AUTHORIZATION_FILE, RESOURCES + ".default")
    )
    for folder in (local, os.path.join(kit, "startup")):
        if os.path.exists(os.path.join(folder, "signature.json")):
            raise ValueError(
                f"{folder}/signature.json: this kit is signed (HE or confidential computing "
                f"provisioning); its local/ folder cannot be edited. Provision without those, or "
                f"add fairfl.flare.components.ALLOW_LIST to class_allow_list when provisioning"
            )
    source = current if os.path.exists(current) else default
    if not os.path.exists(source):
        raise FileNotFoundError(f"{kit} has neither local/resources.json nor local/resources.json.default")
    resources = _read_json(source)
    if not isinstance(resources, dict):
        raise ValueError(f"{source} is not a JSON object; fix or remove it")
    try:
        resources = allow_listed(resources)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    if kind == "server" and storage:
        storage = os.path.abspath(storage)
        resources["snapshot_persistor"]["args"]["storage"]["args"]["root_dir"] = os.path.join(storage, "snapshot")
        for component in resources.get("components", []):
            if component.get("id") == "job_manager":
                component["args"]["uri_root"] = os.path.join(storage, "jobs")
    return {current: resources, authorization: AUTHORIZATION}


def _restrict(path: str, folder_mode: int = 0o700, file_mode: int = 0o600) -> None:
    """Owner-only `path` if it is a folder or a plain file; a symbolic link (or anything else) is left alone, so
    nothing outside the folder being locked is ever changed through one."""
    kind = os.lstat(path).st_mode
    if stat.S_ISDIR(kind):
        os.chmod(path, folder_mode)
    elif stat.S_ISREG(kind):
        os.chmod(path, file_mode)


def restrict_secrets(kit: str) -> None:
    """Owner-only permissions on a kit's `startup/` folder (0700) and its private keys (0600)."""
    startup = os.path.join(kit, "startup")
    _restrict(startup)
    if os.path.isdir(startup) and not os.path.islink(startup):
        for name in os.listdir(startup):
            if name.endswith(".key"):
                _restrict(os.path.join(startup, name))


def restrict_folder(folder: str) -> None:
    """`folder` 0700 and every file under it 0600, sub-folders 0700 (provisioning `state/`: the root CA key; the
    dashboard's database). Links in it are neither followed nor changed (`folder` itself may be one)."""
    folder = os.path.realpath(folder)
    _restrict(folder)
    for parent, dirs, files in os.walk(folder):  # does not descend into linked folders
        for name in dirs + files:
            _restrict(os.path.join(parent, name))


def _overrides(site, ours) -> bool:
    """Whether writing `ours` over the site's `site` would change or remove a value the site set (adding keys,
    or entries to a list of names, changes nothing the site set; nor does dropping NVFlare's unchecked receivers,
    which came with NVFlare's default list, not from the site)."""
    if isinstance(site, dict) and isinstance(ours, dict):
        return any(key not in ours or _overrides(value, ours[key]) for key, value in site.items())
    if isinstance(site, list) and isinstance(ours, list):
        if all(isinstance(entry, str) for entry in site + ours):
            return not set(site) - set(UNCHECKED_RECEIVERS) <= set(ours)
        return len(site) != len(ours) or any(map(_overrides, site, ours))
    return site != ours


def complete_kits(root: str, storage: str | None = None, force: bool = False) -> dict:
    """Complete every server and client kit under `root`; {kit: kind} of those done (admin kits only have their
    keys locked). Every kit's keys and the `state/` folder are locked first. Then, unless `force`, refuses before
    writing anything if completing would change a setting made at the site (see `_overrides`).

    storage: the server's job/snapshot storage (default `<server kit>/storage`)."""
    kits = find_kits(root)
    for kit in kits:  # first, whatever follows: the keys are never left readable
        restrict_secrets(kit)
    provisioning = os.path.dirname(os.path.abspath(root))
    state = _unlinked(os.path.join(provisioning, "state"), provisioning, force)
    if os.path.isdir(state):
        restrict_folder(state)
    if not any(kind in ("server", "client") for kind in kits.values()):
        raise FileNotFoundError(f"no server or site startup kit under {root} (expected <name>/startup/fed_*.json)")
    planned, done = {}, {}
    for kit, kind in kits.items():
        if kind in ("server", "client"):
            planned.update(
                _kit_files(kit, kind, storage or (os.path.join(kit, "storage") if kind == "server" else None), force)
            )
            done[kit] = kind
    # resources.json is written merged into the site's own (its settings kept): refused only where that would
    # change one; authorization.json is ours as a whole: refused if it differs at all
    edited = [
        path
        for path, content in planned.items()
        if os.path.exists(path)
        and (_overrides(_read_json(path), content) if path.endswith("resources.json") else _read_json(path) != content)
    ]
    if edited and not force:
        raise FileExistsError(
            "completing these files would change settings made at the site (or by another "
            "version); nothing was changed. Keep them, or replace them with --force: " + ", ".join(edited)
        )
    for path, content in planned.items():  # atomic: a crash never leaves a site a truncated policy file
        write_json_atomic(path, content, indent=2)
    return done


# A kit's startup/docker.sh (ContainerBuilder), filled as NVFlare fills its own templates ({~~name~~}). The kit and the
# data root are mounted at their host paths: the absolute paths provision-complete writes (the server's job storage)
# and a datalist's then hold inside the container too. It runs as the user who starts it (the owner-only keys stay
# readable), with HOME and USER set because that user has no entry in the image's /etc/passwd.
DOCKER_SH = """#!/usr/bin/env bash
# Runs this kit's {~~kind~~} {~~name~~} in the fairfl image: docs/deployment.md, "Containers". Written by
# fairfl.deploy.kits.ContainerBuilder at provisioning. Each setting: the environment, else the provisioned default.
#   FAIRFL_IMAGE      the image (default {~~image~~})
#   FAIRFL_DATA_ROOT  a host folder, mounted read-only at the same path: a site's data root (default {~~data_shown~~};
#                     empty: none; a site without one trains on the built-in synthetic data)
#   FAIRFL_GPUS       docker's --gpus value: all, 2, '"device=0,2"' (default {~~gpus_shown~~}; empty: no GPU)
# Every other FAIRFL_* variable set when it starts is passed on (the site's settings, docs/running.md).
# docker.sh -d: in the background (docker logs / docker stop {~~name~~}); otherwise in the foreground.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" >/dev/null 2>&1 && pwd)"
KIT="$(dirname "$DIR")"
IMAGE="${FAIRFL_IMAGE:-{~~image~~}}"
DATA_ROOT="${FAIRFL_DATA_ROOT-{~~data_root~~}}"
GPUS="${FAIRFL_GPUS-{~~gpus~~}}"
args=(--rm --init --name {~~name~~} --net=host --ipc=host -u "$(id -u):$(id -g)" -e HOME=/tmp -e USER=fairfl
      -v "$KIT:$KIT" -w "$KIT")
if [ -n "$DATA_ROOT" ]; then
  # docker would create a missing folder, empty and owned by root: a site would start without its data
  [ -d "$DATA_ROOT" ] || { echo "no data root $DATA_ROOT: set FAIRFL_DATA_ROOT (empty: none)" >&2; exit 1; }
  args+=(-v "$DATA_ROOT:$DATA_ROOT:ro" -e "FAIRFL_DATA_ROOT=$DATA_ROOT")
fi
if [ -n "$GPUS" ]; then args+=(--gpus "$GPUS"); fi
for var in $(compgen -e); do
  case "$var" in FAIRFL_IMAGE|FAIRFL_DATA_ROOT|FAIRFL_GPUS) ;; FAIRFL_*) args+=(-e "$var") ;; esac
done
if [ "${1:-}" = "-d" ]; then args+=(-d); fi
if docker container inspect {~~name~~} >/dev/null 2>&1; then
  echo "a container {~~name~~} exists already (docker stop {~~name~~})" >&2; exit 1
fi
# pid files a killed container left would stop the kit's start loop (it would take them for a running instance)
rm -f "$KIT/daemon_pid.fl" "$KIT/pid.fl"
exec docker run "${args[@]}" "$IMAGE" "$KIT/startup/sub_start.sh"
"""


class ContainerBuilder(Builder):
    """NVFlare provisioning builder: `startup/docker.sh` in the server's and every site's kit, running the kit's own
    start loop (`startup/sub_start.sh`) in the fairfl image (provisioning/docker/Dockerfile).

    image: the image every kit runs; gpu_image: the one of sites whose `capacity` lends GPUs (default `image`), run
    with `--gpus <num_of_gpus>`; data_root: each site's data folder on its host (the server mounts none).
    NVFlare's own DockerBuilder writes one compose file for every participant on a single host and an image with an
    unpinned nvflare, and StaticFileBuilder's `docker_image` script has no GPU setting and mounts no data root."""

    def __init__(self, image: str, gpu_image: str = "", data_root: str = "/srv/fairfl/data"):
        for name, value in (("image", image), ("gpu_image", gpu_image or image)):
            if not value or not all(c.isalnum() or c in "._-/:@" for c in value):
                raise ValueError(f"ContainerBuilder {name} {value!r}: not an image name")
        if not os.path.isabs(data_root) or any(c in data_root for c in "\"'$`\n"):
            raise ValueError(f"ContainerBuilder data_root {data_root!r}: not a plain absolute path")
        self.image, self.gpu_image, self.data_root = image, gpu_image or image, data_root

    def build(self, project, ctx):
        server = project.get_server()
        kits = [(server, "server", self.image, "", "")] if server else []
        for client in project.get_clients():
            gpus = int((client.get_prop(PropKey.CAPACITY) or {}).get(PropKey.NUM_GPUS, 0))
            image = self.gpu_image if gpus else self.image
            kits.append((client, "site", image, self.data_root, str(gpus) if gpus else ""))
        for participant, kind, image, data_root, gpus in kits:
            values = {"kind": kind, "name": participant.name, "image": image, "data_root": data_root, "gpus": gpus}
            values.update(data_shown=data_root or "none", gpus_shown=gpus or "none")
            write(os.path.join(ctx.get_kit_dir(participant), "docker.sh"), sh_replace(DOCKER_SH, values), "t", True)
