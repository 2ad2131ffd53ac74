"""Deployment with provisioned kits: complete_kits (the allow-list, GPUs, locked keys), the components NVFlare
admits, the job a site receives, and what a security reviewer asks of a federation: only our component classes run,
only the project admin runs jobs, nobody brings code, and a killed server or site comes back.

The slow tests start real NVFlare servers and sites as separate processes on 127.0.0.1 (free ports) and
always stop them: first through the admin API, then by process group, then every process whose command line
names the test's own folder. One provisioned federation serves all the provisioned checks (module scope)."""

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nvflare.apis.fl_exception import UnsafeComponentError
from nvflare.apis.workspace import Workspace
from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST
from nvflare.app_common.widgets.component_path_authorizer import ComponentPathAuthorizer
from nvflare.fuel.flare_api.api_spec import AuthorizationError
from nvflare.fuel.utils.class_loader import load_class

from fairfl.deploy import admin
from fairfl.deploy.kits import AUTHORIZATION, complete_kits
from fairfl.flare.components import ALLOW_LIST, components, dotted_path
from fairfl.simulate import nvflare_command
from fairfl.tracking import UNCHECKED_RECEIVERS

from deploy_helpers import (
    JOB_TIMEOUT,
    PROJECT_ADMIN,
    fairfl,
    free_port,
    kill_group,
    kill_processes_under,
    mode,
    provision_project,
    read,
    site_env,
)
from helpers import JOBS, REPO, make_job

TEMPLATE = os.path.join(REPO, "provisioning", "project.yml")


