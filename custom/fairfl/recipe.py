"""A fairfl job through NVIDIA FLARE 2.9's recipe API: `FairflRecipe(job, **arguments)` builds the job with the Job
API (FedJob) from the job's configuration, so `recipe.execute(SimEnv(...))` runs it, `recipe.export(folder)` writes a
job folder `nvflare simulator` and the admin console take, and `python -m fairfl.recipe JOB` is the "python job.py"
way to run it.

The controller and the executor are named by class path and arguments, exactly as the job's configuration names
them. The Job API would write a component *object* as the arguments of its class's own __init__ signature, read
back from same-named attributes; our controllers pass the arguments they share on through **kwargs, so an object
would lose them (FedProxController(num_rounds=2, mu=0.5) is written as {"mu": 0.5}: 20 rounds).

The code is the installed package: nothing is copied into the job (no app/custom, so no bring-your-own-code), and
every site checks our classes against its class allow-list. NVFlare's SimEnv writes its default list, which lacks
them, into the simulator workspace unless one is there; so before a SimEnv run the recipe writes ours there
(local/resources.json: NVFlare's default list plus each of our classes by its exact path). ProdEnv submits to a
federation whose kits `fairfl provision-complete` completed, fairfl's POC included; PocEnv is refused
(POC_ENV_REFUSED)."""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

from nvflare.job_config.api import FedJob
from nvflare.recipe import PocEnv, SimEnv
from nvflare.recipe.spec import Recipe, _peek_recipe_args

from fairfl.cli_arguments import add_gpu_argument, add_mlflow_argument, at_least, gpu_problem
from fairfl.files import parse_json
from fairfl.jobconfig import CLIENT_CONFIG, SERVER_CONFIG, add_set_argument, config_problem, set_arguments
from fairfl.jobconfig import JOBS as JOBS_FOLDER
from fairfl.overwrite import refuse_to_overwrite
from fairfl.simulate import RECIPE_SITE_ERRORS
from fairfl.tracking import with_mlflow

META = "meta.json"
# PocEnv provisions its own POC with NVFlare's settings, and first stops and deletes the POC of NVFlare's recorded
# workspace, which `fairfl poc prepare` made its own: refused before it does
POC_ENV_REFUSED = (
    "PocEnv would stop and delete a running POC and provision a new one whose sites refuse fairfl's classes "
    "(NVFlare's default class allow-list): start fairfl's POC with `fairfl poc prepare` and `fairfl poc start`, then "
    "run the recipe in ProdEnv(startup_kit_location=<POC workspace>/fairfl/prod_00/admin@fairfl.org, "
    "username='admin@fairfl.org') (docs/running.md)"
)
ONE_APP_FOR_ALL = {"app": ["@ALL"]}  # the deploy map of every fairfl job, and the only one a FedJob with one app writes
# the simulator empties its workspace at start but keeps these (the sites' settings, e.g. the allow-list)
KEPT_BY_SIMULATOR = {"local", "startup"}


def job_folder(job: str) -> Path:
    """The folder of `job`: a job folder, or the name of one in the repository's jobs/ (fedavg, fedlwr, ...)."""
    for folder in (Path(job), JOBS_FOLDER / job):
        if all((folder / name).is_file() for name in (META, SERVER_CONFIG, CLIENT_CONFIG)):
            return folder
    known = sorted(p.name for p in JOBS_FOLDER.iterdir() if (p / META).is_file()) if JOBS_FOLDER.is_dir() else []
    raise ValueError(
        f"no job {job!r}: give a job folder ({META}, {SERVER_CONFIG}, {CLIENT_CONFIG}) or one of "
        f"{', '.join(known) or 'the jobs of a fairfl checkout'}"
    )


def _read_object(path) -> dict:
    try:
        data = parse_json(Path(path).read_text())  # a folder's job is untrusted: no RecursionError out of it either
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def _read_config(path) -> dict:
    """A job folder's app config, of the shape `fairfl run` checks too (fairfl.jobconfig.config_problem)."""
    config = _read_object(path)
    problem = config_problem(config)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return config


def job_configuration(job: str) -> tuple[dict, dict, dict]:
    """(server config, client config, meta) of `job`: a method job by name, from the method registry (nothing read
    from disk, so an installed package suffices), or a job folder; the one place the recipe reads a job from."""
    from fairfl.methods import JOBS as REGISTERED_JOBS

    if job in REGISTERED_JOBS and not Path(job).exists():
        from fairfl.methods.make_jobs import job_configs

        configs = job_configs(REGISTERED_JOBS[job])
        return tuple(configs[name] for name in (SERVER_CONFIG, CLIENT_CONFIG, META))
    folder = job_folder(job)
    return _read_config(folder / SERVER_CONFIG), _read_config(folder / CLIENT_CONFIG), _read_object(folder / META)


