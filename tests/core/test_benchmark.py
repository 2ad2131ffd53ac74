"""`fairfl benchmark`'s runs: each built-in dataset's comparison and its jobs' arguments, every table of a family
from finished runs without running them again, a finished run kept only where the job's settings are unchanged, a
run that lost its port run again, and (slow) a tiny real benchmark that resumes without redoing finished runs. The
claims are tested in test_benchmark_claims.py, the run statistics and the benchmarks/ scripts in
test_benchmark_statistics.py, the generated blocks of README.md and docs/ in test_docs_blocks.py."""

import json
import os

import pytest

from fairfl.benchmark.runner import family, job_arguments, run_benchmark
from fairfl.methods import VARIANTS

from helpers import REPO, TINY_CLIENT, TINY_SERVER


def test_each_builtin_dataset_belongs_to_its_papers_comparison():
    assert (family("prostate"), family("skin"), family("ich_imbalanced")) == (
        "segmentation",
        "quality_shift",
        "imbalanced",
    )


def test_npr_settings_follow_the_dataset_and_explicit_arguments_win():
    args = job_arguments("ich_imbalanced", "fedprox_npr", 1, 30, 10, {})
    assert args["num_subclusters"] == 2 and "npr_weight" not in args and args["mu"] == 0.01 and args["seed"] == 1
    assert job_arguments("ich_imbalanced", "fednpr", 0, 3, 1, {"npr_weight": 0.5})["npr_weight"] == 0.5
    assert "num_subclusters" not in job_arguments("prostate", "fedavg", 0, 3, 1, {})


@pytest.mark.slow
def test_tiny_benchmark_writes_every_table_and_resumes_without_rerunning(tmp_path, cache_dir, capsys):
    out = tmp_path / "bench"
    tiny = {**TINY_SERVER, **TINY_CLIENT}
    tiny.pop("num_rounds"), tiny.pop("eval_every")
    # FedProx and q-FedAvg on segmentation data: the comparison runs them there too
    methods = ["solo", "fedprox", "qfedavg"]
    # two sites: every table needs no more, and each site is a process start (most of a tiny run's time)
    summary = run_benchmark("prostate", methods, [0], 2, 1, 2, out, tiny, command="test")
    assert {f.name for f in out.iterdir()} >= {"SUMMARY.md", "summary.json", "dice", "runs"}
    assert {f.name for f in (out / "dice").iterdir()} >= {"report.md", "results.csv", "convergence.png"}
    text = (out / "SUMMARY.md").read_text()
    for heading in ("## Dice per site", "## Performance fairness against Solo", "## Round time"):
        assert heading in text
    assert "nvflare 2.9" in text and "`test`" in text
    saved = json.loads((out / "summary.json").read_text())
    assert saved["results"]["fedprox"]["dice"]["avg"][0] == pytest.approx(
        summary["results"]["fedprox"]["dice"]["avg"][0]
    )
    finished = {p: p.stat().st_mtime for p in out.glob("runs/*/server/simulate_job/results.json")}
    assert len(finished) == 3
    runs = {p.parts[-4]: json.loads(p.read_text()) for p in finished}
    assert runs["prostate-fedprox-seed0"]["config"]["mu"] == 0.01
    assert all(0.0 < r["global_share"] <= 1.0 for r in runs["prostate-qfedavg-seed0"]["rounds"])
    assert all(0.0 <= v["dice"] <= 1.0 for r in runs.values() for v in r["final"]["per_site"].values())
    capsys.readouterr()
    run_benchmark("prostate", methods, [0], 2, 1, 2, out, tiny, command="test")
    assert capsys.readouterr().out.count("finished before, kept") == 3
    assert {p: p.stat().st_mtime for p in finished} == finished


FAMILY_METRICS = {  # dataset -> metrics every site reports at the end
    "prostate": ("dice",),
    "skin": (
        "auc",
        "accuracy",
        "balanced_accuracy",
        "clean_auc",
        "clean_accuracy",
        "corrupted_auc",
        "corrupted_accuracy",
    ),
    "skin_imbalanced": ("auc", "accuracy", "balanced_accuracy"),
}


