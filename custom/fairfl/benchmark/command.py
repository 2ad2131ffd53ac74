"""`fairfl benchmark TASK`: every method the papers compare, side by side on one task's data, through the real
NVFlare simulator; several seeds; resumable; the papers' tables, figures and a check of their claims.

TASK is a built-in dataset (prostate, fundus: segmentation, the Fed-LWR and FedCE tables; skin, ich and their
_blur forms: classification under a quality shift, the FedISM+ tables; skin_imbalanced, ich_imbalanced: class
imbalance, the FedNPR table). With --data-root the sites read that folder instead (name the built-in dataset of
the same task). Runs go to <out>/runs/<dataset>-<method>-seed<seed>; a finished run with the same settings is
kept, so an interrupted benchmark continues where it stopped. Outputs in <out>: SUMMARY.md (every table, the
claims, the command and versions), summary.json, and per metric a folder with report.md, results.csv and the
convergence figures (`fairfl report`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from fairfl.benchmark.claims import claims_markdown
from fairfl.benchmark.rejudge import rejudge
from fairfl.benchmark.runner import FAMILIES, family, run_benchmark
from fairfl.cli_arguments import at_least
from fairfl.data.builtin import BUILTIN_DATASETS, builtin_dataset
from fairfl.jobconfig import JOBS, parse_assignments
from fairfl.methods import VARIANTS, family_methods
from fairfl.site_settings import DATA_ROOT_ENV

# the built-in data's test splits in a benchmark: 4 times their size (training and validation unchanged), so that a
# site's score is measured on enough patients to compare methods by (a split of 2 to 6 patients has a standard error
# of 2 to 6 Dice points); `--set test_scale=1` for the splits the jobs use
BENCHMARK_TEST_SCALE = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dataset",
        metavar="TASK",
        choices=sorted(BUILTIN_DATASETS),
        help=f"built-in dataset of the task: {', '.join(sorted(BUILTIN_DATASETS))}",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(VARIANTS),
        metavar="METHOD",
        help="default: the methods the task's papers compare (segmentation: "
        f"{' '.join(family_methods('segmentation'))}; quality shift: "
        f"{' '.join(family_methods('quality_shift'))}; imbalanced: "
        f"{' '.join(family_methods('imbalanced'))})",
    )
    parser.add_argument("--seeds", type=at_least(0), nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=at_least(1), default=20)
    parser.add_argument("--eval-every", type=at_least(0), default=5)
    parser.add_argument(
        "--sites",
        type=at_least(2),
        help="number of sites (default: the papers' for the task: 6, ich_imbalanced 10, quality shift 20)",
    )
    parser.add_argument("--data-root", default="", help="sites read this folder (datalists <site>.json) instead")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="job arguments for every run (JSON values), e.g. image_size=32 model_channels=[8,16]; on the built-in "
        f"data test_scale={BENCHMARK_TEST_SCALE} unless set (test splits {BENCHMARK_TEST_SCALE} times larger)",
    )
    parser.add_argument(
        "--loo",
        action="store_true",
        help="also run FedAvg leaving each site out (sites + 1 runs) for the contribution table",
    )
    parser.add_argument("--out", help="output folder (default: benchmarks/results/compare/<TASK>)")
    parser.add_argument(
        "--rejudge",
        action="store_true",
        help="run nothing: judge the claims again from the outputs already in the output folder "
        "(summary.json, <metric>/results.csv) and rewrite their claims and warnings",
    )


def canonical_command(dataset, methods, seeds, rounds, eval_every, sites, data_root, assignments, loo, out) -> str:
    """The command that reruns this benchmark, every setting spelled out."""
    parts = [
        "fairfl",
        "benchmark",
        dataset,
        "--methods",
        *methods,
        "--seeds",
        *map(str, seeds),
        "--rounds",
        str(rounds),
        "--eval-every",
        str(eval_every),
        "--sites",
        str(sites),
    ]
    parts += ["--data-root", data_root] if data_root else []
    parts += ["--set", *assignments] if assignments else []
    parts += ["--loo"] if loo else []
    parts += ["--out", str(out)] if out else []
    return " ".join(shlex.quote(p) for p in parts)


def run(args) -> int:
    extra = parse_assignments(args.set)
    # a site reads FAIRFL_DATA_ROOT over the job's data_root (fairfl.site_settings), and in the simulator every site
    # has this process's environment: taken as the benchmark's data root, so that the outputs say what was read
    environment_root = os.environ.get(DATA_ROOT_ENV, "")
    if environment_root and args.data_root and os.path.abspath(environment_root) != os.path.abspath(args.data_root):
        print(
            f"fairfl benchmark: --data-root {args.data_root}, but every site would read {DATA_ROOT_ENV}="
            f"{environment_root} (a site's own setting, over the job's): unset it or give the same root",
            file=sys.stderr,
        )
        return 2
    if environment_root and not args.data_root:
        print(f"data root: {environment_root} ({DATA_ROOT_ENV})", flush=True)
        args.data_root = environment_root
    if args.data_root:
        extra["data_root"] = os.path.abspath(args.data_root)
    elif "test_scale" not in extra:
        extra["test_scale"] = BENCHMARK_TEST_SCALE
        args.set = [*args.set, f"test_scale={BENCHMARK_TEST_SCALE}"]
    kind = family(args.dataset)
    sites = args.sites or FAMILIES[kind].get("sites", max(6, builtin_dataset(args.dataset).min_sites))
    methods = args.methods or family_methods(kind)
    out = args.out or JOBS.parent / "benchmarks" / "results" / "compare" / args.dataset
    if args.rejudge:
        try:
            claims = rejudge(out)["claims"]
        except (ValueError, KeyError) as e:
            print(f"fairfl benchmark --rejudge: {e}", file=sys.stderr)
            return 1
        print("\n".join(claims_markdown(claims)))
        return 0
    command = canonical_command(
        args.dataset,
        methods,
        args.seeds,
        args.rounds,
        args.eval_every,
        sites,
        args.data_root,
        args.set,
        args.loo,
        args.out,
    )
    try:
        run_benchmark(
            args.dataset, methods, args.seeds, args.rounds, args.eval_every, sites, out, extra, args.loo, command
        )
    except (RuntimeError, ValueError, OSError) as e:
        print(f"fairfl benchmark: {e}", file=sys.stderr)
        return 1
    return 0
