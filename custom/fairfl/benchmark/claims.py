"""The papers' claims judged on a benchmark's runs (the paired per-seed differences, fairfl.paired) and their
table in SUMMARY.md."""

from __future__ import annotations

import math

from fairfl.benchmark.checks import untrained_methods
from fairfl.benchmark.run_statistics import final_stat, per_site_mean
from fairfl.paired import FAILS, HOLDS, Interval, mean_interval, paired_differences
from fairfl.report.runs import group_name_markdown
from fairfl.report.statistics import mean_sd, site_scores
from fairfl.results import site_key
from fairfl.split_noise import ScoredRun, split_noise
from fairfl.text import markdown_text

# fewer paired seeds than this judge nothing: with 2 the t interval is 12.7 sds wide and one odd seed decides
MIN_JUDGED_SEEDS = 3
NOT_JUDGED = "not judged"


def stat_by_seed(runs: list, metric: str, statistic: str) -> dict:
    """{seed: final Avg. or Std. of `metric` (%)} of the runs with a finite one; a seed run twice is an error."""
    values = {}
    for run in runs:
        value = final_stat(run, metric, statistic)
        if value is None or not math.isfinite(value):
            continue
        if run.get("seed") in values:
            raise ValueError(f"two runs of {run.get('method')} with seed {run.get('seed')}")
        values[run.get("seed")] = value
    return values


def scored_runs(runs: list, metric: str, shared_test: bool = False) -> dict:
    """{seed: ScoredRun} of the runs' final per-site `metric` (%) and their test patients' influences on it;
    `shared_test`: every site scored on one shared test set (fairfl.data.builtin.shared_test_set)."""
    found = {}
    for run in runs:
        final = run.get("final") or {}
        influences = {
            site: records[metric]
            for site, records in (final.get("test_influence") or {}).items()
            if isinstance(records, dict) and metric in records
        }
        found[run.get("seed")] = ScoredRun(site_scores(final, metric), influences, shared_test=shared_test)
    return found


def check_claims(claims: list, runs_by_method: dict, shared_test: bool = False) -> list[dict]:
    """Each claim whose two methods have finished runs: both values (mean ± sd over seeds), the paired per-seed
    differences method - baseline with the 95% interval of their mean, the verdict, and the per-site difference
    (mean over seeds) that shows where it did or did not hold. The verdict is NOT_JUDGED, with its `reason`, below
    MIN_JUDGED_SEEDS paired seeds or when either method did not train (fairfl.benchmark.checks). `shared_test`: the
    runs' sites were scored on one shared test set (its redraw moves them all)."""
    checked, untrained = [], {}
    for claim in claims:
        a, b = runs_by_method.get(claim.method), runs_by_method.get(claim.baseline)
        if not a or not b:
            continue
        values = [stat_by_seed(runs, claim.metric, claim.statistic) for runs in (a, b)]
        if not values[0] or not values[1]:
            continue
        # rounded to 1e-9 points: float noise (equal results summed in another order) decides nothing
        differences = {seed: round(d, 9) for seed, d in paired_differences(*values).items()}
        scored = [scored_runs(runs, claim.metric, shared_test) for runs in (a, b)]
        split = split_noise(*scored, claim.statistic, differences)
        interval = mean_interval(differences.values(), split=split)
        sites_a, sites_b = per_site_mean(a, claim.metric), per_site_mean(b, claim.metric)
        if claim.metric not in untrained:
            untrained[claim.metric] = untrained_methods(runs_by_method, claim.metric)
        verdict, reason = judged(claim, interval, untrained[claim.metric])
        checked.append(
            {
                "paper": claim.paper,
                "claim": claim.text(group_name_markdown),
                "method": claim.method,
                "baseline": claim.baseline,
                "metric": claim.metric,
                "statistic": claim.statistic,
                "margin": claim.margin,
                "value": list(mean_sd(values[0].values())),
                "baseline_value": list(mean_sd(values[1].values())),
                "difference": interval.as_json()["mean"],
                "differences": differences,
                "interval": interval.as_json(),
                "verdict": verdict,
                **({"reason": reason} if reason else {}),
                "seeds": [len(values[0]), len(values[1])],
                "per_site_difference": {s: sites_a[s] - sites_b[s] for s in sites_a if s in sites_b},
            }
        )
    return checked


