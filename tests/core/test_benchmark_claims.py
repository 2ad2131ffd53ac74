"""The papers' claims `fairfl benchmark` checks: paired per-seed differences and their Student t intervals against
hand computations, the verdicts and their table, `--rejudge` from the per-seed results.csv files (hostile rows named
by file and line), and the committed claims equal to those judged from the committed per-seed outputs."""

import json
import math
import os

import pytest

from fairfl.benchmark.claims import check_claims, claims_markdown
from fairfl.benchmark.rejudge import rejudge
from fairfl.cli import main as cli_main
from fairfl.methods import Claim
from fairfl.paired import Interval, mean_interval, paired_differences, paired_interval, verdict

from helpers import REPO


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
    # fewer than 3 paired seeds: not judged, however the interval lies (paired.verdict alone judges 2)
    for seeds in (1, 2):
        few = {m: [r for r in rs if r["seed"] != 1][:seeds] for m, rs in runs.items()}  # seed 1 is the NaN
        (checked,) = check_claims([Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "avg")], few)
        assert checked["verdict"] == "not judged" and checked["reason"] == "fewer than 3 paired seeds"
        assert "| not judged (fewer than 3 paired seeds) |" in "\n".join(claims_markdown([checked]))
    # two seeds 1 point apart at both: [+1, +1] would hold by paired.verdict, yet two seeds decide nothing here
    assert checked["interval"]["n"] == 2 and verdict(Interval.from_json(checked["interval"])) == "holds"
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
        "| Ditto | Ditto: Avg. Dice above FedAvg's | 52.00 ± 1.00 | 50.00 ± 0.00 | +2.00 [-0.48, +4.48] | 3 "
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
    assert kept["claim"] == "old" and kept["verdict"] == "not judged" and kept["interval"] is None
    assert all("holds" not in c for c in summary["claims"])
    text = (out / "SUMMARY.md").read_text()
    assert text.startswith("# Benchmark\n\n## Dice per site\n\nkept\n\n## The papers' claims on this data\n")
    assert "| old | yes |" not in text and "+2.00 [-0.48, +4.48] | 3 | inconclusive |" in text
    assert "+0.50 (no per-seed values) | – | not judged (no per-seed values) |" in text
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


@pytest.mark.parametrize("task", ["prostate", "fundus", "skin", "skin_imbalanced"])
def test_the_committed_claims_are_those_judged_from_the_committed_per_seed_outputs(tmp_path, task):
    import shutil

    committed = os.path.join(REPO, "benchmarks", "results", "compare", task)
    out = tmp_path / task
    shutil.copytree(committed, out, ignore=shutil.ignore_patterns("*.png", "loo"))
    rejudge(out)
    for name in ("SUMMARY.md", "summary.json"):
        with open(os.path.join(committed, name)) as f:
            assert (out / name).read_text() == f.read(), f"{task}/{name}: run `fairfl benchmark {task} --rejudge`"
    claims = json.loads((out / "summary.json").read_text())["claims"]
    verdicts = ("holds", "fails", "inconclusive", "not judged")
    assert claims and all(c["verdict"] in verdicts and "holds" not in c for c in claims)


def test_an_arm_identical_to_the_baseline_holds_no_claim_above_it():
    same = {"site-1": 0.5, "site-2": 0.7}
    runs = {m: [run_record(m, seed, same) for seed in range(3)] for m in ("fedavg", "ditto")}
    avg, std = check_claims(
        [Claim("Ditto", "ditto", "fedavg", "dice", "avg"), Claim("Ditto", "ditto", "fedavg", "dice", "std")], runs
    )
    assert avg["claim"] == "Ditto: Avg. Dice above FedAvg's" and avg["interval"]["low"] == 0.0
    assert avg["verdict"] == std["verdict"] == "fails"  # [0, 0] is not above 0, nor below it
    # a tolerance is still a tolerance: at most 0.5 points below holds for the same arm
    assert Claim("FedFloor", "ditto", "fedavg", "dice", "avg", -0.5).judge(mean_interval([0.0, 0.0, 0.0])) == "holds"


