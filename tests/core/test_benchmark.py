"""`fairfl benchmark`: the claims it checks, the README and docs/ blocks it generates, and (slow) a tiny real
benchmark that
resumes without redoing finished runs."""

import json
import math
import os

import pytest

from fairfl.benchmark.claims import check_claims, claims_markdown
from fairfl.benchmark.rejudge import rejudge
from fairfl.benchmark.runner import family, job_arguments, run_benchmark
from fairfl.cli import main as cli_main
from fairfl.docs_blocks import documentation_files, section, update_generated_blocks
from fairfl.methods import VARIANTS, Claim
from fairfl.paired import Interval, mean_interval, paired_differences, paired_interval, verdict

from helpers import REPO, TINY_CLIENT, TINY_SERVER


def run_record(method, seed, per_site: dict, metric="dice"):
    """A finished run in the results-file schema, final scores `per_site` (fractions)."""
    final = {"per_site": {s: {metric: v} for s, v in per_site.items()}}
    return {
        "schema": 1,
        "method": method,
        "metric": metric,
        "seed": seed,
        "sites": list(per_site),
        "rounds": [{"round": 0, "seconds": 3.0}, {"round": 1, "seconds": 2.0}],
        "final": final,
    }


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


T_975_2DOF = 4.302652729911275  # scipy.stats.t.ppf(0.975, 2), from tables: 4.303


def test_paired_interval_by_hand_and_its_verdicts():
    # differences 1, 2, 3: mean 2, sd 1, half width t(0.975, 2) * 1 / sqrt(3)
    half = T_975_2DOF / 3**0.5
    interval = paired_interval({0: 11.0, 1: 12.0, 2: 13.0}, {0: 10.0, 1: 10.0, 2: 10.0})
    assert (interval.mean, interval.n) == (2.0, 3)
    assert (interval.low, interval.high) == pytest.approx((2 - half, 2 + half))  # [-0.48, +4.48]
    assert interval.text() == "+2.00 [-0.48, +4.48]"
    assert verdict(interval) == "inconclusive"  # "at least 0": 0 lies inside
    assert verdict(mean_interval([2, 3, 4])) == "holds"  # [+0.52, +5.48]: all above 0
    assert verdict(mean_interval([2, 3, 4]), bound=3.0) == "inconclusive"  # a margin of 3 points
    assert verdict(mean_interval([-4, -3, -2])) == "fails"
    assert verdict(mean_interval([-4, -3, -2]), bound=0.0, above=False, strict=True) == "holds"  # "below 0"
    # a difference exactly 0 at every seed: the interval is [0, 0]: "at least" holds, "below" fails
    zero = paired_interval({0: 5.0, 1: 7.0, 2: 6.0}, {0: 5.0, 1: 7.0, 2: 6.0})
    assert (zero.low, zero.high) == (0.0, 0.0)
    assert verdict(zero) == "holds" and verdict(zero, above=False, strict=True) == "fails"
    # one seed: the interval is unbounded, inconclusive however large the difference
    one = paired_interval({0: 90.0}, {0: 10.0})
    assert one.n == 1 and one.low == -math.inf and one.text() == "+80.00 (1 seed)"
    assert verdict(one) == verdict(one, above=False) == "inconclusive"
    # NaN, None, inf and missing seeds are not paired; nothing paired: undefined, inconclusive
    assert paired_differences(
        {0: math.nan, 1: 3.0, 2: None, 3: 1.0, 4: math.inf}, {0: 1.0, 1: 1.0, 2: 1.0, 4: 1.0}
    ) == {1: 2.0}
    none = paired_interval({0: 1.0}, {1: 1.0})
    assert none.n == 0 and math.isnan(none.mean) and none.text() == "–" and verdict(none) == "inconclusive"
    assert none.as_json() == {"mean": None, "low": None, "high": None, "n": 0, "confidence": 0.95}
    for interval in (none, one, zero, mean_interval([2, 3, 4])):
        assert Interval.from_json(interval.as_json()).text() == interval.text()
    with pytest.raises(ValueError, match="confidence"):
        mean_interval([1, 2], confidence=1.0)


