"""Container kits (docs/deployment.md, "Containers"): provisioning/project_docker.yml makes the default kits plus a
`startup/docker.sh` in the server's and each site's kit, which runs the kit's start loop in the fairfl image with
the kit and the site's data mounted and the site's GPUs; provisioning/docker/Dockerfile installs this repository
with the project's pins, copies no kit or key, and runs as a user other than root.

docker.sh is run with a stand-in `docker` on PATH that records its arguments (this machine may have no daemon); the
image itself is built only where a daemon answers (`docker info`)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import fairfl
from fairfl.deploy.kits import ContainerBuilder, find_kits
from fairfl.simulate import nvflare_command

from deploy_helpers import fairfl as fairfl_cli
from helpers import REPO

PROVISIONING = Path(REPO) / "provisioning"
DOCKERFILE = PROVISIONING / "docker" / "Dockerfile"
BUILDER = "fairfl.deploy.kits.ContainerBuilder"
# a stand-in docker: `container inspect` finds a container only when FAKE_CONTAINER names it; `run` records its
# arguments one a line
FAKE_DOCKER = """#!/usr/bin/env bash
if [ "$1" = container ]; then [ "$3" = "${FAKE_CONTAINER:-}" ]; exit; fi
printf '%s\\n' "$@" > "$FAKE_DOCKER_ARGS"
"""


def provision(project: Path, workspace: Path) -> Path:
    subprocess.run(
        nvflare_command() + ["provision", "-p", str(project), "-w", str(workspace)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return workspace / "fairfl" / "prod_00"


def kit_files(prod: Path) -> set:
    return {str(p.relative_to(prod)) for p in prod.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    """The kits of project_docker.yml and of project.yml, provisioned side by side."""
    root = tmp_path_factory.mktemp("container_kits")
    return provision(PROVISIONING / "project_docker.yml", root / "docker"), provision(
        PROVISIONING / "project.yml", root / "default"
    )


def run_docker_sh(kit: Path, tmp_path: Path, *args, **env) -> tuple:
    """(exit code, stderr, the arguments docker got) of the kit's docker.sh with the stand-in docker."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    recorded = tmp_path / "docker_args"
    recorded.unlink(missing_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAIRFL_")}
    environ.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_DOCKER_ARGS=str(recorded), **env)
    proc = subprocess.run(
        ["bash", str(kit / "startup" / "docker.sh"), *args], env=environ, capture_output=True, text=True, timeout=30
    )
    return proc.returncode, proc.stderr, recorded.read_text().splitlines() if recorded.exists() else None


def flag_values(args: list, flag: str) -> list:
    return [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == flag]


def test_project_docker_is_project_yml_plus_the_container_builder():
    default = yaml.safe_load((PROVISIONING / "project.yml").read_text())
    docker = yaml.safe_load((PROVISIONING / "project_docker.yml").read_text())
    added = [b for b in docker["builders"] if b["path"] == BUILDER]
    assert len(added) == 1
    assert {**docker, "builders": [b for b in docker["builders"] if b["path"] != BUILDER]} == default
    # written into startup/ before the certificates and any signature are made
    paths = [b["path"] for b in docker["builders"]]
    assert paths.index(BUILDER) < paths.index("nvflare.lighter.impl.cert.CertBuilder")
    # the images are those the Dockerfile's build commands tag, of this version
    tags = {added[0]["args"]["image"], added[0]["args"]["gpu_image"]}
    assert tags == {f"fairfl:{fairfl.__version__}", f"fairfl:{fairfl.__version__}-cuda"}
    assert tags == set(re.findall(r"-t (\S+) \.$", DOCKERFILE.read_text(), re.M))


def test_the_default_kits_stay_as_they_are_and_the_container_kits_only_add_docker_sh(kits):
    docker, default = kits
    assert not list(default.rglob("docker.sh"))
    kinds = find_kits(str(docker))
    added = {f"{os.path.basename(kit)}/startup/docker.sh" for kit, kind in kinds.items() if kind != "admin"}
    assert len(added) == 4  # the server and site-1..3
    assert kit_files(docker) == kit_files(default) | added
    # provision-complete treats them as any kit: it writes local/ only, docker.sh stays as provisioned
    scripts = {path: (docker / path).read_bytes() for path in added}
    fairfl_cli("provision-complete", str(docker))
    assert {path: (docker / path).read_bytes() for path in added} == scripts
    assert all(os.access(docker / path, os.X_OK) for path in added)


