"""Run a job in NVFlare's real simulator and collect what it left behind.

One place for the CLI (`fairfl run`), the integration tests and the benchmarks. A run goes through NVFlare 2.9's
recipe API (`python -m fairfl.recipe`: FairflRecipe in SimEnv) unless asked for the deprecated `nvflare simulator`
command, which our users' `nvflare simulator jobs/fedlwr` still is; both run the same simulator in the same
workspace layout. The simulator's exit code alone does not tell success (a client that fails to import its code
still exits 0), so the error logs and the results file are checked too."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fairfl.jobconfig import WAITING_ARGUMENTS, customize_job, is_job_copy, job_arguments
from fairfl.progress import PROGRESS, QUIET, VERBOSE, finished_rounds, outcome_line, read_results, round_printer
from fairfl.results import SIMULATOR_RESULTS

SIMULATOR_OUTPUT = "simulator_output.txt"
PORT_CLASH = "Address already in use"
PORT_CLASH_RETRIES = 2
RECIPE, NVFLARE_SIMULATOR = "recipe", "nvflare simulator"  # the two ways in (run_simulator's `via`)
RECIPE_SITE_ERRORS = 3  # `python -m fairfl.recipe` exits with it when the run ended but a log holds an error
# the one error NVFlare's simulator logs when a site's process ends before the server's runner has let it go, at the
# end of a finished run (seen on 2 cores with 10 sites): not a failure once the final record is written
SHUTDOWN_ERROR = "ERROR - Communication error with client "
NEVER_STARTED = -1000  # the exit code of a run killed because a site's process never came up
SITE_START_GRACE = 120.0  # seconds after the first round's record before a site without a log counts as dead


def scored_sites(path: str) -> set | None:
    """The sites the final record of the results file at `path` scores (`final.per_site`), when its last round lost
    none (no `absent` or `failed` site); None without such a record."""
    try:
        with open(path) as f:
            results = json.load(f)
        final, last = results["final"], results["rounds"][-1]
        if last.get("absent") or last.get("failed"):
            return None
        return set(final["per_site"])
    except (OSError, ValueError, RecursionError, TypeError, KeyError, IndexError, AttributeError):
        return None


@dataclass
class SimulatorRun:
    workspace: str
    returncode: int
    seconds: float
    errors: dict = field(default_factory=dict)  # participant -> non-empty error_log.txt text

    @property
    def results_path(self) -> str:
        return os.path.join(self.workspace, SIMULATOR_RESULTS)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and os.path.exists(self.results_path) and (not self.errors or self.teardown_only)

    @property
    def teardown_only(self) -> bool:
        """Every error logged is NVFlare's simulator losing a site's connection (SHUTDOWN_ERROR), the run has a final
        record whose last round lost no site, and every site lost is scored in it: the connection went as the
        finished run shut down, and its results stand. Any other error, a site lost and not scored (killed mid-run),
        or no final record still fails the run."""
        scored = scored_sites(self.results_path) if self.errors else None
        if scored is None:
            return False
        lines = [line for text in self.errors.values() for line in text.splitlines() if line.strip()]
        lost = [re.search(re.escape(SHUTDOWN_ERROR) + r"(\S+?):", line) for line in lines]
        return all(match is not None and match.group(1) in scored for match in lost)

    @property
    def port_clash(self) -> bool:
        """The simulator lost a race for a loopback port to another simulator running beside it, or one of its sites
        never came up (killed, NEVER_STARTED): both are worth running again."""
        return self.returncode == NEVER_STARTED or any(PORT_CLASH in text for text in self.errors.values())

    def describe_failure(self) -> str:
        lines = [f"simulator exit code {self.returncode}; workspace {self.workspace}"]
        if self.returncode == NEVER_STARTED:
            lines.append(f"killed: a site's process never started ({SITE_START_GRACE:.0f} s after the rounds began)")
        if not os.path.exists(self.results_path):
            lines.append(f"no results file at {self.results_path}")
        for who, text in self.errors.items():
            lines.append(f"--- {who}/error_log.txt ---\n{text[-3000:]}")
        return "\n".join(lines)


def nvflare_command() -> list:
    """The `nvflare` entry point of this Python environment (not whichever is first on PATH)."""
    local = os.path.join(os.path.dirname(sys.executable), "nvflare")
    return [local] if os.path.exists(local) else [shutil.which("nvflare") or "nvflare"]


GPU_ID = r"\d{1,4}"
GPU_IDS = rf"{GPU_ID}(?:,{GPU_ID})*"


def gpu_groups(text: str) -> list[list[int]]:
    """The GPU groups of NVFlare's simulator option -gpu: "0,1" (a group of one GPU each) or "[0,1],[2,3]" (each
    group of GPUs runs its own share of the sites, one process at a time); each GPU in one group only. Anything
    else is a ValueError (the simulator would only log it once the run had started)."""
    if re.fullmatch(GPU_IDS, text):
        groups = [[int(i)] for i in text.split(",")]
    elif re.fullmatch(rf"\[{GPU_IDS}\](?:,\[{GPU_IDS}\])*", text):
        groups = [[int(i) for i in group.split(",")] for group in re.findall(rf"\[({GPU_IDS})\]", text)]
    else:
        raise ValueError(
            f"expected GPU ids as the simulator takes them, e.g. 0 or 0,1 or [0,1],[2,3] (no spaces), got {text!r}"
        )
    ids = [i for group in groups for i in group]
    if len(set(ids)) < len(ids):
        raise ValueError(f"a GPU is named twice in {text!r}")
    return groups


def simulator_command(
    job: str, workspace: str, n_clients: int, threads: int | None, via: str = RECIPE, gpu: str | None = None
) -> list:
    """The command `run_simulator` starts (see there)."""
    options = ["-n", str(n_clients), "-t", str(threads or n_clients)]
    if gpu is not None:
        gpu_groups(gpu)  # untrusted text: checked before it reaches a command line
    if via == RECIPE:
        parent, folder = os.path.split(os.path.abspath(workspace).rstrip(os.sep))
        options += ["--gpu", gpu] if gpu else []
        return [sys.executable, "-m", "fairfl.recipe", job, "-w", parent, "--name", folder, *options, "--force"]
    if via == NVFLARE_SIMULATOR:
        options += ["-gpu", gpu] if gpu else []
        return nvflare_command() + ["simulator", job, "-w", workspace, *options]
    raise ValueError(f"via: {RECIPE!r} or {NVFLARE_SIMULATOR!r}, not {via!r}")


def run_simulator(
    job: str,
    workspace: str,
    n_clients: int = 6,
    threads: int | None = None,
    env: dict = None,
    timeout: float | None = None,
    keep_workspace: bool = False,
    kill_after_round: int | None = None,
    via: str = RECIPE,
    on_round=None,
    echo=None,
    gpu: str | None = None,
) -> SimulatorRun:
    """Run job folder `job` with N sites, T at a time, in exactly `workspace` and return what it left: through the
    recipe API (`python -m fairfl.recipe JOB -w PARENT --name FOLDER -n N -t T --force`: SimEnv runs a job in
    workspace_root/<job name>) or, with via=NVFLARE_SIMULATOR, `nvflare simulator JOB -w WORKSPACE -n N -t T`.

    The workspace is emptied first unless keep_workspace (e.g. to keep a prepared `local/resources.json`; the
    recipe adds our classes to its allow-list, `nvflare simulator` uses it as it is). kill_after_round: kill the
    whole simulator (server and sites, SIGKILL) as soon as its results file records that round: a server that
    dies mid-run, for resume drills and tests.

    While it runs: on_round(record, results, elapsed seconds) is called once for each round its results file
    records (fairfl.progress.round_printer prints a line), and the simulator's output, which goes to
    simulator_output.txt in the workspace, is also copied to `echo` (a text stream such as sys.stdout) when given.
    gpu: the simulator's GPU groups (`gpu_groups`: "0,1", "[0,1],[2,3]"), passed to either way in."""
    command = simulator_command(job, workspace, n_clients, threads, via, gpu)  # its arguments checked first
    if os.path.exists(workspace) and not keep_workspace:
        shutil.rmtree(workspace)
    os.makedirs(workspace, exist_ok=True)
    # the workspace is exactly `workspace`: NVFlare's own override of SimEnv's workspace_root must not move it
    child_env = {k: v for k, v in os.environ.items() if k != "NVFLARE_SIMULATOR_WORKSPACE_ROOT"}
    started = time.time()
    # the simulator empties its workspace at start, so the output is written beside it and moved in after
    proc = None
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as log, _terminated_as_interrupt():
        try:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**child_env, **(env or {})}, start_new_session=True
            )
            # several GPU groups run one site process each at a time (the simulator's rule)
            groups = len(gpu_groups(gpu)) if gpu else 1
            at_once = groups if groups > 1 else threads or n_clients
            all_at_once = [f"site-{i}" for i in range(1, n_clients + 1)] if at_once >= n_clients else None
            watch = Watch(os.path.join(workspace, SIMULATOR_RESULTS), started, on_round, log.name, echo)
            returncode = _wait(proc, workspace, timeout, kill_after_round, all_at_once, watch)
            watch.poll(last=True)  # the rounds and output written between the last poll and the end
            if via == RECIPE and returncode == RECIPE_SITE_ERRORS:
                returncode = 0  # the simulator itself ended well: the error logs and results are judged below
        finally:
            if proc is not None and proc.poll() is None:
                with _signals_ignored():  # a second Ctrl-C or SIGTERM must not cut the cleanup short
                    kill_all(proc)
                    proc.wait()
            shutil.move(log.name, os.path.join(workspace, SIMULATOR_OUTPUT))  # also when stopped
    return SimulatorRun(workspace, returncode, time.time() - started, collect_errors(workspace))