def finished_run(workspace, dataset, method, seed, job_args, sites):
    """A finished run's results.json as the simulator workspace holds it, with the settings `job_args`; site k of
    method m scores a value that differs by site, method and seed."""
    offset = sorted(VARIANTS).index(method) / 100 + seed / 200
    per_site = {s: {m: min(1.0, 0.5 + 0.05 * k + offset) for m in FAMILY_METRICS[dataset]} for k, s in enumerate(sites)}
    final = {"per_site": per_site}
    if method in ("fedce_sum", "cffl", "cgsv"):
        final["contributions"] = {s: (k + 1) / sum(range(1, len(sites) + 1)) for k, s in enumerate(sites)}
    results = {
        "schema": 1,
        "method": method,
        "task": "segmentation" if dataset == "prostate" else "classification",
        "metric": FAMILY_METRICS[dataset][0],
        "seed": seed,
        "sites": sites,
        "config": dict(job_args),
        "rounds": [{"round": r, "seconds": 2.0 + r + offset} for r in range(3)]
        + [{"round": 3, "seconds": 9.0, "per_site": per_site}],
        "final": final,
    }
    path = workspace / "server" / "simulate_job" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(results))


@pytest.mark.parametrize(
    "dataset, methods, tables",
    [
        (
            "prostate",
            ["solo", "fedavg", "fedce_sum", "cgsv", "fedlwr"],
            [
                "## Dice per site",
                "## Performance fairness against Solo",
                "## Client contributions",
                "## Contribution estimates against leave-one-out",
                "## The papers' claims on this data",
            ],
        ),
        ("skin", ["fedavg", "fedismplus_s"], ["## AUC per site", "## Clean and corrupted test sets", "FedISM+ (S)"]),
        (
            "skin_imbalanced",
            ["solo", "fedavg", "fednpr", "fednpr_per"],
            [
                "## Balanced accuracy per site",
                "## AUC per site",
                "FedNPR-Per: Avg. Balanced accuracy above FedNPR's",
            ],
        ),
    ],
)
def test_every_table_of_a_family_from_finished_runs_without_running_them_again(
    tmp_path, dataset, methods, tables, monkeypatch
):
    import fairfl.simulate

    monkeypatch.setattr(fairfl.simulate, "run_simulator", lambda *a, **k: pytest.fail("a finished run was run again"))
    sites, seeds, out = ["site-1", "site-2", "site-3"], [0, 1, 2], tmp_path / "bench"  # 3: the fewest judged
    for seed in seeds:
        for method in methods:
            finished_run(
                out / "runs" / f"{dataset}-{method}-seed{seed}",
                dataset,
                method,
                seed,
                job_arguments(dataset, method, seed, 4, 2, {}),
                sites,
            )
    loo = dataset == "prostate"
    if loo:  # FedAvg's leave-one-out runs, as `fairfl leave-one-out` lays them out
        for left_out in [None, *sites]:
            name = "full" if left_out is None else f"without-{left_out}"
            args = {**job_arguments(dataset, "fedavg", 0, 4, 2, {}), "exclude_sites": [left_out] if left_out else []}
            finished_run(out / "loo" / "runs" / name, dataset, "fedavg", 9 if left_out else 0, args, sites)
    summary = run_benchmark(dataset, methods, seeds, 4, 2, 3, out, loo=loo, command="cmd")
    text = (out / "SUMMARY.md").read_text()
    for table in tables + ["## Round time"]:
        assert table in text, table
    for metric in summary["metrics"]:
        assert (out / metric / "results.csv").is_file() and (out / metric / "convergence.png").is_file()
    assert summary["results"]["fedavg"][summary["metrics"][0]]["avg"][1] is not None  # an sd over the seeds
    # rounds 1 and 2 (not evaluated) of every seed: 3 and 4 s plus the run's offset (seed / 200 more per seed)
    offset = sorted(VARIANTS).index("fedavg") / 100
    assert summary["round_seconds"]["fedavg"] == pytest.approx(3.505 + offset)
    # every site of a method later in the variants' alphabet scores higher, by the same amount (the spread is equal)
    assert summary["claims"] and all(set(c["per_site_difference"]) == set(sites) for c in summary["claims"])
    for c in summary["claims"]:
        if c["statistic"] == "std":  # equal spread at every seed: "below" fails
            assert c["difference"] == pytest.approx(0.0, abs=1e-9) and c["verdict"] == "fails"
            continue
        later = sorted(VARIANTS).index(c["method"]) > sorted(VARIANTS).index(c["baseline"])
        assert (c["difference"] > 0) == later