def test_each_docker_sh_runs_its_kit_s_start_loop_in_the_image_with_the_data_and_the_gpus(kits, tmp_path):
    docker, _ = kits
    project = yaml.safe_load((PROVISIONING / "project_docker.yml").read_text())
    settings = next(b["args"] for b in project["builders"] if b["path"] == BUILDER)
    data_root = tmp_path / "data"
    data_root.mkdir()
    for participant in project["participants"]:
        if participant["type"] == "admin":
            continue
        name, kit = participant["name"], docker / participant["name"]
        script = (kit / "startup" / "docker.sh").read_text()
        gpus = participant.get("capacity", {}).get("num_of_gpus", 0)
        image = settings["gpu_image"] if gpus else settings["image"]
        assert f'IMAGE="${{FAIRFL_IMAGE:-{image}}}"' in script
        if participant["type"] == "client":
            assert f'DATA_ROOT="${{FAIRFL_DATA_ROOT-{settings["data_root"]}}}"' in script
        (kit / "daemon_pid.fl").write_text("1")  # what a killed container leaves
        code, err, args = run_docker_sh(kit, tmp_path, FAIRFL_DATA_ROOT=str(data_root), FAIRFL_SHARE_OWN_MODEL="0")
        assert code == 0, err
        assert not (kit / "daemon_pid.fl").exists()
        assert args[0] == "run" and "-d" not in args
        # the image, then the kit's own start command, which exists at the same path in the container
        assert args[-2:] == [image, f"{kit}/startup/sub_start.sh"] and (kit / "startup" / "sub_start.sh").is_file()
        assert flag_values(args, "--name") == [name]
        assert flag_values(args, "-u") == [f"{os.getuid()}:{os.getgid()}"]
        assert flag_values(args, "-v") == [f"{kit}:{kit}", f"{data_root}:{data_root}:ro"]
        assert f"FAIRFL_DATA_ROOT={data_root}" in flag_values(args, "-e")
        assert "FAIRFL_SHARE_OWN_MODEL" in flag_values(args, "-e")  # the site's own settings go in
        assert flag_values(args, "--gpus") == ([str(gpus)] if gpus else [])

    site = docker / "site-1"
    # the provisioned data root, missing on this machine: refused before docker runs (it would create it empty)
    code, err, args = run_docker_sh(site, tmp_path)
    assert code == 1 and args is None and f"no data root {settings['data_root']}" in err
    # empty: no data mount (built-in data), no GPU; -d: in the background; another image
    code, err, args = run_docker_sh(site, tmp_path, "-d", FAIRFL_DATA_ROOT="", FAIRFL_GPUS="", FAIRFL_IMAGE="x:1")
    assert code == 0, err
    assert flag_values(args, "-v") == [f"{site}:{site}"] and "--gpus" not in args and "-d" in args
    assert args[-2] == "x:1"
    # a container of that name already there: refused, its pid files left alone
    (site / "daemon_pid.fl").write_text("7")
    code, err, args = run_docker_sh(site, tmp_path, FAIRFL_DATA_ROOT="", FAKE_CONTAINER="site-1")
    assert code == 1 and args is None and "exists already" in err and (site / "daemon_pid.fl").exists()


@pytest.mark.parametrize(
    "args",
    [
        {"image": ""},
        {"image": "fairfl;rm -rf /"},
        {"image": "a", "gpu_image": "$(id)"},
        {"image": "a", "data_root": "data"},
        {"image": "a", "data_root": "/srv/$(id)"},
    ],
)
def test_the_container_builder_refuses_what_is_no_image_name_or_absolute_path(args):
    with pytest.raises(ValueError, match="ContainerBuilder"):
        ContainerBuilder(**args)


# ------------------------------------------------------------------------------------------ the image
def pinned(path: Path, package: str) -> str:
    versions = set(re.findall(rf"{package}==([\w.]+)", path.read_text()))
    assert len(versions) == 1, f"{path}: {package} pins {versions}"
    return versions.pop()


def instructions(name: str) -> list:
    lines = DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
    return [line.split(None, 1)[1] for line in lines if line.split(None, 1)[:1] == [name]]


def test_the_dockerfile_pins_what_the_project_pins():
    assert pinned(DOCKERFILE, "torch") == pinned(Path(REPO) / "scripts" / "setup.sh", "torch")
    assert pinned(DOCKERFILE, "nvflare") == pinned(Path(REPO) / "setup.cfg", "nvflare")


def test_the_image_installs_this_repository_copies_no_kit_or_key_and_runs_as_a_user(tmp_path):
    copied = [source for line in instructions("COPY") for source in line.split()[:-1]]
    assert copied == ["pyproject.toml", "setup.cfg", "README.md", "custom/fairfl"]
    assert not [s for s in copied if re.search(r"startup|\.key|state|workspace|poc|data|\.venv", s)]
    # the build context holds nothing else either
    ignored = [line for line in (Path(REPO) / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert ignored[0] == "*" and [line[1:] for line in ignored if line[0] == "!"] == copied
    # what it installs is the package copied, with nvflare pinned
    assert any(re.fullmatch(r"pip install nvflare==[\w.]+ /src .*", line) for line in instructions("RUN"))
    users = instructions("USER")
    assert users and users[-1] not in ("root", "0") and not users[-1].startswith("0:")
    # those files alone build the package
    context = tmp_path / "src"
    context.mkdir()
    for source in copied:
        (shutil.copytree if (Path(REPO) / source).is_dir() else shutil.copy)(Path(REPO) / source, context / source)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), context],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert (tmp_path / f"fairfl-{fairfl.__version__}-py3-none-any.whl").is_file()


def docker_daemon() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not docker_daemon(), reason="no docker daemon")
def test_the_image_builds_and_runs_fairfl_as_a_user():
    tag = "fairfl:test-container-kits"
    subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "-t", tag, REPO], check=True, timeout=3600)
    try:
        out = subprocess.run(
            ["docker", "run", "--rm", tag, "python", "-c", "import os, fairfl, nvflare, torch; print(os.getuid())"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout
        assert out.split() != ["0"]
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True, timeout=120)