def test_claims_are_judged_on_paired_per_seed_differences():
    # FedAvg's average differs a lot from seed to seed, Fed-LWR's is always 1 point above it: the seed-to-seed
    # spread of each method says nothing, the paired differences decide
    runs = {
        "fedavg": [run_record("fedavg", s, {"site-1": 0.60 + 0.1 * s, "site-2": 0.40 + 0.1 * s}) for s in range(3)],
        "fedlwr": [run_record("fedlwr", s, {"site-1": 0.61 + 0.1 * s, "site-2": 0.41 + 0.1 * s}) for s in range(3)],
        "ditto": [run_record("ditto", s, {"site-1": 0.70, "site-2": 0.60 - 0.1 * s}) for s in (2, 1, 0)],
    }
    std, avg, margin = check_claims(
        [
            Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "std"),
            Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "avg"),
            Claim("FedNPR", "fedlwr", "fedavg", "dice", "avg", 3.0),
        ],
        runs,
    )
    assert avg["value"] == pytest.approx([61.0, 10.0]) and avg["baseline_value"] == pytest.approx([60.0, 10.0])
    assert avg["differences"] == pytest.approx({0: 1.0, 1: 1.0, 2: 1.0}) and avg["verdict"] == "holds"
    assert avg["interval"] == pytest.approx({"mean": 1.0, "low": 1.0, "high": 1.0, "n": 3, "confidence": 0.95})
    assert std["difference"] == pytest.approx(0.0, abs=1e-9) and std["verdict"] == "fails"  # equal spread
    assert margin["verdict"] == "fails" and "at least 3 points above" in margin["claim"]
    # Ditto's runs listed in another order are still paired by seed: avg 65, 60, 55 against 50, 60, 70
    ditto = check_claims([Claim("Ditto", "ditto", "fedavg", "dice", "avg")], runs)[0]
    assert ditto["differences"] == pytest.approx({0: 15.0, 1: 0.0, 2: -15.0}) and ditto["verdict"] == "inconclusive"
    assert ditto["per_site_difference"] == pytest.approx({"site-1": 0.0, "site-2": 0.0})
    tolerance = Claim("FedISM+", "fedlwr", "fedavg", "dice", "avg", -1.0)
    assert tolerance.judge(mean_interval([-0.5, -0.4, -0.6])) == "holds"
    assert tolerance.text(str) == "fedlwr: Avg. Dice at most 1 point below fedavg's"  # methods named as asked
    assert tolerance.judge(mean_interval([-1.5, -1.4, -1.6])) == "fails"
    # a seed whose run has no finite result (diverged: NaN) is left out of the pairs, not counted as a result
    runs["fedlwr"][1]["final"]["per_site"]["site-1"]["dice"] = math.nan
    assert check_claims([Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "avg")], runs)[0]["interval"]["n"] == 2
    # one seed only: inconclusive
    one = check_claims([Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "avg")], {m: r[:1] for m, r in runs.items()})[0]
    assert one["verdict"] == "inconclusive" and one["interval"]["low"] is None
    # a claim whose methods did not run is left out, not guessed; a seed run twice is an error
    assert check_claims([Claim("FedCE", "fedce_sum", "fedavg", "dice", "std")], runs) == []
    with pytest.raises(ValueError, match="seed 0"):
        check_claims(
            [Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "avg")],
            {**runs, "fedavg": runs["fedavg"] + runs["fedavg"][:1]},
        )


def test_claims_markdown_shows_each_verdict_with_its_interval():
    runs = {
        "fedavg": [run_record("fedavg", s, {"site-1": 0.5, "site-2": 0.5}) for s in range(3)],
        "ditto": [
            run_record("ditto", s, {"site-1": 0.5 + d, "site-2": 0.5 + d}) for s, d in enumerate([0.01, 0.02, 0.03])
        ],
    }
    checked = check_claims(
        [Claim("Ditto", "ditto", "fedavg", "dice", "avg"), Claim("Ditto", "ditto", "fedavg", "dice", "std")], runs
    )
    text = "\n".join(claims_markdown(checked))
    assert (
        "| Ditto | Ditto: Avg. Dice at least FedAvg's | 52.00 ± 1.00 | 50.00 ± 0.00 | +2.00 [-0.48, +4.48] | 3 "
        "| inconclusive |" in text
    )
    assert "| +0.00 [+0.00, +0.00] | 3 | **fails** |" in text  # the std: 0 at every site and seed
    assert "Student t" in text and "Where a claim did not hold" in text
    assert claims_markdown([]) == []


