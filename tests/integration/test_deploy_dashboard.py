"""The FLARE dashboard: its API serves the project, refuses a wrong password and keeps its database private;
`fairfl dashboard` asks for the password twice on a terminal of its own, refuses weak ones and never takes one from
the environment."""

import json
import os
import pty
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from deploy_helpers import free_port, mode, site_env

STRONG = "Harbour-Lights-2026"


def test_dashboard_api_serves_the_project_refuses_a_wrong_password_and_keeps_its_database_private(tmp_path):
    from fairfl.deploy.dashboard import API, make_app

    with pytest.raises(ValueError, match="no dashboard database"):
        make_app(str(tmp_path / "empty"))
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "chapter1.tex").write_text("keep")
    modes = mode(tmp_path / "thesis"), mode(tmp_path / "thesis" / "chapter1.tex")
    with pytest.raises(ValueError, match="holds no dashboard database"):  # it would lock someone's files away
        make_app(str(tmp_path / "thesis"), "admin@fairfl.org", STRONG, "fairfl")
    assert (mode(tmp_path / "thesis"), mode(tmp_path / "thesis" / "chapter1.tex")) == modes
    for weak, why in (
        ("s3cret-Pass", "at least 12"),
        ("correcthorsebattery", "three of"),
        ("Admin-password-1", "'admin'"),
        ("Fairfl-Project-9", "'fairfl'"),
        ("Password1234", "common"),
        ("P@ssword1234", "common"),
        ("Welcome#2026", "common"),
        ("aaaaaaaaaaaA1", "in a row"),
        ("Blue-Cat-1234!x", "in a row"),
        ("Aa1" + "\0" * 10, "control characters"),
    ):
        with pytest.raises(ValueError, match=f"too weak: .*{why}"):  # before anything is written
            make_app(str(tmp_path / "dash"), "admin@fairfl.org", weak, "fairfl")
    assert not (tmp_path / "dash").exists()
    client = make_app(str(tmp_path / "dash"), "admin@fairfl.org", STRONG, "fairfl").test_client()
    assert "NVFL_CREDENTIAL" not in os.environ and "SECRET_KEY" not in os.environ
    # the database will hold the root CA's private key: owner-only (SQLite creates it 0644)
    assert mode(tmp_path / "dash") == 0o700
    assert {p.name: mode(p) for p in (tmp_path / "dash").iterdir()} == {
        "db.sqlite": 0o600,
        "secret_key": 0o600,
        ".db_init_done": 0o600,
    }
    assert client.post(f"{API}/login", json={"email": "admin@fairfl.org", "password": "wrong"}).status_code == 401
    login = client.post(f"{API}/login", json={"email": "admin@fairfl.org", "password": STRONG})
    assert login.status_code == 200 and login.json["user"]["role"] == "project_admin"
    auth = {"Authorization": f"Bearer {login.json['access_token']}"}
    assert client.get(f"{API}/clients").status_code == 401  # no token, no sites

    project = {"short_name": "fairfl", "title": "Fair FL", "server1": "localhost", "frozen": False}
    assert client.patch(f"{API}/project", json=project, headers=auth).json["status"] == "ok"
    site = client.post(
        f"{API}/clients",
        json={"name": "site-1", "organization": "hospital_a", "capacity": {"num_of_gpus": 1, "mem_per_gpu_in_GiB": 16}},
        headers=auth,
    )
    assert site.status_code == 201
    site_id = site.json["client"]["id"]
    client.patch(f"{API}/clients/{site_id}", json={"approval_state": 100}, headers=auth)
    client.patch(f"{API}/project", json={"frozen": True}, headers=auth)  # freezing creates the root CA

    got = client.get(f"{API}/project").json["project"]
    assert (got["short_name"], got["server1"], got["frozen"], got["num_clients"]) == ("fairfl", "localhost", True, 1)
    assert mode(tmp_path / "dash" / "db.sqlite") == 0o600  # now holding the root key
    users = client.get(f"{API}/users", headers=auth).json["user_list"]
    assert [u["email"] for u in users] == ["admin@fairfl.org"]
    assert [c["name"] for c in client.get(f"{API}/clients", headers=auth).json["client_list"]] == ["site-1"]
    if not (shutil.which("zip") and shutil.which("unzip")):
        pytest.skip("the dashboard zips startup kits with the `zip` program, not installed here")
    kit = client.post(f"{API}/clients/{site_id}/blob", json={"pin": "1234"}, headers=auth)
    assert kit.status_code == 200 and kit.data[:2] == b"PK"  # a zip (password: the pin)
    (tmp_path / "site-1.zip").write_bytes(kit.data)
    subprocess.run(["unzip", "-q", "-P", "1234", str(tmp_path / "site-1.zip"), "-d", str(tmp_path / "kit")], check=True)
    assert json.loads((tmp_path / "kit" / "startup" / "fed_client.json").read_text())["client"]["fqsn"] == "site-1"


