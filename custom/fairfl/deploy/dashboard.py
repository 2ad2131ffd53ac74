"""NVFlare's dashboard (project set-up, user and site sign-up, startup kit downloads) on a workstation.

A real deployment runs the dashboard's container (`nvflare dashboard --start`, needs Docker). This runs the
same Flask app bound to 127.0.0.1 only, with its database in a folder of ours; never `nvflare dashboard
--local`, which binds every interface and writes its database into site-packages."""

from __future__ import annotations

import os
import secrets

HOST = "127.0.0.1"
API = "/nvflare-dashboard/api/v1"


def make_app(web_root: str, admin_email: str | None = None, password: str | None = None, org: str | None = None):
    """The dashboard's Flask app with its database under `web_root`.

    The project admin (email, password, org) is needed the first time only, to seed the database. The
    secret key that signs login tokens is kept in `web_root/secret_key` (readable by the owner only)."""
    web_root = os.path.abspath(web_root)
    os.makedirs(web_root, mode=0o700, exist_ok=True)
    key_file = os.path.join(web_root, "secret_key")
    if not os.path.exists(key_file):
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    seeded = os.path.exists(os.path.join(web_root, "db.sqlite"))
    if not seeded and not (admin_email and password and org):
        raise ValueError(f"{web_root} holds no dashboard database yet: give the project admin's email, "
                         f"password and organisation to create it")
    if any(":" in (v or "") for v in (admin_email, password, org)):
        raise ValueError("the admin email, password and organisation must not contain ':'")
    os.environ["NVFL_WEB_ROOT"] = web_root
    os.environ["SECRET_KEY"] = open(key_file).read().strip()
    if admin_email:
        os.environ["NVFL_CREDENTIAL"] = f"{admin_email}:{password}:{org}"
    from nvflare.dashboard.application import init_app  # reads the environment above when first called

    return init_app()


def serve(web_root: str, port: int, admin_email=None, password=None, org=None) -> None:
    """Serve the dashboard at http://127.0.0.1:PORT until interrupted."""
    app = make_app(web_root, admin_email, password, org)
    print(f"FLARE dashboard on http://{HOST}:{port} (this machine only); database in {web_root}", flush=True)
    app.run(host=HOST, port=port)
