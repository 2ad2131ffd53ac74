"""Complete provisioned startup kits with what `project.yml` cannot express.

Writes only into each kit's `local/` folder (never `startup/`):
- `local/resources.json`: the provisioned settings (resource manager with the site's GPUs, storage, ...)
  with `fairfl.` added to the class allow-list, so our installed package runs in jobs without BYOC;
- `local/authorization.json`: only the project admin may submit jobs, and nobody has the BYOC right
  (our jobs carry no code, so none is needed).

Plain NVFlare 2.9 kits carry no `signature.json` (mutual TLS is the trust anchor); HE and confidential
computing kits sign `local/` too, and editing it would break their start, so those are refused."""

from __future__ import annotations

import json
import os

from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

ALLOW_PREFIX = "fairfl."

# Per-role rights, NVFlare's authorization.json format. "any" for the project admin would include BYOC,
# so its rights are spelled out.
AUTHORIZATION = {
    "format_version": "1.0",
    "permissions": {
        "project_admin": {"submit_job": "any", "clone_job": "any", "manage_job": "any", "download_job": "any",
                          "view": "any", "operate": "any", "shell_commands": "any", "byoc": "none",
                          "server-predeployed-flwr": "none"},
        "org_admin": {"submit_job": "none", "clone_job": "none", "manage_job": "none", "download_job": "none",
                      "view": "any", "operate": "o:site", "shell_commands": "o:site", "byoc": "none",
                      "server-predeployed-flwr": "none"},
        "lead": {"submit_job": "none", "clone_job": "none", "manage_job": "none", "download_job": "none",
                 "view": "any", "operate": "o:site", "shell_commands": "o:site", "byoc": "none",
                 "server-predeployed-flwr": "none"},
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
    """`resources` (a resources.json dict) with `fairfl.` added to its class allow-list, enforced.

    The list in the file replaces NVFlare's default, so the defaults stay in it."""
    listed = resources.get("class_allow_list") or list(DEFAULT_CLASS_ALLOW_LIST)
    if listed == "*" or "*" in listed:
        raise ValueError("class_allow_list is '*' (every class allowed); refusing to narrow it silently")
    return {**resources, "class_list_enforcement_mode": "enforce",
            "class_allow_list": list(dict.fromkeys([*listed, ALLOW_PREFIX]))}


def complete_kit(kit: str, kind: str, storage: str | None = None) -> list:
    """Write local/resources.json (and local/authorization.json) of one server or client kit; the files written.

    storage (server only): folder for the server's job and snapshot storage (NVFlare's default is under
    /tmp/nvflare, shared by every server on the machine)."""
    local = os.path.join(kit, "local")
    for folder in (local, os.path.join(kit, "startup")):
        if os.path.exists(os.path.join(folder, "signature.json")):
            raise ValueError(f"{folder}/signature.json: this kit is signed (HE or confidential computing "
                             f"provisioning); its local/ folder cannot be edited. Provision without those, or "
                             f"add 'fairfl.' to class_allow_list when provisioning")
    current = os.path.join(local, "resources.json")
    source = current if os.path.exists(current) else current + ".default"
    if not os.path.exists(source):
        raise FileNotFoundError(f"{kit} has neither local/resources.json nor local/resources.json.default")
    with open(source) as f:
        resources = allow_listed(json.load(f))
    if kind == "server" and storage:
        storage = os.path.abspath(storage)
        resources["snapshot_persistor"]["args"]["storage"]["args"]["root_dir"] = os.path.join(storage, "snapshot")
        for component in resources.get("components", []):
            if component.get("id") == "job_manager":
                component["args"]["uri_root"] = os.path.join(storage, "jobs")
    written = []
    for name, content in (("resources.json", resources), ("authorization.json", AUTHORIZATION)):
        path = os.path.join(local, name)
        with open(path, "w") as f:
            json.dump(content, f, indent=2)
        written.append(path)
    return written


def complete_kits(root: str, storage: str | None = None) -> dict:
    """Complete every server and client kit under `root`; {kit: kind} of those done (admin kits need nothing).

    storage: the server's job/snapshot storage (default `<server kit>/storage`)."""
    kits = find_kits(root)
    if not any(kind == "server" for kind in kits.values()) and not any(kind == "client" for kind in kits.values()):
        raise FileNotFoundError(f"no server or site startup kit under {root} (expected <name>/startup/fed_*.json)")
    done = {}
    for kit, kind in kits.items():
        if kind in ("server", "client"):
            complete_kit(kit, kind, storage or (os.path.join(kit, "storage") if kind == "server" else None))
            done[kit] = kind
    return done
