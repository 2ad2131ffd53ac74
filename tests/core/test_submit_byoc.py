"""A job's app/custom/ on its way to a federation, whose sites run only the installed package and refuse
bring-your-own-code: fairfl's marker (the README `nvflare simulator` needs) is left out of what `fairfl submit` and
`fairfl poc submit` send, code there is refused before the federation sees the job, with what to do, and
`fairfl export-job` leaves both out and names the code. The federation is mocked (`fairfl.deploy.admin.submit`)."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from fairfl import cli
from fairfl.deploy import admin
from fairfl.deploy.admin import SIGNATURE_FILES, custom_code

from helpers import JOBS

SUBMITS = {
    "poc submit": ["poc", "submit", "JOB", "--no-wait"],
    "submit": ["submit", "JOB", "--admin", "KIT", "--no-wait"],
}


@pytest.fixture
def sent(tmp_path, monkeypatch):
    """The folders the mocked admin API was sent, each as a sorted list of its files."""
    folders = []

    def submit(kit, job, user=None):
        with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:  # what admin.submit sends: its copy of the job
            copy = Path(admin.submittable_copy(job, tmp))
            folders.append(sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()))
        return "job-1"

    monkeypatch.setattr("fairfl.deploy.admin.submit", submit)
    monkeypatch.setattr("fairfl.deploy.poc.admin_kit", lambda: "KIT")
    monkeypatch.setenv("NVFLARE_POC_WORKSPACE", str(tmp_path))
    return folders


def job_with(tmp_path: Path, files: dict) -> Path:
    job = tmp_path / "fedavg"
    shutil.copytree(os.path.join(JOBS, "fedavg"), job)
    for name, text in files.items():
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_text(text)
    return job


@pytest.mark.parametrize("command", list(SUBMITS))
def test_the_marker_and_nvflare_signatures_are_left_out_of_what_is_submitted(command, tmp_path, sent):
    # a folder NVFlare's own submit once signed in place keeps its signature files: they are not code either
    job = job_with(tmp_path, {f"app/custom/{name}": "{}" for name in SIGNATURE_FILES})
    assert custom_code(str(job)) == []
    assert cli.main([str(job) if a == "JOB" else a for a in SUBMITS[command]]) == 0
    assert sent == [["app/config/config_fed_client.json", "app/config/config_fed_server.json", "meta.json"]]
    assert (job / "app" / "custom" / "README.md").is_file()  # the user's folder is never changed


@pytest.mark.parametrize("command", list(SUBMITS))
def test_code_in_app_custom_is_refused_before_the_federation_sees_it(command, tmp_path, sent, capsys):
    job = job_with(tmp_path, {"app/custom/evil.py": "import os\n", "app/custom/lib/util.py": ""})
    assert cli.main([str(job) if a == "JOB" else a for a in SUBMITS[command]]) == 1
    error = capsys.readouterr().err
    assert "brings code in app/custom (app/custom/evil.py, app/custom/lib/util.py)" in error
    assert "BYOC not permitted" in error and f"fairfl export-job {job} OUT" in error
    assert sent == []


def test_export_job_leaves_out_the_marker_and_names_code_it_leaves_out(tmp_path, capsys):
    assert cli.main(["export-job", os.path.join(JOBS, "fedlwr"), str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "app" / "custom").exists()
    assert "left out code" not in capsys.readouterr().err
    job = job_with(tmp_path, {"app/custom/evil.py": ""})
    assert cli.main(["export-job", str(job), str(tmp_path / "exported")]) == 0
    assert not (tmp_path / "exported" / "app" / "custom").exists()
    assert "left out code of app/custom, which the sites would not run: app/custom/evil.py" in capsys.readouterr().err


def test_a_submitted_copy_keeps_the_job_name_and_needs_a_job_folder(tmp_path):
    copy = admin.submittable_copy(os.path.join(JOBS, "fedlwr"), str(tmp_path))
    assert os.path.basename(copy) == "fedlwr" and not os.path.exists(os.path.join(copy, "app", "custom"))
    with pytest.raises(FileNotFoundError, match="not a job folder"):
        admin.submittable_copy(str(tmp_path / "none"), str(tmp_path))
