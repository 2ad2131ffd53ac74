"""Bad command lines, table-driven: every `fairfl` command's bad arguments (the real `fairfl.cli.main`) end in a
clear error naming the argument, exit code 2 (argparse) or 1 (refused), and nothing under the test's folder is
lost or written."""

import pytest

from fairfl import cli

from helpers import REPO


def non_empty(path):
    path.mkdir(parents=True, exist_ok=True)
    (path / "keep.txt").write_text("precious")
    return path


def beside_a_user_folder(workspace):
    """A workspace whose job-copy folder (`fairfl run --set` writes <workspace>_job) holds a user's file."""
    non_empty(workspace.parent / f"{workspace.name}_job")
    return str(workspace)


# case -> (arguments given tmp_path, the text the error must show); exit code 2 (argparse) or 1 (refused)
CLI_CASES = {
    "prepare-data --num-sites 0": (lambda t: ["prepare-data", "--num-sites", "0"], "--num-sites"),
    "prepare-data --num-sites -3": (lambda t: ["prepare-data", "--num-sites", "-3"], "--num-sites"),
    "prepare-data --size-scale -1": (lambda t: ["prepare-data", "--size-scale", "-1"], "--size-scale"),
    "prepare-data --size-scale 0": (lambda t: ["prepare-data", "--size-scale", "0"], "--size-scale"),
    "prepare-data --size-scale nan": (lambda t: ["prepare-data", "--size-scale", "nan"], "--size-scale"),
    "prepare-data --image-size 4": (lambda t: ["prepare-data", "--image-size", "4"], "--image-size"),
    "prepare-data --seed -1": (lambda t: ["prepare-data", "--seed", "-1"], "--seed"),
    "prepare-data images too small for the anatomy": (
        lambda t: ["prepare-data", "--out", str(t / "o"), "--image-size", "16"],
        "image_size must be at least 32",
    ),
    "prepare-data one site of a ten-site split": (
        lambda t: ["prepare-data", "--dataset", "ich_imbalanced", "--out", str(t / "o"), "--num-sites", "1"],
        "num_sites >= 2",
    ),
    "prepare-data --num-sites two": (lambda t: ["prepare-data", "--num-sites", "two"], "--num-sites"),
    "prepare-data --test-scale 0.5": (lambda t: ["prepare-data", "--test-scale", "0.5"], "--test-scale"),
    "prepare-data --test-scale nan": (lambda t: ["prepare-data", "--test-scale", "nan"], "--test-scale"),
    "prepare-data --out a non-empty folder": (
        lambda t: ["prepare-data", "--out", str(non_empty(t / "out"))],
        "out is not empty",
    ),
    "run a missing job": (lambda t: ["run", str(t / "nojob"), "-w", str(t / "w")], "nojob"),
    "run -n 0": (lambda t: ["run", "jobs/fedavg", "-n", "0", "-w", str(t / "w")], "--n-clients"),
    "run -t 0": (lambda t: ["run", "jobs/fedavg", "-t", "0", "-w", str(t / "w")], "--threads"),
    "run into a non-empty workspace": (
        lambda t: ["run", "jobs/fedavg", "-w", str(non_empty(t / "ws"))],
        "ws is not empty",
    ),
    "run --set into a non-empty <workspace>_job": (
        lambda t: ["run", "jobs/fedavg", "-w", beside_a_user_folder(t / "ws"), "--set", "num_rounds=1"],
        "ws_job is not empty",
    ),
    "run --force --set into a <workspace>_job that is no job copy": (
        lambda t: ["run", "jobs/fedavg", "--force", "-w", beside_a_user_folder(t / "ws"), "--set", "num_rounds=1"],
        "does not look like a job copy",
    ),
    "run --set an argument the job does not have": (
        lambda t: ["run", "jobs/fedavg", "-w", str(t / "ws"), "--set", "nosuchkey=1"],
        "nosuchkey",
    ),
    "run --set a string for a number": (
        lambda t: ["run", "jobs/fedavg", "-w", str(t / "ws"), "--set", "num_rounds=abc"],
        "num_rounds",
    ),
    "run --set free_riders (the sites' own setting)": (
        lambda t: ["run", "jobs/fedce", "-w", str(t / "ws"), "--set", 'free_riders=["site-4"]'],
        "FAIRFL_FREE_RIDERS",
    ),
    "run --set without '='": (lambda t: ["run", "jobs/fedavg", "-w", str(t / "ws"), "--set", "num_rounds"], "--set"),
    "run --free-riders '../site-2'": (
        lambda t: ["run", "jobs/fedavg", "-w", str(t / "ws"), "--free-riders", "site-3,../site-2"],
        "site name '../site-2'",
    ),
    "run --force into a folder that is no workspace": (
        lambda t: ["run", "jobs/fedavg", "--force", "-w", str(non_empty(t / "home"))],
        "does not look like",
    ),
    "convert-prostate from a missing folder": (lambda t: ["convert-prostate", str(t / "nosrc"), str(t / "d")], "nosrc"),
    "convert-prostate into a non-empty folder": (
        lambda t: ["convert-prostate", str(non_empty(t / "src")), str(non_empty(t / "dst"))],
        "dst is not empty",
    ),
    "convert-fundus into a non-empty folder": (
        lambda t: ["convert-fundus", str(non_empty(t / "src")), str(non_empty(t / "dst"))],
        "dst is not empty",
    ),
    "convert-isic --alpha 0": (
        lambda t: ["convert-isic", str(non_empty(t / "s")), str(t / "d"), "--alpha", "0"],
        "--alpha",
    ),
    "convert-isic --corrupted-fraction 1.5": (
        lambda t: ["convert-isic", str(non_empty(t / "s")), str(t / "d"), "--corrupted-fraction", "1.5"],
        "--corrupted-fraction",
    ),
    "convert-isic --severity 9": (
        lambda t: ["convert-isic", str(non_empty(t / "s")), str(t / "d"), "--severity", "9"],
        "--severity",
    ),
    "convert-rsna-ich --max-images 0": (
        lambda t: ["convert-rsna-ich", str(non_empty(t / "s")), str(t / "d"), "--max-images", "0"],
        "--max-images",
    ),
    "convert-rsna-ich --num-sites 0": (
        lambda t: ["convert-rsna-ich", str(non_empty(t / "s")), str(t / "d"), "--num-sites", "0"],
        "--num-sites",
    ),
    "leave-one-out -n 0": (lambda t: ["leave-one-out", "jobs/fedavg", "-n", "0", "-o", str(t / "o")], "--n-clients"),
    "benchmark --rounds 0": (lambda t: ["benchmark", "prostate", "--rounds", "0", "--out", str(t / "b")], "--rounds"),
    "benchmark --sites 1": (lambda t: ["benchmark", "prostate", "--sites", "1", "--out", str(t / "b")], "--sites"),
    "benchmark --seeds -1": (lambda t: ["benchmark", "prostate", "--seeds", "-1", "--out", str(t / "b")], "--seeds"),
    "export-job --gpus -1": (lambda t: ["export-job", "jobs/fedavg", str(t / "e"), "--gpus", "-1"], "--gpus"),
    "export-job of a folder that is no job": (
        lambda t: ["export-job", str(non_empty(t / "j")), str(t / "e")],
        "not a job folder",
    ),
    "report --out a non-empty folder": (
        lambda t: ["report", str(t / "results.json"), "--out", str(non_empty(t / "r"))],
        "r is not empty",
    ),
    "poc prepare --port -5": (lambda t: ["poc", "prepare", "--port", "-5"], "--port"),
    "poc prepare --port 65536": (lambda t: ["poc", "prepare", "--port", "65536"], "--port"),
    "poc prepare -n 0": (lambda t: ["poc", "prepare", "-n", "0"], "--n-sites"),
    "dashboard --port 70000": (lambda t: ["dashboard", "--root", str(t / "d"), "--port", "70000"], "--port"),
    "dashboard --port 0": (lambda t: ["dashboard", "--root", str(t / "d"), "--port", "0"], "--port"),
    "dashboard --root a folder that is no dashboard's": (
        lambda t: ["dashboard", "--admin", "a@b.org", "--root", str(non_empty(t / "thesis"))],
        "holds no dashboard database",
    ),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_command_line_is_refused_naming_the_argument_and_nothing_is_lost(tmp_path, case, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # jobs/ as in the README
    make_args, named = CLI_CASES[case]
    args = make_args(tmp_path)
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    try:
        code = cli.main(args)
    except SystemExit as e:  # argparse: usage and "argument --x: ..." on stderr
        code = e.code
    assert code in (1, 2)
    assert named in capsys.readouterr().err
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing lost or written