def start(kit: str, kind: str, org: str) -> subprocess.Popen:
    """One participant as its start.sh runs it (without the restart loop, so that we hold its process), in a
    process group of its own: killing the group kills it and its job processes, nothing else."""
    module, config, uid = {
        "server": ("server.server_train", "fed_server.json", []),
        "client": ("client.client_train", "fed_client.json", [f"uid={os.path.basename(kit)}"]),
    }[kind]
    command = [
        sys.executable,
        "-u",
        "-m",
        f"nvflare.private.fed.app.{module}",
        "-m",
        kit,
        "-s",
        config,
        "--set",
        "secure_train=true",
        *uid,
        f"org={org}",
        "config_folder=config",
    ]
    with open(os.path.join(kit, "console.txt"), "a") as log:
        return subprocess.Popen(
            command, cwd=kit, env=site_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


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
        time.sleep(1)
    raise TimeoutError(f"sites {names} did not connect within {timeout} s")


# ------------------------------------------------------------------------------------------ fast: kits
def test_complete_kits_allow_lists_our_classes_keeps_gpus_locks_keys_and_never_overwrites_edits(tmp_path):
    root = tmp_path / "ws"
    subprocess.run(
        nvflare_command() + ["provision", "-p", TEMPLATE, "-w", str(root)], check=True, capture_output=True, timeout=120
    )
    prod = root / "fairfl" / "prod_00"
    assert not list(prod.rglob("signature.json"))  # plain 2.9 kits are not signed; mTLS is the trust anchor
    state = root / "fairfl" / "state"
    assert mode(state / "cert.json") & 0o044  # nvflare provision leaves the root CA key readable by all

    def startup_digests():
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in prod.glob("*/startup/*")}

    # links in the folders locked lead outside: what they point at is never changed
    outside = {tmp_path / "thesis.txt": 0o644, tmp_path / "notes": 0o755}
    (tmp_path / "thesis.txt").write_text("keep")
    (tmp_path / "notes").mkdir()
    for target in outside:
        os.chmod(target, outside[target])
    (state / "thesis").symlink_to(tmp_path / "thesis.txt")
    (state / "notes").symlink_to(tmp_path / "notes")
    (prod / "site-1" / "startup" / "thesis.key").symlink_to(tmp_path / "thesis.txt")

    before = startup_digests()
    done = complete_kits(str(prod))
    assert startup_digests() == before
    assert {target: mode(target) for target in outside} == outside
    (prod / "site-1" / "startup" / "thesis.key").unlink()
    assert sorted(os.path.basename(k) for k in done) == ["fl-server.example.org", "site-1", "site-2", "site-3"]
    for site, gpus, mem in (("site-1", 1, 16), ("site-3", 2, 24)):
        resources = json.loads((prod / site / "local" / "resources.json").read_text())
        assert resources["class_list_enforcement_mode"] == "enforce"
        assert set(resources["class_allow_list"]) == set(DEFAULT_CLASS_ALLOW_LIST) - set(UNCHECKED_RECEIVERS) | set(
            ALLOW_LIST
        )
        assert not [e for e in resources["class_allow_list"] if e.startswith("fairfl.") and e not in ALLOW_LIST]
        manager = next(c for c in resources["components"] if c["id"] == "resource_manager")
        assert (manager["args"]["num_of_gpus"], manager["args"]["mem_per_gpu_in_GiB"]) == (gpus, mem)
        policy = json.loads((prod / site / "local" / "authorization.json").read_text())
        assert policy == AUTHORIZATION
        rights = policy["permissions"]
        assert [r for r in rights if rights[r].get("submit_job") == "any"] == ["project_admin"]
        assert all(r.get("byoc", "none") == "none" for r in rights.values())
        assert rights["project_admin"]["shell_commands"] == "none"  # it could read any site's logs
    server = json.loads((prod / "fl-server.example.org" / "local" / "resources.json").read_text())
    jobs = next(c for c in server["components"] if c["id"] == "job_manager")["args"]["uri_root"]
    assert jobs == str(prod / "fl-server.example.org" / "storage" / "jobs")
    assert set(ALLOW_LIST) <= set(server["class_allow_list"])

    # secrets are owner-only: the provisioning state (root CA key), every kit's startup/ and its key
    assert (mode(state), mode(state / "cert.json")) == (0o700, 0o600)
    for kit in prod.iterdir():
        assert mode(kit / "startup") == 0o700
        assert [mode(key) for key in (kit / "startup").glob("*.key")] == [0o600]

    # re-running writes the same files: fine. A site's edit is never overwritten silently
    complete_kits(str(prod))
    edited = prod / "site-2" / "local" / "authorization.json"
    mine = json.loads(edited.read_text())
    mine["permissions"]["lead"]["view"] = "none"
    edited.write_text(json.dumps(mine))
    untouched = (prod / "site-1" / "local" / "resources.json").read_text()
    (prod / "site-1" / "local" / "resources.json").unlink()
    key = next((prod / "site-2" / "startup").glob("*.key"))
    for secret in (key, state / "cert.json"):
        os.chmod(secret, 0o644)
    with pytest.raises(FileExistsError, match="site-2/local/authorization.json"):
        complete_kits(str(prod))
    assert (mode(key), mode(state / "cert.json")) == (0o600, 0o600)  # locked even so
    assert json.loads(edited.read_text()) == mine
    assert not (prod / "site-1" / "local" / "resources.json").exists()  # nothing written when refusing
    # a kit completed by an older version (the whole package allow-listed) is refused too, then fixed with --force
    old = json.loads(untouched)
    old["class_allow_list"].append("fairfl.")
    (prod / "site-1" / "local" / "resources.json").write_text(json.dumps(old))
    with pytest.raises(FileExistsError, match="site-1/local/resources.json"):
        complete_kits(str(prod))
    out = fairfl("provision-complete", str(prod), "--force")
    assert "keep the provisioning state/ folder" in out
    assert json.loads(edited.read_text()) == AUTHORIZATION
    assert "fairfl." not in json.loads((prod / "site-1" / "local" / "resources.json").read_text())["class_allow_list"]
    complete_kits(str(prod))  # unchanged content: nothing to refuse
    # a site's own resources.json (from the default, its GPU memory changed) is completed, its settings kept
    own = json.loads((prod / "site-3" / "local" / "resources.json.default").read_text())
    next(c for c in own["components"] if c["id"] == "resource_manager")["args"]["mem_per_gpu_in_GiB"] = 40
    own["class_allow_list"] = [*DEFAULT_CLASS_ALLOW_LIST, "hospital.models."]
    (prod / "site-3" / "local" / "resources.json").write_text(json.dumps(own))
    complete_kits(str(prod))
    merged = json.loads((prod / "site-3" / "local" / "resources.json").read_text())
    assert next(c for c in merged["components"] if c["id"] == "resource_manager")["args"]["mem_per_gpu_in_GiB"] == 40
    assert set(merged["class_allow_list"]) == {*own["class_allow_list"], *ALLOW_LIST} - set(UNCHECKED_RECEIVERS)
    merged["class_list_enforcement_mode"] = "disabled"  # a setting completing would change: refused
    (prod / "site-3" / "local" / "resources.json").write_text(json.dumps(merged))
    with pytest.raises(FileExistsError, match="site-3/local/resources.json"):
        complete_kits(str(prod))
    complete_kits(str(prod), force=True)
    resources = prod / "site-1" / "local" / "resources.json"
    for broken, why in (
        ("{not json", "is not a JSON object"),
        ('{"class_allow_list": ["*"]}', "every class allowed"),
        ('{"class_allow_list": "fairfl."}', "must be a list"),
    ):
        resources.write_text(broken)
        with pytest.raises(ValueError, match=f"site-1/local/resources.json.*{why}"):
            complete_kits(str(prod), force=True)
    resources.unlink()

    # a signed kit (HE or confidential computing provisioning) cannot be edited: refused, naming the file
    (prod / "site-2" / "local" / "signature.json").write_text("{}")
    with pytest.raises(ValueError, match="site-2/local/signature.json"):
        complete_kits(str(prod))
    with pytest.raises(FileNotFoundError, match="no server or site startup kit"):
        complete_kits(str(tmp_path))


