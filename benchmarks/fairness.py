"""Fairness benchmark: Solo, FedAvg and Fed-LWR on the built-in six-site data, several seeds, through the
real NVFlare simulator; paper-style tables (mean +/- sd over seeds) and the round-time ratio.

Settings (Fed-LWR):
  epoch  one local epoch per round, as the paper: Solo, FedAvg, Fed-LWR (no CKA clip, the paper's Eq. 5)
  clip   Fed-LWR with the authors' code's CKA clip [1e-4, 0.99] (compared with FedAvg of `epoch`)
  steps  the same number of local steps at every site: FedAvg and Fed-LWR

Resumable: a run whose results.json is complete is not run again.

    python benchmarks/fairness.py --rounds 40 --seeds 0 1 2 --out benchmarks/results/fairness
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from fairfl.benchmark.claims import stat_by_seed
from fairfl.benchmark.runner import versions
from fairfl.paired import paired_interval
from fairfl.report.document import make_report
from fairfl.results import SIMULATOR_RESULTS
from fairfl.simulate import run_unless_finished

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# variant -> (job, extra job arguments)
VARIANTS = {
    "solo": ("solo", {}),
    "fedavg": ("fedavg", {}),
    "fedlwr": ("fedlwr", {}),
    "fedlwr_clip": ("fedlwr", {"cka_clip": [1e-4, 0.99]}),
    "fedavg_steps": ("fedavg", {"local_steps": "STEPS"}),
    "fedlwr_steps": ("fedlwr", {"local_steps": "STEPS"}),
}
SETTINGS = {
    "epoch": ["solo", "fedavg", "fedlwr"],
    "clip": ["fedavg", "fedlwr_clip"],
    "steps": ["fedavg_steps", "fedlwr_steps"],
}


def run_variant(variant, seed, args) -> str:
    """Run one (variant, seed) unless its results are already complete; return the results path."""
    job_name, extra = VARIANTS[variant]
    extra = {k: (args.steps if v == "STEPS" else v) for k, v in extra.items()}
    return run_job(job_name, f"{variant}-seed{seed}", {"seed": seed, **extra}, args)


def run_job(job_name, run_name, job_args, args, n_clients=None, env=None) -> str:
    """Run jobs/<job_name> with `job_args` (plus --rounds/--eval-every) in <out>/runs/<run_name>, unless a
    finished run with the same settings is there; return the results path. `env`: the sites' own settings."""
    workspace = Path(args.out) / "runs" / run_name
    job_args = {"num_rounds": args.rounds, "eval_every": args.eval_every, **job_args}
    try:
        run_unless_finished(os.path.join(REPO, "jobs", job_name), workspace, n_clients or args.sites, job_args, env=env)
    except RuntimeError as e:
        sys.exit(str(e))
    return str(workspace / SIMULATOR_RESULTS)


def round_seconds(results_path) -> list:
    """Seconds of the rounds that were not evaluated, without round 0 (process start-up)."""
    rounds = json.loads(Path(results_path).read_text())["rounds"]
    return [r["seconds"] for r in rounds[1:] if "per_site" not in r]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sites", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12, help="local steps per round in the `steps` setting")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "fairness"))
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)

    variants = list(dict.fromkeys(v for s in args.settings for v in SETTINGS[s]))
    paths = {}
    for seed in args.seeds:  # seeds outermost: an interrupted benchmark still has comparable runs
        for variant in variants:
            paths[variant, seed] = run_variant(variant, seed, args)

    summary = {
        "command": " ".join(["python", "benchmarks/fairness.py"] + (argv if argv is not None else sys.argv[1:])),
        "versions": versions(),
        "rounds": args.rounds,
        "seeds": args.seeds,
        "sites": args.sites,
        "steps": args.steps,
        "settings": {},
    }
    tables = {}
    for setting in args.settings:
        runs = [paths[v, s] for v in SETTINGS[setting] for s in args.seeds]
        tables[setting] = make_report(runs, os.path.join(args.out, setting))["table"]
        summary["settings"][setting] = {
            v: variant_summary([paths[v, s] for s in args.seeds]) for v in SETTINGS[setting]
        }
    write_summary(args.out, summary, summary_markdown(summary, tables))


def step_shares(results_path, key: str) -> list:
    """Per site and round (round 0 excluded): seconds of a step before training (`probe_seconds`: SAGA's
    sharpness, `prototype_seconds`: FedNPR's prototypes) / (those + the local training's `train_seconds`)."""
    rounds = json.loads(Path(results_path).read_text())["rounds"]
    return [
        m[key] / (m[key] + m["train_seconds"])
        for r in rounds[1:]
        for m in (r.get("train") or {}).values()
        if key in m and "train_seconds" in m
    ]


def write_summary(out_dir, summary: dict, markdown: str) -> None:
    """A benchmark's outputs: summary.json (numbers) and SUMMARY.md (tables), also printed."""
    Path(out_dir, "summary.json").write_text(json.dumps(summary, indent=1))
    Path(out_dir, "SUMMARY.md").write_text(markdown)
    print(markdown)