class Watch:
    """What run_simulator shows of a running simulator: each round its results file newly records, to on_round, and
    the simulator's new output (`output`, a file) to `echo`. A results file that cannot be read yet or holds
    nonsense counts as no rounds (fairfl.progress); a failing on_round is reported once and then left out, never
    the end of the run."""

    def __init__(self, results_path: str, started: float, on_round=None, output: str | None = None, echo=None):
        self.results_path, self.started, self.on_round = results_path, started, on_round
        self.output, self.echo = output, echo
        self.reported, self.echoed = 0, 0  # rounds passed to on_round; bytes of output copied to echo

    def poll(self, last: bool = False) -> dict:
        """The results file as it is now ({} if unreadable), after passing on what is new."""
        results = read_results(self.results_path)
        rounds = finished_rounds(results)
        for record in rounds[self.reported :] if self.on_round else []:
            try:
                self.on_round(record, results, time.time() - self.started)
            except Exception as e:
                print(f"progress display failed ({e!r}); the run goes on without it", file=sys.stderr, flush=True)
                self.on_round = None
                break
        self.reported = max(self.reported, len(rounds))
        if self.echo and self.output:
            self._copy_output(last)
        return results

    def _copy_output(self, last: bool) -> None:
        try:
            with open(self.output, "rb") as f:
                f.seek(self.echoed)
                new = f.read()
        except OSError:
            return
        end = len(new) if last else new.rfind(b"\n") + 1  # whole lines only: a line may be half written
        if end:
            self.echo.write(new[:end].decode("utf-8", errors="replace"))
            self.echo.flush()
            self.echoed += end


