"""The `fairfl` command: run a job, prepare or convert data, report, export jobs for production."""

from __future__ import annotations

import argparse
import os
import shutil
import sys


def _run(args) -> int:
    from fairfl.jobconfig import customize_job, parse_assignments
    from fairfl.report import make_report
    from fairfl.simulate import run_simulator

    job = os.path.abspath(args.job)
    workspace = os.path.abspath(args.workspace or os.path.join("workspaces", os.path.basename(job.rstrip("/"))))
    overrides = parse_assignments(args.set)
    if overrides:  # a customised copy beside the workspace; the job folder itself is never edited
        job = customize_job(job, workspace.rstrip("/") + "_job", overrides)
        print(f"job with {overrides}: {job}")
    print(f"running {job} in the NVFlare simulator with {args.n_clients} sites; workspace {workspace}", flush=True)
    run = run_simulator(job, workspace, args.n_clients, args.threads)
    if not run.ok:
        print(run.describe_failure(), file=sys.stderr)
        return 1
    report = make_report([run.results_path], os.path.join(workspace, "report"))
    print(f"\nfinished in {run.seconds:.0f} s\nresults:     {run.results_path}\nreport:      {report['report']}\n"
          f"tensorboard: tensorboard --logdir {os.path.join(os.path.dirname(run.results_path), 'tb_events')}\n"
          f"logs:        {workspace}/<site>/log.txt")
    return 0


def _prepare_data(args) -> int:
    from fairfl.data.synthetic_prostate import ensure_builtin_data, generate_prostate_sites

    if args.out:
        root = generate_prostate_sites(args.out, num_sites=args.num_sites, image_size=args.image_size, seed=args.seed)
    else:
        root = ensure_builtin_data(image_size=args.image_size, seed=args.seed, num_sites=args.num_sites)
    print(root)
    return 0


def _convert_prostate(args) -> int:
    from fairfl.data.convert_prostate import convert_prostate

    summary = convert_prostate(args.src, args.dst, seed=args.seed, site_names="flare" if args.rename_sites else None)
    print(summary)
    return 0


def _export_job(args) -> int:
    """Copy a job without its BYOC marker folders, for sites that forbid bring-your-own-code."""
    if os.path.exists(args.out):
        print(f"{args.out} exists; not overwriting", file=sys.stderr)
        return 1
    shutil.copytree(args.job, args.out, ignore=shutil.ignore_patterns("custom", "__pycache__"))
    print(f"exported {args.job} -> {args.out} (no app/custom: sites must allow-list 'fairfl.')")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from fairfl import report

    parser = argparse.ArgumentParser(prog="fairfl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a job in the NVFlare simulator, then write its report")
    p.add_argument("job", help="job folder, e.g. jobs/fedlwr")
    p.add_argument("-w", "--workspace", help="simulator workspace (default workspaces/<job name>)")
    p.add_argument("-n", "--n-clients", type=int, default=6)
    p.add_argument("-t", "--threads", type=int, default=None, help="client processes at once (default n)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a job argument for this run (JSON value), e.g. --set num_rounds=50; repeatable")
    p.set_defaults(func=_run)

    p = sub.add_parser("prepare-data", help="generate the built-in synthetic multi-site prostate data")
    p.add_argument("--out", help="write here instead of the cache")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-sites", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_prepare_data)

    p = sub.add_parser("convert-prostate", help="convert the multi-site prostate MRI layout to 2-D datalists")
    p.add_argument("src", help="folder with <site>/Image/<case>.nii.gz and <site>/Mask/<case>.nii.gz")
    p.add_argument("dst", help="output data root (<site>.json datalists)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rename-sites", action="store_true", help="name sites site-1..site-N (FLARE client names)")
    p.set_defaults(func=_convert_prostate)

    p = sub.add_parser("report", help="paper-style table and figures from one or more runs")
    report.add_arguments(p)
    p.set_defaults(func=report.run)

    p = sub.add_parser("export-job", help="copy a job for POC/production sites that forbid bring-your-own-code")
    p.add_argument("job")
    p.add_argument("out")
    p.set_defaults(func=_export_job)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