def test_claims_judged_again_from_the_committed_outputs(tmp_path, capsys):
    out = tmp_path / "bench"
    (out / "dice").mkdir(parents=True)
    rows = ["method,variant,seed,site,metric,percent,file"]
    for seed, (avg, lwr) in enumerate([(70.0, 72.0), (60.0, 63.0), (65.0, 66.0)]):
        for method, value in (("fedavg", avg), ("fedlwr", lwr)):
            rows += [
                f"{method},,{seed},site-1,dice,{value:.4f},x",
                f"{method},,{seed},site-2,dice,{value:.4f},x",
                f"{method},,{seed},mean,dice,{value:.4f},x",
                f"{method},,{seed},std,dice,0.0000,x",
            ]
    rows.append("fedlwr,free riders: site-3,0,site-1,dice,1.0,x")  # a variant is not the method
    (out / "dice" / "results.csv").write_text("\n".join(rows) + "\n")
    old_missing = {
        "paper": "FedCE",
        "claim": "old",
        "method": "fedce_sum",
        "baseline": "fedavg",
        "metric": "clean_dice",
        "statistic": "avg",
        "value": [1.0, 0.1],
        "baseline_value": [0.5, 0.1],
        "difference": 0.5,
        "holds": True,
        "seeds": [3, 3],
        "per_site_difference": {},
    }
    (out / "summary.json").write_text(
        json.dumps({"family": "segmentation", "metrics": ["dice"], "claims": [old_missing]})
    )
    (out / "SUMMARY.md").write_text(
        "# Benchmark\n\n## Dice per site\n\nkept\n\n## The papers' claims on this data\n\n| old | yes |\n"
    )
    assert cli_main(["benchmark", "prostate", "--rejudge", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    avg = next(c for c in summary["claims"] if c["method"] == "fedlwr" and c["statistic"] == "avg")
    # differences 2, 3, 1: mean 2, sd 1
    assert avg["interval"]["mean"] == pytest.approx(2.0) and avg["interval"]["n"] == 3
    assert avg["interval"]["low"] == pytest.approx(2 - T_975_2DOF / 3**0.5) and avg["verdict"] == "inconclusive"
    kept = summary["claims"][0]  # no per-seed values of its metric: kept, not judged, in its place in the outputs
    assert kept["claim"] == "old" and kept["verdict"] == "inconclusive" and kept["interval"] is None
    assert all("holds" not in c for c in summary["claims"])
    text = (out / "SUMMARY.md").read_text()
    assert text.startswith("# Benchmark\n\n## Dice per site\n\nkept\n\n## The papers' claims on this data\n")
    assert "| old | yes |" not in text and "+2.00 [-0.48, +4.48] | 3 | inconclusive |" in text
    assert "+0.50 (no per-seed values) | – | inconclusive |" in text
    assert "+2.00 [-0.48, +4.48]" in capsys.readouterr().out
    rejudge(out)  # judging again changes nothing
    assert json.loads((out / "summary.json").read_text()) == summary and (out / "SUMMARY.md").read_text() == text
    # a broken results file: an error naming the file and the line, nothing rewritten
    (out / "dice" / "results.csv").write_text(
        "method,variant,seed,site,metric,percent,file\nfedavg,,zero,site-1,dice,1,x\n"
    )
    assert cli_main(["benchmark", "prostate", "--rejudge", "--out", str(out)]) == 1
    assert "results.csv, line 2" in capsys.readouterr().err and (out / "SUMMARY.md").read_text() == text
    assert cli_main(["benchmark", "prostate", "--rejudge", "--out", str(tmp_path / "none")]) == 1
    assert "no benchmark outputs" in capsys.readouterr().err


def test_section_and_readme_blocks_are_rewritten_from_their_source(tmp_path):
    out = tmp_path / "benchmarks" / "results" / "x"
    out.mkdir(parents=True)
    (out / "SUMMARY.md").write_text(
        "# Title\n\nintro\n\n## Dice per site\n\n| a |\n\n[report](dice/report.md)\n\n"
        "### detail\n\nkept\n\n## Round time\n\nnot this\n"
    )
    assert (
        section((out / "SUMMARY.md").read_text(), "Dice per site")
        == "| a |\n\n[report](dice/report.md)\n\n### detail\n\nkept\n"
    )
    with pytest.raises(ValueError, match="no section"):
        section("# a\n", "b")
    readme = tmp_path / "README.md"
    readme.write_text(
        "before\n<!-- generated from benchmarks/results/x/SUMMARY.md#Dice per site -->\ntyped by hand\n"
        "<!-- end generated -->\nafter\n"
    )
    assert update_generated_blocks(readme, check=True) == ["benchmarks/results/x/SUMMARY.md#Dice per site"]
    assert "typed by hand" in readme.read_text()  # --check changes nothing
    assert cli_main(["update-readme", str(readme), "--check"]) == 1
    assert cli_main(["update-readme", str(readme)]) == 0
    text = readme.read_text()
    assert "typed by hand" not in text and "| a |" in text and "##### detail" in text and "not this" not in text
    assert "[report](benchmarks/results/x/dice/report.md)" in text and text.endswith("after\n")
    assert update_generated_blocks(readme, check=True) == []


def test_a_docs_page_block_links_relative_to_the_page_and_a_stale_one_is_reported(tmp_path, capsys):
    out = tmp_path / "benchmarks" / "results" / "x"
    out.mkdir(parents=True)
    (out / "SUMMARY.md").write_text(
        "# T\n\n## Dice per site\n\n| a |\n\n[report](dice/report.md) "
        "![fig](../y/plot.png) [web](https://example.org/a.md) [here](#dice-per-site)\n"
    )
    readme = tmp_path / "README.md"
    block = "<!-- generated from {}benchmarks/results/x/SUMMARY.md#Dice per site -->\n{}<!-- end generated -->\n"
    readme.write_text("intro\n")
    (tmp_path / "docs" / "methods").mkdir(parents=True)
    page = tmp_path / "docs" / "benchmarks.md"
    page.write_text("# Benchmarks\n\n" + block.format("../", "old numbers\n"))
    nested = tmp_path / "docs" / "methods" / "fedavg.md"
    nested.write_text(block.format("../../", "") + "tail\n")
    assert documentation_files(tmp_path) == [readme, page, nested]
    files = [str(f) for f in documentation_files(tmp_path)]
    assert cli_main(["update-readme", *files, "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{page}: out of date" in err and f"{nested}: out of date" in err and "README" not in err
    assert "old numbers" in page.read_text()  # --check changes nothing
    assert cli_main(["update-readme", *files]) == 0 and cli_main(["update-readme", *files, "--check"]) == 0
    text = page.read_text()
    assert "old numbers" not in text and "[report](../benchmarks/results/x/dice/report.md)" in text
    assert "![fig](../benchmarks/results/y/plot.png)" in text
    assert "[web](https://example.org/a.md)" in text and "[here](#dice-per-site)" in text  # not file links
    assert "[report](../../benchmarks/results/x/dice/report.md)" in nested.read_text()
    assert nested.read_text().endswith("<!-- end generated -->\ntail\n")
    # a block whose path is written as from the repository root, in a docs page: an error naming the page
    page.write_text(block.format("", ""))
    assert cli_main(["update-readme", str(page), "--check"]) == 1
    err = capsys.readouterr().err
    assert str(page) in err and "relative to the file holding it" in err


@pytest.mark.parametrize("task", ["prostate", "fundus", "skin", "skin_imbalanced"])
def test_the_committed_claims_are_those_judged_from_the_committed_per_seed_outputs(tmp_path, task):
    import shutil

    committed = os.path.join(REPO, "benchmarks", "results", "compare", task)
    out = tmp_path / task
    shutil.copytree(committed, out, ignore=shutil.ignore_patterns("*.png", "loo"))
    rejudge(out)
    for name in ("SUMMARY.md", "summary.json"):
        assert (out / name).read_text() == open(os.path.join(committed, name)).read(), (
            f"{task}/{name}: run `fairfl benchmark {task} --rejudge`"
        )
    claims = json.loads((out / "summary.json").read_text())["claims"]
    assert claims and all(c["verdict"] in ("holds", "fails", "inconclusive") and "holds" not in c for c in claims)


def test_the_readme_and_docs_results_are_those_of_the_committed_benchmark_outputs(capsys):
    files = documentation_files(REPO)
    # docs/benchmarks.md is the index of one page per task under docs/benchmarks/, each with its generated blocks
    folder = os.path.join(REPO, "docs", "benchmarks")
    pages = [os.path.join(folder, f"{p}.md") for p in ("segmentation", "quality-shift", "class-imbalance", "cost")]
    assert set(pages) <= set(map(str, files))
    stale = {str(f): update_generated_blocks(f, check=True) for f in files}
    assert not any(stale.values()), f"blocks out of date: {stale}: run `fairfl update-readme`"
    for page in pages:
        with open(page) as f:
            assert "<!-- generated from ../../benchmarks/results/" in f.read(), page  # the moves kept their blocks
    assert cli_main(["update-readme", "--check"]) == 0  # the default: README.md and docs/**/*.md


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
                "FedNPR-Per: Avg. Balanced accuracy at least FedNPR's",
            ],
        ),
    ],
)
def test_every_table_of_a_family_from_finished_runs_without_running_them_again(
    tmp_path, dataset, methods, tables, monkeypatch
):
    import fairfl.simulate

    monkeypatch.setattr(fairfl.simulate, "run_simulator", lambda *a, **k: pytest.fail("a finished run was run again"))
    sites, seeds, out = ["site-1", "site-2", "site-3"], [0, 1], tmp_path / "bench"
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
    assert summary["results"]["fedavg"][summary["metrics"][0]]["avg"][1] is not None  # an sd over the 2 seeds
    # rounds 1 and 2 (not evaluated) of both seeds: 3 and 4 s plus the run's offset
    offset = sorted(VARIANTS).index("fedavg") / 100
    assert summary["round_seconds"]["fedavg"] == pytest.approx(3.5 + offset + 0.0025)
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