def _wait(
    proc,
    workspace: str,
    timeout: float | None,
    kill_after_round: int | None,
    sites: list | None = None,
    watch: Watch | None = None,
) -> int:
    """The simulator's exit code; raises subprocess.TimeoutExpired after `timeout` seconds (the finally above kills
    it). With kill_after_round, kills the process group once the results file records that round. With `sites`
    (every site runs at once: -t = -n), kills it when one of them has not started SITE_START_GRACE seconds after
    the server began its rounds (NEVER_STARTED): the server would wait for it until task_timeout, an hour.
    `watch` is polled every half second (progress lines, echoed output)."""
    deadline = time.time() + (timeout or float("inf"))
    watch = watch or Watch(os.path.join(workspace, SIMULATOR_RESULTS), time.time())
    rounds_began = None
    while proc.poll() is None:
        if time.time() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        results = watch.poll()
        if "rounds" in results:
            rounds_began = rounds_began or time.time()
        rounds = finished_rounds(results)
        if kill_after_round is not None and any(r["round"] >= kill_after_round for r in rounds):
            kill_all(proc)
            return proc.wait()
        if sites and rounds_began and time.time() - rounds_began > SITE_START_GRACE and never_started(workspace, sites):
            kill_all(proc)
            proc.wait()
            return NEVER_STARTED
        time.sleep(0.5 if kill_after_round is None else 0.05)  # a kill must land before the next round ends
    return proc.returncode


class Terminated(KeyboardInterrupt):
    """SIGTERM while the simulator ran (its processes are stopped by then), told apart from Ctrl-C."""


