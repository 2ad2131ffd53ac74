"""`fairfl poc ...`, `fairfl submit`, `fairfl download`, `fairfl provision-complete`, `fairfl dashboard`."""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from contextlib import contextmanager

# seconds `fairfl poc start` waits for the server and every site (--timeout): on this project's 2-core machine they
# were ready after 13 s idle, 25 s beside 4 busy processes and 57 s beside 12; a loaded CI runner once needed over 180
POC_START_TIMEOUT = 300


def _fail(command: str, error: Exception) -> int:
    print(f"fairfl {command}: {error}", file=sys.stderr)
    return 1


@contextmanager
def _job_to_submit(job: str, overrides: dict):
    """`job` itself, or with --set a copy of it with the arguments changed (fairfl.jobconfig.customize_job) in a
    temporary folder: the server keeps the job it was sent, so unlike `fairfl run` (whose simulator reads its copy
    later) no copy is left beside the user's job, to be refused or replaced by the next submit."""
    if not overrides:
        yield job
        return
    from fairfl.jobconfig import customize_job

    with tempfile.TemporaryDirectory(prefix="fairfl-submit-") as tmp:
        # the job's own folder name: the name the federation lists it under
        yield customize_job(job, os.path.join(tmp, os.path.basename(os.path.abspath(job).rstrip("/"))), overrides)


def _poc_next_steps() -> list[str]:
    """How to use a POC that `fairfl poc start` started: the lines it prints after what runs."""
    return [
        "submit: fairfl poc submit jobs/fedlwr",
        "        with NVFlare's own tools, a copy without the job's app/custom marker: fairfl export-job jobs/fedlwr "
        "OUT, then nvflare job submit -j OUT",
        "stop:   fairfl poc stop",
    ]


def _poc(args) -> int:
    from fairfl.deploy import admin, poc
    from fairfl.jobconfig import checked_overrides
    from fairfl.progress import round_printer

    try:
        if args.action == "prepare":
            ws = poc.prepare(args.n_sites, args.port, args.force)
            print(
                f"POC workspace {ws}: server localhost:{args.port} (127.0.0.1 only), sites "
                f"site-1..site-{args.n_sites}, admin {poc.ADMIN}; class allow-list admits fairfl's "
                f"component classes only\n"
                f"next: fairfl poc start"
            )
        elif args.action == "start":
            federation, seconds = poc.start(args.timeout)
            print(f"POC federation ready after {seconds:.0f} s, from {poc.workspace()}:")
            print("\n".join([*federation.lines(), *_poc_next_steps()]))
        elif args.action == "status":
            federation = poc.status()
            print(f"POC federation {'ready' if federation.ready else 'not ready'}, from {poc.workspace()}:")
            print("\n".join(federation.lines()))
            return 0 if federation.ready else 1
        elif args.action == "submit":
            overrides = checked_overrides(args.job, args.set)  # before the federation sees the job
            admin.refuse_custom_code(args.job)
            with _job_to_submit(args.job, overrides) as job:
                job_id, status = poc.submit(
                    job, wait=not args.no_wait, timeout=args.timeout, on_round=round_printer("POC ")
                )
            print(f"job {job_id}" + _with_overrides(overrides) + (f": {status}" if status else " submitted"))
            if status and status != "FINISHED:COMPLETED":
                print(f"logs: fairfl poc download {job_id} (the server's and sites' logs are in it)", file=sys.stderr)
                return 1
            print(f"next: fairfl poc download {job_id}")
        elif args.action == "download":
            folder, report = poc.download(args.job_id, args.out)
            print(f"{report['table']}\n\njob workspace: {folder}\nreport:        {report['report']}")
        elif args.action == "stop":
            poc.stop()
        elif args.action == "clean":
            poc.clean()
    except (OSError, RuntimeError, ValueError) as e:
        return _fail(f"poc {args.action}", e)
    except Exception as e:  # the admin API's own errors: no connection, authorization, job timeout
        return _fail(f"poc {args.action}", f"{type(e).__name__}: {e}")
    return 0