def variant_summary(results_paths) -> dict:
    """Mean over seeds of the final mean, std and worst, the median non-evaluation round time, the final main
    metric per site (`final_dice`, `final_auc`), and for Fed-LWR what the method saw: each site's mean CKA and mean
    layer weight over layers and
    rounds, and the share of CKA values above 0.99 (where the authors' clip makes the weights uniform)."""
    runs = [json.loads(Path(p).read_text()) for p in results_paths]
    sites = runs[0]["sites"]
    summary = {key: statistics.mean(r["final"][key] for r in runs) for key in ("mean", "std", "worst")}
    metric = runs[0].get("metric", "dice")
    summary["per_seed"] = {f"{metric}_{key}": per_seed_final(results_paths, metric, key) for key in ("avg", "std")}
    summary["round_seconds_median"] = statistics.median(sum((round_seconds(p) for p in results_paths), []))
    summary[f"final_{metric}"] = {s: statistics.mean(r["final"]["per_site"][s][metric] for r in runs) for s in sites}
    records = [rec for r in runs for rec in r["rounds"] if rec.get("cka")]
    if records:
        cka = [v for rec in records for per_layer in rec["cka"].values() for v in per_layer.values()]
        summary["cka_share_above_0.99"] = sum(v > 0.99 for v in cka) / len(cka)
        summary["mean_cka"] = {
            s: statistics.mean(v for rec in records for v in rec["cka"].get(s, {}).values()) for s in sites
        }
        summary["mean_layer_weight"] = {
            s: statistics.mean(w[s] for rec in records for w in rec["layer_weights"].values() if s in w) for s in sites
        }
    return summary


def per_seed_final(results_paths, metric: str, statistic: str) -> dict:
    """{seed: the run's final Avg. or Std. of `metric`, in points} (`fairfl.benchmark.claims.stat_by_seed`): what
    `target_cell` pairs by seed."""
    return stat_by_seed([json.load(open(p)) for p in results_paths], metric, statistic)


def target_cell(method: dict, baseline: dict, key: str) -> str:
    """A target table's cell: method - baseline of `key` (e.g. "dice_std"), paired by seed, with its 95% interval
    (fairfl.paired), e.g. "+0.30 [+0.10, +0.49] (3 seeds)"; "–" when the summaries hold no per-seed values."""
    interval = paired_interval(
        (method.get("per_seed") or {}).get(key, {}), (baseline.get("per_seed") or {}).get(key, {})
    )
    return "–" if interval.n == 0 else f"{interval.text()} ({interval.n} seed{'s' * (interval.n > 1)})"


def summary_markdown(summary, tables) -> str:
    settings = summary["settings"]
    lines = [
        "# Fairness benchmark: Solo, FedAvg, Fed-LWR",
        "",
        f"`{summary['command']}` — {summary['sites']} sites, {summary['rounds']} rounds, seeds "
        f"{summary['seeds']}; {summary['versions']}.",
        "",
    ]
    titles = {
        "epoch": "One local epoch per round (the paper's setting)",
        "clip": "Fed-LWR with the authors' CKA clip [1e-4, 0.99] (FedAvg as in `epoch`)",
        "steps": f"{summary['steps']} local steps per round at every site",
    }
    for setting, table in tables.items():
        lines += [
            f"## {titles[setting]}",
            "",
            table,
            "",
            f"Figures and per-run details: [{setting}/report.md]({setting}/report.md)",
            "",
        ]
    lines += [
        "## Against the targets",
        "",
        "Differences are paired by seed (Fed-LWR − FedAvg, same seed), in points, with the 95% interval of their mean.",
        "",
        "| setting | Fed-LWR std / FedAvg std (target <= 0.5) | Fed-LWR − FedAvg Std. | Fed-LWR − FedAvg Avg. "
        "(target >= 0) | Fed-LWR round time / FedAvg round time (target <= 1.3) |",
        "|---|---:|---:|---:|---:|",
    ]
    for setting, avg, lwr in (
        ("epoch", "fedavg", "fedlwr"),
        ("clip", "fedavg", "fedlwr_clip"),
        ("steps", "fedavg_steps", "fedlwr_steps"),
    ):
        if setting in settings:
            a, b = settings[setting][avg], settings[setting][lwr]
            lines.append(
                f"| {setting} | {b['std'] / a['std']:.2f} | {target_cell(b, a, 'dice_std')} | "
                f"{target_cell(b, a, 'dice_avg')} "
                f"| {b['round_seconds_median'] / a['round_seconds_median']:.2f} "
                f"({b['round_seconds_median']:.2f} s / {a['round_seconds_median']:.2f} s, medians) |"
            )
    for setting, variants in settings.items():
        for variant, values in variants.items():
            if "mean_cka" in values:
                lines += [
                    "",
                    f"What {variant} saw ({setting} setting; mean over seeds, layers and rounds; "
                    f"{100 * values['cka_share_above_0.99']:.0f}% of CKA values above 0.99):",
                    "",
                    "| | " + " | ".join(values["mean_cka"]) + " |",
                    "|---|" + "---:|" * len(values["mean_cka"]),
                    "| CKA to the anchor | " + " | ".join(f"{v:.4f}" for v in values["mean_cka"].values()) + " |",
                    "| layer weight | " + " | ".join(f"{v:.3f}" for v in values["mean_layer_weight"].values()) + " |",
                    "| final Dice (%) | " + " | ".join(f"{100 * v:.2f}" for v in values["final_dice"].values()) + " |",
                ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