def not_judged_reason(paired_seeds: int, untrained: set) -> str:
    """Why a claim is not judged ("" when it is)."""
    if untrained:
        return f"{', '.join(sorted(map(group_name_markdown, untrained)))} did not train"
    if paired_seeds < MIN_JUDGED_SEEDS:
        return f"fewer than {MIN_JUDGED_SEEDS} paired seeds"
    return ""


def judged(claim, interval: Interval, untrained) -> tuple[str, str]:
    """(verdict, why it is not judged or "") of `claim` on the interval of its paired differences; `untrained`: the
    methods that did not train."""
    reason = not_judged_reason(interval.n, {claim.method, claim.baseline} & set(untrained))
    return (NOT_JUDGED, reason) if reason else (claim.judge(interval), "")


def verdict_text(c: dict) -> str:
    """A checked claim's verdict as SUMMARY.md prints it: fails in bold, not judged with its reason."""
    if c["verdict"] == NOT_JUDGED:
        return f"{NOT_JUDGED} ({c['reason']})" if c.get("reason") else NOT_JUDGED
    return "**fails**" if c["verdict"] == FAILS else c["verdict"]


def _value(stat) -> str:
    mean, sd = stat
    return f"{mean:.2f}" if sd is None else f"{mean:.2f} ± {sd:.2f}"


CLAIMS_RULE = (
    "Each claim as the paper states it for its method, judged on the paired per-seed differences "
    "(method − baseline, same seed) of the final value: their mean and its 95% interval (Student t, "
    "n − 1 degrees of freedom over the n paired seeds). A claim **holds** when the whole interval "
    "satisfies it, **fails** when none of it does, and is **inconclusive** otherwise; it is **not judged** "
    f"with fewer than {MIN_JUDGED_SEEDS} paired seeds or when either method did not train (Warnings). A claim "
    '"above" or "below" the baseline\'s is strict: an arm equal to the baseline does not hold it. Measured '
    "and baseline are mean ± sd over seeds."
)


SPLIT_RULE = (
    "Where a difference shows its test-split error (se), the interval counts the test splits' noise too: each "
    "site's test patients redrawn (patients as clusters, the same patients for every run), combined with the seeds' "
    "variation (fairfl.split_noise; docs/benchmarks.md)."
)


def _interval_cell(c: dict) -> str:
    if c.get("interval") is None:  # the outputs it was judged from had no per-seed values of its metric
        return f"{c['difference']:+.2f} (no per-seed values)"
    interval = Interval.from_json(c["interval"])
    return interval.text() + ("" if interval.split_se is None else f" (test splits: se {interval.split_se:.2f})")


def claims_markdown(checked: list) -> list[str]:
    if not checked:
        return []
    counted = any((c.get("interval") or {}).get("split_se") is not None for c in checked)
    lines = [
        CLAIMS_RULE + (" " + SPLIT_RULE if counted else ""),
        "",
        "| paper | claim | measured | baseline | difference, 95% interval (points) | paired seeds | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for c in checked:
        seeds = c["interval"]["n"] if c.get("interval") else "–"
        lines.append(
            f"| {c['paper']} | {c['claim']} | {_value(c['value'])} | {_value(c['baseline_value'])} | "
            f"{_interval_cell(c)} | {seeds} | {verdict_text(c)} |"
        )
    missed = [c for c in checked if c["verdict"] != HOLDS]
    if missed and any(c["per_site_difference"] for c in missed):
        lines += [
            "",
            "Where a claim did not hold, per site (final value of the method minus the baseline's, "
            "points, mean over seeds; for a Std. claim the site's own metric):",
            "",
        ]
        sites = sorted({s for c in missed for s in c["per_site_difference"]}, key=site_key)
        lines += ["| claim | " + " | ".join(map(markdown_text, sites)) + " |", "|---|" + "---:|" * len(sites)]
        for c in missed:
            lines.append(
                f"| {c['claim']} | "
                + " | ".join(
                    f"{c['per_site_difference'][s]:+.2f}" if s in c["per_site_difference"] else "–" for s in sites
                )
                + " |"
            )
    return lines


CLAIMS_HEADING = "## The papers' claims on this data"


def claims_section(checked: list) -> list[str]:
    claims = claims_markdown(checked)
    return ["", CLAIMS_HEADING, "", *claims] if claims else []
