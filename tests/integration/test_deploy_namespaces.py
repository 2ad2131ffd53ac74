"""A provisioned mutual-TLS federation between hospitals: the server and each site in a network namespace of its own,
joined by a bridge, the server known by a host name that only the namespaces resolve. A job runs end to end while
one site's link is cut for longer than a heartbeat and comes back.

Needs root and iproute2 (`ip netns`); skipped, saying why, where either is missing. Nothing is added to the root
namespace: the bridge lives in a namespace of its own, so parallel runs (names carry the test's PID) cannot clash.
Every namespace, /etc/netns/<name> folder and process the test makes is removed or killed, also on failure."""

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from fairfl.deploy import admin
from fairfl.deploy.kits import complete_kits

from deploy_helpers import (
    JOB_TIMEOUT,
    PROJECT_ADMIN,
    fairfl,
    fairfl_command,
    kill_group,
    kill_processes_under,
    provision_project,
    read,
    site_env,
)
from helpers import make_job

SERVER = "server.hospitals.test"  # .test is reserved (RFC 2606): no DNS answers for it
PORT = 8102  # each run has its own namespaces, so a fixed port cannot be taken
SUBNET = "10.213.0"  # a /24 inside the test's bridge namespace only; never routed in the root namespace
ADDRESSES = {"server": f"{SUBNET}.1", "site-1": f"{SUBNET}.11", "site-2": f"{SUBNET}.12"}
# NVFlare's sites send a heartbeat every 10 s (a job's) and give up a message after 5 s; the job waits for every
# site (2 of 2 is the quorum), so a link down this long stalls a round without ending it
DROP_SECONDS = 12
NETNS_CONFIG = Path("/etc/netns")  # `ip netns exec NAME` bind-mounts /etc/netns/NAME/hosts over /etc/hosts


