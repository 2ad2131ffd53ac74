"""Deployment: provisioned kits with mutual TLS, the POC commands, the dashboard's API.

The slow tests start real NVFlare servers and sites as separate processes on 127.0.0.1 (free ports) and
always stop them: first through the admin API or `nvflare poc stop`, then by process id (every process
whose command line names the test's own folder)."""

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import yaml
from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

from conftest import REPO, make_job
from fairfl.deploy import admin
from fairfl.deploy.kits import AUTHORIZATION, complete_kits
from fairfl.simulate import nvflare_command

TESTS = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(REPO, "provisioning", "project.yml")
JOB_TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def provision(tmp_path, name: str, port: int, sites=("site-1", "site-2")) -> str:
    """The repo's project.yml template, cut down to a loopback server and `sites` without GPUs; prod folder."""
    project = yaml.safe_load(open(TEMPLATE))
    project["name"] = name
    participants = []
    for p in project["participants"]:
        if p["type"] == "server":
            participants.append({**p, "name": "localhost", "fed_learn_port": port})
        elif p["type"] == "client" and p["name"] in sites:
            participants.append({k: v for k, v in p.items() if k != "capacity"})  # this machine has no GPU
        elif p["type"] == "admin" and p["role"] == "project_admin":
            participants.append(p)
    project["participants"] = participants
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(project))
    subprocess.run(nvflare_command() + ["provision", "-p", str(path), "-w", str(tmp_path / name)], check=True,
                   capture_output=True, timeout=120)
    return str(tmp_path / name / name / "prod_00")


def site_env(**extra) -> dict:
    python_path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), TESTS) if p)
    return {**os.environ, "PYTHONPATH": python_path, "OMP_WAIT_POLICY": "PASSIVE", **extra}


def start(kit: str, kind: str, org: str) -> subprocess.Popen:
    """One participant as its start.sh runs it (without the restart loop, so that we hold its process)."""
    module, config, uid = {"server": ("server.server_train", "fed_server.json", []),
                           "client": ("client.client_train", "fed_client.json",
                                      [f"uid={os.path.basename(kit)}"])}[kind]
    command = [sys.executable, "-u", "-m", f"nvflare.private.fed.app.{module}", "-m", kit, "-s", config,
               "--set", "secure_train=true", *uid, f"org={org}", "config_folder=config"]
    with open(os.path.join(kit, "console.txt"), "w") as log:
        return subprocess.Popen(command, cwd=kit, env=site_env(), stdout=log, stderr=subprocess.STDOUT)