def test_a_run_that_lost_a_port_to_another_simulator_is_run_again(tmp_path, monkeypatch, capsys):
    import fairfl.simulate as simulate

    workspace = tmp_path / "runs" / "prostate-fedavg-seed0"
    calls = []

    def fake_run(job, ws, n_clients, threads, env=None):
        calls.append(ws)
        if len(calls) == 1:  # the first try: the server could not bind its port
            return simulate.SimulatorRun(ws, 0, 1.0, {"server": f"tcp_driver - ERROR - {simulate.PORT_CLASH}"})
        finished_run(workspace, "prostate", "fedavg", 0, {"seed": 0}, ["site-1", "site-2"])
        return simulate.SimulatorRun(ws, 0, 1.0, {})

    monkeypatch.setattr(simulate, "run_simulator", fake_run)
    results = simulate.run_unless_finished(os.path.join(REPO, "jobs", "fedavg"), workspace, 2, {"seed": 0})
    assert len(calls) == 2 and results["final"] and "running it again" in capsys.readouterr().out

    def other_failure(job, ws, n_clients, threads, env=None):
        calls.append(ws)
        return simulate.SimulatorRun(ws, 1, 1.0, {"site-1": "ValueError: bad data"})

    monkeypatch.setattr(simulate, "run_simulator", other_failure)
    calls.clear()
    with pytest.raises(RuntimeError, match="bad data"):
        simulate.run_unless_finished(os.path.join(REPO, "jobs", "fedavg"), tmp_path / "runs" / "x", 2, {"seed": 0})
    assert len(calls) == 1  # any other failure is reported at once, not retried


def test_a_finished_run_is_kept_only_when_the_jobs_own_defaults_are_unchanged_too(tmp_path, monkeypatch):
    """A job default changed since a run finished (here test_scale 1 -> 4, as when the built-in test splits grow)
    must not keep the old run, though no argument asked for it; a default of None (the dataset's value, which
    the results record resolved) does not count as changed."""
    import fairfl.simulate as simulate
    from fairfl.jobconfig import customize_job
    from fairfl.jobconfig import job_arguments as job_defaults

    def must_not_run(*args, **kwargs):
        raise AssertionError("the finished run should have been kept")

    monkeypatch.setattr(simulate, "run_simulator", must_not_run)
    job = os.path.join(REPO, "jobs", "fedavg")
    recorded = {**job_defaults(job), "seed": 0, "num_classes": 2, "test_scale": 1.0}  # None resolved by the run
    workspace = tmp_path / "runs" / "prostate-fedavg-seed0"
    finished_run(workspace, "prostate", "fedavg", 0, recorded, ["site-1", "site-2"])
    assert simulate.run_unless_finished(job, workspace, 2, {"seed": 0})["final"]

    larger_tests = customize_job(job, str(tmp_path / "fedavg_test_scale4"), {"test_scale": 4.0})
    with pytest.raises(ValueError, match="other settings \\(test_scale\\)"):
        simulate.run_unless_finished(larger_tests, workspace, 2, {"seed": 0})


def finished_runs(out, dataset, methods, seeds, rounds=4, extra=None, job_copy=False):
    """finished_run for each (seed, method) into out/runs, each with the job copy beside it if `job_copy` (what
    fairfl.simulate writes before a run: the sites' arguments as the run was written)."""
    from fairfl.jobconfig import JOBS, customize_job
    from fairfl.methods import variant_job

    for seed in seeds:
        for method in methods:
            workspace = out / "runs" / f"{dataset}-{method}-seed{seed}"
            args = job_arguments(dataset, method, seed, rounds, 2, extra or {})
            finished_run(workspace, dataset, method, seed, args, ["site-1", "site-2", "site-3"])
            if job_copy:
                customize_job(str(JOBS / variant_job(method)[0]), f"{workspace}_job", args)