def _submit(args) -> int:
    from fairfl.deploy import admin
    from fairfl.jobconfig import checked_overrides

    try:
        overrides = checked_overrides(args.job, args.set)  # before the federation sees the job
        admin.refuse_custom_code(args.job)
    except ValueError as e:
        return _fail("submit", e)
    try:
        with _job_to_submit(args.job, overrides) as job:
            job_id = admin.submit(args.admin, job, args.user)
        print(f"job {job_id}{_with_overrides(overrides)} submitted", flush=True)
        if args.no_wait:
            return 0
        status = admin.wait(args.admin, job_id, args.timeout, args.user)
    except Exception as e:
        return _fail("submit", f"{type(e).__name__}: {e}")
    print(f"job {job_id}: {status}\nnext: fairfl download {job_id} --admin {args.admin}")
    return 0 if status == admin.COMPLETED else 1


def _with_overrides(overrides: dict) -> str:
    return f" (with {overrides})" if overrides else ""


def _download(args) -> int:
    from fairfl.deploy import admin
    from fairfl.report.document import make_report

    try:
        folder = admin.download(args.admin, args.job_id, args.out, args.user)
        report = make_report([admin.find_results(folder)], os.path.join(folder, "report"))
    except Exception as e:
        return _fail("download", f"{type(e).__name__}: {e}")
    print(f"{report['table']}\n\njob workspace: {folder}\nreport:        {report['report']}")
    return 0


def _provision_complete(args) -> int:
    from fairfl.deploy.kits import complete_kits

    try:
        done = complete_kits(args.kits, args.storage, force=args.force)
    except (OSError, ValueError) as e:
        return _fail("provision-complete", e)
    for kit, kind in done.items():
        print(
            f"{kind:6} {kit}: local/resources.json (allow-list + fairfl's component classes), local/authorization.json"
        )
    print(
        "private keys and startup/ folders are now owner-only; keep the provisioning state/ folder (the root "
        "CA's private key) offline"
    )
    return 0


PASSWORD_ENV = "FAIRFL_DASHBOARD_PASSWORD"


def _read_password(args) -> str:
    """The new project admin's password: one line from --password-fd, else typed twice at the terminal."""
    if args.password_fd is not None:
        with os.fdopen(args.password_fd, "r", closefd=False) as f:
            return f.readline().rstrip("\n")
    password = getpass.getpass(f"password for {args.admin}: ")
    if getpass.getpass("the same password again: ") != password:
        raise ValueError("the two passwords differ")
    return password


def _dashboard(args) -> int:
    from fairfl.deploy.dashboard import make_app, needs_admin, serve

    if PASSWORD_ENV in os.environ:  # a password in the environment is visible to every process of this user
        return _fail(
            "dashboard",
            f"${PASSWORD_ENV} is no longer read (the environment leaks to other processes): "
            f"unset it; type the password when asked, or pass it with --password-fd",
        )
    try:
        # the password is never bound here: nothing holds it once make_app has stored its hash (refusing a weak one)
        app = make_app(
            args.root, args.admin, _read_password(args) if args.admin and needs_admin(args.root) else None, args.org
        )
        serve(app, args.root, args.port)
    except (OSError, ValueError) as e:
        return _fail("dashboard", e)
    return 0