def fairfl(*args, env=None, timeout=300) -> str:
    """Run `fairfl ARGS` as a user would; its output (it must succeed)."""
    proc = subprocess.run([sys.executable, "-m", "fairfl.cli", *args], env=env or site_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"fairfl {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def kill_processes_under(folder: str) -> None:
    """Kill every process whose command line names `folder` (all of them started by this test)."""
    folder = str(folder)
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if folder in cmdline:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def connected_clients(session) -> set:
    return {c.name for c in session.get_system_info().client_info}


def wait_for_clients(kit, user, names, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with admin.admin_session(kit, user, timeout=10) as session:
                if connected_clients(session) >= set(names):
                    return
        except Exception:
            pass
        time.sleep(3)
    raise TimeoutError(f"sites {names} did not connect within {timeout} s")


def read(path) -> str:
    return open(path, errors="replace").read() if os.path.exists(path) else ""


# ------------------------------------------------------------------------------------------ fast: kits
def test_complete_kits_allow_lists_fairfl_keeps_gpus_and_leaves_startup_untouched(tmp_path):
    root = tmp_path / "ws"
    subprocess.run(nvflare_command() + ["provision", "-p", TEMPLATE, "-w", str(root)], check=True,
                   capture_output=True, timeout=120)
    prod = root / "fairfl" / "prod_00"
    assert not list(prod.rglob("signature.json"))  # plain 2.9 kits are not signed; mTLS is the trust anchor

    def startup_digests():
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in prod.glob("*/startup/*")}

    before = startup_digests()
    done = complete_kits(str(prod))
    assert startup_digests() == before
    assert sorted(os.path.basename(k) for k in done) == ["fl-server.example.org", "site-1", "site-2", "site-3"]
    for site, gpus, mem in (("site-1", 1, 16), ("site-3", 2, 24)):
        resources = json.loads((prod / site / "local" / "resources.json").read_text())
        assert resources["class_list_enforcement_mode"] == "enforce"
        assert set(resources["class_allow_list"]) == set(DEFAULT_CLASS_ALLOW_LIST) | {"fairfl."}
        manager = next(c for c in resources["components"] if c["id"] == "resource_manager")
        assert (manager["args"]["num_of_gpus"], manager["args"]["mem_per_gpu_in_GiB"]) == (gpus, mem)
        policy = json.loads((prod / site / "local" / "authorization.json").read_text())
        assert policy == AUTHORIZATION
        rights = policy["permissions"]
        assert [r for r in rights if rights[r].get("submit_job") == "any"] == ["project_admin"]
        assert all(r.get("byoc", "none") == "none" for r in rights.values())
    server = json.loads((prod / "fl-server.example.org" / "local" / "resources.json").read_text())
    jobs = next(c for c in server["components"] if c["id"] == "job_manager")["args"]["uri_root"]
    assert jobs == str(prod / "fl-server.example.org" / "storage" / "jobs")
    assert "fairfl." in server["class_allow_list"]

    # a signed kit (HE or confidential computing provisioning) cannot be edited: refused, naming the file
    (prod / "site-2" / "local" / "signature.json").write_text("{}")
    with pytest.raises(ValueError, match="site-2/local/signature.json"):
        complete_kits(str(prod))
    with pytest.raises(FileNotFoundError, match="no server or site startup kit"):
        complete_kits(str(tmp_path))


def test_submitted_job_leaves_out_custom(tmp_path):
    job = os.path.join(REPO, "jobs", "fedlwr")
    copy = admin.without_custom(job, str(tmp_path))
    assert os.path.basename(copy) == "fedlwr" and not os.path.exists(os.path.join(copy, "app", "custom"))
    assert admin.without_custom(copy, str(tmp_path / "again")) == copy
    with pytest.raises(FileNotFoundError, match="not a job folder"):
        admin.without_custom(str(tmp_path), str(tmp_path))


# ------------------------------------------------------------------------------------------ fast: dashboard
def test_dashboard_api_serves_the_project_and_refuses_a_wrong_password(tmp_path):
    from fairfl.deploy.dashboard import API, make_app

    with pytest.raises(ValueError, match="no dashboard database"):
        make_app(str(tmp_path / "empty"))
    client = make_app(str(tmp_path / "dash"), "admin@fairfl.org", "s3cret-Pass", "fairfl").test_client()
    assert client.post(f"{API}/login", json={"email": "admin@fairfl.org", "password": "wrong"}).status_code == 401
    login = client.post(f"{API}/login", json={"email": "admin@fairfl.org", "password": "s3cret-Pass"})
    assert login.status_code == 200 and login.json["user"]["role"] == "project_admin"
    auth = {"Authorization": f"Bearer {login.json['access_token']}"}
    assert client.get(f"{API}/clients").status_code == 401  # no token, no sites

    project = {"short_name": "fairfl", "title": "Fair FL", "server1": "localhost", "frozen": False}
    assert client.patch(f"{API}/project", json=project, headers=auth).json["status"] == "ok"
    site = client.post(f"{API}/clients", json={"name": "site-1", "organization": "hospital_a",
                                               "capacity": {"num_of_gpus": 1, "mem_per_gpu_in_GiB": 16}},
                       headers=auth)
    assert site.status_code == 201
    site_id = site.json["client"]["id"]
    client.patch(f"{API}/clients/{site_id}", json={"approval_state": 100}, headers=auth)
    client.patch(f"{API}/project", json={"frozen": True}, headers=auth)  # freezing creates the root CA

    got = client.get(f"{API}/project").json["project"]
    assert (got["short_name"], got["server1"], got["frozen"], got["num_clients"]) == ("fairfl", "localhost", True, 1)
    users = client.get(f"{API}/users", headers=auth).json["user_list"]
    assert [u["email"] for u in users] == ["admin@fairfl.org"]
    assert [c["name"] for c in client.get(f"{API}/clients", headers=auth).json["client_list"]] == ["site-1"]
    if not (shutil.which("zip") and shutil.which("unzip")):
        pytest.skip("the dashboard zips startup kits with the `zip` program, not installed here")
    kit = client.post(f"{API}/clients/{site_id}/blob", json={"pin": "1234"}, headers=auth)
    assert kit.status_code == 200 and kit.data[:2] == b"PK"  # a zip (password: the pin)
    (tmp_path / "site-1.zip").write_bytes(kit.data)
    subprocess.run(["unzip", "-q", "-P", "1234", str(tmp_path / "site-1.zip"), "-d", str(tmp_path / "kit")],
                   check=True)
    assert json.loads((tmp_path / "kit" / "startup" / "fed_client.json").read_text())["client"]["fqsn"] == "site-1"


# ------------------------------------------------------------------------------------------ slow: real processes
@pytest.fixture
def cleanup(tmp_path):
    """Whatever a test started under tmp_path is killed at the end, even when it failed half-way."""
    yield
    kill_processes_under(tmp_path)


def exported(tmp_path, name, **client_extra) -> str:
    job = make_job("fedlwr", str(tmp_path / "jobs" / f"{name}_full"), client_extra=client_extra or None)
    out = tmp_path / "jobs" / name
    fairfl("export-job", job, str(out))
    return str(out)


@pytest.mark.slow
def test_provisioned_mtls_federation_runs_fedlwr_refuses_a_foreign_site_and_an_unlisted_class(
        tmp_path, cache_dir, cleanup):
    port = free_port()
    prod = provision(tmp_path, "fairfl", port)
    complete_kits(prod)
    # another project's site aimed at our server, holding our public root CA (so that it trusts our server):
    # its own certificate comes from another root CA, which our server must refuse
    foreign = provision(tmp_path, "other", port, sites=("site-3",))
    shutil.copy(os.path.join(prod, "site-1", "startup", "rootCA.pem"), os.path.join(foreign, "site-3", "startup"))
    admin_kit = os.path.join(prod, "admin@coordinating-center.example.org")
    user = os.path.basename(admin_kit)
    server = os.path.join(prod, "localhost")

    processes = [start(server, "server", "coordinating_center")]
    time.sleep(3)
    processes += [start(os.path.join(prod, "site-1"), "client", "hospital_a"),
                  start(os.path.join(prod, "site-2"), "client", "hospital_b"),
                  start(os.path.join(foreign, "site-3"), "client", "hospital_c")]
    try:
        wait_for_clients(admin_kit, user, ["site-1", "site-2"])
        started = time.time()
        out = fairfl("submit", exported(tmp_path, "fedlwr"), "--admin", admin_kit, "--no-wait")
        good = re.search(r"^job (\S+) submitted$", out, re.M).group(1)
        # the sites' allow-list admits fairfl., not the test's fault filter: they must refuse to build it
        bad = admin.submit(admin_kit, exported(tmp_path, "unlisted", task_result_filters=[
            {"tasks": ["train"], "filters": [{"path": "faults.CorruptResult", "args": {"site": "x"}}]}]), user)
        assert admin.wait(admin_kit, good, JOB_TIMEOUT, user) == admin.COMPLETED
        print(f"fedlwr job: {time.time() - started:.0f} s")
        out = fairfl("download", good, "--admin", admin_kit, "-o", str(tmp_path / "downloads"))
        folder = tmp_path / "downloads" / good
        assert f"job workspace: {folder}" in out and (folder / "report" / "report.md").is_file()
        results = json.load(open(admin.find_results(str(folder))))
        assert results["method"] == "fedlwr" and results["sites"] == ["site-1", "site-2"]
        assert [r["round"] for r in results["rounds"]] == [0, 1]
        assert set(results["final"]["per_site"]) == {"site-1", "site-2"}

        # the job fails on its own: the sites report the refused component
        status = admin.wait(admin_kit, bad, 120, user)
        assert status.startswith("FINISHED") and status != admin.COMPLETED, status
        for site in ("site-1", "site-2"):
            assert "'faults.CorruptResult'" in read(os.path.join(prod, site, bad, "log.txt"))
            assert "not in allow_list" in read(os.path.join(prod, site, bad, "log.txt"))

        # the foreign site, trying all along (its process still runs), never joined: the server refused its
        # certificate at the TLS handshake (neither side logs that at INFO level)
        with admin.admin_session(admin_kit, user) as session:
            assert connected_clients(session) == {"site-1", "site-2"}
        assert processes[3].poll() is None
        assert "site-3" not in read(os.path.join(server, "log.txt"))
        with admin.admin_session(admin_kit, user) as session:
            session.shutdown_system()
        for process in processes[:3]:  # the foreign site is not part of this federation: killed below
            process.wait(timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


@pytest.mark.slow
def test_poc_commands_prepare_start_submit_download_stop_clean(tmp_path, cache_dir, cleanup):
    workspace = tmp_path / "poc"
    # nvflare poc keeps its settings in ~/.nvflare: a home of the test's own
    env = site_env(HOME=str(tmp_path / "home"), NVFLARE_POC_WORKSPACE=str(workspace))

    def poc(*args):
        return fairfl("poc", *args, env=env)

    port = free_port()
    poc("prepare", "-n", "2", "--port", str(port))
    site_resources = json.loads((workspace / "fairfl" / "prod_00" / "site-1" / "local" / "resources.json").read_text())
    assert "fairfl." in site_resources["class_allow_list"]
    started = False
    try:
        poc("start", "--timeout", "120")
        started = True
        if shutil.which("ss"):  # the server port is bound on loopback only
            listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
            ours = [line for line in listening.splitlines() if f":{port} " in line]
            assert ours and all("127.0.0.1:" in line for line in ours), ours

        t0 = time.time()
        out = poc("submit", make_job("fedavg", str(tmp_path / "fedavg")), "--timeout", str(JOB_TIMEOUT))
        print(f"POC fedavg job: {time.time() - t0:.0f} s")
        job_id, status = re.search(r"^job (\S+): (\S+)$", out, re.M).groups()
        assert status == "FINISHED:COMPLETED", out
        out = poc("download")  # the last job submitted
        folder = tmp_path / "poc-results" / job_id
        assert str(folder) in out and "| FedAvg |" in out
        results = json.load(open(admin.find_results(str(folder))))
        assert results["sites"] == ["site-1", "site-2"] and results["final"]
        assert (folder / "report" / "report.md").is_file()
    finally:
        if started:
            poc("stop")
    poc("clean")
    assert not workspace.exists()


def test_export_job_asks_each_site_for_gpus(tmp_path):
    from nvflare.utils.job_launcher_utils import get_resource_manager_spec, validate_portable_resource_spec

    from fairfl.cli import main

    assert main(["export-job", os.path.join(REPO, "jobs", "fedlwr"), str(tmp_path / "gpu"), "--gpus", "1"]) == 0
    meta = json.loads((tmp_path / "gpu" / "meta.json").read_text())
    validate_portable_resource_spec(meta["resource_spec"])
    # what each site's GPU resource manager is asked for, whatever the site is called
    assert get_resource_manager_spec(meta, "site-7") == {"num_of_gpus": 1}
    # the repo's jobs ask for nothing, so the simulator and CPU-only POC sites run them
    assert json.loads(open(os.path.join(REPO, "jobs", "fedlwr", "meta.json")).read())["resource_spec"] == {}