def with_arguments(job: str, server: dict, client: dict, arguments: dict) -> tuple[dict, dict]:
    """The two configs with `arguments` set by `fairfl run --set`'s rules (fairfl.jobconfig.set_arguments): on every
    fairfl component, server or client, that has the argument; an argument none has, or a value of another JSON
    kind than the job's, is a ValueError naming it."""
    configs = set_arguments(
        {SERVER_CONFIG: copy.deepcopy(server), CLIENT_CONFIG: copy.deepcopy(client)}, arguments, job
    )
    return configs[SERVER_CONFIG], configs[CLIENT_CONFIG]


def _raw_entries(config: dict) -> dict:
    """The entries of an app config the job is written with as they are: its components by class path and args
    (the controller's `workflows`, the executor's `executors`, any non-empty `components` or filters)."""
    return {key: value for key, value in config.items() if key != "format_version" and value != []}


def allow_fairfl_classes(workspace: str) -> str:
    """Add our component classes to the class allow-list of a simulator workspace (`local/resources.json`, made
    from resources.json.default or NVFlare's default list where there is none; the other entries and settings
    kept): what the simulator's sites check a job without app/custom against. Returns the file written."""
    from fairfl.deploy.kits import allow_listed
    from fairfl.files import write_json_atomic

    path = os.path.join(workspace, "local", "resources.json")
    source = path if os.path.exists(path) else path + ".default"
    resources = _read_object(source) if os.path.exists(source) else {"format_version": 2}
    try:
        resources = allow_listed(resources)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, resources)
    return path


class FairflRecipe(Recipe):
    """The fairfl job `job` (a name in jobs/ or a job folder) as an NVFlare recipe, with `arguments` set (e.g.
    num_rounds=50, image_size=32: server or client arguments, as `fairfl run --set`). `name`: the job's name
    (default its meta.json's), which SimEnv also names the run's workspace after (workspace_root/<name>). `mlflow`:
    True or a tracking URI adds NVFlare's MLflow receiver to the server (`fairfl run --mlflow`, fairfl.tracking);
    the job's TensorBoard receiver is always there. (NVFlare's add_experiment_tracking adds a receiver through the
    Job API, which the job's own component list would replace: refused, see `_validate_before_use`.)"""

    def __init__(self, job: str, *, name: str | None = None, mlflow: bool | str = False, **arguments):
        server, client, meta = job_configuration(job)
        server, client = with_arguments(job, server, client, arguments)
        server = with_mlflow(server, mlflow)
        if meta.get("deploy_map", ONE_APP_FOR_ALL) != ONE_APP_FOR_ALL:
            raise ValueError(
                f"job {job}: the recipe runs one app on every site, not the deploy_map {json.dumps(meta['deploy_map'])}"
            )
        other_meta = {
            k: v for k, v in meta.items() if k not in ("name", "min_clients", "mandatory_clients", "deploy_map")
        }
        try:
            fed_job = FedJob(
                name=name or meta.get("name"),
                min_clients=meta.get("min_clients", 1),
                mandatory_clients=meta.get("mandatory_clients"),
                meta_props=other_meta,
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"job {job}, {META}: {e}") from None
        fed_job.set_app_packages(["fairfl"])  # a fairfl object added to the recipe later is not copied either
        fed_job.to_server(_raw_entries(server))
        fed_job.to_clients(_raw_entries(client))
        super().__init__(fed_job)

    def _validate_before_use(self) -> None:
        super()._validate_before_use()
        # a job entry would replace what was added through the Job API under the same key: refuse, lose nothing
        for target, app in self._job._deploy_map.items():
            config = app.app_config
            clash = [key for key in config.additional_params if getattr(config, key, None)]
            if clash:
                raise ValueError(
                    f"{target}: {', '.join(clash)} added through the Job API would be replaced by the "
                    f"job's own {', '.join(clash)}"
                )

    def run(self, env, server_exec_params=None, client_exec_params=None):
        if isinstance(env, PocEnv):
            raise ValueError(POC_ENV_REFUSED)
        if isinstance(env, SimEnv):  # else SimEnv writes NVFlare's default allow-list, which refuses our classes
            allow_fairfl_classes(os.path.join(env.workspace_root, self.name))
        return super().run(env, server_exec_params, client_exec_params)