def test_test_split_errors_average_each_sites_error_over_runs_and_skip_runs_without_one():
    from fairfl.benchmark.run_statistics import test_split_errors

    def run(se2, se10):
        per_site = {
            "site-2": {"dice": 0.7, **({"dice_se": se2} if se2 is not None else {})},
            "site-10": {"dice": 0.6, "dice_se": se10},
        }
        return {"final": {"per_site": per_site}}

    errors = test_split_errors({"fedavg": [run(0.02, 0.10), run(None, 0.20)], "ditto": [run(0.04, 0.30)]}, "dice")
    assert list(errors) == ["site-2", "site-10"]  # natural site order
    assert errors["site-2"] == pytest.approx(3.0) and errors["site-10"] == pytest.approx(20.0)
    assert test_split_errors({"fedavg": [{"final": None}]}, "dice") == {}


def test_the_benchmark_scripts_judge_targets_on_seed_paired_intervals(tmp_path):
    """benchmarks/fairness.py (and fedce, fedism, fednpr through it): a target cell is the paired per-seed difference
    with its 95% interval, not a difference of means; pairing cancels what the seed shifts in both methods."""
    import sys

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from fairness import per_seed_final, target_cell
    finally:
        sys.path.pop(0)

    def write(name, seed, dice):
        path = tmp_path / f"{name}{seed}.json"
        path.write_text(
            json.dumps(
                {"seed": seed, "final": {"per_site": {f"site-{i + 1}": {"dice": d} for i, d in enumerate(dice)}}}
            )
        )
        return str(path)

    # the seed moves both methods by a lot; the method is always 2 points better on average
    base = [write("a", s, [0.5 + 0.1 * s, 0.6 + 0.1 * s]) for s in range(3)]
    better = [write("b", s, [0.52 + 0.1 * s, 0.62 + 0.1 * s]) for s in range(3)]
    a = {"per_seed": {"dice_avg": per_seed_final(base, "dice", "avg")}}
    b = {"per_seed": {"dice_avg": per_seed_final(better, "dice", "avg")}}
    assert a["per_seed"]["dice_avg"] == pytest.approx({0: 55.0, 1: 65.0, 2: 75.0})
    assert target_cell(b, a, "dice_avg") == "+2.00 [+2.00, +2.00] (3 seeds)"
    assert target_cell(b, {"per_seed": {}}, "dice_avg") == "–"