def test_the_summary_says_what_data_the_sites_used(tmp_path, monkeypatch):
    """A data root of 96-px images is read at the executor's image_size (64 unless set): the summary says so."""
    import fairfl.simulate

    monkeypatch.setattr(fairfl.simulate, "run_simulator", lambda *a, **k: pytest.fail("a finished run was run again"))
    out, extra = tmp_path / "bench", {"data_root": "/data/prostate_96px"}
    finished_runs(out, "prostate", ["fedavg"], [0, 1, 2], extra=extra, job_copy=True)
    summary = run_benchmark("prostate", ["fedavg"], [0, 1, 2], 4, 2, 3, out, extra, command="cmd")
    used = {"image_size": 64, "data_root": "/data/prostate_96px", "synthetic_size_scale": 2.0, "test_scale": 1.0}
    assert summary["site_settings"] == used
    assert json.loads((out / "summary.json").read_text())["site_settings"] == used
    text = (out / "SUMMARY.md").read_text()
    assert "The sites used image_size 64, data_root /data/prostate_96px, synthetic_size_scale 2.0, test_scale 1.0" in (
        text
    )


def test_a_call_naming_some_methods_keeps_the_folders_other_finished_methods(tmp_path, monkeypatch):
    import fairfl.simulate

    monkeypatch.setattr(fairfl.simulate, "run_simulator", lambda *a, **k: pytest.fail("a finished run was run again"))
    out, seeds = tmp_path / "bench", [0, 1, 2]
    finished_runs(out, "prostate", ["solo", "fedavg", "ditto", "fedlwr"], seeds)
    finished_runs(out, "prostate", ["fedprox"], seeds, rounds=9)  # another setting: not this benchmark's
    summary = run_benchmark("prostate", ["fedavg", "ditto"], seeds, 4, 2, 3, out, command="cmd")
    assert summary["methods"] == ["fedavg", "ditto", "solo", "fedlwr"]
    assert summary["earlier_methods"] == ["solo", "fedlwr"] and set(summary["results"]) == set(summary["methods"])
    assert summary["other_settings_runs"] == [f"prostate-fedprox-seed{s}" for s in seeds]
    assert "fedlwr" in {c["method"] for c in summary["claims"]}  # judged against FedAvg like the named ones
    rows = (out / "dice" / "results.csv").read_text()
    assert "\nsolo," in rows and "\nfedlwr," in rows and "\nfedprox," not in rows
    text = (out / "SUMMARY.md").read_text()
    assert "Also covers the finished runs of Solo, Fed-LWR from earlier calls into this folder" in text
    assert "Left out, run with other settings: runs/prostate-fedprox-seed0" in text


def test_a_data_root_in_the_environment_is_the_benchmarks_and_never_contradicts_data_root(
    tmp_path, monkeypatch, capsys
):
    """Every simulated site reads FAIRFL_DATA_ROOT over the job's data_root: the benchmark takes it as its data root
    (so its outputs, its recorded command and the shared-test judgement say what the sites read), and refuses a
    --data-root that the sites would not read."""
    import fairfl.benchmark.command as command
    from fairfl.cli import main as cli_main

    called = []
    monkeypatch.setattr(command, "run_benchmark", lambda *args, **kwargs: called.append(args) or {})
    root = tmp_path / "isic"
    root.mkdir()
    monkeypatch.setenv("FAIRFL_DATA_ROOT", str(root))
    out = ["--out", str(tmp_path / "out"), "--methods", "fedavg", "--seeds", "0"]
    assert cli_main(["benchmark", "skin", *out]) == 0
    (dataset, _, _, _, _, _, _, extra, _, recorded) = called[-1]
    assert dataset == "skin" and extra["data_root"] == str(root) and "test_scale" not in extra
    assert f"--data-root {root}" in recorded
    assert cli_main(["benchmark", "skin", "--data-root", str(root), *out]) == 0  # the same root: fine
    other = tmp_path / "other"
    other.mkdir()
    called.clear()
    assert cli_main(["benchmark", "skin", "--data-root", str(other), *out]) == 2
    assert not called and "every site would read FAIRFL_DATA_ROOT" in capsys.readouterr().err
    monkeypatch.delenv("FAIRFL_DATA_ROOT")
    assert cli_main(["benchmark", "skin", *out]) == 0
    assert "data_root" not in called[-1][7] and called[-1][7]["test_scale"] == 4.0