def test_an_arm_that_did_not_train_is_flagged_and_credited_with_no_claim():
    from fairfl.benchmark.checks import training_checks, warnings_section, with_warnings

    fedavg = {"site-1": 0.72, "site-2": 0.68, "site-3": 0.30}  # site-3: FedAvg's defaults leave it untrained
    runs = {
        "fedavg": [run_record("fedavg", s, fedavg) for s in range(3)],
        # q-FedAvg at 7.7 Dice against FedAvg's 70: a tiny spread, but of a model that fits no site
        "qfedavg": [run_record("qfedavg", s, {"site-1": 0.077, "site-2": 0.076, "site-3": 0.078}) for s in range(3)],
        "ditto": [run_record("ditto", s, {k: v + 0.01 for k, v in fedavg.items()}) for s in range(3)],
    }
    checks = training_checks(runs, ["dice"])
    assert checks["did_not_train"] == {"qfedavg": [pytest.approx(7.7), pytest.approx(170 / 3)]}
    assert checks["low_fedavg_sites"] == {"dice": {"site-3": pytest.approx(30.0)}}
    std, ditto = check_claims(
        [Claim("q-FFL", "qfedavg", "fedavg", "dice", "std"), Claim("Ditto", "ditto", "fedavg", "dice", "avg")], runs
    )
    assert std["verdict"] == "not judged" and std["reason"] == "q-FedAvg (L = 1/lr) did not train"
    assert ditto["verdict"] == "holds"  # +1 at every seed: a trained arm is judged as before
    section = warnings_section(checks, ["dice"])
    text = "\n".join(section)
    assert section[0] == "## Warnings" and "**Did not train**: q-FedAvg (L = 1/lr) (7.70)" in text
    assert "below 0.5 times FedAvg's (56.67)" in text and "below 50% at site-3 30.00" in text
    # SUMMARY.md: the warnings right after the header, replaced (not repeated) when judged again, removed when none
    summary = "# Benchmark\n\nheader\n\n## Dice per site\n\ntable\n"
    warned = with_warnings(summary, section)
    assert warned.startswith("# Benchmark\n\nheader\n\n## Warnings\n\n**Did not train**")
    assert warned.endswith("\n\n## Dice per site\n\ntable\n") and with_warnings(warned, section) == warned
    assert with_warnings(warned, []) == summary
    # the quality-shift tasks: the clean test set decides, not the corrupted one
    assert training_checks(runs, ["auc", "clean_auc"])["low_fedavg_sites"] == {}


def test_a_registry_variant_is_rejudged_as_itself_from_results_csv(tmp_path):
    """fedavg_sgd's runs record method fedavg and variant SGD in results.csv: --rejudge reads them as fedavg_sgd's
    (the q-FedAvg SGD benchmark), while other variants (free riders) stay out."""
    from fairfl.benchmark.rejudge import runs_from_csv

    csv_file = tmp_path / "results.csv"
    csv_file.write_text(
        "method,variant,seed,site,metric,percent,file\n"
        "fedavg,SGD,0,site-1,dice,70.0,x\nqfedavg,SGD,0,site-1,dice,60.0,x\n"
        "fedavg,,0,site-1,dice,72.0,x\nfedavg,free riders: site-3,0,site-1,dice,1.0,x\n"
    )
    runs = runs_from_csv([csv_file])
    assert sorted(runs) == ["fedavg", "fedavg_sgd", "qfedavg_sgd"]
    assert runs["fedavg_sgd"][0]["final"]["per_site"]["site-1"]["dice"] == pytest.approx(0.70)
    assert runs["fedavg"][0]["final"]["per_site"]["site-1"]["dice"] == pytest.approx(0.72)


def test_claims_read_the_final_round_even_where_an_earlier_round_was_better():
    """The report's paper-style best round (fairfl.report.best_round) is never what a claim is judged on: a method
    whose earlier evaluated round beat the baseline by 20 points, but whose last round is 2 points below it, fails."""
    from fairfl.report.best_round import best_round

    def with_better_round(method, seed, final, earlier):
        run = run_record(method, seed, {"site-1": final, "site-2": final})
        run["rounds"] = [
            {"round": 0, "seconds": 3.0, "per_site": {s: {"dice": earlier} for s in ("site-1", "site-2")}},
            {"round": 1, "seconds": 2.0, "per_site": run["final"]["per_site"]},
        ]
        return run

    runs = {
        "fedavg": [with_better_round("fedavg", s, 0.60 + 0.01 * s, 0.50) for s in range(3)],
        "fedlwr": [with_better_round("fedlwr", s, 0.58 + 0.01 * s, 0.80) for s in range(3)],
    }
    assert all(best_round(run, "dice")["best"][0] == 0 for run in runs["fedlwr"])  # the earlier round was better
    (avg,) = check_claims([Claim("Fed-LWR", "fedlwr", "fedavg", "dice", "avg")], runs)
    assert avg["differences"] == {0: -2.0, 1: -2.0, 2: -2.0} and avg["verdict"] == "fails"
    assert avg["value"][0] == pytest.approx(59.0) and avg["baseline_value"][0] == pytest.approx(61.0)


def test_claims_that_counted_the_test_splits_are_kept_when_rejudged_without_the_runs(tmp_path):
    """The committed worst-off benchmark counted the test splits from its runs' influences, which are not committed:
    judged again from its results.csv alone, every such claim keeps its interval (and verdict), byte for byte."""
    import shutil

    committed = os.path.join(REPO, "benchmarks", "results", "worst_off", "prostate")
    out = tmp_path / "prostate"
    shutil.copytree(committed, out, ignore=shutil.ignore_patterns("*.png", "runs"))
    csv_file = out / "dice" / "results.csv"
    csv_file.write_text(csv_file.read_text().replace("/work/main/", str(tmp_path / "gone") + "/"))
    rejudge(out)
    for name in ("SUMMARY.md", "summary.json"):
        with open(os.path.join(committed, name)) as f:
            assert (out / name).read_text() == f.read(), name
    claims = json.loads((out / "summary.json").read_text())["claims"]
    assert all(c["interval"]["split_se"] > 0 for c in claims)