def test_mean_weights_average_layers_then_rounds_then_runs():
    from fairfl.benchmark.run_statistics import mean_weights

    lwr = {
        "rounds": [
            {"layer_weights": {"a": {"site-1": 0.2, "site-2": 0.8}, "b": {"site-1": 0.4, "site-2": 0.6}}},
            {"layer_weights": {"a": {"site-1": 0.5, "site-2": 0.5}}},
            {},
        ]
    }
    assert mean_weights([lwr]) == pytest.approx({"site-1": 0.4, "site-2": 0.6})  # (0.3 + 0.5) / 2
    avg = [
        {"rounds": [{"weights": {"site-1": 0.25, "site-10": 0.75}}]},
        {"rounds": [{"weights": {"site-1": 0.35, "site-10": 0.65}}, {"rejected": {"site-1": "NaN"}}]},
    ]
    assert list(mean_weights(avg)) == ["site-1", "site-10"]
    assert mean_weights(avg) == pytest.approx({"site-1": 0.3, "site-10": 0.7})
    assert mean_weights([{"rounds": [{"weights": None}]}]) == {}


def test_train_diagnostics_are_medians_over_sites_rounds_and_runs():
    from fairfl.benchmark.run_statistics import train_diagnostics

    runs = [
        {
            "rounds": [
                {"train": {"site-1": {"npr_grad_ratio": 1.0}, "site-2": {"npr_grad_ratio": 9.0}}},
                {"train": {"site-1": {"train_loss": 0.3}}},
            ]
        },
        {"rounds": [{"train": {"site-1": {"npr_grad_ratio": 2.0}}}, {"train": None}]},
    ]
    assert train_diagnostics(runs) == {"npr_grad_ratio": 2.0}
    assert train_diagnostics([{"rounds": [{"train": {"site-1": {"train_loss": 0.3}}}]}]) == {}