def dashboard_at_terminal(root, port, typed: list, env=None, extra=()):
    """`fairfl dashboard` started on a terminal of its own (a pty it controls, as getpass needs), typing each
    line of `typed` when prompted; (process, pty master fd)."""
    master, slave = pty.openpty()

    def own_terminal():
        os.setsid()
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fairfl.cli",
            "dashboard",
            "--admin",
            "admin@fairfl.org",
            "--org",
            "coordinating_center",
            "--root",
            str(root),
            "--port",
            str(port),
            *extra,
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env or site_env(),
        preexec_fn=own_terminal,
    )
    os.close(slave)
    for line in typed:
        read_until(master, b": ")
        os.write(master, line.encode() + b"\n")
    return process, master


def read_until(fd, marker: bytes, timeout=60) -> str:
    seen, deadline = b"", time.time() + timeout
    while marker not in seen:
        assert time.time() < deadline, f"no {marker!r} in {seen!r}"
        try:
            seen += os.read(fd, 1024)
        except OSError:  # the process ended and closed its terminal
            break
    return seen.decode(errors="replace")


def test_dashboard_asks_the_password_twice_refuses_weak_ones_and_never_takes_it_from_the_environment(tmp_path):
    root, port = tmp_path / "dash", free_port()
    env = site_env(FAIRFL_DASHBOARD_PASSWORD=STRONG)
    proc = subprocess.run(
        [sys.executable, "-m", "fairfl.cli", "dashboard", "--admin", "a@b.org", "--root", str(root)],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert proc.returncode == 1 and "FAIRFL_DASHBOARD_PASSWORD is no longer read" in proc.stderr
    env = {k: v for k, v in site_env().items() if k != "FAIRFL_DASHBOARD_PASSWORD"}

    for typed, why in (([STRONG, STRONG + "x"], "the two passwords differ"), (["Short-1", "Short-1"], "too weak")):
        process, master = dashboard_at_terminal(root, port, typed, env)
        assert why in read_until(master, why.encode())
        assert process.wait(timeout=60) == 1
        os.close(master)
    assert not root.exists()
    # automation: the password from a file descriptor, never on the command line or in the environment
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"weakweakweakweak\n")
    os.close(write_fd)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairfl.cli",
            "dashboard",
            "--admin",
            "a@b.org",
            "--root",
            str(root),
            "--password-fd",
            str(read_fd),
        ],
        env=env,
        capture_output=True,
        text=True,
        pass_fds=(read_fd,),
        timeout=60,
    )
    os.close(read_fd)
    assert proc.returncode == 1 and "too weak" in proc.stderr

    process, master = dashboard_at_terminal(root, port, [STRONG, STRONG], env)
    try:
        read_until(master, b"FLARE dashboard on http://127.0.0.1")
        for leak in (f"/proc/{process.pid}/environ", f"/proc/{process.pid}/cmdline"):
            assert STRONG.encode() not in Path(leak).read_bytes()
        assert mode(root / "db.sqlite") == 0o600 and mode(root) == 0o700
        login = urllib.request.Request(
            f"http://127.0.0.1:{port}/nvflare-dashboard/api/v1/login",
            method="POST",
            data=json.dumps({"email": "admin@fairfl.org", "password": STRONG}).encode(),
            headers={"Content-Type": "application/json"},
        )
        deadline = time.time() + 30
        while True:
            try:
                assert json.load(urllib.request.urlopen(login, timeout=5))["user"]["role"] == "project_admin"
                break
            except OSError:
                assert time.time() < deadline
                time.sleep(0.5)
    finally:
        process.kill()
        process.wait()
        os.close(master)