def add_commands(sub) -> None:
    """Register the deployment subcommands on the `fairfl` parser's subparsers."""
    from fairfl.cli_arguments import at_least
    from fairfl.jobconfig import add_set_argument

    port = at_least(1, at_most=65535)
    p = sub.add_parser(
        "poc",
        help="a POC federation on this machine (127.0.0.1 only): prepare, start, submit, "
        "download, stop, clean; workspace $NVFLARE_POC_WORKSPACE or workspaces/poc",
    )
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("prepare", help="provision the server and N sites, allow-list fairfl's components")
    a.add_argument("-n", "--n-sites", type=at_least(1), default=2)
    a.add_argument("--port", type=port, default=8002, help="server port on 127.0.0.1 (default 8002)")
    a.add_argument("--force", action="store_true", help="replace an earlier POC workspace (nothing else)")
    a = actions.add_parser(
        "start", help="start the server and the sites in the background; returns once every site is connected"
    )
    a.add_argument(
        "--timeout",
        type=at_least(1),
        default=POC_START_TIMEOUT,
        help=f"seconds to wait for the server and every site (default {POC_START_TIMEOUT}: a loaded machine is slow); "
        "after it, whatever started keeps running and is named",
    )
    actions.add_parser("status", help="what runs: each participant's processes, the admin port, the connected sites")
    a = actions.add_parser(
        "submit", help="submit a job (its app/custom marker left out: not BYOC; code there is refused) and wait for it"
    )
    a.add_argument("job", help="job folder, e.g. jobs/fedlwr")
    add_set_argument(a)
    a.add_argument("--no-wait", action="store_true")
    a.add_argument("--timeout", type=float, default=0.0, help="seconds to wait (0: until it ends)")
    a = actions.add_parser("download", help="download a job's workspace and write its report")
    a.add_argument("job_id", nargs="?", help="default: the last one submitted")
    a.add_argument("-o", "--out", help="folder (default: <POC workspace>-results)")
    actions.add_parser("stop", help="stop the server and the sites")
    actions.add_parser("clean", help="delete the POC workspace (stop first)")
    p.set_defaults(func=_poc)

    for name, what in (
        ("submit", "submit a job to a federation as an admin, and wait for it"),
        ("download", "download a finished job's workspace and write its report"),
    ):
        p = sub.add_parser(name, help=what)
        if name == "submit":
            p.add_argument(
                "job", help="job folder; its app/custom marker is left out (not BYOC), code in app/custom is refused"
            )
            add_set_argument(p)
            p.add_argument("--no-wait", action="store_true")
            p.add_argument("--timeout", type=float, default=0.0, help="seconds to wait (0: until it ends)")
            p.set_defaults(func=_submit)
        else:
            p.add_argument("job_id")
            p.add_argument("-o", "--out", default=".", help="folder to download into (default: here)")
            p.set_defaults(func=_download)
        p.add_argument("--admin", required=True, metavar="KIT", help="your admin startup kit folder")
        p.add_argument("--user", help="admin user name (default: the kit's folder name)")

    p = sub.add_parser(
        "provision-complete",
        help="allow-list fairfl's component classes, set the authorization "
        "policy (local/ only) and make the keys owner-only in the "
        "startup kits of `nvflare provision`",
    )
    p.add_argument("kits", help="the provisioned folder holding the kits, e.g. workspace/fairfl/prod_00")
    p.add_argument("--storage", help="server job storage (default <server kit>/storage)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace local/ files that differ from what it writes (a site's own edits are lost)",
    )
    p.set_defaults(func=_provision_complete)

    p = sub.add_parser(
        "dashboard",
        help="run the FLARE dashboard on 127.0.0.1 (a workstation; for a real "
        "deployment use its container: nvflare dashboard --start)",
    )
    p.add_argument(
        "--root",
        default=os.path.join("workspaces", "dashboard"),
        help="database folder (new, empty or the dashboard's own)",
    )
    p.add_argument("--port", type=port, default=8443)
    p.add_argument(
        "--admin",
        metavar="EMAIL",
        help="project admin, first start only (the password is asked twice; at least 12 characters of 3 kinds)",
    )
    p.add_argument(
        "--password-fd",
        type=int,
        metavar="FD",
        help="read the admin's password from this open file descriptor instead (automation: 3<secret-file)",
    )
    p.add_argument("--org", default="fairfl", help="project admin's organisation, first start only")
    p.set_defaults(func=_dashboard)
