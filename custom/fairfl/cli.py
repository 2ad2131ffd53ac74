"""The `fairfl` command: run a job, prepare or convert data, leave-one-out values, report, export jobs for
production."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys

from fairfl.cli_arguments import (
    add_gpu_argument,
    add_mlflow_argument,
    at_least,
    existing_file,
    existing_folder,
    gpu_problem,
    job_folder,
    number_in,
    site_names,
)
from fairfl.overwrite import refuse_to_overwrite


def verbosity(args) -> int:
    from fairfl.progress import PROGRESS, QUIET, VERBOSE

    return QUIET if args.quiet else VERBOSE if args.verbose else PROGRESS


def _run(args) -> int:
    from fairfl.jobconfig import checked_overrides, customize_job, is_job_copy
    from fairfl.progress import QUIET, outcome_line, read_results
    from fairfl.report.document import make_report
    from fairfl.simulate import Terminated, is_simulator_workspace, run_simulator, watch_options
    from fairfl.site_settings import FREE_RIDERS_ENV
    from fairfl.tracking import TB_FOLDER, log_report, mlflow_location

    problem = gpu_problem(args.gpu, args.n_clients)
    if problem:
        print(f"fairfl run: error: {problem}", file=sys.stderr)
        return 2
    job = os.path.abspath(args.job)
    workspace = os.path.abspath(args.workspace or os.path.join("workspaces", os.path.basename(job.rstrip("/"))))
    job_copy = workspace.rstrip("/") + "_job"  # a customised copy beside the workspace; the job itself is never edited
    env = {FREE_RIDERS_ENV: ",".join(args.free_riders)} if args.free_riders else {}
    try:  # every argument of the job as it would run, before anything is written or started
        overrides = checked_overrides(job, args.set)
    except ValueError as e:
        print(f"fairfl run: error: {e}", file=sys.stderr)
        return 2
    # the simulator empties its workspace: only a previous simulator workspace, and only with --force
    problem = refuse_to_overwrite(workspace, args.force, "workspace", is_simulator_workspace)
    customized = overrides or args.mlflow is not False
    problem = problem or (
        customized and refuse_to_overwrite(job_copy, args.force, "job copy", lambda folder: is_job_copy(str(folder)))
    )
    if problem:
        print(f"fairfl run: {problem}", file=sys.stderr)
        return 1
    if customized:
        try:
            job = customize_job(job, job_copy, overrides, mlflow=args.mlflow)
        except ValueError as e:  # mlflow missing or a bad URI (the arguments were checked above)
            print(f"fairfl run: error: {e}", file=sys.stderr)
            return 2
    if verbosity(args) > QUIET:
        if customized:
            changes = [str(overrides)] * bool(overrides) + ["MLflow tracking"] * (args.mlflow is not False)
            print(f"job with {' and '.join(changes)}: {job}")
        print(
            f"running {job} in NVFlare's simulator (recipe API, SimEnv) with {args.n_clients} sites; workspace "
            f"{workspace}"
            + (f"; free riders {', '.join(args.free_riders)}" if args.free_riders else "")
            + (f"; GPUs {args.gpu}" if args.gpu else ""),
            flush=True,
        )
    try:
        run = run_simulator(
            job, workspace, args.n_clients, args.threads, env=env, gpu=args.gpu, **watch_options(verbosity(args))
        )
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: run_simulator has stopped the simulator's processes
        print(
            f"\nfairfl run: interrupted; the simulator was stopped. What the run recorded is in {workspace} (the "
            f"server's results.json holds every round it finished)",
            file=sys.stderr,
        )
        return 143 if isinstance(stop, Terminated) else 130  # 128 + the signal's number, as a shell reports it
    results = read_results(run.results_path)
    finished = run.ok and isinstance(results.get("final"), dict) and not results.get("stopped")
    print("\n" + outcome_line(results, run.seconds, None if run.ok else "the simulator's errors follow (stderr)"))
    if not run.ok:
        print(run.describe_failure(), file=sys.stderr)
    paths = [("results", run.results_path)] if results else []
    if finished:
        report_dir = os.path.join(workspace, "report")
        paths.append(("report", make_report([run.results_path], report_dir)["report"]))
        run_dir = os.path.dirname(run.results_path)
        paths.append(("tensorboard", f"tensorboard --logdir {os.path.join(run_dir, TB_FOLDER)}"))
        if args.mlflow is not False:
            try:  # the report beside the job's MLflow runs; the run itself succeeded either way
                log_report(mlflow_location(run_dir, args.mlflow), run_dir, report_dir)
            except Exception as e:  # noqa: BLE001 - MLflow's errors and an unreachable server's alike
                print(f"fairfl run: the report was not added to MLflow: {e}", file=sys.stderr)
            paths.append(("mlflow", f"mlflow ui --backend-store-uri {mlflow_location(run_dir, args.mlflow)}"))
    paths.append(("logs", f"{workspace}/<site>/log.txt, {workspace}/simulator_output.txt"))
    print("\n".join(f"{what + ':':<12} {where}" for what, where in paths))
    return 0 if finished else 1


# the generator of each built-in dataset, for `prepare-data --out` ("module:function", imported when used)
GENERATORS = {
    "prostate": "fairfl.data.synthetic_prostate:generate_prostate_sites",
    "prostate3d": "fairfl.data.synthetic_prostate3d:generate_prostate3d_sites",
    "fundus": "fairfl.data.synthetic_fundus:generate_fundus_sites",
    "skin": "fairfl.data.synthetic_classification:generate_skin_sites",
    "ich": "fairfl.data.synthetic_classification:generate_ich_sites",
    "skin_imbalanced": "fairfl.data.imbalanced:generate_skin_imbalanced_sites",
    "ich_imbalanced": "fairfl.data.imbalanced:generate_ich_imbalanced_sites",
}


def _import(target: str):
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)


def _prepare_data(args) -> int:
    from fairfl.data.builtin import builtin_dataset, ensure_builtin
    from fairfl.presets import TASK_DEFAULTS

    if args.size_scale is None:
        args.size_scale = TASK_DEFAULTS[builtin_dataset(args.dataset).task]["synthetic_size_scale"]
    if args.num_sites is None:
        args.num_sites = max(6, builtin_dataset(args.dataset).min_sites)

    # the cache (no --out) is not the user's: a re-run finds the data there and writes nothing
    problem = args.out and refuse_to_overwrite(args.out, args.force, "output folder")
    if problem:
        print(f"fairfl prepare-data: {problem}", file=sys.stderr)
        return 1
    try:  # the generators refuse settings they cannot make data for (too small images, too few images a site)
        if args.out:
            root = _import(GENERATORS[args.dataset])(
                args.out,
                num_sites=args.num_sites,
                image_size=args.image_size,
                seed=args.seed,
                size_scale=args.size_scale,
                test_scale=args.test_scale,
            )
        else:
            root = ensure_builtin(
                args.dataset,
                image_size=args.image_size,
                seed=args.seed,
                num_sites=args.num_sites,
                size_scale=args.size_scale,
                test_scale=args.test_scale,
            )
    except ValueError as e:
        print(f"fairfl prepare-data: {e}", file=sys.stderr)
        return 1
    print(root)
    return 0


def _converter(target: str, options=()):
    """A subcommand handler for a dataset converter `convert(src, dst, seed=..., site_names=..., **options)` (seed
    and site_names where the subcommand has --seed: a converter without sites, convert-dicom, takes neither);
    `options` names the arguments passed on when given. Bad data: the error (site and file) and exit code 1."""

    def convert(args) -> int:
        extra = {k: getattr(args, k) for k in options if getattr(args, k) is not None}
        if hasattr(args, "seed"):
            extra.update(seed=args.seed, site_names="flare" if args.rename_sites else None)
        problem = refuse_to_overwrite(args.dst, False, "output folder")  # converters never write over data
        if problem:
            print(f"fairfl {args.command}: {problem.split(' or give --force')[0]}", file=sys.stderr)
            return 1
        try:
            summary = _import(target)(args.src, args.dst, **extra)
        except ValueError as e:  # DataError included: it names the site and the file
            print(f"fairfl {args.command}: {e}", file=sys.stderr)
            return 1
        print(json.dumps(summary, indent=1, default=str))
        return 0

    return convert


def _leave_one_out(args) -> int:
    from fairfl.jobconfig import parse_assignments
    from fairfl.loo import load_loo, marginal_table, run_leave_one_out

    out = args.out or os.path.join("workspaces", "loo-" + os.path.basename(os.path.abspath(args.job)))
    print(
        f"leave-one-out of {args.job} with {args.n_clients} sites in {out}: one run with every site, then one "
        f"without each of {', '.join(args.sites) if args.sites else 'them'}",
        flush=True,
    )
    try:
        path = run_leave_one_out(
            os.path.abspath(args.job),
            out,
            args.n_clients,
            parse_assignments(args.set),
            sites=args.sites,
            threads=args.threads,
            verbosity=verbosity(args),
        )
    except (RuntimeError, ValueError) as e:
        print(f"fairfl leave-one-out: {e}", file=sys.stderr)
        return 1
    print(
        f"\n{marginal_table(load_loo(path))}\n\nleave-one-out: {path}\ncompare with: fairfl report RUNS... --loo {path}"
    )
    return 0


def _export_job(args) -> int:
    """Copy a job without its app/custom folders, for NVFlare's own submit tools (`nvflare job submit`, the FLARE API)
    and sites that forbid bring-your-own-code: the repository's jobs carry one holding only a README, which makes
    `nvflare simulator` admit the installed package (docs/running.md). --set changes arguments of the copy as `fairfl
    run --set` does. Code in app/custom is left out too, and named: the sites would not run it."""
    from fairfl.deploy.admin import custom_code
    from fairfl.files import read_json
    from fairfl.jobconfig import checked_overrides, customize_job

    if os.path.exists(args.out):
        print(f"{args.out} exists; not overwriting", file=sys.stderr)
        return 1
    meta_path = os.path.join(args.job, "meta.json")
    try:  # all checked before anything is copied: a retry finds no half-written folder
        overrides = checked_overrides(args.job, args.set)
        try:
            meta = read_json(meta_path)
        except ValueError as e:
            raise ValueError(f"{meta_path}: {e}") from None
        if not isinstance(meta, dict):
            raise ValueError(f"{meta_path}: not a JSON object")
    except ValueError as e:
        print(f"fairfl export-job: error: {e}", file=sys.stderr)
        return 2
    byoc = ("custom", "__pycache__")  # the simulator's BYOC marker; sites run the installed package
    if overrides:
        customize_job(args.job, args.out, overrides, leave_out=byoc)
    else:
        shutil.copytree(args.job, args.out, ignore=shutil.ignore_patterns(*byoc))
    if args.gpus is not None:  # every site's resource manager must lend this many GPUs before the job starts
        meta["resource_spec"] = {"@default": {"num_of_gpus": args.gpus}}
        with open(os.path.join(args.out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
    changed = f" with {overrides}" if overrides else ""
    print(f"exported {args.job}{changed} -> {args.out} (no app/custom: sites need `fairfl provision-complete`)")
    left_out = custom_code(args.job)
    if left_out:
        print(
            f"left out code of app/custom, which the sites would not run: {', '.join(left_out)}; the classes a job "
            f"names must be installed at every site and allow-listed",
            file=sys.stderr,
        )
    return 0


def _add_simulator_arguments(parser) -> None:
    from fairfl.jobconfig import add_set_argument

    parser.add_argument("-n", "--n-clients", type=at_least(1), default=6)
    parser.add_argument("-t", "--threads", type=at_least(1), default=None, help="client processes at once (default n)")
    add_set_argument(parser)
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("-q", "--quiet", action="store_true", help="no line per round: only the outcome and paths")
    shown.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print the simulator's own log as it runs (always kept in <workspace>/simulator_output.txt)",
    )


def build_parser() -> argparse.ArgumentParser:
    from fairfl.arguments import MIN_IMAGE_SIZE
    from fairfl.data.builtin import MAX_TEST_SCALE
    from fairfl.docs_blocks import update_readme_command
    from fairfl.jobconfig import JOBS, add_set_argument

    parser = argparse.ArgumentParser(prog="fairfl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a job in NVFlare's simulator (through the recipe API), then write its report")
    p.add_argument("job", type=job_folder, help="job folder, e.g. jobs/fedlwr")
    p.add_argument("-w", "--workspace", help="simulator workspace (default workspaces/<job name>)")
    p.add_argument("--force", action="store_true", help="replace the workspace (and job copy) of an earlier run")
    p.add_argument(
        "--free-riders",
        type=site_names,
        default=[],
        metavar="SITE[,SITE]",
        help="these sites are free riders (FedCE's Fig. 4): sets the sites' own "
        "FAIRFL_FREE_RIDERS in the simulator's environment",
    )
    add_mlflow_argument(p)
    _add_simulator_arguments(p)
    add_gpu_argument(p)
    p.set_defaults(func=_run)

    p = sub.add_parser("prepare-data", help="generate a built-in synthetic multi-site dataset")
    p.add_argument("--dataset", choices=sorted(GENERATORS), default="prostate")
    p.add_argument("--out", help="write here instead of the cache (not into a non-empty folder without --force)")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out folder (same names replaced)")
    p.add_argument("--image-size", type=at_least(MIN_IMAGE_SIZE), default=64)
    p.add_argument(
        "--num-sites",
        type=at_least(1),
        help="as many as the run will have (default 6, or the dataset's minimum: ich_imbalanced 10)",
    )
    p.add_argument("--seed", type=at_least(0), default=0)
    # the jobs' `synthetic_size_scale`: with another value the jobs would not find this data in the cache
    p.add_argument(
        "--size-scale",
        type=number_in(0, 100, low_open=True),
        default=None,
        help="scales the number of cases per site (default: the jobs' synthetic_size_scale for the "
        "dataset's task, segmentation 2.0, classification 1.0)",
    )
    p.add_argument(
        "--test-scale",
        type=number_in(1, MAX_TEST_SCALE),
        default=1.0,
        help="test splits hold this many times their items, training and validation unchanged (the "
        "server's test_scale; default 1)",
    )
    p.set_defaults(func=_prepare_data)

    p = sub.add_parser(
        "check-data", help="every problem of every site's datalist and files, by the sites' own checks, before a run"
    )
    p.add_argument("root", type=existing_folder, help="data root holding <site>.json datalists")
    p.add_argument("--sites", nargs="+", metavar="SITE", help="check these sites (default: every <site>.json)")
    p.add_argument("--task", choices=["segmentation", "classification"], help="default: dataset.json's or segmentation")
    p.add_argument("--num-classes", type=at_least(1), help="background included; default: dataset.json's or the task's")
    p.add_argument("--in-channels", type=at_least(1), help="for --decode; default: dataset.json's or the task's")
    p.add_argument("--decode", action="store_true", help="also decode every file as a site's loader does (slower)")
    p.set_defaults(func=lambda args: _import("fairfl.data.check:check_data_command")(args))

    for name, target, what, src_help, extra in (
        (
            "convert-prostate",
            "fairfl.data.convert_prostate:convert_prostate",
            "the multi-site prostate MRI layout (or NVFlare's prostate example's datalists) to 2-D datalists",
            "folder with <site>/Image/<case>.nii.gz and <site>/Mask/<case>.nii.gz (with --nvflare-datalists: the "
            "folder their paths are relative to, NVFlare's dataset_2D/ or dataset/)",
            ("nvflare_datalists",),
        ),
        (
            "convert-fundus",
            "fairfl.data.convert_fundus:convert_fundus",
            "the multi-site retinal fundus layout (optic disc and cup) to datalists",
            "folder of the multi-site fundus data, one folder per site",
            (),
        ),
    ):
        p = sub.add_parser(name, help=f"convert {what}")
        p.add_argument("src", type=existing_folder, help=src_help)
        p.add_argument("dst", help="output data root (<site>.json datalists); must not exist or be empty")
        p.add_argument("--seed", type=at_least(0), default=0)
        p.add_argument("--rename-sites", action="store_true", help="name sites site-1..site-N (FLARE client names)")
        if "nvflare_datalists" in extra:
            p.add_argument(
                "--nvflare-datalists",
                type=existing_folder,
                help="folder of NVFlare's prostate example datalists (client_<site>.json: its datalist_2D/ or "
                "datalist/); their sites and split are kept",
            )
        p.set_defaults(func=_converter(target, extra), command=name)

    p = sub.add_parser("convert-dicom", help="convert DICOM series to NIfTI volumes, one per series (the 3-D path)")
    p.add_argument("src", type=existing_folder, help="folder of DICOM files at any depth (any patients and series)")
    p.add_argument("dst", help="output folder (<series>.nii.gz, series.json); must not exist or be empty")
    p.set_defaults(func=_converter("fairfl.data.convert_dicom:convert_dicom"), command="convert-dicom")

    # classification: Dirichlet sites with a quality shift (FedISM+) or, for ISIC, one site per source (FedNPR)
    for name, target, what, extra in (
        (
            "convert-isic",
            "fairfl.data.convert_isic:convert_isic",
            "the ISIC 2019 training release (images + ground-truth CSV) to per-site datalists",
            ("sites", "flamby_split"),
        ),
        (
            "convert-rsna-ich",
            "fairfl.data.convert_rsna_ich:convert_rsna_ich",
            "the RSNA intracranial hemorrhage layout (PNG slices + label CSV) to per-site datalists",
            ("include_none", "max_images"),
        ),
    ):
        p = sub.add_parser(name, help=f"convert {what}")
        p.add_argument(
            "src", type=existing_folder, help="source folder in the public layout (see the converter's docstring)"
        )
        p.add_argument("dst", help="output data root (<site>.json datalists); must not exist or be empty")
        p.add_argument("--seed", type=at_least(0), default=0)
        p.add_argument("--rename-sites", action="store_true", help="name source sites site-1..site-N")
        if "sites" in extra:
            p.add_argument(
                "--sites",
                choices=["dirichlet", "source"],
                help="dirichlet (default; FedISM+) or one site per source hospital (FedNPR, FLamby)",
            )
            p.add_argument(
                "--flamby-split",
                type=existing_file,
                help="FLamby's Fed-ISIC2019 train_test_split file (with --sites source): its centres are the sites "
                "and its test fold the test sets (default: SRC/train_test_split if there)",
            )
        if "include_none" in extra:
            p.add_argument(
                "--include-none",
                action="store_true",
                default=None,
                help="keep slices without hemorrhage as a sixth class",
            )
            p.add_argument("--max-images", type=at_least(1), help="a seeded random subset (FedISM+: 25000)")
        p.add_argument("--num-sites", type=at_least(1), help="Dirichlet sites (default 20)")
        p.add_argument("--alpha", type=number_in(0, 1e6, low_open=True), help="Dirichlet concentration (default 1.0)")
        p.add_argument(
            "--image-size", type=at_least(MIN_IMAGE_SIZE), help="resize to square PNGs (default: copy the files)"
        )
        p.add_argument(
            "--corrupted-fraction",
            type=number_in(0, 1),
            help="share of the sites with corrupted images, the last ones (FedISM+: 0.2; needs --image-size)",
        )
        p.add_argument("--corruption", choices=["noise", "blur"], help="Gaussian noise (default) or motion blur")
        p.add_argument("--severity", type=int, choices=range(1, 6), help="corruption severity 1-5 (default 3)")
        options = (*extra, "num_sites", "alpha", "image_size", "corrupted_fraction", "corruption", "severity")
        p.set_defaults(func=_converter(target, options), command=name)

    p = sub.add_parser(
        "leave-one-out",
        help="leave-one-out client values: the job with every site, then without each site (FedCE paper, Table 3)",
    )
    p.add_argument(
        "job",
        nargs="?",
        type=job_folder,
        default=os.path.join("jobs", "fedavg"),
        help="job folder (default jobs/fedavg)",
    )
    p.add_argument("-o", "--out", help="output folder: runs/ and loo.json (default workspaces/loo-<job name>)")
    _add_simulator_arguments(p)
    p.add_argument(
        "--sites",
        nargs="+",
        metavar="SITE",
        help="leave out only these sites, one at a time (default: every site); give the job before it",
    )
    p.set_defaults(func=_leave_one_out)

    from fairfl.report import command as report_command

    p = sub.add_parser("report", help="paper-style table and figures from one or more runs")
    report_command.add_arguments(p)
    p.set_defaults(func=report_command.run)

    from fairfl.benchmark import command as benchmark_command

    p = sub.add_parser(
        "benchmark",
        help="every method of a task's papers side by side: tables, figures, claims",
        description=benchmark_command.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    benchmark_command.add_arguments(p)
    p.set_defaults(func=benchmark_command.run)
    p = sub.add_parser(
        "update-readme", help="rewrite the generated result blocks of README.md and docs/ from the benchmark outputs"
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="Markdown files (default: README.md and docs/**/*.md)")
    p.add_argument("--check", action="store_true", help="change nothing; fail if a block is out of date")
    p.set_defaults(func=update_readme_command)

    p = sub.add_parser("make-jobs", help="write the job folders from the method registry (fairfl.methods)")
    p.add_argument("--out", default=str(JOBS), help="jobs folder to write (default: the repository's jobs/)")
    p.add_argument("--check", action="store_true", help="change nothing; fail if a job differs from its spec")
    p.set_defaults(func=_make_jobs)

    p = sub.add_parser(
        "export-job",
        help="copy a job without app/custom, for NVFlare's own submit tools (nvflare job submit -j OUT, the FLARE "
        "API): a repository job as it is is refused there (BYOC); fairfl submit and fairfl poc submit do this "
        "themselves",
    )
    p.add_argument("job", type=job_folder)
    p.add_argument("out")
    p.add_argument("--gpus", type=at_least(0), help="GPUs each site must lend the job (meta.json resource_spec)")
    add_set_argument(p)
    p.set_defaults(func=_export_job)

    from fairfl.deploy.commands import add_commands

    add_commands(sub)
    return parser


def _make_jobs(args) -> int:
    from fairfl.methods.make_jobs import differences, write_jobs  # imports the controllers (torch, nvflare)

    if args.check:
        found = differences(args.out)
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print(f"{len(found)} difference(s); rewrite with: fairfl make-jobs --out {args.out}", file=sys.stderr)
        return 1 if found else 0
    written = write_jobs(args.out)
    print(f"{len(written)} file(s) written under {args.out}" + "".join(f"\n  {w}" for w in written))
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