def job_component_paths(config) -> list:
    """Every component path a job config names, wherever it sits (workflows, executors, filters, components,
    nested arguments)."""
    if isinstance(config, dict):
        own = [config[k] for k in ("path", "class_path") if isinstance(config.get(k), str)]
        return own + [p for v in config.values() for p in job_component_paths(v)]
    if isinstance(config, list):
        return [p for v in config for p in job_component_paths(v)]
    return []


def test_every_shipped_job_names_only_listed_components_and_nvflare_admits_nothing_else_of_fairfl(tmp_path):
    """Through NVFlare's own policy code, with the allow-list provision-complete writes: a new job naming an
    unlisted class fails here, and no function or lookalike of the package passes."""
    configs = glob.glob(os.path.join(JOBS, "*", "app", "config", "*.json"))
    assert len(configs) == 2 * len(os.listdir(JOBS))
    named = {p for c in configs for p in job_component_paths(json.loads(Path(c).read_text()))}
    assert named <= set(ALLOW_LIST), sorted(named - set(ALLOW_LIST))
    assert all(isinstance(c, type) and dotted_path(c) == p for c, p in zip(components(), ALLOW_LIST, strict=True))

    kit = tmp_path / "site-1"
    (kit / "local").mkdir(parents=True)
    (kit / "local" / "resources.json.default").write_text(json.dumps({"format_version": 2}))
    (kit / "startup").mkdir()
    (kit / "startup" / "fed_client.json").write_text("{}")
    complete_kits(str(tmp_path))
    authorizer, workspace = ComponentPathAuthorizer(), Workspace(str(kit), "site-1")
    for path in sorted(named) + ["nvflare.app_common.workflows.fedavg.FedAvg"]:
        authorizer.authorize_component_config({"path": path, "args": {}}, workspace=workspace)
    for path in (
        "fairfl.simulate.run_simulator",
        "fairfl.cli.main",
        "fairfl.jobconfig.customize_job",
        "fairfl.flare.components.dotted_path",
        "fairfl.flare.executor.FairflExecutorX",
        "fairfl.flare.engine.FairRoundController",
        "fairfl.training.save_atomic",
        "os.system",
    ):
        with pytest.raises(UnsafeComponentError, match="not in allow_list"):
            authorizer.authorize_component_config({"path": path}, workspace=workspace)
        with pytest.raises(UnsafeComponentError, match="not in allow_list"):
            authorizer.authorize_component_config({"class_path": path}, workspace=workspace)
    # NVFlare admits `entry.anything` for an exact entry, but its loader imports everything before the last '.'
    # as a module: an attribute of a listed class cannot be reached
    authorizer.authorize_component_config({"path": f"{ALLOW_LIST[0]}.__init__"}, workspace=workspace)
    with pytest.raises(TypeError, match="Can't load class"):
        load_class(f"{ALLOW_LIST[0]}.__init__")


def test_export_job_asks_each_site_for_gpus(tmp_path):
    from nvflare.utils.job_launcher_utils import get_resource_manager_spec, validate_portable_resource_spec

    from fairfl.cli import main

    assert main(["export-job", os.path.join(REPO, "jobs", "fedlwr"), str(tmp_path / "gpu"), "--gpus", "1"]) == 0
    meta = json.loads((tmp_path / "gpu" / "meta.json").read_text())
    validate_portable_resource_spec(meta["resource_spec"])
    # what each site's GPU resource manager is asked for, whatever the site is called
    assert get_resource_manager_spec(meta, "site-7") == {"num_of_gpus": 1}
    # the repo's jobs ask for nothing, so the simulator and CPU-only POC sites run them
    assert json.loads(Path(REPO, "jobs", "fedlwr", "meta.json").read_text())["resource_spec"] == {}