@contextlib.contextmanager
def _signals_ignored():
    """SIGINT and SIGTERM ignored for the block (main thread only), then as they were."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def _terminated_as_interrupt():
    """While the simulator runs, SIGTERM (`timeout`, `kill`, a batch system's stop) raises KeyboardInterrupt in the main
    thread, as Ctrl-C does, so that the run's `finally` kills the simulator's processes instead of leaving them
    running on, orphaned, with the GPU and the cores (Python's default for SIGTERM ends at once, skipping it)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        yield  # a SIGTERM the caller chose to ignore stays ignored
        return

    def interrupt(signum, frame):
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def kill_all(proc) -> None:
    """SIGKILL `proc`, its process group and every process below it: NVFlare's SimEnv starts the simulator in a
    session of its own, which a group kill misses (the server would go on with the run)."""
    import psutil

    try:
        below = psutil.Process(proc.pid).children(recursive=True)  # before the kill, which orphans them
    except psutil.NoSuchProcess:
        below = []
    os.killpg(proc.pid, signal.SIGKILL)
    for child in below:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def never_started(workspace: str, sites: list) -> list:
    """The sites of a simulator workspace whose process never came up: no log yet, or a log that ends in a port
    taken by another process (the site's process exits at once; the server would wait for it until task_timeout)."""

    errors = collect_errors(workspace)
    return [
        site
        for site in sites
        if not os.path.exists(os.path.join(workspace, site, "log.txt")) or PORT_CLASH in errors.get(site, "")
    ]


def is_simulator_workspace(folder) -> bool:
    """Whether `folder` holds an earlier simulator run (its output or its server folder): what a new run may replace."""
    return (Path(folder) / SIMULATOR_OUTPUT).exists() or (Path(folder) / "server").is_dir()


def collect_errors(workspace: str) -> dict:
    """{participant: text} of every non-empty error_log.txt in a simulator workspace."""
    errors = {}
    for path in sorted(glob.glob(os.path.join(workspace, "*", "error_log.txt"))):
        text = Path(path).read_text().strip()
        if text:
            errors[os.path.basename(os.path.dirname(path))] = text
    return errors


def watch_options(verbosity: int, label: str = "") -> dict:
    """run_simulator's on_round/echo for a verbosity (fairfl.progress: QUIET, PROGRESS, VERBOSE); `label` starts
    each progress line."""
    return {
        **({"on_round": round_printer(label)} if verbosity >= PROGRESS else {}),
        **({"echo": sys.stdout} if verbosity >= VERBOSE else {}),
    }


def run_unless_finished(
    job: str,
    workspace: Path,
    n_clients: int,
    job_args: dict,
    threads: int | None = None,
    env: dict | None = None,
    verbosity: int = QUIET,
) -> dict:
    """The results dict of `job` with `job_args` run in the simulator in `workspace` (`env`: the sites' own
    settings, fairfl.site_settings, e.g. free riders; `verbosity`: a line per round, or the simulator's log too,
    each progress line starting with the workspace's name).

    A workspace that already holds a finished run (results.json with a `final`) is kept, after checking that
    it ran with every argument this run would have: `job_args` and the job's own defaults (a default changed
    since, such as test_scale, must not keep old runs), against the server's arguments as its results recorded
    them and the sites' (lr, ...) as the job copy beside it holds them. A default of None means "the dataset's
    value", which the results record resolved, and a default of how the run waits for sites (WAITING_ARGUMENTS)
    never changes its numbers, so neither is compared. Resuming must not mix settings."""
    results_path = Path(workspace) / SIMULATOR_RESULTS
    job_copy = f"{workspace}_job"
    if results_path.is_file():
        results = json.loads(results_path.read_text())
        if results.get("final"):
            config = {**(job_arguments(job_copy) if is_job_copy(job_copy) else {}), **(results.get("config") or {})}
            defaults = {k: v for k, v in job_arguments(str(job)).items() if k not in WAITING_ARGUMENTS}
            wanted = {**defaults, **job_args}
            changed = sorted(k for k, v in wanted.items() if v is not None and k in config and config[k] != v)
            if changed:
                raise ValueError(
                    f"{workspace} holds a finished run with other settings ({', '.join(changed)}): "
                    f"delete it or choose another output folder"
                )
            print(f"  {workspace.name}: finished before, kept", flush=True)
            return results
    job_copy = customize_job(str(job), job_copy, job_args)
    watch = watch_options(verbosity, f"  {workspace.name}: ")
    run = run_simulator(job_copy, str(workspace), n_clients, threads, env=env, **watch)
    for _ in range(PORT_CLASH_RETRIES):  # simulators side by side pick free ports independently: run it again
        if run.ok or not run.port_clash:
            break
        print(f"  {workspace.name}: a port was taken by another process; running it again", flush=True)
        run = run_simulator(job_copy, str(workspace), n_clients, threads, env=env, **watch)
    if not run.ok:
        raise RuntimeError(f"{workspace.name} failed:\n{run.describe_failure()}")
    if run.errors:  # teardown_only: said, not hidden
        print(f"  {workspace.name}: a site's connection was lost as the finished run shut down (kept)", flush=True)
    results = json.loads(results_path.read_text())
    print(f"  {workspace.name}: {outcome_line(results, run.seconds)}", flush=True)
    return results