# --- python -m fairfl.recipe: the "python job.py" way in --------------------------------------------------------
def folder_or_new(text: str) -> str:
    """An argparse type: a folder, or a path where none exists yet."""
    if not text or (os.path.exists(text) and not os.path.isdir(text)):
        raise argparse.ArgumentTypeError(f"not a folder: {text!r}")
    return text


def job_name(text: str) -> str:
    """An argparse type: a name that is one folder (SimEnv makes WORKSPACE_ROOT/NAME), not a path."""
    if not text or text in (".", "..") or os.sep in text or (os.altsep and os.altsep in text) or "\0" in text:
        raise argparse.ArgumentTypeError(f"not a plain folder name: {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fairfl.recipe",
        description="Run a fairfl job in NVFlare's simulator through the recipe API "
        "(SimEnv); the results land in WORKSPACE_ROOT/<job name>/server/simulate_job/results.json.",
        epilog="NVFlare's own --export [--export-dir DIR] writes the job folder DIR/<job name> (default ./fl_job) "
        "instead of running it. Exit status: 0 done; 1 the simulator failed or could not start; 2 bad arguments; "
        f"{RECIPE_SITE_ERRORS} the simulator ran to its end but a site or the server logged an error, or no results "
        "file was written (the workspace has the logs).",
    )
    parser.add_argument("job", help="a job in jobs/ (fedavg, fedlwr, ...) or a job folder")
    add_set_argument(parser)
    parser.add_argument("-n", "--n-clients", type=at_least(1), default=6, help="simulated sites (default 6)")
    parser.add_argument("-t", "--threads", type=at_least(1), help="client processes at once (default n)")
    parser.add_argument(
        "-w",
        "--workspace-root",
        type=folder_or_new,
        default="workspaces",
        help="SimEnv's workspace_root: the run's workspace is WORKSPACE_ROOT/<job name> (default workspaces)",
    )
    parser.add_argument(
        "--name", type=job_name, help="the job's name, and so its workspace WORKSPACE_ROOT/NAME (default the job's own)"
    )
    parser.add_argument("--force", action="store_true", help="replace the workspace of an earlier run")
    add_mlflow_argument(parser)
    add_gpu_argument(parser)
    return parser


def _workspace_problem(workspace: str, force: bool) -> str | None:
    from fairfl.simulate import is_simulator_workspace

    if os.path.isdir(workspace) and set(os.listdir(workspace)) <= KEPT_BY_SIMULATOR:
        return None  # nothing the simulator would delete
    return refuse_to_overwrite(workspace, force, "workspace", is_simulator_workspace)


def main(argv=None) -> int:
    from fairfl.jobconfig import parse_assignments
    from fairfl.simulate import SimulatorRun, collect_errors

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads > args.n_clients:
        parser.error(f"argument -t/--threads: at most -n ({args.n_clients}), got {args.threads}")
    problem = gpu_problem(args.gpu, args.n_clients)
    if problem:
        parser.error(problem)
    try:
        recipe = FairflRecipe(args.job, name=args.name, mlflow=args.mlflow, **parse_assignments(args.set))
    except ValueError as e:  # no such job, key=value malformed, an argument the job lacks or of the wrong kind
        parser.error(str(e))
    env = SimEnv(
        num_clients=args.n_clients,
        num_threads=args.threads,
        gpu_config=args.gpu,
        workspace_root=os.path.abspath(args.workspace_root),
    )
    workspace = os.path.join(env.workspace_root, recipe.name)  # NVFLARE_SIMULATOR_WORKSPACE_ROOT wins, as in SimEnv
    exporting = _peek_recipe_args()[0]  # NVFlare took --export from the command line when the recipe API loaded
    problem = None if exporting else _workspace_problem(workspace, args.force)
    if problem:
        print(f"{parser.prog}: {problem}", file=sys.stderr)
        return 1
    started = time.time()
    try:
        recipe.execute(env)  # with --export: writes the job folder and exits
    except (OSError, RuntimeError, ValueError) as e:  # a failed simulator (SimEnv); an unusable allow-list file
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 1
    run = SimulatorRun(workspace, 0, time.time() - started, collect_errors(workspace))
    if not run.ok:  # the exit code alone does not tell (fairfl.simulate)
        print(run.describe_failure(), file=sys.stderr)
        return RECIPE_SITE_ERRORS
    print(f"finished in {run.seconds:.0f} s\nresults: {run.results_path}\nreport:  fairfl report {workspace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