def test_cost_benchmark_counts_only_training_rounds_and_pairs_each_method_with_its_own_fedavg_runs():
    """benchmarks/cost.py: round 0 (the sites start) and evaluated rounds are not a round's cost; a site's own
    method work is its probe, prototype and personal-training seconds; a method's ratio pairs its runs with the
    FedAvg runs of the same repeat, never with another method's."""
    import sys

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    try:
        from cost import round_costs, summarize
    finally:
        sys.path.pop(0)

    def record(r, seconds, per_site=None, stopped=None):
        train = {"site-1": {"train_seconds": 1.0, "probe_seconds": 0.5}, "site-2": {"train_seconds": 2.0}}
        phases = {"train_task": seconds - 0.5, "server_step": 0.5}
        return {
            "round": r,
            "seconds": seconds,
            "train": train,
            "phases": phases,
            "per_site": per_site,
            "stopped": stopped,
        }

    results = {"rounds": [record(0, 30.0), record(1, 3.0), record(2, 5.0), record(3, 4.0, stopped="x")]}
    results["rounds"].append(record(4, 99.0, per_site={"site-1": {"dice": 0.5}}))
    costs = round_costs(results)
    assert costs["rounds"] == 2 and costs["round"] == pytest.approx(4.0) and costs["train_task"] == pytest.approx(3.5)
    assert costs["slowest_site_training"] == 2.0 and costs["all_sites_training"] == 3.0
    assert costs["all_sites_method_work"] == 0.5
    assert round_costs({"rounds": [record(0, 1.0), {"round": 1, "seconds": 2.0}]})["train_task"] is None  # old file

    def run(seconds, dataset="prostate"):
        return {"round": seconds, **{k: 0.0 for k in costs if k not in ("rounds", "round")}, "dataset": dataset}

    runs = {"fedavg@fedprox#0": run(2.0), "fedprox@fedprox#0": run(2.2), "fedavg@fedprox#1": run(4.0)}
    runs.update({"fedprox@fedprox#1": run(4.8), "fedavg@ditto#0": run(1.0), "ditto@ditto#0": run(3.0)})
    runs["ditto@ditto#1"] = run(9.0)  # its FedAvg run has not run yet: no pair
    floors = {"prostate#per_core#0": {"round": 1.0}, "prostate#per_core#1": {"round": 2.0}}
    summary, text = summarize(runs, {**floors, "prostate#per_site#0": {"round": 2.5}})
    assert summary["methods"]["fedprox"]["ratios"] == [1.1, 1.2] and summary["methods"]["ditto"]["ratio"] == 3.0
    assert "| fedprox | 3.50 | 3.00 | 1.15 [1.1, 1.2] | 1.1 |" in text
    assert "| prostate | 2.00 | 1.50 | 1.33 | 2.50 | 0.80 |" in text  # FedAvg's median round over each floor's