# ------------------------------------------------------------------------------------------ slow: federation
def exported(tmp_path, name, server=None, **client_extra) -> str:
    job = make_job("fedlwr", str(tmp_path / "jobs" / f"{name}_full"), server=server, client_extra=client_extra or None)
    out = tmp_path / "jobs" / name
    fairfl("export-job", job, str(out))
    return str(out)


def with_component(job: str, side: str, path: str, args: dict, meta=None) -> str:
    """`job` with its client executor (side 'client') or server workflow ('server') replaced by `path`(**args)."""
    config_file = os.path.join(job, "app", "config", f"config_fed_{side}.json")
    config = json.loads(Path(config_file).read_text())
    component = config["executors"][0]["executor"] if side == "client" else config["workflows"][0]
    component.update(path=path, args=args)
    Path(config_file).write_text(json.dumps(config))
    if meta:
        meta_file = os.path.join(job, "meta.json")
        Path(meta_file).write_text(json.dumps({**json.loads(Path(meta_file).read_text()), **meta}))
    return job


class Federation:
    """A provisioned mutual-TLS federation on 127.0.0.1: server `localhost`, site-1 (hospital_a), site-2
    (hospital_b), their org admins and leads, the project admin; and a site of another project aimed at it."""

    ORGS = {"localhost": "coordinating_center", "site-1": "hospital_a", "site-2": "hospital_b"}

    def __init__(self, root):
        self.root = root
        port = free_port()
        self.prod = provision_project(root, "fairfl", port)
        complete_kits(self.prod)
        # another project's site aimed at our server, holding our public root CA (so that it trusts our server):
        # its own certificate comes from another root CA, which our server must refuse
        self.foreign = os.path.join(provision_project(root, "other", port, sites=("site-3",)), "site-3")
        shutil.copy(os.path.join(self.prod, "site-1", "startup", "rootCA.pem"), os.path.join(self.foreign, "startup"))
        self.admin_kit, self.processes, self._reference = self.kit(PROJECT_ADMIN), {}, None

    def kit(self, name) -> str:
        return os.path.join(self.prod, name)

    def start(self, name) -> None:
        kind = "server" if name == "localhost" else "client"
        self.processes[name] = start(self.kit(name), kind, self.ORGS[name])

    def kill(self, name) -> None:
        kill_group(self.processes[name])

    def wait_for_sites(self, timeout=120) -> None:
        wait_for_clients(self.admin_kit, PROJECT_ADMIN, ["site-1", "site-2"], timeout)

    def log(self, name, job_id) -> str:
        return read(os.path.join(self.kit(name), job_id, "log.txt"))

    def downloaded(self, job_id, tmp_path) -> str:
        """A finished job's server workspace (results, logs), downloaded as the project admin."""
        return admin.download(self.admin_kit, job_id, str(tmp_path / "downloads"), PROJECT_ADMIN)

    def results(self, job_id, tmp_path) -> dict:
        return json.load(open(admin.find_results(self.downloaded(job_id, tmp_path))))

    def session(self, user=PROJECT_ADMIN):
        return admin.admin_session(self.kit(user), user)

    def reference(self, tmp_path) -> tuple:
        """(job id, results) of a tiny Fed-LWR job run start to end, submitted and downloaded with the CLI (once)."""
        if self._reference is None:
            started = time.time()
            out = fairfl(
                "submit", exported(tmp_path, "reference"), "--admin", self.admin_kit, "--timeout", str(JOB_TIMEOUT)
            )
            job_id, status = re.search(r"^job (\S+): (\S+)$", out, re.M).groups()
            assert status == admin.COMPLETED, out
            print(f"fedlwr job: {time.time() - started:.0f} s")
            out = fairfl("download", job_id, "--admin", self.admin_kit, "-o", str(tmp_path / "downloads"))
            folder = tmp_path / "downloads" / job_id
            assert f"job workspace: {folder}" in out and (folder / "report" / "report.md").is_file()
            self._reference = job_id, json.loads(Path(admin.find_results(str(folder))).read_text())
        return self._reference