def ip(*args, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def namespaces_unavailable() -> str:
    """Why this machine cannot run the test ('' when it can): root, `ip`, namespaces, veth pairs and bridges."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "no `ip` command (iproute2)"
    probe = f"fairfl{os.getpid()}-probe"
    try:
        for args in (
            ("netns", "add", probe),
            ("-n", probe, "link", "add", "name", "a", "type", "veth", "peer", "name", "b"),
            ("-n", probe, "link", "add", "name", "br", "type", "bridge"),
        ):
            proc = ip(*args, check=False)
            if proc.returncode:
                return f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}"
        return ""
    finally:
        ip("netns", "del", probe, check=False)


class HospitalNetwork:
    """A namespace per participant, each with `eth0` at its address, veth-paired to a port named after the
    participant on a bridge in a namespace of its own (the switch between the hospitals), and a hosts file
    naming the server."""

    def __init__(self):
        self.switch = f"fairfl{os.getpid()}-switch"
        self.names = {who: f"fairfl{os.getpid()}-{who}" for who in ADDRESSES}
        self.made_config_root, self.created, self.configs = not NETNS_CONFIG.exists(), [], []

    def __enter__(self):
        try:
            self._add(self.switch)
            ip("-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            hosts = f"127.0.0.1 localhost\n{ADDRESSES['server']} {SERVER}\n"
            for who, ns in self.names.items():
                self._add(ns)
                (NETNS_CONFIG / ns).mkdir(parents=True)  # never one left by another run: that is an error
                self.configs.append(NETNS_CONFIG / ns)
                (NETNS_CONFIG / ns / "hosts").write_text(hosts)
                ip("-n", self.switch, "link", "add", "name", who, "type", "veth", "peer", "name", "eth0", "netns", ns)
                ip("-n", self.switch, "link", "set", who, "master", "br0", "up")
                ip("-n", ns, "addr", "add", f"{ADDRESSES[who]}/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
                ip("-n", ns, "link", "set", "lo", "up")  # NVFlare's job processes talk to their parent over it
        except BaseException:
            self.__exit__()
            raise
        return self

    def _add(self, ns):
        ip("netns", "add", ns)
        self.created.append(ns)

    def exec(self, who) -> list:
        return ["ip", "netns", "exec", self.names[who]]

    def link(self, who, up: bool) -> None:
        """The participant's port on the switch up or down: its cable, as the hospital's network sees it."""
        ip("-n", self.switch, "link", "set", who, "up" if up else "down")

    def __exit__(self, *_):
        for ns in reversed(self.created):  # deleting a namespace deletes its veth ends and bridge
            ip("netns", "del", ns, check=False)
        for folder in self.configs:
            shutil.rmtree(folder, ignore_errors=True)
        if self.made_config_root:
            with contextlib.suppress(OSError):
                NETNS_CONFIG.rmdir()  # only if empty: another run may be using it


def kit_env() -> dict:
    """A participant's environment: the venv's python3 first on PATH (the kits' scripts run `python3`), one
    OpenMP thread that sleeps while waiting (2 cores, other work beside)."""
    path = os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", "")))
    return site_env(PATH=path, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")


def start_kit(net, who, kit) -> subprocess.Popen:
    """The kit's own start script without its restart loop (`--once`, which execs python): `ip netns exec` execs
    too, so the PID is the participant's, and its process group holds its job processes."""
    with open(os.path.join(kit, "console.txt"), "a") as log:
        return subprocess.Popen(
            [*net.exec(who), "bash", os.path.join(kit, "startup", "sub_start.sh"), "--once"],
            cwd=kit,
            env=kit_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_until(condition, timeout, what, processes=()) -> None:
    deadline = time.time() + timeout
    while not condition():
        dead = [p.args[-3:] for p in processes if p.poll() is not None]
        assert not dead, f"{dead} ended while waiting until {what}"
        assert time.time() < deadline, f"not {what} within {timeout} s"
        time.sleep(0.2)


def common_name(certificate: str) -> str:
    cert = x509.load_pem_x509_certificate(Path(certificate).read_bytes())
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def results_sent(log: str) -> list:
    """When a site's job log says a task result reached the server (seconds since the epoch; logs are local time)."""
    stamps = re.findall(r"^(\S+ \S+) - ClientRunner - INFO - .* - task result sent to server", log, re.M)
    return [datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp() for stamp in stamps]


@pytest.mark.slow
def test_hospitals_in_their_own_namespaces_finish_a_job_through_a_dropped_link(tmp_path, cache_dir):
    why = namespaces_unavailable()
    if why:
        pytest.skip(f"cannot make network namespaces here: {why}")
    prod = provision_project(tmp_path, "hospitals", PORT, server=SERVER)
    complete_kits(prod)
    kits = {who: os.path.join(prod, SERVER if who == "server" else who) for who in ADDRESSES}
    admin_kit, sites = os.path.join(prod, PROJECT_ADMIN), ("site-1", "site-2")
    # the provisioned name is the server's certificate's and what the sites connect to
    assert common_name(os.path.join(kits["server"], "startup", "server.crt")) == SERVER
    for who in sites:
        assert common_name(os.path.join(kits[who], "startup", "client.crt")) == who
        assert f'"target": "{SERVER}:{PORT}"' in read(os.path.join(kits[who], "startup", "fed_client.json"))
    with pytest.raises(socket.gaierror):  # only the namespaces know the name: no way in through 127.0.0.1
        socket.getaddrinfo(SERVER, PORT)
    full = make_job("fedavg", str(tmp_path / "jobs" / "full"), server={"num_rounds": 3, "run_name": "drop"})
    job = str(tmp_path / "jobs" / "fedavg")
    fairfl("export-job", full, job)

    processes = {}
    with HospitalNetwork() as net:
        try:
            for who in ADDRESSES:  # a site that starts first retries until the server listens
                processes[who] = start_kit(net, who, kits[who])
            server_log = os.path.join(kits["server"], "log.txt")
            wait_until(
                lambda: all(f"New client {s}@" in read(server_log) for s in sites),
                120,
                "both sites logged in",
                processes.values(),
            )
            # each site came in over the bridge from its own address and checked the server's certificate name
            for who in sites:
                link = rf"{re.escape(ADDRESSES['server'])}:{PORT} <= {re.escape(ADDRESSES[who])}:\d+ SSL {who}\]"
                assert re.search(link, read(server_log)), who
                assert f"verified server identity '{SERVER}'" in read(os.path.join(kits[who], "log.txt")), who

            # the admin works from the server's namespace, the only place the name and address mean the server
            admin_command = ["--admin", admin_kit]
            submit = processes["submit"] = subprocess.Popen(
                fairfl_command("submit", job, *admin_command, "--timeout", str(JOB_TIMEOUT), prefix=net.exec("server")),
                env=kit_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            checkpoint = os.path.join(kits["server"], "fairfl_runs", "drop", "checkpoint.pt")
            wait_until(lambda: os.path.exists(checkpoint), JOB_TIMEOUT, "round 0 ended", processes.values())
            net.link("site-2", up=False)  # round 1 now waits for site-2 (2 of 2 sites is the quorum)
            cut = time.time()
            time.sleep(DROP_SECONDS)
            net.link("site-2", up=True)
            restored = time.time()
            out, _ = submit.communicate(timeout=JOB_TIMEOUT)
            job_id, status = re.search(r"^job (\S+): (\S+)$", out, re.M).groups()
            assert status == admin.COMPLETED, out
            # the same participant processes all along: site-2 was not restarted, it got through again
            assert [who for who in ADDRESSES if processes[who].poll() is not None] == []
            fairfl("download", job_id, *admin_command, "-o", str(tmp_path / "downloads"), prefix=net.exec("server"))
        finally:
            for process in processes.values():
                if process.poll() is None:
                    kill_group(process)
            kill_processes_under(tmp_path)

    results = json.loads(Path(admin.find_results(str(tmp_path / "downloads" / job_id))).read_text())
    assert results["sites"] == list(sites) and "stopped" not in results
    assert [r["round"] for r in results["rounds"]] == [0, 1, 2]
    for record in results["rounds"]:  # site-2 answered the round the cut held up, and the one after it
        assert set(record["train"]) == set(sites), record["round"]
    assert set(results["final"]["per_site"]) == set(sites)
    # the cut was real: none of site-2's answers got through while its cable was out, the next one after
    sent = results_sent(read(os.path.join(kits["site-2"], job_id, "log.txt")))
    assert not [t for t in sent if cut + 0.5 < t < restored], (cut, restored, sent)
    assert [t for t in sent if t >= restored], (cut, restored, sent)
