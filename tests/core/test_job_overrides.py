"""`--set KEY=VALUE` of `fairfl export-job`, `fairfl poc submit` and `fairfl submit`, checked as `fairfl run` checks
it: the job exported or submitted carries the new values, a hostile one is refused naming the argument before
anything is written or reaches the federation (mocked here: `fairfl.deploy.admin.submit`), and without --set the
job goes as it is."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from fairfl import cli
from fairfl.jobconfig import CLIENT_CONFIG, SERVER_CONFIG

from helpers import JOBS

# command -> (its command line for a job folder and the test's folder, exit code of a refused --set)
COMMANDS = {
    "export-job": (lambda job, t: ["export-job", job, str(t / "exported")], 2),
    "poc submit": (lambda job, t: ["poc", "submit", job, "--no-wait"], 1),
    "submit": (lambda job, t: ["submit", job, "--admin", "KIT", "--no-wait"], 1),
}


def files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def job_and_sent(tmp_path, monkeypatch):
    """A copy of jobs/fedavg, and {"job": folder, "files": its files} of the job the mocked admin API was sent; the
    temporary folders of this test are its own (tmp/)."""
    job = tmp_path / "fedavg"
    shutil.copytree(os.path.join(JOBS, "fedavg"), job)
    sent: dict = {}

    def submit(kit, folder, user=None):  # read now: a temporary copy is gone once the command returns
        sent.update(job=folder, files=files(Path(folder)))
        return "job-1"

    monkeypatch.setattr("fairfl.deploy.admin.submit", submit)
    monkeypatch.setattr("fairfl.deploy.poc.admin_kit", lambda: "KIT")
    monkeypatch.setenv("NVFLARE_POC_WORKSPACE", str(tmp_path))  # where poc submit notes the last job id
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return job, sent


def run(command: str, job: Path, tmp_path: Path, sent: dict, *assignments: str) -> tuple[int, dict]:
    """The exit code and the files of the job the command exported or submitted ({} when none)."""
    make_args, _ = COMMANDS[command]
    code = cli.main([*make_args(str(job), tmp_path), *(arg for a in assignments for arg in ("--set", a))])
    if command == "export-job":
        exported = tmp_path / "exported"
        return code, files(exported) if exported.exists() else {}
    return code, sent.get("files", {})


@pytest.mark.parametrize("command", list(COMMANDS))
def test_set_changes_the_job_each_command_exports_or_submits(command, tmp_path, job_and_sent):
    job, sent = job_and_sent
    before = files(job)
    code, written = run(command, job, tmp_path, sent, "num_rounds=7", "local_epochs=2")
    assert code == 0
    server, client = (json.loads(written[Path(name)]) for name in (SERVER_CONFIG, CLIENT_CONFIG))
    assert server["workflows"][0]["args"]["num_rounds"] == 7
    assert client["executors"][0]["executor"]["args"]["local_epochs"] == 2
    assert files(job) == before  # the user's job is never edited
    if command == "export-job":
        assert not any(path.parts[:2] == ("app", "custom") for path in written)
    else:  # a copy under its own name, removed once submitted
        assert Path(sent["job"]).name == "fedavg" and not list((tmp_path / "tmp").iterdir())


@pytest.mark.parametrize("command", list(COMMANDS))
def test_without_set_the_job_goes_as_before(command, tmp_path, job_and_sent):
    job, sent = job_and_sent
    code, written = run(command, job, tmp_path, sent)
    assert code == 0
    if command == "export-job":  # a plain copy without app/custom
        assert written == {path: data for path, data in files(job).items() if path.parts[:2] != ("app", "custom")}
    else:
        assert sent["job"] == str(job)


HOSTILE_SETS = {
    "a string for a number": ("num_rounds=abc", "num_rounds"),
    "out of range": ("local_epochs=0", "FairflExecutor: local_epochs must be"),
    "an argument the job does not have": ("nosuchkey=1", "nosuchkey"),
    "no '='": ("num_rounds", "argument --set"),
}


@pytest.mark.parametrize("hostile", list(HOSTILE_SETS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_hostile_set_is_refused_before_anything_is_written_or_submitted(
    command, hostile, tmp_path, job_and_sent, capsys
):
    job, sent = job_and_sent
    assignment, named = HOSTILE_SETS[hostile]
    before = files(tmp_path)
    code, written = run(command, job, tmp_path, sent, "eval_every=1", assignment)
    err = capsys.readouterr().err
    assert code == COMMANDS[command][1] and named in err and "Traceback" not in err, err
    assert not written and files(tmp_path) == before and not list((tmp_path / "tmp").iterdir())