@pytest.fixture(scope="module")
def federation(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("federation")
    fed = Federation(root)
    try:
        fed.start("localhost")
        time.sleep(3)
        fed.start("site-1")
        fed.start("site-2")
        fed.foreign_process = start(fed.foreign, "client", "hospital_c")
        fed.wait_for_sites()
        yield fed
        with fed.session() as session:
            session.shutdown_system()
        for process in fed.processes.values():
            process.wait(timeout=60)
    finally:
        for process in [*fed.processes.values(), getattr(fed, "foreign_process", None)]:
            if process and process.poll() is None:
                kill_group(process)
        kill_processes_under(root)


@pytest.mark.slow
def test_provisioned_federation_runs_a_job_and_refuses_a_foreign_site_and_any_other_code(federation, tmp_path):
    # jobs naming a function of the package: `fairfl.` on the allow-list would run them on every site and the
    # server. Each would leave a marker folder if it ran; one also claims BYOC in its meta (NVFlare ignores that)
    markers = tmp_path / "markers"
    at_sites = with_component(
        exported(tmp_path, "at_sites"),
        "client",
        "fairfl.cli.main",
        {"argv": ["prepare-data", "--out", str(markers / "site"), "--image-size", "8", "--num-sites", "2"]},
        meta={"byoc": True},
    )
    at_server = with_component(
        exported(tmp_path, "at_server"),
        "server",
        "fairfl.simulate.run_simulator",
        {"job": os.path.join(JOBS, "fedavg"), "workspace": str(markers / "server"), "timeout": 1},
    )
    hostile = {admin.submit(federation.admin_kit, job, PROJECT_ADMIN): job for job in (at_sites, at_server)}

    job_id, results = federation.reference(tmp_path)
    assert results["method"] == "fedlwr" and results["sites"] == ["site-1", "site-2"]
    assert [r["round"] for r in results["rounds"]] == [0, 1]
    assert set(results["final"]["per_site"]) == {"site-1", "site-2"}

    for bad, job in hostile.items():  # each fails on its own, refused where it was to run
        status = admin.wait(federation.admin_kit, bad, 120, PROJECT_ADMIN)
        assert status.startswith("FINISHED") and status != admin.COMPLETED, status
        if job == at_sites:
            for site in ("site-1", "site-2"):
                assert "'fairfl.cli.main'" in federation.log(site, bad)
                assert "not in allow_list" in federation.log(site, bad)
        else:
            server_log = read(os.path.join(federation.downloaded(bad, tmp_path), "workspace", "log.txt"))
            assert "'fairfl.simulate.run_simulator' at config path 'workflows.#1' is not in allow_list" in server_log
    assert not markers.exists()

    # the foreign site, trying all along (its process still runs), never joined: the server refused its
    # certificate at the TLS handshake (neither side logs that at INFO level)
    with federation.session() as session:
        assert connected_clients(session) == {"site-1", "site-2"}
    assert federation.foreign_process.poll() is None
    assert "site-3" not in read(os.path.join(federation.kit("localhost"), "log.txt"))


@pytest.mark.slow
def test_only_the_project_admin_runs_jobs_nobody_brings_code_and_nobody_reads_a_hospitals_files(federation, tmp_path):
    job_id, _ = federation.reference(tmp_path)
    job = exported(tmp_path, "rights")
    for user in ("it@hospital-a.example.org", "lead@hospital-a.example.org"):
        with federation.session(user) as session:
            assert job_id in {j["job_id"] for j in session.list_jobs()}  # a real session: it may view
            with pytest.raises(AuthorizationError):
                session.submit_job(job)
            with pytest.raises(AuthorizationError):
                session.abort_job(job_id)
            with pytest.raises(AuthorizationError):
                session.download_job_result(job_id, str(tmp_path / "stolen"))
    assert not (tmp_path / "stolen").exists()

    # bring-your-own-code: a job with code in app/custom is refused, even from the project admin: NVFlare stores
    # it, then refuses to deploy it (nobody has the byoc right); no site receives the code
    byoc = tmp_path / "jobs" / "byoc"
    shutil.copytree(job, byoc)
    (byoc / "app" / "custom").mkdir()
    (byoc / "app" / "custom" / "evil.py").write_text("import os\nos.system('touch /tmp/pwned')\n")
    with federation.session() as session:
        refused = session.submit_job(str(byoc))
        assert session.wait_for_job(refused, timeout=120, poll_interval=1)["status"] != admin.COMPLETED
    log = read(os.path.join(federation.kit("localhost"), "log.txt"))
    assert f"Failed to run the Job ({refused}): RuntimeError: Failed to deploy app 'app': BYOC not permitted" in log
    assert not glob.glob(os.path.join(federation.prod, "*", "**", "evil.py"), recursive=True)

    with federation.session() as session:
        # shell commands at a hospital are its own org admins': the project admin cannot read a site's files
        for command in (lambda: session.cat_target("site-1", file="log.txt"), lambda: session.ls_target("site-1")):
            with pytest.raises(AuthorizationError):
                command()
    with federation.session("it@hospital-a.example.org") as session:
        assert "client.key" in session.ls_target("site-1", path="startup")
        assert "site-1" in session.cat_target("site-1", file="log.txt")
        with pytest.raises(AuthorizationError):
            session.ls_target("site-2")


@pytest.mark.slow
def test_a_site_then_the_server_killed_mid_run_come_back_and_the_named_run_resumes_to_the_same_result(
    federation, tmp_path
):
    """One interrupted run for both restarts (each costs a job): after round 0, site-2 is killed and restarted,
    then the server (the sites stay up). NVFlare 2.9 hands a running job neither to a restarted site nor to a
    restarted server; the admin submits the named run again, and it resumes after round 0 with site-2 back."""
    _, reference = federation.reference(tmp_path)
    job = exported(tmp_path, "trial", server={"run_name": "trial"})
    # site-2 must be killed while round 1 still waits for it: NVFlare's default 2 s between a site's answer and its
    # next request leaves that window (the jobs' 0.2 s can let a tiny round 1 end first); it changes no number
    server_config = os.path.join(job, "app", "config", "config_fed_server.json")
    config = json.loads(Path(server_config).read_text())
    Path(server_config).write_text(json.dumps({**config, "server": {"task_request_interval": 2.0}}))
    first = admin.submit(federation.admin_kit, job, PROJECT_ADMIN)
    checkpoint = os.path.join(federation.kit("localhost"), "fairfl_runs", "trial", "checkpoint.pt")
    deadline = time.time() + JOB_TIMEOUT
    while not os.path.exists(checkpoint):
        assert time.time() < deadline, "round 0 never finished"
        time.sleep(0.2)
    server_log, old_site = os.path.join(federation.kit("localhost"), "log.txt"), federation.processes["site-2"].pid
    logins = read(server_log).count("New client site-2@")
    federation.kill("site-2")  # the site and its job process, mid-job: round 1 now waits for it
    federation.start("site-2")
    deadline = time.time() + 120
    while read(server_log).count("New client site-2@") == logins:  # the server logs the restarted site in
        assert time.time() < deadline, "the restarted site-2 never came back"
        time.sleep(0.5)
    sites = {s: federation.processes[s].pid for s in ("site-1", "site-2")}
    assert sites["site-2"] != old_site
    federation.kill("localhost")  # the server and its job process; the sites stay up
    federation.start("localhost")
    federation.wait_for_sites()
    assert {s: federation.processes[s].pid for s in sites} == sites
    assert all(federation.processes[s].poll() is None for s in sites)
    with federation.session() as session:  # NVFlare 2.9 neither restarts nor closes a job the server lost
        assert session.get_job_meta(first)["status"] == "RUNNING"

    # the admin submits the same job again: the named run continues after its last completed round
    second = admin.submit(federation.admin_kit, job, PROJECT_ADMIN)
    assert admin.wait(federation.admin_kit, second, JOB_TIMEOUT, PROJECT_ADMIN) == admin.COMPLETED
    resumed = federation.results(second, tmp_path)
    assert resumed["resumed"] == 1 and [r["round"] for r in resumed["rounds"]] == [0, 1]
    assert set(resumed["rounds"][1]["train"]) == {"site-1", "site-2"}  # the restarted site rejoined
    # the same as the run that never stopped: every round's layer weights and training losses, the final Dice
    for ours, theirs in zip(resumed["rounds"], reference["rounds"], strict=True):
        for layer, weights in theirs["layer_weights"].items():
            assert ours["layer_weights"][layer] == pytest.approx(weights, abs=1e-9)
        for site in theirs["train"]:
            assert ours["train"][site]["train_loss"] == pytest.approx(theirs["train"][site]["train_loss"], abs=1e-9)
    for site, metrics in reference["final"]["per_site"].items():
        assert resumed["final"]["per_site"][site]["dice"] == pytest.approx(metrics["dice"], abs=1e-9)
